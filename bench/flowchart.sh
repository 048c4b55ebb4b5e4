#!/usr/bin/env bash
# The flow-control chart: 1 producer -> 1 consumer, 16 B, autoack, unlimited rate, for DUR seconds
# (default 300), on Warren and then on RabbitMQ 3.10, with PerfTest; the broker's RSS is sampled
# every second beside PerfTest's per-second send/receive rates and latency percentiles. Renders
# an HTML page and SVG charts (bench/flowchart.py). Loopback only; bounded by DUR.
#
#   bench/flowchart.sh [OUTDIR]     env: DUR (300), WARREN_BIN, SHARED (../shared)
#
# OUTDIR defaults to bench/results/flowchart-<UTC stamp>/; docs/ copies are made by hand.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
BENCH=$SHARED/bench
DUR=${DUR:-300}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
OUT=${1:-$ROOT/bench/results/flowchart-$(date -u +%Y%m%dT%H%M%SZ)}
PT_LIB=/opt/rabbitmq-perftest/lib-${PERFTEST_VERSION:-2.22.1}
mkdir -p "$OUT"
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p warren)
[ -d "$PT_LIB" ] || "$BENCH/perftest.sh" 2>/dev/null || true
"$BENCH/rabbitmq.sh" status >/dev/null 2>&1 || "$BENCH/rabbitmq.sh" start
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
DATA=$(mktemp -d /tmp/warren-flowchart-XXXXXX)
WPID=""; SAMPLER=""
cleanup() {
  [ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null || true
  [ -z "$WPID" ] || kill "$WPID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT

sample() {  # PID FILE: t_s,rss_kb every second
  local pid=$1 f=$2 t0
  t0=$(date +%s.%N)
  echo "t_s,rss_kb" >"$f"
  while kill -0 "$pid" 2>/dev/null; do
    echo "$(echo "$(date +%s.%N) - $t0" | bc),$(awk '/^VmRSS/{print $2}' /proc/"$pid"/status)" >>"$f"
    sleep 1
  done
}
run() {  # NAME URI PID
  local name=$1 uri=$2 pid=$3
  sample "$pid" "$OUT/$name-rss.csv" & SAMPLER=$!
  timeout --kill-after=30 $((DUR + 60)) java -Xms256m -Xmx2g -cp "$PT_LIB/*" com.rabbitmq.perf.PerfTest \
    -h "$uri" -x 1 -y 1 -u flowchart -a -s 16 -z "$DUR" >"$OUT/$name-perftest.txt" 2>&1 || true
  kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""
}

"$BIN" server --amqp-port "$PORT" --http-port "$(free_port)" --data-dir "$DATA" 2>"$OUT/warren.log" &
WPID=$!
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 0.05; done
echo "flowchart: Warren (pid $WPID) for $DUR s" >&2
run warren "amqp://guest:guest@127.0.0.1:$PORT/%2f" "$WPID"
kill "$WPID"; wait "$WPID" 2>/dev/null || true; WPID=""
"$BENCH/rabbitmq.sh" purge-all >/dev/null 2>&1 || true
RPID=$("$BENCH/rabbitmq.sh" pid)
echo "flowchart: RabbitMQ (pid $RPID) for $DUR s" >&2
run rabbitmq "amqp://guest:guest@127.0.0.1:5673/%2f" "$RPID"
"$BENCH/rabbitmq.sh" purge-all >/dev/null 2>&1 || true
{
  echo "command: DUR=$DUR bench/flowchart.sh"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "warren: $BIN ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'))"
  echo "rabbitmq: $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?')"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
} >"$OUT/meta.txt"
python3 "$HERE/flowchart.py" "$OUT"
echo "results: $OUT" >&2
