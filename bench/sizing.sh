#!/usr/bin/env bash
# The cluster sizing study's own test (issue 31, item 6; ../shared/DESIGN.md: seven 16-vCPU
# nodes, mirrored, persistent 1 KB, held 65k msg/s with p99 < 1 s), as a growing-intensity run
# of RabbitMQ's PerfTest against a 3-node cluster with replicated (quorum) queues:
#   100 queues (perf-test-1..100, -qq), 200 publishers at a fixed rate each, persistent 1 KB,
#   confirms 1000 in flight, prefetch 1000, consumers that work 10 ms per message
#   (--consumer-latency 10000), their number raised with the rate as the study does (enough
#   for the step's rate with a quarter to spare: ceil(rate / 100 * 1.25), rounded up to a
#   multiple of 100 queues, at least 200). Connections are spread over the three nodes
#   (PerfTest -H with the three URIs: each queue is led by the node that declared it).
# Each step runs STEP seconds (default 40); a step holds when the receive rate is at least 95%
# of the attempted rate and PerfTest's consumer latency p99 is under 1 s. The run stops at the
# first step that does not hold, and prints the highest total rate held.
#   bench/sizing.sh warren      Warren, 3 nodes (scripts/cluster.sh, WARREN_BIN)
#   bench/sizing.sh rabbitmq    RabbitMQ 3.10, 3 nodes (bench/rabbitmq-cluster.sh)
# RATES: the total rates to try (default "1000 2000 4000 6000 8000 12000 16000 24000").
# On 2 shared cores this measures the machine (PerfTest's 400+ threads share it) as much as the
# broker: compare the two brokers only within one run of this script each, interleaved.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="$(cd "$ROOT/../shared/bench" && pwd)"
BROKER="${1:?usage: bench/sizing.sh warren|rabbitmq}"
STEP="${STEP:-40}"
RATES="${RATES:-1000 2000 4000 6000 8000 12000 16000 24000}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results/sizing-$BROKER-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS_DIR"
case "$BROKER" in
  warren)
    export BASE="${BASE:-6780}"
    DIR="$(mktemp -d /tmp/warren-bench-sizing.XXXX)"
    trap '"$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
    WARREN_BIN="${WARREN_BIN:-$ROOT/target/release/warren}" "$ROOT/scripts/cluster.sh" start "$DIR" >/dev/null
    uri() { echo "amqp://guest:guest@127.0.0.1:$((BASE + $1))/%2f"; }
    pids() { cat "$DIR"/n?.pid; }
    HTTP=$((BASE + 10001)) ;;
  rabbitmq)
    BASE=5690 MGMT=1 "$ROOT/bench/rabbitmq-cluster.sh" start >/dev/null
    trap '"$ROOT/bench/rabbitmq-cluster.sh" stop >/dev/null 2>&1' EXIT
    uri() { echo "amqp://guest:guest@127.0.0.1:$((5690 + $1))/%2f"; }
    # The three nodes' Erlang VMs (their node names are in their environment, not argv).
    pids() {
      local p
      for p in $(pgrep -u rabbitmq -f beam.smp); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^RABBITMQ_NODENAME=rabbit-c' && echo "$p"
      done
    }
    HTTP=15691 ;;
  *) echo "bench/sizing.sh: unknown broker $BROKER (warren or rabbitmq)" >&2; exit 2 ;;
esac
URIS="$(uri 1),$(uri 2),$(uri 3)"
cpu() { local t=0 p; for p in $(pids); do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo "$t"; }
delete_queues() {
  local i
  for i in $(seq 1 100); do
    curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$HTTP/api/queues/%2f/perf-test-$i" || true
  done
}
held=0
echo "| total rate attempted | consumers | received msg/s | latency p50 | p99 | broker CPU-s | held |"
echo "|---:|---:|---:|---:|---:|---:|---|"
for total in $RATES; do
  per=$(( (total + 199) / 200 ))
  consumers=$(( (total * 125 / 10000 + 99) / 100 * 100 ))
  [ "$consumers" -lt 200 ] && consumers=200
  delete_queues
  out="$RESULTS_DIR/step-$total.txt"
  c0="$(cpu)"
  "$SHARED/perftest.sh" "$(uri 1)" -- -H "$URIS" --queue-pattern 'perf-test-%d' --queue-pattern-from 1 \
    --queue-pattern-to 100 --producers 200 --consumers "$consumers" -qq --flag persistent \
    --qos 1000 --confirm 1000 --size 1024 --rate "$per" --consumer-latency 10000 -z "$STEP" \
    >"$out" 2>&1 || true
  c1="$(cpu)"
  # perftest.sh writes one summary line ("manual: send=N recv=N msg/s | latency p50=..us ...").
  line="$(grep -E 'recv=' "$out" | tail -1)"
  recv="$(grep -oE 'recv=[0-9]+' <<<"$line" | grep -oE '[0-9]+$' || echo 0)"
  p50="$(grep -oE 'p50=[0-9]+' <<<"$line" | grep -oE '[0-9]+$' || echo -)"
  p99="$(grep -oE 'p99=[0-9]+' <<<"$line" | head -1 | grep -oE '[0-9]+$' || echo -)"
  attempted=$(( per * 200 ))
  ok=no
  if [ "${recv:-0}" -ge $(( attempted * 95 / 100 )) ] && [ "$p99" != - ] && [ "$p99" -lt 1000000 ]; then
    ok=yes; held=$attempted
  fi
  echo "| $attempted | $consumers | ${recv:-0} | ${p50}us | ${p99}us | $(( (c1 - c0) / 100 )) | $ok |"
  [ "$ok" = yes ] || break
done
delete_queues
echo "$BROKER: highest total rate held with p99 < 1 s: $held msg/s (raw: $RESULTS_DIR)"
