#!/usr/bin/env bash
# Soak test, loopback only and bounded in time: hundreds of connections churning (open, publish
# with confirms, consume, close) plus clients killed with -9, some mid-frame, against a fresh
# Warren. Prints RSS and fd counts before/peak/after, messages confirmed and lost, probe results.
#   bench/soak.sh                  # 10 minutes
#   SOAK_SECONDS=180 bench/soak.sh # shorter; SOAK_WORKERS, SOAK_CONNS set the load
# Uses $WARREN_BIN, else target/release/warren (built if missing), and .venv-interop (pika).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}"
[[ -x "$BIN" ]] || (cd "$ROOT" && cargo build --release -p warren)
VENV="${INTEROP_VENV:-$ROOT/.venv-interop}"
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -r "$ROOT/tests/interop/python/requirements.txt"
fi
DIR="$(mktemp -d /tmp/warren-soak.XXXXXX)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
HTTP="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
rc=0
ulimit -n 65536 2>/dev/null || true
"$BIN" server --amqp-port "$PORT" --http-port "$HTTP" --data-dir "$DIR/data" 2>"$DIR/broker.log" &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
SOAK_PORT="$PORT" SOAK_BROKER_PID="$BROKER" SOAK_DIR="$DIR" "$VENV/bin/python" "$ROOT/bench/soak.py" 2>"$DIR/clients.log" || rc=$?
echo "soak: client errors logged: $(wc -l <"$DIR/clients.log") (first: $(head -1 "$DIR/clients.log"))"
echo "soak: broker log: $(grep -c 'connection closed' "$DIR/broker.log") connection-closed lines, $(grep -ci 'panic' "$DIR/broker.log") panics, $(grep -c 'alarm set' "$DIR/broker.log") alarms set $(grep -m1 'alarm set' "$DIR/broker.log" || true)"
exit $rc
