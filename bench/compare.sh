#!/usr/bin/env bash
# Warren vs RabbitMQ 3.10, side by side, with RabbitMQ's PerfTest (../shared/bench/perftest.sh):
# each scenario runs on Warren then on RabbitMQ, ROUNDS times, and the medians and the ratios
# Warren/RabbitMQ are printed as a markdown table. Loopback only; every run is bounded by DUR.
#
#   bench/compare.sh [SCENARIO ...]   default: S1 S4-1000 S4-5000 S4-10000 S4-20000 S4-40000 S4-80000
#   env: ROUNDS (3), DUR (30; S4-* always run 15 s), WARREN_PORT (5672), SHARED (../shared),
#        WARREN_BIN (default target/release/warren, built if missing),
#        RESTART_WARREN (1: a fresh Warren and data dir for every scenario, so peak RSS is the
#        scenario's own; 0: one Warren for the whole run), ALLOW_CONCURRENT (0: refuse to start
#        while another PerfTest runs here; one compare.sh at a time, by a lock in /tmp)
#
# Scenarios are those of ../shared/bench/README.md. Raw PerfTest outputs, Warren's log and
# summary.md go to bench/results/<UTC timestamp>/ (gitignored). The Warren started here is
# stopped on exit; RabbitMQ (127.0.0.1:5673) is started if down and left running.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
BENCH=$SHARED/bench
PORT=${WARREN_PORT:-5672}
RMQ_URI=amqp://guest:guest@127.0.0.1:5673/%2f
W_URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
RESTART_WARREN=${RESTART_WARREN:-1}
export ROUNDS=${ROUNDS:-3} DUR=${DUR:-30}
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(S1 S4-1000 S4-5000 S4-10000 S4-20000 S4-40000 S4-80000)

