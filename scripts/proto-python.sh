#!/usr/bin/env bash
# proto-python.sh DIR: the Python client's generated code, from the
# trainer API's .proto and pspnode/rpc/status.proto, written under DIR
# (make proto writes clients/python; the test that the committed code is
# current writes a temporary directory and compares). Messages and their
# .pyi come from protoc itself (3.21: the builder layout), the service
# stub from grpc_python_plugin (Debian protobuf-compiler-grpc, the same
# gRPC release as python3-grpcio), its .pyi from protoc-gen-mypy_grpc
# (Debian mypy-protobuf).
set -euo pipefail
out=${1:?usage: proto-python.sh DIR}
cd "$(dirname "$0")/.."
plugin=$(command -v grpc_python_plugin) || { echo "proto-python: no grpc_python_plugin: apt-get install protobuf-compiler-grpc" >&2; exit 1; }
command -v protoc-gen-mypy_grpc >/dev/null || { echo "proto-python: no protoc-gen-mypy_grpc: apt-get install mypy-protobuf" >&2; exit 1; }
protoc -I proto --python_out="$out" --pyi_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" --grpc_python_out="$out" --mypy_grpc_out="$out" \
  proto/pspnode/trainer/v3/trainer.proto
protoc -I proto --python_out="$out" --pyi_out="$out" proto/pspnode/rpc/status.proto
