#!/usr/bin/env bash
# Three pspnode daemons and three PyTorch trainers on this machine: the
# MNIST example (examples/torch/mnist.py) as one job under pSSP(2, 2).
#
#   examples/torch/run-three.sh            (or: make torch-example)
#
# Each daemon is `pspnode run --trainer unix:SOCKET`; the first starts the
# job and the others join through it. Each trainer wraps its SGD optimizer
# in pspnode.Optimizer, trains on a third of the training images for STEPS
# steps (default 400) and reports its held-out accuracy. Logs and CSV files
# stay in the directory it prints. Needs Debian's python3-torch,
# python3-grpcio, python3-protobuf and python3-numpy (make test-deps).
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-400}
BIN=${BIN:-bin/pspnode}
[ -x "$BIN" ] || make build
dir=$(mktemp -d -t pspnode-torch-XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

boot=""
for i in 0 1 2; do
  args=(run --job torch-example --listen /ip4/127.0.0.1/tcp/0 --trainer "unix:$dir/d$i.sock"
        --barrier pssp:2:2 --nat-traversal=false --http 127.0.0.1:0 --log-level warn)
  [ -n "$boot" ] && args+=(--bootstrap "$boot")
  "$BIN" "${args[@]}" >"$dir/d$i.out" 2>"$dir/d$i.log" &
  pids+=($!)
  until grep -q '^trainer: ' "$dir/d$i.out" 2>/dev/null; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$dir/d$i.log"; exit 1; }
    sleep 0.1
  done
  [ -n "$boot" ] || boot=$(grep -m1 '^listening: ' "$dir/d0.out" | cut -d' ' -f2)
  echo "daemon $i: $(grep '^http: ' "$dir/d$i.out" | cut -d' ' -f2) (/status), trainer socket $dir/d$i.sock"
done

tpids=()
for i in 0 1 2; do
  /usr/bin/python3 examples/torch/mnist.py --daemon "unix:$dir/d$i.sock" --shard "$i" --shards 3 \
    --steps "$STEPS" --out "$dir/t$i.csv" --summary "$dir/t$i.json" --log warning 2>"$dir/t$i.log" &
  tpids+=($!)
done
echo "three trainers training $STEPS steps each (logs in $dir) ..."
status=0
for i in 0 1 2; do
  if wait "${tpids[$i]}"; then
    /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f'trainer $i: {s[\"steps\"]} steps in {s[\"elapsed_s\"]:.1f} s, held-out accuracy {s[\"final_accuracy\"]:.3f}')" "$dir/t$i.json"
  else
    echo "trainer $i failed:"; cat "$dir/t$i.log"; status=1
  fi
done
exit $status
