#!/usr/bin/env bash
# The benchmark page in one command: measure, then render docs/benchmarks.md and its charts.
#
#   bench/report.sh                        bench/perf.sh (S1 S2P S2 and the S4 sweep, Warren, LavinMQ
#                                          2.8.2 and RabbitMQ 3.10, warren perf, lavinmqperf and
#                                          PerfTest, ROUNDS rounds), then bench/cores.sh, then render
#   bench/report.sh --render-only [ARGS]   only render, from the newest bench/results/perf-* and
#                                          cores-*; ARGS go to bench/report.py (--results DIR, --check)
#   env: ROUNDS (3) for perf.sh; the rest as perf.sh and cores.sh read it (DUR, SWEEP, CORES, ...)
#
# Takes the machine for a long while (perf.sh alone is about an hour at ROUNDS=3): nothing else
# should run meanwhile, since the figures are only meaningful on an otherwise idle machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --render-only ]; then
  shift
else
  [ $# -eq 0 ] || { echo "usage: bench/report.sh [--render-only [report.py args]]" >&2; exit 2; }
  BROKERS="warren lavinmq rabbitmq" TOOLS="warren-perf lavinmqperf perftest" ROUNDS=${ROUNDS:-3} \
    "$HERE/perf.sh" S1 S2P S2
  "$HERE/cores.sh"
fi
exec python3 "$HERE/report.py" "$@"
