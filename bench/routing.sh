#!/usr/bin/env bash
# Routing cost with many bindings, Warren vs RabbitMQ 3.10, driven by `warren perf` (1 -> 1, 16 B,
# autoack, unlimited rate) through an exchange that also carries N other bindings:
#
#   bench/routing.sh direct N    N queues bound to one direct exchange, each by its own name; the
#                                producer publishes to one of them (routing key bm-<N-1>)
#   bench/routing.sh topic N     N queues bound to one topic exchange by 'bm-<i>.*.#' (i < N-1:
#                                none of them matches) and the consumed one by 'bm-<N-1>.*.#';
#                                the producer publishes with key 'bm-<N-1>.a.b'
#   bench/routing.sh fanout N    N queues (x-max-length 1, so memory stays flat) and one consumed
#                                queue bound to one fanout exchange; every message goes to all
#   env: ROUNDS (3), DUR (8 s per run), WARREN_BIN (default $CARGO_TARGET_DIR or target/release),
#        WARREN_PORT (5692), PYTHON (a python with pika; default the interop suite's venv,
#        created by tests/interop/python/run.sh)
#
# Rounds alternate Warren (fresh, empty data dir) and RabbitMQ (127.0.0.1:5673, started if down;
# the exchange and queues are deleted after each run). Prints each run's receive rate and the
# medians. Loopback only; each run is bounded by DUR.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
MODE=${1:?usage: bench/routing.sh direct|topic|fanout N}
N=${2:?usage: bench/routing.sh direct|topic|fanout N}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-8}
PORT=${WARREN_PORT:-5692}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
PYTHON=${PYTHON:-$ROOT/.venv-interop/bin/python}
[ -x "$BIN" ] || { echo "routing.sh: no warren binary at $BIN (cargo build --release)" >&2; exit 1; }
"$PYTHON" -c 'import pika' 2>/dev/null \
  || { echo "routing.sh: $PYTHON has no pika (run tests/interop/python/run.sh once, or set PYTHON)" >&2; exit 1; }
case "$MODE" in direct | topic | fanout) ;; *) echo "routing.sh: mode is direct, topic or fanout" >&2; exit 2 ;; esac
"$ROOT/../shared/bench/rabbitmq.sh" status >/dev/null 2>&1 || "$ROOT/../shared/bench/rabbitmq.sh" start >/dev/null

# setup|teardown PORT: declares (or deletes) the exchange `bench-routing` and its queues.
defs() {
  "$PYTHON" - "$1" "$2" "$MODE" "$N" <<'PY'
import sys, pika
action, port, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
ch = c.channel()
names = [f"bm-{i}" for i in range(n)] + (["bm-sink"] if mode == "fanout" else [])
if action == "setup":
    ch.exchange_declare("bench-routing", mode)
    for q in names:
        args = {"x-max-length": 1} if mode == "fanout" and q != "bm-sink" else None
        ch.queue_declare(q, arguments=args)
        ch.queue_bind(q, "bench-routing", routing_key=f"{q}.*.#" if mode == "topic" else q)
else:
    for q in names:
        ch.queue_delete(q)
    ch.exchange_delete("bench-routing")
c.close()
PY
}

queue=$([ "$MODE" = fanout ] && echo bm-sink || echo "bm-$((N - 1))")
key=$([ "$MODE" = topic ] && echo "$queue.a.b" || echo "$queue")
run() {  # PORT -> receive rate
  "$BIN" perf -h "amqp://guest:guest@127.0.0.1:$1/%2f" -x 1 -y 1 -e bench-routing -t "$MODE" \
    -u "$queue" -k "$key" -p -a -s 16 -z "$DUR" 2>&1 | sed -n 's/.*receiving rate avg: \([0-9]*\).*/\1/p' | tail -1
}

W=""; DATA=$(mktemp -d /tmp/warren-routing-XXXXXX)
trap '[ -n "$W" ] && kill "$W" 2>/dev/null; rm -rf "$DATA"' EXIT
ws=(); rs=()
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "${DATA:?}"/*
  "$BIN" server --amqp-port "$PORT" --http-port 0 --data-dir "$DATA" 2>/dev/null & W=$!
  for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  defs setup "$PORT"; w=$(run "$PORT"); kill "$W"; wait "$W" 2>/dev/null || true; W=""
  defs setup 5673; b=$(run 5673); defs teardown 5673
  echo "round $r: Warren ${w:-?} msg/s, RabbitMQ ${b:-?} msg/s"
  ws+=("${w:-0}"); rs+=("${b:-0}")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mw=$(median "${ws[@]}"); mr=$(median "${rs[@]}")
echo "$MODE with $N bindings, median of $ROUNDS: Warren $mw msg/s, RabbitMQ $mr msg/s, W/R $(awk -v a="$mw" -v b="$mr" 'BEGIN {printf (b > 0) ? "%.2f" : "-", a / b}')"
