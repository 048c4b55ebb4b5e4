#!/usr/bin/env bash
# Run the Go interop suite.
#   Against RabbitMQ (default amqp://guest:guest@127.0.0.1:5673/, or $AMQP_URL):
#     tests/interop/go/run.sh
#   Against Warren (started and stopped by the suite on free 127.0.0.1 ports):
#     WARREN_BIN=target/release/warren tests/interop/go/run.sh
#   Cluster mode: through node 2 of a 3-node Warren cluster whose non-exclusive queues all live
#   on nodes 1 and 3 (queue_master_locator = "min-masters", WARREN_CLUSTER_BALLAST (default 1000)
#   queues pinned on node 2; see cluster_mode_test.go):
#     WARREN_CLUSTER=1 WARREN_BIN=target/release/warren tests/interop/go/run.sh
#   (tests/interop/cluster_mode.sh runs the bounded part that scripts/test.sh runs.)
# Extra arguments are passed to `go test` (e.g. -run TestQos -v).
# Exits non-zero when any test fails.
set -euo pipefail
if [[ -n "${WARREN_BIN:-}" && "$WARREN_BIN" == */* && "$WARREN_BIN" != /* ]]; then
  WARREN_BIN="$PWD/$WARREN_BIN" # relative to the caller's directory
  export WARREN_BIN
fi
cd "$(dirname "$0")"
exec go test -count=1 -timeout 600s "$@" ./...
