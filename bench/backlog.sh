#!/usr/bin/env bash
# A long durable queue: publish N persistent messages of SIZE bytes into one queue with no
# consumer (PerfTest), restart the broker and time the recovery, then drain the queue. Samples the
# broker's RSS every 2 s throughout. Loopback only; bounded by N.
#
#   bench/backlog.sh            env: BACKLOG_N (10000000), BACKLOG_SIZE (1000), BACKLOG_PRODUCERS (2),
#                               WARREN_BIN, DATA (a fresh dir under /tmp, removed after)
# (Not N/SIZE/PRODUCERS: PerfTest reads environment variables named after its options.)
#
# Output: bench/results/backlog-<UTC stamp>/ with PerfTest's outputs (publish.txt, drain.txt),
# rss.csv (t_s,phase,rss_kb) and summary.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
N=${BACKLOG_N:-10000000}
SIZE=${BACKLOG_SIZE:-1000}
PRODUCERS=${BACKLOG_PRODUCERS:-2}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$ROOT/bench/results/backlog-$STAMP
DATA=${DATA:-$(mktemp -d /tmp/warren-backlog-XXXXXX)}
mkdir -p "$OUT"
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p warren)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
HTTP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
PT_LIB=/opt/rabbitmq-perftest/lib-${PERFTEST_VERSION:-2.22.1}
PID=""; SAMPLER=""
cleanup() {
  [ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null || true
  [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT
PHASE=$OUT/phase
T0=$(date +%s.%N)

start() {
  "$BIN" server --amqp-port "$PORT" --http-port "$HTTP" --data-dir "$DATA" 2>>"$OUT/warren.log" &
  PID=$!
  until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 0.05; done
}
sample() {
  while sleep 2; do
    local rss
    rss=$(awk '/^VmRSS/{print $2}' /proc/"$PID"/status 2>/dev/null || echo 0)
    echo "$(echo "$(date +%s.%N) - $T0" | bc),$(cat "$PHASE"),$rss" >>"$OUT/rss.csv"
  done
}
perftest() {  # OUTFILE ARGS...
  local f=$1; shift
  java -Xms256m -Xmx2g -cp "$PT_LIB/*" com.rabbitmq.perf.PerfTest -h "$URI" "$@" >"$OUT/$f" 2>&1
}
peak() { awk '/^VmHWM/{print $2}' /proc/"$PID"/status; }
rss() { awk '/^VmRSS/{print $2}' /proc/"$PID"/status; }

echo "t_s,phase,rss_kb" >"$OUT/rss.csv"
echo publish >"$PHASE"
start
sample & SAMPLER=$!
per=$((N / PRODUCERS))
perftest publish.txt -x "$PRODUCERS" -y 0 -u backlog -ad false -f persistent -s "$SIZE" -C "$per"
# The last publishes may still be buffered: wait until the log stops growing.
prev=-1; while cur=$(du -sb "$DATA" | cut -f1); [ "$cur" != "$prev" ]; do prev=$cur; sleep 2; done
{
  echo "messages: $((per * PRODUCERS)) x $SIZE B persistent, $PRODUCERS producers, one durable queue"
  echo "after publish: rss_kb=$(rss) peak_rss_kb=$(peak) disk_bytes=$cur"
} | tee "$OUT/summary.txt"

echo restart >"$PHASE"
kill -TERM "$PID"; wait "$PID" || true
t=$(date +%s.%N); start
until [ "$(grep -c 'vhost recovered' "$OUT/warren.log")" -ge 2 ]; do sleep 0.05; done
t1=$(date +%s.%N)
echo "restart: recovered after $(echo "$t1 - $t" | bc) s; $(grep 'vhost recovered' "$OUT/warren.log" | tail -1 | sed 's/.*INFO //'); rss_kb=$(rss)" | tee -a "$OUT/summary.txt"

echo drain >"$PHASE"
perftest drain.txt -x 0 -y 1 -u backlog -p -ad false -q 1000 -D "$((per * PRODUCERS))"
echo "after drain: rss_kb=$(rss) peak_rss_kb=$(peak) disk_bytes=$(du -sb "$DATA" | cut -f1)" | tee -a "$OUT/summary.txt"
grep -E "sending rate avg|receiving rate avg" "$OUT/publish.txt" "$OUT/drain.txt" | tee -a "$OUT/summary.txt" || true
echo "results: $OUT"
