#!/usr/bin/env bash
# idle-node.sh: measures what an idle pspnode costs (target: < 2 %
# of one core and < 50 MB RSS with 50 peers). It starts 1 + PEERS separate
# `pspnode run` processes on 127.0.0.1, bootstrapped from the first, with the
# synthetic task time scaled so that no node finishes a step during the run
# (--time-scale 1000: a step takes about 2000 s), lets the overlay settle for
# WARM seconds, then reads the first node's and a later joiner's CPU time
# (/proc/PID/stat) over MEAS seconds and their RSS, and prints the first
# node's /status. Linux only (/proc). Usage:
#
#   make bench-idle                     # or: scripts/idle-node.sh [bin/pspnode]
#   MODEL=none PEERS=50 WARM=60 MEAS=60 scripts/idle-node.sh
set -euo pipefail
BIN=${1:-bin/pspnode}
PEERS=${PEERS:-50}
WARM=${WARM:-60}
MEAS=${MEAS:-60}
MODEL=${MODEL:-linreg}
[ -x "$BIN" ] || { echo "idle-node: no executable $BIN (run make build)" >&2; exit 2; }
[ -r /proc/self/stat ] || { echo "idle-node: needs Linux /proc" >&2; exit 2; }
D=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
common=(--time-scale 1000 --model "$MODEL" --log-level warn --job idle --eval-every 0)
"$BIN" run --listen /ip4/127.0.0.1/tcp/0 --http 127.0.0.1:0 "${common[@]}" >"$D/n0.out" 2>"$D/n0.err" &
pids+=($!)
boot=""
for _ in $(seq 1 100); do
  boot=$(grep -o '/ip4/127.0.0.1/tcp/[0-9]*/p2p/[A-Za-z0-9]*' "$D/n0.out" | head -1 || true)
  [ -n "$boot" ] && break
  sleep 0.1
done
[ -n "$boot" ] || { echo "idle-node: first node printed no address:" >&2; cat "$D/n0.err" >&2; exit 1; }
echo "idle-node: first node $boot; starting $PEERS peers"
for i in $(seq 1 "$PEERS"); do
  "$BIN" run --listen /ip4/127.0.0.1/tcp/0 --bootstrap "$boot" "${common[@]}" >"$D/n$i.out" 2>"$D/n$i.err" &
  pids+=($!)
  sleep 0.2
done
echo "idle-node: settling for ${WARM}s, then measuring for ${MEAS}s"
sleep "$WARM"
tick=$(getconf CLK_TCK)
cpu() { # utime+stime of a node process, in clock ticks
  if [ ! -r "/proc/$1/stat" ]; then
    echo "idle-node: node process $1 exited early; last node errors:" >&2
    tail -q -n 3 "$D"/n*.err >&2
    exit 1
  fi
  awk '{print $14+$15}' "/proc/$1/stat"
}
a=${pids[0]}; b=${pids[$((PEERS / 2))]}
a0=$(cpu "$a"); b0=$(cpu "$b"); t0=$(date +%s.%N)
sleep "$MEAS"
a1=$(cpu "$a"); b1=$(cpu "$b"); t1=$(date +%s.%N)
report() { # name pid ticks0 ticks1
  local rss
  rss=$(awk '/VmRSS/{print $2}' "/proc/$2/status")
  awk -v n="$1" -v d="$(($4 - $3))" -v tk="$tick" -v t0="$t0" -v t1="$t1" -v rss="$rss" \
    'BEGIN{printf "%-12s cpu %.2f %% of one core, RSS %.0f MiB\n", n, 100*d/tk/(t1-t0), rss/1024}'
}
report "first node" "$a" "$a0" "$a1"
report "a joiner" "$b" "$b0" "$b1"
alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
echo "processes alive: $alive of $((PEERS + 1))"
url=$(grep -ho 'http://127.0.0.1:[0-9]*' "$D/n0.out" "$D/n0.err" | head -1 || true)
[ -n "$url" ] && curl -s "$url/status" | grep -E '"(connected_peers|routing_table_size|population_estimate|step)"' || true
