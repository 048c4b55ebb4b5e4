#!/usr/bin/env bash
# Core scaling (issue 19, item 3): 10 queues, 10 producers, 10 consumers, 16 B transient messages,
# autoack, with the broker pinned by taskset to 1, 2, 4... cores and the load generator pinned to
# the cores the broker does not have (when the machine has cores to spare; on a small machine
# they share). Brokers and generators alternate in every round; one line per run, then medians.
#
#   bench/cores.sh
#   env: CORES ("1 2" on <= 4 cores, else "1 2 4 8"), ROUNDS (3), DUR (10 s per run),
#        BROKERS ("warren lavinmq"), GENS ("warren lavinmq"), WARREN_BIN (target/release/warren),
#        LAVINMQ_DIR (../shared/bench/lavinmq: lavinmq and lavinmqperf), OUT (bench/results/cores-<UTC>)
#
# Loopback only; every broker started here is stopped on exit. Broker CPU is user+system time
# from /proc over the run, so "CPU-s per million" compares what each broker spends per message.
# runs.tsv holds the same rows for bench/report.py.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
NCPU=$(nproc)
if [ "$NCPU" -le 4 ]; then CORES=${CORES:-"1 2"}; else CORES=${CORES:-"1 2 4 8"}; fi
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-10}
BROKERS=${BROKERS:-"warren lavinmq"}
GENS=${GENS:-"warren lavinmq"}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
LAVIN=${LAVINMQ_DIR:-$ROOT/../shared/bench/lavinmq}
OUT=${OUT:-$HERE/results/cores-$(date -u +%Y%m%dT%H%M%SZ)}
PORT=5695
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "cores.sh: $BIN not found (cargo build --release -p warren)" >&2; exit 1; }

BPID=""
stop_broker() {
  [ -n "$BPID" ] || return 0
  kill -TERM "$BPID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$BPID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$BPID" 2>/dev/null || true
  BPID=""
}
trap stop_broker EXIT
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_broker() {  # broker cpuset
  local data="$OUT/data-$1"
  rm -rf "$data"; mkdir -p "$data"
  case "$1" in
    warren) taskset -c "$2" "$BIN" server --amqp-port $PORT --http-port $((PORT + 1)) \
              --data-dir "$data" 2>"$OUT/warren.log" & ;;
    lavinmq) taskset -c "$2" "$LAVIN/lavinmq" -b 127.0.0.1 -p $PORT --http-port $((PORT + 1)) \
              -D "$data" --mqtt-port $((PORT + 2)) --metrics-http-port $((PORT + 3)) \
              >"$OUT/lavinmq.log" 2>&1 & ;;
  esac
  BPID=$!
  for _ in $(seq 100); do port_open $PORT && return 0; sleep 0.1; done
  echo "cores.sh: $1 did not start (see $OUT/$1.log)" >&2; exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Prints the receive rate in msg/s.
generate() {  # gen cpuset
  local uri="amqp://guest:guest@127.0.0.1:$PORT/%2f"
  case "$1" in
    warren) taskset -c "$2" "$BIN" perf -h "$uri" -x 10 -y 10 --queue-pattern 'perf-test-%d' \
              --queue-pattern-from 1 --queue-pattern-to 10 -a -s 16 -z "$DUR" --json "$OUT/run.json" \
              >"$OUT/gen.log" 2>&1
            python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["runs"][0]["summary"]["receive_rate"]))' "$OUT/run.json" ;;
    lavinmq) taskset -c "$2" "$LAVIN/lavinmqperf" throughput --uri="$uri" -x 10 -y 10 -s 16 \
              --queue-pattern='perf-test-%' --queue-pattern-from=1 --queue-pattern-to=10 -z "$DUR" -j \
              >"$OUT/gen.log" 2>&1
            python3 -c '
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        print(round(json.loads(line)["avg_consume_rate"]))
        break
else:
    sys.exit("no JSON summary from lavinmqperf")' "$OUT/gen.log" ;;
  esac
}

last=$((NCPU - 1))
echo "| round | broker | generator | broker cores | generator cores | recv msg/s | broker CPU-s per M msgs |" | tee "$OUT/runs.md"
echo "|---|---|---|---:|---|---:|---:|" | tee -a "$OUT/runs.md"
printf 'round\tbroker\tgenerator\tbroker_cores\tgenerator_cores\trecv_rate\tcpu_s_per_M\n' >"$OUT/runs.tsv"
for r in $(seq "$ROUNDS"); do
  for c in $CORES; do
    bset="0-$((c - 1))"
    if [ $((NCPU - c)) -ge 2 ]; then gset="$c-$last"; else gset="0-$last"; fi
    for g in $GENS; do
      for b in $BROKERS; do
        start_broker "$b" "$bset"
        t0=$(cpu_ticks "$BPID")
        rate=$(generate "$g" "$gset" || echo 0)
        t1=$(cpu_ticks "$BPID")
        stop_broker
        cpu=$(python3 -c "import os,sys; t=(int(sys.argv[2])-int(sys.argv[1]))/os.sysconf('SC_CLK_TCK'); n=int(sys.argv[3])*int(sys.argv[4]); print(f'{t/(n/1e6):.2f}' if n else '-')" "$t0" "$t1" "$rate" "$DUR")
        echo "| $r | $b | $g | $c | $gset | $rate | $cpu |" | tee -a "$OUT/runs.md"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$b" "$g" "$c" "$gset" "$rate" "${cpu/-/}" >>"$OUT/runs.tsv"
      done
    done
  done
done

python3 - "$OUT/runs.md" <<'EOF' | tee "$OUT/summary.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]).read().splitlines()[2:]:
    f = [x.strip() for x in line.strip("|").split("|")]
    rows[(f[1], f[2], int(f[3]))].append(int(f[5]))
print("| broker | generator | " + " | ".join(f"{c} cores" for c in sorted({k[2] for k in rows})) + " | scaling, most/fewest cores |")
print("|---|---|" + "---:|" * (len({k[2] for k in rows}) + 1))
for b, g in sorted({(k[0], k[1]) for k in rows}):
    cs = sorted(k[2] for k in rows if k[:2] == (b, g))
    med = {c: statistics.median(rows[(b, g, c)]) for c in cs}
    ratio = med[cs[-1]] / med[cs[0]] if med[cs[0]] else float("nan")
    print(f"| {b} | {g} | " + " | ".join(f"{med[c]:,.0f}" for c in cs) + f" | {ratio:.2f}x |")
EOF
