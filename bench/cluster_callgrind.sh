#!/usr/bin/env bash
# Instructions per message of forwarding, steadier than wall-clock rates: a 3-node
# cluster on loopback with one node under callgrind, 2 queues homed on node 1, 2 producers and
# 2 consumers on one node, 100k messages of 12 B (20k msg/s per producer, so the node under
# callgrind keeps up), counters zeroed before the run and dumped after it.
#   bench/cluster_callgrind.sh [BIN...]   for each binary (default target/release/warren):
#     leader  node 1 (queues and clients) under callgrind: all the work of a local message
#     home    node 1 under callgrind, clients on node 2: the queue's side of a forwarded message
#     client  node 2 under callgrind, clients on node 2: the clients' side
#   prints instructions per message of each, and home + client against leader.
# The totals move by up to 5% between runs of one build (how many messages share a read and a
# run depends on timing): compare builds in one invocation, or per function from the
# callgrind.out files left under the printed folder (callgrind_annotate --inclusive=yes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${BASE:-7780}"
N=100000
OUT="$(mktemp -d /tmp/warren-cluster-callgrind.XXXX)"
trap 'for i in 1 2 3; do [ -f "$OUT/n$i.pid" ] && kill "$(cat "$OUT/n$i.pid")" 2>/dev/null; done; true' EXIT
peers="127.0.0.1:$((BASE + 20001)),127.0.0.1:$((BASE + 20002)),127.0.0.1:$((BASE + 20003))"
uri() { echo "amqp://guest:guest@127.0.0.1:$((BASE + $1))"; }

one() { # BIN GRIND_NODE CLIENT_NODE NAME: prints instructions per message
  local bin=$1 grind=$2 client=$3 name=$4 d="$OUT/$4" i pre
  mkdir -p "$d"
  for i in 1 2 3; do
    mkdir -p "$d/n$i"
    pre=()
    [ "$i" = "$grind" ] && pre=(valgrind --tool=callgrind --callgrind-out-file="$d/callgrind.out" --dump-instr=no)
    WARREN_COOKIE=bench nohup "${pre[@]}" "$bin" server --node-name "warren$i@localhost" --data-dir "$d/n$i" \
      --amqp-port $((BASE + i)) --http-port $((BASE + 10000 + i)) \
      --cluster-listen "127.0.0.1:$((BASE + 20000 + i))" --cluster-peers "$peers" >"$d/n$i.log" 2>&1 &
    echo $! >"$OUT/n$i.pid"
  done
  for i in 1 2 3; do
    for _ in $(seq 1 300); do
      curl -sf -u guest:guest "http://127.0.0.1:$((BASE + 10000 + i))/api/overview" >/dev/null 2>&1 && break
      sleep 0.5
    done
  done
  "$bin" perf -h "$(uri 1)" --queue-pattern 'q-%d' --queue-pattern-from 1 --queue-pattern-to 2 -x 0 -y 1 \
    --auto-delete false -z 1 >/dev/null 2>&1
  sleep 2
  local pid; pid="$(cat "$OUT/n$grind.pid")"
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$bin" perf -h "$(uri "$client")" --queue-pattern 'q-%d' --queue-pattern-from 1 --queue-pattern-to 2 \
    -x 2 -y 2 --auto-delete false -C $((N / 2)) -D $((N / 2)) -r 20000 >"$d/perf.out" 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  for i in 1 2 3; do kill "$(cat "$OUT/n$i.pid")" 2>/dev/null || true; rm -f "$OUT/n$i.pid"; done
  sleep 3
  local f; f="$(ls "$d"/callgrind.out.* | sort | tail -1)"
  # awk reads to the end: a reader that stops early kills callgrind_annotate with SIGPIPE.
  callgrind_annotate "$f" 2>/dev/null | awk -v n=$N '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print int($1 / n); done = 1}'
}

[ $# -gt 0 ] || set -- "$ROOT/target/release/warren"
echo "| binary | leader | home | client | home + client | vs leader |"
echo "|---|---|---|---|---|---|"
for bin in "$@"; do
  l="$(one "$bin" 1 1 leader)"; h="$(one "$bin" 1 2 home)"; c="$(one "$bin" 2 2 client)"
  echo "| $bin | $l | $h | $c | $((h + c)) | $(awk -v a=$((h + c)) -v b="$l" 'BEGIN {printf "%.2f", a / b}') |"
done
echo "(instructions per message; files under $OUT)"
