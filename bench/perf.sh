#!/usr/bin/env bash
# The standard scenarios (../shared/bench/README.md) with both load generators, `warren perf` and
# RabbitMQ's PerfTest, against both brokers, Warren and RabbitMQ 3.10, in one run; records each
# generator's CPU time so their cost per message can be compared against the same broker.
#
#   bench/perf.sh [SCENARIO ...]      default: S1 S2 S3 S4-1000 S4-10000 S4-40000 S4-80000 S5;
#                                     also S6a S6b (backlog fill, then drain: given together in
#                                     that order, each broker and tool runs the fill then the
#                                     drain), S7 (quorum), S8
#   env: DUR (30; S4-* run 15 s, S5 60 s), ROUNDS (1), TOOLS ("warren-perf perftest"),
#        BROKERS ("warren rabbitmq"), WARREN_BIN (default $CARGO_TARGET_DIR or target/release/warren,
#        built if missing), SWEEP (1: also a `warren perf --sweep` per broker, with an SVG chart),
#        WRITE_DOCS (1: replace the generated section of docs/benchmarks.md with this run's tables)
#
# Every run of one scenario uses the same PerfTest flags; each tool runs alone on the machine (the
# order is Warren/warren-perf, Warren/PerfTest, RabbitMQ/warren-perf, RabbitMQ/PerfTest). Raw
# outputs go to bench/results/perf-<UTC timestamp>/ with summary.md. Loopback only; every run is
# bounded by its -z. A fresh Warren on a free port is started here and stopped on exit; RabbitMQ
# (127.0.0.1:5673) is started if down, purged before each of its runs, and left running.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
BENCH=$SHARED/bench
export DUR=${DUR:-30}
ROUNDS=${ROUNDS:-1}
TOOLS=${TOOLS:-"warren-perf perftest"}
BROKERS=${BROKERS:-"warren rabbitmq"}
SWEEP=${SWEEP:-1}
PT_LIB=${PERFTEST_CACHE:-/opt/rabbitmq-perftest}/lib-${PERFTEST_VERSION:-2.22.1}
RMQ_URI=amqp://guest:guest@127.0.0.1:5673/%2f
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(S1 S2 S3 S4-1000 S4-10000 S4-40000 S4-80000 S5)

die() { echo "perf.sh: $*" >&2; exit 1; }

# The scenario table of ../shared/bench/perftest.sh (kept in step with it), PerfTest's flags as is.
scenario_args() {
  case "$1" in
    S1) echo "-x 1 -y 1 -u bench-s1 -a -s 16 -z $DUR" ;;
    S2) echo "-x 10 -y 10 -u bench-s2 -f persistent -s 4000 -c 100 -q 100 -z $DUR" ;;
    S3) echo "-x 10 -y 10 -qp bench-s3-%d -qpf 1 -qpt 10 -f persistent -s 4000 -c 100 -q 100 -z $DUR" ;;
    S4-*) echo "-x 1 -y 1 -u bench-s4 -a -s 16 -r ${1#S4-} -z 15" ;;
    S5) echo "--queue-pattern bench-s5-%d --queue-pattern-from 1 --queue-pattern-to 100 --producers 200 --consumers 200 --flag persistent --qos 1000 --confirm 1000 --size 1024 --rate 50 --consumer-latency 10000 -z 60" ;;
    S6a) echo "-qp bench-s6-%d -qpf 1 -qpt 10 -f persistent -ad false -s 1000 -x 10 -y 0 -c 100 -C 100000 -z 900" ;;
    S6b) echo "-qp bench-s6-%d -qpf 1 -qpt 10 -f persistent -ad false -s 1000 -x 0 -y 10 -q 100 -ew empty -z 900" ;;
    S7) echo "-x 10 -y 10 -u bench-s7 -qq -s 4000 -c 100 -q 100 -z $DUR" ;;
    S8) echo "-x 1000 -y 10 -qp bench-s8-%d -qpf 1 -qpt 10 -P 1 -s 16 -q 100 -niot 4 -niotp 6 -ctp 2 -hst 2 -z 60" ;;
    *) die "unknown scenario $1 (S1 S2 S3 S4-<rate> S5 S6a S6b S7 S8)" ;;
  esac
}
# Seconds the rates are averaged over; 0: the run ends on its own (S6), use the generator's wall time.
scenario_secs() { case "$1" in S4-*) echo 15 ;; S5|S8) echo 60 ;; S6*) echo 0 ;; *) echo "$DUR" ;; esac; }

BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
if [ ! -x "$BIN" ]; then
  echo "perf.sh: building $BIN" >&2
  (cd "$ROOT" && cargo build --release -p warren) || die "cargo build failed"
fi
if [[ " $TOOLS " == *" perftest "* ]] && [ ! -f "$PT_LIB/perf-test-${PERFTEST_VERSION:-2.22.1}.jar" ]; then
  "$BENCH/perftest.sh" amqp://127.0.0.1:1 -- --version >/dev/null 2>&1 || true  # fetches PerfTest
  [ -d "$PT_LIB" ] || die "PerfTest not found in $PT_LIB"
fi
# One benchmark at a time (the same lock as compare.sh), and not while someone's PerfTest runs.
exec 9>/tmp/warren-bench-compare.lock
flock -n 9 || die "another benchmark holds /tmp/warren-bench-compare.lock; wait for it"
foreign() { pgrep -f 'com\.rabbitmq\.perf\.PerfTest|warren perf' 2>/dev/null | tr '\n' ' ' || true; }
[ -z "$(foreign)" ] || die "a load generator is already running here (pids $(foreign)); wait for it"

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$HERE/results/perf-$STAMP
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/warren-perfbench-XXXXXX)
cp "$BIN" "$WORK/warren"  # a private copy: a rebuild during the run cannot mix two builds
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
HPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
W_URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
WPID=""
stop_warren() { [ -z "$WPID" ] || { kill "$WPID" 2>/dev/null || true; wait "$WPID" 2>/dev/null || true; WPID=""; }; }
trap 'stop_warren; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
"$WORK/warren" server --amqp-port "$PORT" --http-port "$HPORT" --data-dir "$WORK/data" >>"$OUT/warren.log" 2>&1 9>&- &
WPID=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
kill -0 "$WPID" 2>/dev/null || die "Warren did not start: $(tail -n 3 "$OUT/warren.log")"
RPID=""
if [[ " $BROKERS " == *" rabbitmq "* ]]; then
  [ "$("$BENCH/rabbitmq.sh" status)" = up ] || "$BENCH/rabbitmq.sh" start >/dev/null 9>&- || die "RabbitMQ did not start"
  RPID=$("$BENCH/rabbitmq.sh" pid)
fi

cpu_ticks() { awk '{print $14+$15}' /proc/"$1"/stat 2>/dev/null || echo 0; }

run_one() {  # BROKER TOOL SCENARIO ROUND
  local broker=$1 tool=$2 s=$3 r=$4 uri pid out c0 c1
  if [ "$broker" = warren ]; then uri=$W_URI; pid=$WPID; else uri=$RMQ_URI; pid=$RPID
    # S6b drains what S6a just filled.
    [ "$s" = S6b ] || "$BENCH/rabbitmq.sh" purge-all >/dev/null 2>&1 || true
  fi
  out=$OUT/$s-$broker-$tool-$r.txt
  # shellcheck disable=SC2046
  set -- $(scenario_args "$s")
  echo "== $s $broker $tool (round $r)"
  c0=$(cpu_ticks "$pid")
  if [ "$tool" = warren-perf ]; then
    timeout --kill-after=30 $(( $(scenario_secs "$s") + 1020 )) /usr/bin/time -o "$out.time" \
      -f '# generator: user_s=%U sys_s=%S wall_s=%e max_rss_kb=%M' \
      "$WORK/warren" perf -h "$uri" "$@" --json "$out.json" >"$out" 2>&1 9>&- || true
  else
    timeout --kill-after=30 $(( $(scenario_secs "$s") + 1020 )) /usr/bin/time -o "$out.time" \
      -f '# generator: user_s=%U sys_s=%S wall_s=%e max_rss_kb=%M' \
      java -Xms256m -Xmx4g -cp "$PT_LIB/*" com.rabbitmq.perf.PerfTest -h "$uri" "$@" >"$out" 2>&1 9>&- || true
  fi
  c1=$(cpu_ticks "$pid")
  grep '^# generator' "$out.time" >>"$out" || true
  echo "# broker: pid=$pid cpu_s=$(( (c1 - c0) / 100 )) secs=$(scenario_secs "$s")" >>"$out"
  python3 "$HERE/perf_summary.py" --line "$out"
}

