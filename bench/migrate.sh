#!/usr/bin/env bash
# The migration of a live RabbitMQ workload onto Warren with shovels, measured: see
# bench/migrate.py (its arguments pass through). Uses the interop suite's venv for pika (made
# by tests/interop/python/run.sh) and WARREN_BIN (default: target/release/warren, built if
# missing); RabbitMQ 3.10 comes from ../shared/bench/rabbitmq.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${INTEROP_VENV:-$ROOT/.venv-interop}"
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q -r "$ROOT/tests/interop/python/requirements.txt"
fi
export WARREN_BIN="${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}"
[[ -x "$WARREN_BIN" ]] || (cd "$ROOT" && cargo build --release -p warren)
exec "$VENV/bin/python" "$ROOT/bench/migrate.py" "$@"
