#!/usr/bin/env bash
# Run the Go interop suite.
#   Against RabbitMQ (default amqp://guest:guest@127.0.0.1:5673/, or $AMQP_URL):
#     tests/interop/go/run.sh
#   Against Warren (started and stopped by the suite on free 127.0.0.1 ports):
#     WARREN_BIN=target/release/warren tests/interop/go/run.sh
# Extra arguments are passed to `go test` (e.g. -run TestQos -v).
# Exits non-zero when any test fails.
set -euo pipefail
if [[ -n "${WARREN_BIN:-}" && "$WARREN_BIN" == */* && "$WARREN_BIN" != /* ]]; then
  WARREN_BIN="$PWD/$WARREN_BIN" # relative to the caller's directory
  export WARREN_BIN
fi
cd "$(dirname "$0")"
exec go test -count=1 -timeout 600s "$@" ./...
