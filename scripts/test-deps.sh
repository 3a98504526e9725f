#!/usr/bin/env bash
# test-deps.sh: the set-up `make test` runs first. It installs the Debian
# packages the tests need when they are missing: with apt-get as root, or
# through passwordless sudo. When it cannot, it says what is missing and
# why, and exits 1, so that `make test` stops here rather than in a test
# that needs a missing tool. When everything is installed it only asks
# dpkg (well under a second) and never runs apt-get.
#
#   iproute2, nftables  ip, tc and nft: the netns testnet's tests
#                       (cmd/pspnode, internal/netns; they run as root)
#   prometheus          promtool checks the node's /metrics (TestMetricsLint)
#   python3, python3-torch, python3-grpcio, python3-protobuf,
#   python3-numpy       the PyTorch trainer client and its tests
#   libopenblas0-serial the BLAS torch's matrix products use: Debian's
#                       python3-torch takes the system's libblas.so.3, which
#                       is the reference BLAS (2.5 GFLOP/s here) unless an
#                       optimised one is installed (OpenBLAS, single-threaded:
#                       70 GFLOP/s, and no threads of its own beside torch's)
#   python3-venv, python3-pip, python3-setuptools, python3-wheel
#                       the test that pip-installs the client into a venv
#   protobuf-compiler, protobuf-compiler-grpc, mypy-protobuf
#                       protoc, grpc_python_plugin and protoc-gen-mypy_grpc:
#                       the test that the client's generated code is current
#                       (make proto)
#   gcc                 only without a C compiler: the race detector needs cgo
#
# Node.js (20.19 or later) and npm, for the js-libp2p interop client
# (interop/), come from the machine: Debian's nodejs is older than the
# client's dependencies need. Without them the interop test skips, unless
# PSPNODE_REQUIRE_NODE is set (CI sets it): then it fails.
#
# Usage: scripts/test-deps.sh        (make test-deps)
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

declare -A why=(
  [iproute2]="ip and tc, for the netns testnet's tests"
  [nftables]="nft, for the netns testnet's NAT routers"
  [prometheus]="promtool, which checks the node's /metrics"
  [python3]="the PyTorch trainer client"
  [python3-torch]="the PyTorch trainer client"
  [python3-grpcio]="the trainer client's gRPC"
  [python3-protobuf]="the trainer client's messages"
  [python3-numpy]="the trainer client's tensors"
  [libopenblas0-serial]="an optimised BLAS for torch (the reference one is 30 times slower)"
  [python3-venv]="a venv to pip-install the trainer client into"
  [python3-pip]="pip, to install the trainer client"
  [python3-setuptools]="the trainer client's build backend"
  [python3-wheel]="bdist_wheel, for the client's platform wheel that carries the binary"
  [protobuf-compiler]="protoc, for the trainer API's .proto"
  [protobuf-compiler-grpc]="grpc_python_plugin, the trainer client's service stub"
  [mypy-protobuf]="protoc-gen-mypy_grpc, the trainer client's stub types (.pyi)"
  [gcc]="a C compiler: the race detector needs cgo"
)
pkgs=(iproute2 nftables prometheus python3 python3-torch python3-grpcio python3-protobuf
  python3-numpy libopenblas0-serial python3-venv python3-pip python3-setuptools python3-wheel protobuf-compiler protobuf-compiler-grpc mypy-protobuf)
if ! command -v "$(go env CC 2>/dev/null || echo gcc)" >/dev/null 2>&1; then
  pkgs+=(gcc)
fi

say() { echo "test-deps: $*" >&2; }

if ! command -v dpkg-query >/dev/null 2>&1; then
  say "not a Debian system (no dpkg-query): cannot check or install the packages make test needs:"
  for p in "${pkgs[@]}"; do say "  $p: ${why[$p]}"; done
  say "install their equivalents, then run the tests with: go test -race ./..."
  exit 1
fi

missing=()
for p in "${pkgs[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      say "missing Debian packages, and no root or passwordless sudo to install them:"
      for p in "${missing[@]}"; do say "  $p: ${why[$p]}"; done
      say "install them as root:  apt-get install --no-install-recommends ${missing[*]}"
      say "(the netns tests also need root: run make test as root)"
      exit 1
    fi
  fi
  say "installing ${missing[*]}"
  for p in "${missing[@]}"; do say "  $p: ${why[$p]}"; done
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# What the packages put on PATH, checked once: a package can be installed
# while its tool is not where the tests look.
for t in ip tc nft promtool protoc grpc_python_plugin protoc-gen-mypy_grpc python3; do
  command -v "$t" >/dev/null 2>&1 || { say "$t is not on PATH after installing its package"; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
  say "note: not root: the netns tests need root and will fail"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  say "note: no node or npm on PATH: the js-libp2p interop test (interop/) will skip, or fail with PSPNODE_REQUIRE_NODE set"
fi
