#!/usr/bin/env bash
# Runs the fault-injection checker for N seeds in a row (one at a time) and prints a summary table
# (Markdown, for docs/reliability.md):
#   bench/faults/run.sh N [START_SEED] [-- CHECKER_ARGS...]
# Results are appended to bench/faults/results-<date>.jsonl (RESULTS overrides). PYTHON picks the
# interpreter (default .venv-interop/bin/python, which has pika); WARREN_BIN the broker binary.
# Exit status: 0 if every run passed, 1 otherwise.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv-interop/bin/python}"
N="${1:-5}"
START="${2:-1}"
shift $(( $# < 2 ? $# : 2 ))
[ "${1:-}" = "--" ] && shift
RESULTS="${RESULTS:-$HERE/results-$(date +%Y-%m-%d).jsonl}"
BATCH="$(date +%Y%m%dT%H%M%S)-$$"
failed=0
trap 'echo "interrupted" >&2; exit 130' INT TERM
for ((seed = START; seed < START + N; seed++)); do
  echo "=== seed $seed ($(date +%H:%M:%S))"
  "$PY" "$HERE/checker.py" --seed "$seed" --results "$RESULTS" --batch "$BATCH" "$@"
  rc=$?
  if [ "$rc" -eq 130 ]; then exit 130; fi
  [ "$rc" -ne 0 ] && failed=$((failed + 1))
done
echo
echo "results: $RESULTS (batch $BATCH)"
"$PY" "$HERE/summarize.py" "$RESULTS" --batch "$BATCH"
[ "$failed" -eq 0 ]
