#!/usr/bin/env bash
# soak-real.sh: leaves NODES separate `pspnode run` daemons training for
# MINUTES on 127.0.0.1 and reads each one's /metrics every EVERY seconds:
# resident memory (process_resident_memory_bytes), goroutines
# (go_goroutines), heap (go_memstats_heap_alloc_bytes) and step
# (psp_step). It writes the readings to OUT (CSV) and prints, per node,
# how RSS and goroutines moved after the first WARM minutes (target: flat
# within 10 %). The model is MNIST
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
common=(--model logreg --data mnist --exchange gossip --barrier pssp:2:2 --time-scale 0.05 --log-level warn --job soak)
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
# Per node, after WARM minutes: the mean of the first and of the last K
# readings (K = 3 minutes' worth; single readings swing with the
# collector's cycle), the largest single deviation from the first
# reading, and the least-squares trend in % of the mean per minute.
awk -F, -v warm="$WARM" -v k=$(( (180 + EVERY - 1) / EVERY )) 'NR>1 && $1>=warm {
    n=$2; c=++cnt[n]; t[n,c]=$1; r[n,c]=$3; g[n,c]=$4; s1[n]=$6
  } END {
    for (n in cnt) {
      c=cnt[n]; kk=(k<c?k:c)
      split("", a)
      for (f=3; f<=4; f++) {
        sf=0; sl=0; st=0; sv=0; stt=0; stv=0; mx=0
        for (i=1; i<=c; i++) {
          v=(f==3?r[n,i]:g[n,i]); x=t[n,i]
          if (i<=kk) sf+=v; if (i>c-kk) sl+=v
          st+=x; sv+=v; stt+=x*x; stv+=x*v
          d=(v-(f==3?r[n,1]:g[n,1]))/(f==3?r[n,1]:g[n,1]); if (d<0) d=-d; if (d>mx) mx=d
        }
        slope=(c*stv-st*sv)/(c*stt-st*st+1e-12)
        a[f]=sprintf("%.1f -> %.1f (%+.1f %%; single readings within %.1f %%; trend %+.2f %%/min)",
          sf/kk/(f==3?1048576:1), sl/kk/(f==3?1048576:1), 100*(sl-sf)/sf, 100*mx, 100*slope/(sv/c))
      }
      printf "soak-real: node %s, step %d: RSS MiB %s; goroutines %s\n", n, s1[n], a[3], a[4]
    }
  }' "$OUT"
