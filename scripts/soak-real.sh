#!/usr/bin/env bash
# soak-real.sh: leaves NODES separate `pspnode run` daemons training for
# MINUTES on 127.0.0.1 and reads each one's /metrics every EVERY seconds:
# resident memory (process_resident_memory_bytes), goroutines
# (go_goroutines), live heap (go_memstats_heap_alloc_bytes) and step
# (psp_step). It writes the readings to OUT (CSV) and prints, per node, the
# largest deviation of RSS and goroutines after the first WARM minutes from
# their value at WARM minutes (target: within 10 %). The model is MNIST
# logistic regression on the built-in data with pSSP(2,2) and 0.1-s
# synthetic steps, so the nodes keep stepping, exchanging updates and
# querying each other for the whole run. Linux only. Usage:
#
#   scripts/soak-real.sh [bin/pspnode]                  # 3 nodes, 30 min
#   NODES=3 MINUTES=30 WARM=5 EVERY=30 OUT=results/soak-real.csv scripts/soak-real.sh
set -euo pipefail
BIN=${1:-bin/pspnode}
NODES=${NODES:-3}
MINUTES=${MINUTES:-30}
WARM=${WARM:-5}
EVERY=${EVERY:-30}
OUT=${OUT:-results/soak-real.csv}
[ -x "$BIN" ] || { echo "soak-real: no executable $BIN (run make build)" >&2; exit 2; }
command -v curl >/dev/null || { echo "soak-real: needs curl" >&2; exit 2; }
D=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
common=(--model logreg --data mnist --barrier pssp:2:2 --time-scale 0.05 --log-level warn --job soak)
start_node() { # index, extra flags...
  local i=$1; shift
  "$BIN" run --listen /ip4/127.0.0.1/tcp/0 --http 127.0.0.1:0 "${common[@]}" "$@" >"$D/n$i.out" 2>"$D/n$i.err" &
  pids+=($!)
}
wait_line() { # file, pattern: prints the first match, waiting up to 10 s
  for _ in $(seq 1 100); do
    if grep -qo "$2" "$1"; then grep -o "$2" "$1" | head -1; return; fi
    sleep 0.1
  done
  echo "soak-real: no '$2' in $1:" >&2; cat "${1%.out}.err" >&2; exit 1
}
start_node 0
boot=$(wait_line "$D/n0.out" '/ip4/127.0.0.1/tcp/[0-9]*/p2p/[A-Za-z0-9]*')
for i in $(seq 1 $((NODES - 1))); do start_node "$i" --bootstrap "$boot"; done
https=()
for i in $(seq 0 $((NODES - 1))); do
  https+=("$(wait_line "$D/n$i.out" 'http://127.0.0.1:[0-9]*' )")
done
mkdir -p "$(dirname "$OUT")"
echo "minute,node,rss_bytes,goroutines,heap_bytes,step" >"$OUT"
echo "soak-real: $NODES nodes (${https[*]}), $MINUTES min, readings every ${EVERY}s to $OUT"
end=$((SECONDS + MINUTES * 60))
while :; do
  m=$(awk -v s="$SECONDS" 'BEGIN{printf "%.2f", s/60}')
  for i in "${!https[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "soak-real: node $i exited; its last errors:" >&2; tail -n 5 "$D/n$i.err" >&2; exit 1
    fi
    curl -fsS --max-time 5 "${https[$i]}/metrics" | awk -v m="$m" -v n="$i" '
      /^process_resident_memory_bytes /{r=$2} /^go_goroutines /{g=$2}
      /^go_memstats_heap_alloc_bytes /{h=$2} /^psp_step /{s=$2}
      END{printf "%s,%s,%.0f,%.0f,%.0f,%.0f\n", m, n, r, g, h, s}' >>"$OUT"
  done
  [ "$SECONDS" -ge "$end" ] && break
  sleep "$EVERY"
done
awk -F, -v warm="$WARM" 'NR>1 && $1>=warm {
    n=$2; if (!(n in r0)) {r0[n]=$3; g0[n]=$4}
    dr=($3-r0[n])/r0[n]; dg=($4-g0[n])/g0[n]
    if (dr<0) dr=-dr; if (dg<0) dg=-dg
    if (dr>mr[n]) mr[n]=dr; if (dg>mg[n]) mg[n]=dg
    last[n]=$0; r1[n]=$3; g1[n]=$4; s1[n]=$6
  } END {
    for (n in r0) printf "soak-real: node %s: RSS %.1f -> %.1f MiB (max deviation %.1f %%), goroutines %d -> %d (max deviation %.1f %%), step %d\n",
      n, r0[n]/1048576, r1[n]/1048576, 100*mr[n], g0[n], g1[n], 100*mg[n], s1[n]
  }' "$OUT"