die() { echo "compare.sh: $*" >&2; exit 1; }
DONE=()
write_summary() {  # [note]
  [ -f "$OUT/header.md" ] || return 0
  {
    cat "$OUT/header.md"
    [ -z "${1:-}" ] || { echo "**$1**"; echo; }
    [ ! -s "$OUT/warnings" ] || { sed 's/^/- **/; s/$/**/' "$OUT/warnings"; echo; }
    if [ ${#DONE[@]} -gt 0 ]; then python3 "$HERE/summarize.py" "$OUT" "${DONE[@]}"; else echo "(no scenario completed)"; fi
    echo
    echo "Raw results: \`bench/results/$STAMP/\` (\`<scenario>-A-<round>.txt\` = Warren, \`-B-\` = RabbitMQ)"
  } >"$OUT/summary.md"
}
abort() {
  echo "compare.sh: ABORTED: $*" | tee -a "$OUT/compare.log" >&2
  write_summary "ABORTED: $* -- scenarios after the last in the table were not run or are invalid"
  rm -f "$OUT/header.md"; echo; cat "$OUT/summary.md"; exit 1
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

[ -x "$BENCH/perftest.sh" ] || die "$BENCH/perftest.sh not found (set SHARED)"
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
if [ ! -x "$BIN" ]; then
  echo "compare.sh: building $BIN" >&2
  (cd "$ROOT" && cargo build --release -p warren) || die "cargo build failed"
fi
# One comparison at a time on this machine: two overlapping runs load the same 2 cores and the same
# RabbitMQ (whose queues each run purges), and both would report garbage.
exec 9>/tmp/warren-bench-compare.lock
flock -n 9 || die "another bench/compare.sh is running (lock /tmp/warren-bench-compare.lock held); wait for it"
foreign_perftest() { pgrep -f 'com\.rabbitmq\.perf\.PerfTest' 2>/dev/null | tr '\n' ' ' || true; }
[ -z "$(foreign_perftest)" ] || [ "${ALLOW_CONCURRENT:-0}" = 1 ] \
  || die "PerfTest is already running here (pids $(foreign_perftest)); its load would skew both brokers' figures (ALLOW_CONCURRENT=1 to run anyway)"
port_open "$PORT" && die "port $PORT is taken ($(ss -ltnpH "sport = :$PORT" 2>/dev/null | grep -o 'users:.*' || echo '?')); stop what listens there or set WARREN_PORT"

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$HERE/results/$STAMP
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/warren-bench-XXXXXX)
# A private copy, so a rebuild of target/ during the run cannot mix two builds in one run.
cp "$BIN" "$WORK/warren"
WPID=""
stop_warren() {
  if [ -n "$WPID" ]; then kill "$WPID" 2>/dev/null || true; wait "$WPID" 2>/dev/null || true; WPID=""; fi
}
trap 'stop_warren; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

N_START=0
# Our Warren is alive (not a zombie) and is the process listening on $PORT. Checked after each
# start and before and after each scenario, so that a run against some other broker on the port
# (another benchmark, a test) is never reported as Warren's.
warren_ok() {
  [ -n "$WPID" ] && [ -r "/proc/$WPID/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$WPID/status" \
    && ss -ltnpH "sport = :$PORT" 2>/dev/null | grep -q "pid=$WPID,"
}
start_warren() {
  N_START=$((N_START + 1))
  local data="$WORK/data-$N_START"
  mkdir -p "$data"
  "$WORK/warren" server --amqp-port "$PORT" --http-port 0 --data-dir "$data" >>"$OUT/warren.log" 2>&1 9>&- &
  WPID=$!
  for _ in $(seq 1 100); do warren_ok && break; kill -0 "$WPID" 2>/dev/null || break; sleep 0.1; done
  warren_ok || abort "Warren (pid $WPID) did not start or does not own port $PORT: $(tail -n 3 "$OUT/warren.log" | tr '\n' ' ')"
}
if [ "$("$BENCH/rabbitmq.sh" status)" != up ]; then
  "$BENCH/rabbitmq.sh" start >/dev/null 9>&- || die "RabbitMQ did not start"
fi
RPID=$("$BENCH/rabbitmq.sh" pid)
[ -n "$RPID" ] || die "no RabbitMQ pid"

{
  echo "# Warren vs RabbitMQ 3.10, PerfTest side by side ($STAMP)"
  echo
  echo "- command: \`ROUNDS=$ROUNDS DUR=$DUR RESTART_WARREN=$RESTART_WARREN WARREN_PORT=$PORT bench/compare.sh ${SCENARIOS[*]}\`"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r); PerfTest runs on the same cores"
  echo "- Warren: binary $BIN built $(date -u -r "$BIN" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$BIN" | cut -c1-12) (working tree at run start: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')); data dir on $(df -h "$WORK" | awk 'NR==2{print $1}')"
  echo "- RabbitMQ: $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?') on 127.0.0.1:5673, queues purged before each of its runs"
  echo "- PerfTest: $(ls -d /opt/rabbitmq-perftest/lib-* 2>/dev/null | sed 's/.*lib-//' | tail -1), java $(java -version 2>&1 | head -1 | grep -o '"[^"]*"' | tr -d '"')"
  echo
} >"$OUT/header.md"
cat "$OUT/header.md"

start_warren
first=1
for s in "${SCENARIOS[@]}"; do
  # S6b drains what S6a preloaded: same Warren, no purge of RabbitMQ before it.
  purge="$BENCH/rabbitmq.sh purge-all >/dev/null 2>&1"
  [ "$s" != S6b ] || purge=""
  if [ "$RESTART_WARREN" = 1 ] && [ "$first" = 0 ] && [ "$s" != S6b ]; then
    stop_warren
    for _ in $(seq 1 50); do port_open "$PORT" || break; sleep 0.1; done
    start_warren
  fi
  first=0
  warren_ok || abort "Warren (pid $WPID) is gone or no longer owns port $PORT before $s"
  f=$(foreign_perftest); [ -z "$f" ] || echo "WARNING: another PerfTest (pids $f) is running before $s: concurrent load" | tee -a "$OUT/compare.log" "$OUT/warnings"
  echo "== $s (Warren pid $WPID, RabbitMQ pid $RPID)" | tee -a "$OUT/compare.log"
  RESULTS_DIR=$OUT BROKER_PID_A=$WPID BROKER_PID_B=$RPID \
    PURGE_B="$purge" \
    "$BENCH/perftest.sh" compare "$W_URI" "$RMQ_URI" "$s" 2>&1 9>&- | tee -a "$OUT/compare.log" || true
  warren_ok || abort "Warren (pid $WPID) died or lost port $PORT during $s; its $s figures are not Warren's"
  f=$(foreign_perftest); [ -z "$f" ] || echo "WARNING: another PerfTest (pids $f) was running at the end of $s: its figures are skewed by concurrent load" | tee -a "$OUT/compare.log" "$OUT/warnings"
  DONE+=("$s")
done
stop_warren
write_summary
rm -f "$OUT/header.md"
echo
cat "$OUT/summary.md"
echo "raw results: $OUT"
