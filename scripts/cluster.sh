#!/usr/bin/env bash
# Starts or stops a 3-node Warren cluster on loopback, each node with its own data dir and
# ports (docs/clustering.md):
#   scripts/cluster.sh start [DIR]   nodes warren1..3@localhost; AMQP 5681-5683, HTTP 15681-15683,
#                                    inter-node links 25681-25683; data and logs under DIR
#                                    (default ./warren-cluster)
#   scripts/cluster.sh stop [DIR]
# start exits 1, with the failing node's log tail, when a node does not come up; stop signals
# only pids that are still the cluster's nodes.
# WARREN_BIN picks the binary (default target/release/warren); BASE moves every port by BASE-5680;
# WARREN_ARGS adds `warren server` flags to every node (e.g. "--config FILE").
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
        ${WARREN_ARGS:-} >"$DIR/n$i.log" 2>&1 &
      echo $! >"$DIR/n$i.pid"
    done
    # Each node must answer its HTTP API; one that exits, or does not answer within 60 s, fails
    # the start: its log's tail is shown and the nodes started here are stopped again.
    for i in 1 2 3; do
      up=0
      for _ in $(seq 1 300); do
        if curl -sf -u guest:guest "http://127.0.0.1:$((BASE + 10000 + i))/api/overview" >/dev/null 2>&1; then up=1; break; fi
        kill -0 "$(cat "$DIR/n$i.pid")" 2>/dev/null || break
        sleep 0.2
      done
      if [ "$up" != 1 ]; then
        echo "cluster.sh: node warren$i@localhost did not come up; the tail of $DIR/n$i.log:" >&2
        tail -n 20 "$DIR/n$i.log" >&2 || true
        "$0" stop "$DIR" >/dev/null 2>&1 || true
        exit 1
      fi
    done
    echo "cluster up: AMQP 127.0.0.1:$((BASE + 1))-$((BASE + 3)), HTTP $((BASE + 10001))-$((BASE + 10003)); logs in $DIR"
    ;;
  stop)
    # Only a pid that is still this cluster's node is signalled (a stale pid file may name an
    # unrelated process by now); then each is waited for, up to 20 s.
    for i in 1 2 3; do
      f="$DIR/n$i.pid"
      [ -f "$f" ] || continue
      pid="$(cat "$f")"
      if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--node-name warren$i@localhost"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && echo "cluster.sh: node warren$i@localhost (pid $pid) did not stop in 20 s" >&2
      fi
      rm -f "$f"
    done
    ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
