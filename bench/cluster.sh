#!/usr/bin/env bash
# The cluster scenarios of issue 15 (the studies': 10 queues, 10 producers, 10 consumers), run
# with `warren perf` against a 3-node Warren cluster on loopback (scripts/cluster.sh):
#   leader     queues on node 1, every client on node 1
#   remote     queues on node 1, clients on nodes 2 and 3 (none on the queues' node)
#   spread     queues spread over the 3 nodes, each queue's clients on its home node
#   anywhere   queues spread over the 3 nodes, clients on every node (2 in 3 remote)
# Each scenario runs ROUNDS times (default 3) for SECONDS (default 10), interleaved; the median
# receive rate (msg/s) of each is printed with its ratio to `leader`.
#   bench/cluster.sh [extra generator flags, e.g. -s 1024]
# SCENARIOS picks which run (default "leader remote spread anywhere").
# EXTERNAL=1 starts no cluster and runs against nodes already up at AMQP ports BASE+1..BASE+3,
# e.g. RabbitMQ's: bench/rabbitmq-cluster.sh start; EXTERNAL=1 BASE=5690 bench/cluster.sh
# NODE_PIDS="P1 P2 P3" names an external cluster's node processes (RabbitMQ's:
# "$(cat /tmp/rabbitmq-cluster/c{1,2,3}/beam.pid)"); Warren's are known. With them the table
# also gives the nodes' CPU time per million messages received (user + system, all 3 nodes).
# Queues are purged before each run (with pika from .venv-interop, when there), so a backlog one
# run left (RabbitMQ builds one under unthrottled producers) does not slow the next.
# NODE_CPU=P puts each node in its own cpu cgroup limited to P% of one core, as if each had a
# machine of its own (the studies' clusters); without it the 3 nodes and the generator share
# this machine's cores, and a scenario's rate measures its CPU per message. Needs root and the
# cgroup v1 cpu controller at /sys/fs/cgroup/cpu.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
W="${WARREN_BIN:-$ROOT/target/release/warren}"
ROUNDS="${ROUNDS:-3}"
SCENARIOS="${SCENARIOS:-leader remote spread anywhere}"
# From the environment: bash's own SECONDS (time since the shell started) would be 0 here.
SECONDS_RUN="$(printenv SECONDS || echo 10)"
export BASE="${BASE:-6680}"
DIR="$(mktemp -d /tmp/warren-bench-cluster.XXXX)"
if [ "${EXTERNAL:-0}" = 1 ]; then
  trap 'rm -rf "$DIR"' EXIT
else
  trap '"$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
  WARREN_BIN="$W" "$ROOT/scripts/cluster.sh" start "$DIR" >/dev/null
fi
uri() { echo "amqp://guest:guest@127.0.0.1:$((BASE + $1))"; }
EXTRA=("$@")
# Declares queues FROM..TO (prefix P) through node N, so N is their home.
declare_on() { "$W" perf -h "$(uri "$1")" --queue-pattern "$2-%d" --queue-pattern-from "$3" --queue-pattern-to "$4" \
  -x 0 -y 1 --auto-delete false -z 1 >/dev/null 2>&1; }
declare_on 1 one 1 10
declare_on 1 sp 1 4; declare_on 2 sp 5 7; declare_on 3 sp 8 10
rate() { grep -oE "receiving rate avg: [0-9]+" | grep -oE "[0-9]+$" || echo 0; }
if [ "${EXTERNAL:-0}" = 1 ]; then
  read -r -a PIDS <<<"${NODE_PIDS:-}"
else
  PIDS=("$(cat "$DIR/n1.pid")" "$(cat "$DIR/n2.pid")" "$(cat "$DIR/n3.pid")")
fi
CG=/sys/fs/cgroup/cpu
if [ -n "${NODE_CPU:-}" ]; then
  if [ "${#PIDS[@]}" -ne 3 ] || [ ! -w "$CG" ]; then
    echo "NODE_CPU needs the 3 node pids (NODE_PIDS for an external cluster) and a writable $CG" >&2
    exit 2
  fi
  uncage() { # the nodes back to the root group, the groups removed
    local p i
    for p in "${PIDS[@]}"; do echo "$p" >"$CG/cgroup.procs" 2>/dev/null || true; done
    for i in 1 2 3; do rmdir "$CG/warren-bench-n$i" 2>/dev/null || true; done
  }
  if [ "${EXTERNAL:-0}" = 1 ]; then
    trap 'uncage; rm -rf "$DIR"' EXIT
  else
    trap 'uncage; "$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
  fi
  for i in 1 2 3; do
    g="$CG/warren-bench-n$i"
    mkdir -p "$g"
    echo 10000 >"$g/cpu.cfs_period_us"
    echo $((NODE_CPU * 100)) >"$g/cpu.cfs_quota_us"
    # Each of the node's processes (RabbitMQ: beam.smp; its children stay where they are).
    echo "${PIDS[$((i - 1))]}" >"$g/cgroup.procs"
  done
  echo "each node limited to ${NODE_CPU}% of a core" >&2
