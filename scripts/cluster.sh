#!/usr/bin/env bash
# Starts or stops a 3-node Warren cluster on loopback, each node with its own data dir and
# ports (docs/clustering.md):
#   scripts/cluster.sh start [DIR]   nodes warren1..3@localhost; AMQP 5681-5683, HTTP 15681-15683,
#                                    inter-node links 25681-25683; data and logs under DIR
#                                    (default ./warren-cluster)
#   scripts/cluster.sh stop [DIR]
# WARREN_BIN picks the binary (default target/release/warren); BASE moves every port by BASE-5680.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${WARREN_BIN:-$ROOT/target/release/warren}"
DIR="${2:-./warren-cluster}"
BASE="${BASE:-5680}"
COOKIE="${WARREN_COOKIE:-warren-cluster-cookie}"
peers="127.0.0.1:$((BASE + 20001)),127.0.0.1:$((BASE + 20002)),127.0.0.1:$((BASE + 20003))"
case "${1:-}" in
  start)
    mkdir -p "$DIR"
    for i in 1 2 3; do
      mkdir -p "$DIR/n$i"
      WARREN_COOKIE="$COOKIE" nohup "$BIN" server --node-name "warren$i@localhost" \
        --data-dir "$DIR/n$i" --amqp-port $((BASE + i)) --http-port $((BASE + 10000 + i)) \
        --cluster-listen "127.0.0.1:$((BASE + 20000 + i))" --cluster-peers "$peers" \
        >"$DIR/n$i.log" 2>&1 &
      echo $! >"$DIR/n$i.pid"
    done
    for i in 1 2 3; do
      for _ in $(seq 1 100); do
        if curl -sf -u guest:guest "http://127.0.0.1:$((BASE + 10000 + i))/api/overview" >/dev/null 2>&1; then break; fi
        sleep 0.2
      done
    done
    echo "cluster up: AMQP 127.0.0.1:$((BASE + 1))-$((BASE + 3)), HTTP $((BASE + 10001))-$((BASE + 10003)); logs in $DIR"
    ;;
  stop)
    for i in 1 2 3; do
      [ -f "$DIR/n$i.pid" ] && kill "$(cat "$DIR/n$i.pid")" 2>/dev/null || true
      rm -f "$DIR/n$i.pid"
    done
    ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
