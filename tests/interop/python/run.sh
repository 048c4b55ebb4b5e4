#!/usr/bin/env bash
# Run the Python interop suite.
#   tests/interop/python/run.sh [pytest args...]
# Broker: WARREN_BIN=path/to/warren starts one per session; otherwise AMQP_URL
# (default amqp://guest:guest@127.0.0.1:5673/%2f, the reference RabbitMQ) is used as is.
# Cluster mode: WARREN_BIN and WARREN_CLUSTER=1 start a 3-node cluster instead (every node with
# queue_master_locator = "min-masters"; WARREN_CLUSTER_BALLAST, default 1000, queues pinned on
# node 2) and run the suite through node 2, so that every non-exclusive queue lives on node 1
# or 3; tests marked single_node are skipped. See conftest.py; tests/interop/cluster_mode.sh runs
# the bounded part that scripts/test.sh runs.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
VENV="${INTEROP_VENV:-$ROOT/.venv-interop}"
REQ="$HERE/requirements.txt"
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" >"$STAMP"
fi
export PYTHONDONTWRITEBYTECODE=1
# Run the whole directory unless a test path (file, dir or node id) is among the arguments.
target=("$HERE")
for a in "$@"; do
  if [[ "$a" != -* && -e "${a%%::*}" ]]; then target=(); break; fi
done
exec "$VENV/bin/python" -m pytest -q "${target[@]}" "$@"
