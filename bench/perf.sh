#!/usr/bin/env bash
# The standard scenarios (../shared/bench/README.md) with three load generators, `warren perf`,
# RabbitMQ's PerfTest and LavinMQ's lavinmqperf, against Warren, RabbitMQ 3.10 and LavinMQ 2.8.2 in
# one run; records each generator's CPU time and each broker's, so cost per message compares.
#
#   bench/perf.sh [SCENARIO ...]      default: S1 S2 S3 S4-1000 S4-10000 S4-40000 S4-80000 S5;
#                                     also S6a S6b (backlog fill, then drain: given together in
#                                     that order, each broker and tool runs the fill then the
#                                     drain), S7 (quorum), S8, S2P (lavinmqperf's persistent
#                                     scenario: 1 -> 1, 1 KiB, confirms 100, ack every 100)
#   env: DUR (30; S4-* run 15 s, S5 60 s), ROUNDS (1), TOOLS ("warren-perf perftest"; also
#        lavinmqperf), BROKERS ("warren rabbitmq"; also lavinmq, from ../shared/bench/lavinmq.sh,
#        and warren-base: a second Warren build, WARREN_BASE_BIN, for an A/B of two builds in
#        one interleaved run; bench/ab_summary.py reads its ratios),
#        WARREN_BIN (default $CARGO_TARGET_DIR or target/release/warren, built if missing),
#        WARREN_ARGS, WARREN_BASE_ARGS (extra `warren server` flags for each, e.g. an A/B of
#        one build with two configurations: "--config some.toml"),
#        SWEEP (1: also S4 at each of SWEEP_RATES, every tool against every broker: sweep.tsv),
#        SWEEP_RATES (1000,5000,10000,20000,40000,80000,unlimited), SWEEP_ROUNDS (1)
#
# Every run of one scenario uses the same flags (lavinmqperf: its spelling of them); each tool runs
# alone on the machine. Within a round every tool runs against each broker in turn, and the broker
# that goes first rotates from round to round. Raw outputs go to bench/results/perf-<UTC timestamp>/
# with summary.md, runs.tsv (one row per run), commands.tsv and sweep.tsv, read by bench/report.py.
# Loopback only; every run is bounded by its -z. A fresh Warren on a free port is started here and
# stopped on exit; RabbitMQ (127.0.0.1:5673) and LavinMQ (5674) are started if down and left
# running; every broker's queues are deleted before each run (S6b keeps what S6a filled).
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
SWEEP_RATES=${SWEEP_RATES:-1000,5000,10000,20000,40000,80000,unlimited}
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
    S4-unlimited) echo "-x 1 -y 1 -u bench-s4 -a -s 16 -z 15" ;;
    S4-*) echo "-x 1 -y 1 -u bench-s4 -a -s 16 -r ${1#S4-} -z 15" ;;
    S5) echo "--queue-pattern bench-s5-%d --queue-pattern-from 1 --queue-pattern-to 100 --producers 200 --consumers 200 --flag persistent --qos 1000 --confirm 1000 --size 1024 --rate 50 --consumer-latency 10000 -z 60" ;;
    S6a) echo "-qp bench-s6-%d -qpf 1 -qpt 10 -f persistent -ad false -s 1000 -x 10 -y 0 -c 100 -C 100000 -z 900" ;;
    S6b) echo "-qp bench-s6-%d -qpf 1 -qpt 10 -f persistent -ad false -s 1000 -x 0 -y 10 -q 100 -ew empty -z 900" ;;
    S7) echo "-x 10 -y 10 -u bench-s7 -qq -s 4000 -c 100 -q 100 -z $DUR" ;;
    S8) echo "-x 1000 -y 10 -qp bench-s8-%d -qpf 1 -qpt 10 -P 1 -s 16 -q 100 -niot 4 -niotp 6 -ctp 2 -hst 2 -z 60" ;;
    S2P) echo "-x 1 -y 1 -u bench-s2p -f persistent -s 1024 -c 100 -A 100 -z $DUR" ;;
    *) die "unknown scenario $1 (S1 S2 S2P S3 S4-<rate> S5 S6a S6b S7 S8)" ;;
  esac
}
# The same scenarios in lavinmqperf's flags (its -a N acks every N, 0 = no-ack; -P is prefetch,
# 0 = unlimited, its default; -c is the most unconfirmed publishes; -r is per publisher).
lavin_args() {
  case "$1" in
    S1) echo "-x 1 -y 1 -u bench-s1 -s 16 -z $DUR" ;;
    S2) echo "-x 10 -y 10 -u bench-s2 -p -s 4000 -c 100 -P 100 -a 1 -z $DUR" ;;
    S2P) echo "-s 1024 -p -c 100 -a 100 -u bench-s2p -z $DUR" ;;
    S3) echo "-x 10 -y 10 --queue-pattern=bench-s3-% --queue-pattern-from=1 --queue-pattern-to=10 -p -s 4000 -c 100 -P 100 -a 1 -z $DUR" ;;
    S4-unlimited) echo "-x 1 -y 1 -u bench-s4 -s 16 -l -z 15" ;;
    S4-*) echo "-x 1 -y 1 -u bench-s4 -s 16 -r ${1#S4-} -l -z 15" ;;
    *) return 1 ;;
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
stop_warren() {
  local p
  for p in "$WPID" "${BPID:-}"; do
    [ -z "$p" ] || { kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
  done
  WPID=""; BPID=""
}
trap 'stop_warren; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
"$WORK/warren" server --amqp-port "$PORT" --http-port "$HPORT" --data-dir "$WORK/data" ${WARREN_ARGS:-} >>"$OUT/warren.log" 2>&1 9>&- &
WPID=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
kill -0 "$WPID" 2>/dev/null || die "Warren did not start: $(tail -n 3 "$OUT/warren.log")"
BPID=""
B_URI=""
BHPORT=""
if [[ " $BROKERS " == *" warren-base "* ]]; then
  [ -x "${WARREN_BASE_BIN:-}" ] || die "BROKERS names warren-base: set WARREN_BASE_BIN to the other build"
  cp "$WARREN_BASE_BIN" "$WORK/warren-base"
  BPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  BHPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  B_URI="amqp://guest:guest@127.0.0.1:$BPORT/%2f"
  "$WORK/warren-base" server --amqp-port "$BPORT" --http-port "$BHPORT" --data-dir "$WORK/data-base" ${WARREN_BASE_ARGS:-} >>"$OUT/warren-base.log" 2>&1 9>&- &
  BPID=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$BPORT") 2>/dev/null && break; sleep 0.1; done
  kill -0 "$BPID" 2>/dev/null || die "the base Warren did not start: $(tail -n 3 "$OUT/warren-base.log")"
fi
LPID=""
LAVIN_URI=amqp://guest:guest@127.0.0.1:${LAVINMQ_PORT:-5674}/%2f
if [[ " $BROKERS " == *" lavinmq "* ]]; then
  [ "$("$BENCH/lavinmq.sh" status)" = up ] || "$BENCH/lavinmq.sh" start >/dev/null 9>&- || die "LavinMQ did not start"
  LPID=$("$BENCH/lavinmq.sh" pid)
fi
# Every queue is deleted before a run (through the broker's HTTP API, guest/guest): one generator's
# durable queue must not meet the next one's declare of the same name with other flags.
delete_queues() {  # HTTP_PORT
  local api=http://127.0.0.1:$1/api/queues q
  for q in $(curl -s -u guest:guest "$api" | python3 -c 'import json,sys,urllib.parse
for q in json.load(sys.stdin): print(urllib.parse.quote(q["vhost"], safe="") + "/" + urllib.parse.quote(q["name"], safe=""))' 2>/dev/null); do
    curl -s -o /dev/null -u guest:guest -X DELETE "$api/$q" || true
  done
}
RPID=""
if [[ " $BROKERS " == *" rabbitmq "* ]]; then
  [ "$("$BENCH/rabbitmq.sh" status)" = up ] || "$BENCH/rabbitmq.sh" start >/dev/null 9>&- || die "RabbitMQ did not start"
  RPID=$("$BENCH/rabbitmq.sh" pid)
fi

cpu_ticks() { awk '{print $14+$15}' /proc/"$1"/stat 2>/dev/null || echo 0; }

run_one() {  # BROKER TOOL SCENARIO ROUND
  local broker=$1 tool=$2 s=$3 r=$4 uri pid hp out c0 c1
  case "$broker" in
    warren) uri=$W_URI; pid=$WPID; hp=$HPORT ;;
    warren-base) uri=$B_URI; pid=$BPID; hp=$BHPORT ;;
    lavinmq) uri=$LAVIN_URI; pid=$LPID; hp=${LAVINMQ_HTTP_PORT:-15674} ;;
    *) uri=$RMQ_URI; pid=$RPID; hp=15673 ;;
  esac
  # S6b drains what S6a just filled.
  [ "$s" = S6b ] || delete_queues "$hp"
  out=$OUT/$s-$broker-$tool-$r.txt
  if [ "$tool" = lavinmqperf ]; then
    lavin_args "$s" >/dev/null || { echo "== $s: no lavinmqperf form, skipped"; return 0; }
    # shellcheck disable=SC2046
    set -- $(lavin_args "$s")
  else
    # shellcheck disable=SC2046
    set -- $(scenario_args "$s")
  fi
  echo "== $s $broker $tool (round $r)"
  c0=$(cpu_ticks "$pid")
  if [ "$tool" = lavinmqperf ]; then
    # lavinmqperf waits forever for a broker that is gone: bounded here. URI without the vhost.
    timeout --kill-after=10 $(( $(scenario_secs "$s") + 60 )) /usr/bin/time -o "$out.time" \
      -f '# generator: user_s=%U sys_s=%S wall_s=%e max_rss_kb=%M' \
      "$BENCH/lavinmq.sh" perf throughput "$@" -j --uri="${uri%/%2f}" >"$out" 2>&1 9>&- || true
  elif [ "$tool" = warren-perf ]; then
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
  echo "# broker: pid=$pid cpu_s=$(( (c1 - c0) / 100 )) cpu_ticks=$(( c1 - c0 )) secs=$(scenario_secs "$s")" >>"$out"
  python3 "$HERE/perf_summary.py" --line "$out"
  python3 "$HERE/perf_summary.py" --tsv-row "$out" "$s" "$broker" "$tool" "$r" >>"$OUT/runs.tsv"
}