{
  echo "- command: \`DUR=$DUR ROUNDS=$ROUNDS bench/perf.sh ${SCENARIOS[*]}\`"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM; generators and brokers share the cores"
  echo "- Warren: sha256 $(sha256sum "$BIN" | cut -c1-12) (tree $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')); RabbitMQ $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?'); PerfTest $(basename "$PT_LIB" | sed 's/lib-//'), java $(java -version 2>&1 | head -1 | grep -o '"[^"]*"' | tr -d '"')"
} >"$OUT/header.md"
cat "$OUT/header.md"

for ((i = 0; i < ${#SCENARIOS[@]}; i++)); do
  s=${SCENARIOS[$i]}
  if [ "$s" = S6b ] && [ "$i" -gt 0 ] && [ "${SCENARIOS[$((i - 1))]}" = S6a ]; then continue; fi
  for r in $(seq 1 "$ROUNDS"); do
    for broker in $BROKERS; do
      for tool in $TOOLS; do
        run_one "$broker" "$tool" "$s" "$r"
        # S6 is a fill then a drain of the same queues, so each (broker, tool) runs both in turn.
        if [ "$s" = S6a ] && [ "${SCENARIOS[$((i + 1))]:-}" = S6b ]; then run_one "$broker" "$tool" S6b "$r"; fi
      done
    done
  done
done
if [ "$SWEEP" = 1 ]; then
  for broker in $BROKERS; do
    if [ "$broker" = warren ]; then uri=$W_URI; else uri=$RMQ_URI; "$BENCH/rabbitmq.sh" purge-all >/dev/null 2>&1 || true; fi
    echo "== S4 sweep on $broker (warren perf --sweep)"
    "$WORK/warren" perf -h "$uri" -x 1 -y 1 -u bench-s4 -a -s 16 --sweep 1000,5000,10000,20000,40000,80000,unlimited \
      -z 15 --json "$OUT/sweep-$broker.json" --svg "$OUT/sweep-$broker.svg" --report "$OUT/sweep-$broker.html" \
      >"$OUT/sweep-$broker.txt" 2>&1 9>&- || true
    tail -n 8 "$OUT/sweep-$broker.txt"
  done
fi
stop_warren
python3 "$HERE/perf_summary.py" "$OUT" "${SCENARIOS[@]}" >"$OUT/tables.md"
{ cat "$OUT/header.md"; echo; cat "$OUT/tables.md"; } >"$OUT/summary.md"
echo; cat "$OUT/summary.md"; echo "raw results: $OUT"
if [ "${WRITE_DOCS:-0}" = 1 ]; then
  mkdir -p "$ROOT/docs/img"
  for b in $BROKERS; do [ ! -f "$OUT/sweep-$b.svg" ] || cp "$OUT/sweep-$b.svg" "$ROOT/docs/img/perf-sweep-$b.svg"; done
  python3 "$HERE/perf_summary.py" --write-docs "$ROOT/docs/benchmarks.md" "$OUT/summary.md"
  echo "docs/benchmarks.md: generated section replaced"
fi
