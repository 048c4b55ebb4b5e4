#!/usr/bin/env bash
# Profiles Warren's 3 nodes under the sizing study's load at one rate (bench/sizing.sh's
# arguments: 100 quorum queues, 200 publishers, 200 consumers working 10 ms a message,
# persistent 1 KB, confirms 1000, prefetch 1000), for docs/benchmarks/notes:
#   bench/sizing_profile.sh RATE OUTDIR
# Starts a cluster (scripts/cluster.sh, WARREN_BIN), runs PerfTest for DUR seconds (default 40)
# and, from the WARM-th second (default 15), `perf record -g` of the three nodes for 15 s
# (PERF=0 skips it). Prints the nodes' CPU ticks in that window and PerfTest's summary line;
# perf.data and PerfTest's output stay in OUTDIR.
set -euo pipefail
RATE="${1:?usage: bench/sizing_profile.sh RATE OUTDIR}"
OUT="${2:?usage: bench/sizing_profile.sh RATE OUTDIR}"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="$(cd "$ROOT/../shared/bench" && pwd)"
export BASE="${BASE:-6780}"
DIR="$(mktemp -d /tmp/warren-sizing-profile.XXXX)"
trap '"$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
WARREN_BIN="${WARREN_BIN:-$ROOT/target/release/warren}" "$ROOT/scripts/cluster.sh" start "$DIR" >/dev/null
uri() { echo "amqp://guest:guest@127.0.0.1:$((BASE + $1))/%2f"; }
per=$(( (RATE + 199) / 200 ))
"$SHARED/perftest.sh" "$(uri 1)" -- -H "$(uri 1),$(uri 2),$(uri 3)" --queue-pattern 'perf-test-%d' \
  --queue-pattern-from 1 --queue-pattern-to 100 --producers 200 --consumers 200 -qq \
  --flag persistent --qos 1000 --confirm 1000 --size 1024 --rate "$per" \
  --consumer-latency 10000 -z "${DUR:-40}" >"$OUT/perftest.txt" 2>&1 &
pt=$!
sleep "${WARM:-15}"
cpu() { local t=0 p; for p in $(cat "$DIR"/n?.pid); do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
c0="$(cpu)"
if [ "${PERF:-1}" = 1 ]; then
  perf record -F 499 -g -p "$(cat "$DIR"/n?.pid | paste -sd,)" -o "$OUT/perf.data" -- sleep 15 >/dev/null 2>&1
else
  sleep 15
fi
c1="$(cpu)"
echo "the nodes' CPU ticks in the 15 s window: $((c1 - c0))"
wait "$pt" || true
grep -E 'recv=' "$OUT/perftest.txt" | tail -1