{
  echo "- command: \`DUR=$DUR ROUNDS=$ROUNDS bench/perf.sh ${SCENARIOS[*]}\`"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM; generators and brokers share the cores"
  [ -z "${BPID:-}" ] || echo "- Warren base (warren-base): sha256 $(sha256sum "$WARREN_BASE_BIN" | cut -c1-12) ($WARREN_BASE_BIN)"
  echo "- Warren: sha256 $(sha256sum "$BIN" | cut -c1-12) (tree $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')); RabbitMQ $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?'); PerfTest $(basename "$PT_LIB" | sed 's/lib-//'), java $(java -version 2>&1 | head -1 | grep -o '"[^"]*"' | tr -d '"')"
} >"$OUT/header.md"
cat "$OUT/header.md"
printf 'scenario\tbroker\ttool\tround\tsend_rate\trecv_rate\tp50_us\tp99_us\tbroker_cpu_s\trecv_msgs\tsecs\n' >"$OUT/runs.tsv"
printf 'scenario\ttool\tcommand\n' >"$OUT/commands.tsv"
for s in "${SCENARIOS[@]}"; do
  for tool in $TOOLS; do
    case "$tool" in
      lavinmqperf) a=$(lavin_args "$s") || continue; c="lavinmqperf throughput $a -j --uri=\$URI" ;;
      warren-perf) c="warren perf -h \$URI $(scenario_args "$s")" ;;
      *) c="PerfTest -h \$URI $(scenario_args "$s")" ;;
    esac
    printf '%s\t%s\t%s\n' "$s" "$tool" "$c" >>"$OUT/commands.tsv"
  done
