#!/usr/bin/env bash
# Replicated queues (issue 16): S7 (PerfTest -qq: quorum queue, persistent, confirms 100,
# qos 100, 4000 B, 10 producers and 10 consumers on one queue) on a 3-node Warren cluster on
# loopback against RabbitMQ 3.10's quorum queue on one node, in the same run:
#   warren-leader   Warren cluster, clients on the queue's leader (node 1)
#   warren-remote   Warren cluster, the queue led by node 1, clients on node 2
#   rabbitmq        RabbitMQ 3.10, one node (../shared/bench/rabbitmq.sh, port 5673)
#   warren-classic  S2 (the same load on a durable classic queue) on the same Warren cluster,
#                   clients on its home node: what replication costs
# Each runs ROUNDS times (default 3) for DUR seconds (default 20), interleaved; prints medians of
# the receive rate and their ratios. Raw PerfTest outputs stay in RESULTS_DIR.
#   bench/quorum.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="$(cd "$ROOT/../shared/bench" && pwd)"
W="${WARREN_BIN:-$ROOT/target/release/warren}"
ROUNDS="${ROUNDS:-3}"
export DUR="${DUR:-20}"
export BASE="${BASE:-6780}"
export RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results/quorum-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS_DIR"
DIR="$(mktemp -d /tmp/warren-bench-quorum.XXXX)"
trap '"$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
WARREN_BIN="$W" "$ROOT/scripts/cluster.sh" start "$DIR" >/dev/null
"$SHARED/rabbitmq.sh" start >/dev/null 2>&1 || true
uri() { echo "amqp://guest:guest@127.0.0.1:$((BASE + $1))/%2f"; }
RABBIT="amqp://guest:guest@127.0.0.1:5673/%2f"
pid_of() { cat "$DIR/n$1.pid"; }
rabbit_pid() { pgrep -f 'beam.smp.*rabbit' | head -1 || true; }
S7=(-x 10 -y 10 -qq -s 4000 -c 100 -q 100 -z "$DUR")
S2=(-x 10 -y 10 -f persistent -s 4000 -c 100 -q 100 -z "$DUR")
delete_q() { # HTTP_PORT QUEUE
  curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$1/api/queues/%2f/$2" || true; }
# perftest.sh prints one summary line per run ("manual: send=N recv=N msg/s | ...").
rate() { grep -oE "recv=[0-9]+" "$1" | grep -oE "[0-9]+$" | tail -1 || echo 0; }
run() { # NAME ROUND
  local out="$RESULTS_DIR/$1-$2.txt"
  case "$1" in
    warren-leader)
      delete_q $((BASE + 10001)) s7-leader
      "$SHARED/perftest.sh" "$(uri 1)" -- -u s7-leader "${S7[@]}" >"$out" 2>&1 || true ;;
    warren-remote)
      delete_q $((BASE + 10001)) s7-remote
      # Declared through node 1 (its leader), then loaded through node 2.
      "$W" perf -h "$(uri 1)" -u s7-remote -qq -x 0 -y 1 -z 1 >/dev/null 2>&1 || true
      "$SHARED/perftest.sh" "$(uri 2)" -- -u s7-remote -p "${S7[@]}" >"$out" 2>&1 || true ;;
    rabbitmq)
      delete_q 15673 s7-rabbit
      "$SHARED/perftest.sh" "$RABBIT" -- -u s7-rabbit "${S7[@]}" >"$out" 2>&1 || true ;;
    warren-classic)
      delete_q $((BASE + 10001)) s2-classic
      "$SHARED/perftest.sh" "$(uri 1)" -- -u s2-classic "${S2[@]}" >"$out" 2>&1 || true ;;
  esac
  rate "$out"
}
declare -A R
for r in $(seq 1 "$ROUNDS"); do
  for s in warren-leader rabbitmq warren-remote warren-classic; do
    v="$(run "$s" "$r")"; R[$s]="${R[$s]:-} $v"
    echo "round $r $s: $v msg/s" >&2
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2))}'; }
rb="$(echo "${R[rabbitmq]}" | median)"
echo "| scenario | median receive rate (msg/s) | vs RabbitMQ 3.10 quorum (1 node) | rounds |"
echo "|---|---:|---:|---|"
for s in warren-leader warren-remote rabbitmq warren-classic; do
  m="$(echo "${R[$s]}" | median)"
  ratio="$(awk -v a="$m" -v b="$rb" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
  echo "| $s | $m | $ratio |${R[$s]} |"
done
echo "raw outputs: $RESULTS_DIR" >&2