fi
ticks() { # the nodes' CPU time so far, in clock ticks
  local t=0 p
  for p in "${PIDS[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  echo "$t"
}
HZ="$(getconf CLK_TCK)"
PY="$ROOT/.venv-interop/bin/python"
purge() {
  [ -x "$PY" ] || return 0
  "$PY" - "$(uri 1)" <<'PYEOF' >/dev/null 2>&1 || echo "purge failed" >&2
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
for p, n in (("one", 10), ("sp", 10)):
    for i in range(1, n + 1):
        ch.queue_purge(f"{p}-{i}")
conn.close()
PYEOF
}
run() { # NAME: prints "receive-rate node-cpu-seconds"
  local t0 v
  purge
  t0="$(ticks)"
  v="$(run_perf "$1")"
  echo "$v $(awk -v a="$t0" -v b="$(ticks)" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz}')"
}
# gen HOSTS PATTERN FROM TO N: N producers and N consumers on queues PATTERN FROM..TO, through
# HOSTS; prints the generator's output. GEN=perftest runs RabbitMQ's PerfTest
# (/work/shared/bench/perftest.sh, or PERFTEST_SH) with the same flags instead of `warren perf`.
gen() {
  if [ "${GEN:-warren}" = perftest ]; then
    # perftest.sh prints a summary line; PerfTest's own output is in its RESULTS_DIR.
    local rd
    rd="$(mktemp -d "$DIR/perftest.XXXX")"
    RESULTS_DIR="$rd" "${PERFTEST_SH:-/work/shared/bench/perftest.sh}" "${1%%,*}" -- -H "$1" \
      -qp "$2" -qpf "$3" -qpt "$4" -x "$5" -y "$5" -ad false -z "$SECONDS_RUN" "${EXTRA[@]}" >/dev/null 2>&1
    cat "$rd"/*.txt
  else
    "$W" perf -H "$1" --queue-pattern "$2" --queue-pattern-from "$3" --queue-pattern-to "$4" \
      -x "$5" -y "$5" --auto-delete false -z "$SECONDS_RUN" "${EXTRA[@]}" 2>&1
  fi
}
run_perf() { # NAME: prints the receive rate
  case "$1" in
    leader) gen "$(uri 1)" 'one-%d' 1 10 10 | rate ;;
    remote) gen "$(uri 2),$(uri 3)" 'one-%d' 1 10 10 | rate ;;
    spread)
      gen "$(uri 1)" 'sp-%d' 1 4 4 >"$DIR/s1" &
      gen "$(uri 2)" 'sp-%d' 5 7 3 >"$DIR/s2" &
      gen "$(uri 3)" 'sp-%d' 8 10 3 >"$DIR/s3"
      wait
      echo $(( $(rate <"$DIR/s1") + $(rate <"$DIR/s2") + $(rate <"$DIR/s3") )) ;;
    anywhere) gen "$(uri 1),$(uri 2),$(uri 3)" 'sp-%d' 1 10 10 | rate ;;
  esac
}
declare -A R C
for r in $(seq 1 "$ROUNDS"); do
  for s in $SCENARIOS; do
    read -r v cpu <<<"$(run "$s")"
    R[$s]="${R[$s]:-} $v"
    # CPU-seconds per million received (the run's messages: its rate over SECONDS).
    C[$s]="${C[$s]:-} $(awk -v c="$cpu" -v r="$v" -v t="$SECONDS_RUN" 'BEGIN {printf "%.2f", (r ? c / (r * t / 1e6) : 0)}')"
    echo "round $r $s: $v msg/s, nodes $cpu CPU-s" >&2
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
lead="$(echo "${R[leader]:-}" | median)"
echo "| scenario | median receive rate (msg/s) | vs leader | nodes' CPU-s per M (median) | rounds |"
echo "|---|---|---|---|---|"
for s in $SCENARIOS; do
  m="$(echo "${R[$s]}" | median)"
  cpu="-"
  [ "${#PIDS[@]}" -eq 3 ] && cpu="$(echo "${C[$s]}" | median)"
  echo "| $s | ${m%.*} | $(awk -v a="$m" -v b="$lead" 'BEGIN {printf "%.2f", (b ? a/b : 0)}') | $cpu | ${R[$s]# } |"
done