done
# shellcheck disable=SC2206
BROKER_LIST=($BROKERS)

for ((i = 0; i < ${#SCENARIOS[@]}; i++)); do
  s=${SCENARIOS[$i]}
  if [ "$s" = S6b ] && [ "$i" -gt 0 ] && [ "${SCENARIOS[$((i - 1))]}" = S6a ]; then continue; fi
  for r in $(seq 1 "$ROUNDS"); do
    for ((k = 0; k < ${#BROKER_LIST[@]}; k++)); do
      broker=${BROKER_LIST[$(( (k + r - 1) % ${#BROKER_LIST[@]} ))]}
      for tool in $TOOLS; do
        run_one "$broker" "$tool" "$s" "$r"
        # S6 is a fill then a drain of the same queues, so each (broker, tool) runs both in turn.
        if [ "$s" = S6a ] && [ "${SCENARIOS[$((i + 1))]:-}" = S6b ]; then run_one "$broker" "$tool" S6b "$r"; fi
      done
    done
  done
done
if [ "$SWEEP" = 1 ]; then
  # Rate attempted vs achieved vs latency (S4 at each rate), every tool against every broker.
  for r in $(seq 1 "${SWEEP_ROUNDS:-1}"); do
    for rate in ${SWEEP_RATES//,/ }; do
      for ((k = 0; k < ${#BROKER_LIST[@]}; k++)); do
        broker=${BROKER_LIST[$(( (k + r - 1) % ${#BROKER_LIST[@]} ))]}
        for tool in $TOOLS; do run_one "$broker" "$tool" "S4-$rate" "$r"; done
      done
    done
  done
  python3 "$HERE/perf_summary.py" --sweep-tsv "$OUT" >"$OUT/sweep.tsv"
fi
stop_warren
python3 "$HERE/perf_summary.py" "$OUT" "${SCENARIOS[@]}" >"$OUT/tables.md"
{ cat "$OUT/header.md"; echo; cat "$OUT/tables.md"; } >"$OUT/summary.md"
echo; cat "$OUT/summary.md"; echo "raw results: $OUT"
