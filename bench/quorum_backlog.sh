#!/usr/bin/env bash
# Issue 16, item 3: the memory of a replicated queue's backlog. A 3-node cluster on loopback
# (scripts/cluster.sh), one quorum queue, N persistent messages of SIZE bytes published with
# confirms by `warren perf` (no consumer), each node's RSS sampled every 5 s throughout; then the
# queue's count, each node's RSS and group directory size. DRAIN=1 consumes the backlog afterwards
# (RSS still sampled; its consumers multi-ack every 100, so up to 100 each are left unacked and
# requeued when they close). Results: $OUT/rss.csv and $OUT/summary.txt (default
# bench/results/quorum-backlog-<time>).
#   N=10000000 SIZE=1000 bench/quorum_backlog.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${WARREN_BIN:-$ROOT/target/release/warren}"
N="${N:-10000000}"
SIZE="${SIZE:-1000}"
PRODUCERS="${PRODUCERS:-4}"
BASE="${BASE:-7780}"
# The nodes' data (N x SIZE on each node, 30 GB for the default) goes with the run unless DIR is set.
if [ -z "${DIR:-}" ]; then DIR="$(mktemp -d /tmp/warren-qq-backlog.XXXXXX)"; TMPDATA=1; fi
OUT="${OUT:-$ROOT/bench/results/quorum-backlog-$(date -u +%Y%m%d-%H%M)}"
QUEUE=qq-backlog
export WARREN_BIN="$BIN" BASE
mkdir -p "$OUT"
"$ROOT/scripts/cluster.sh" start "$DIR" >/dev/null
SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  "$ROOT/scripts/cluster.sh" stop "$DIR" >/dev/null
  sleep 1
  [ "${TMPDATA:-0}" = 1 ] && rm -rf "$DIR"
}
trap cleanup EXIT
uris="amqp://guest:guest@127.0.0.1:$((BASE + 1)),amqp://guest:guest@127.0.0.1:$((BASE + 2)),amqp://guest:guest@127.0.0.1:$((BASE + 3))"
api() { curl -sf -u guest:guest "http://127.0.0.1:$((BASE + 10001))$1"; }
# The cluster is formed once node 1 lists three running nodes.
for _ in $(seq 1 300); do
  [ "$(api /api/nodes 2>/dev/null | python3 -c 'import json,sys; print(sum(n.get("running", False) for n in json.load(sys.stdin)))' 2>/dev/null || echo 0)" = 3 ] && break
  sleep 0.2
done
rss() { awk '/^VmRSS/ {print $2}' "/proc/$(cat "$DIR/n$1.pid")/status"; }
echo "t_s,n1_rss_kb,n2_rss_kb,n3_rss_kb,messages" >"$OUT/rss.csv"
start=$(date +%s)
(
  while true; do
    m=$(api "/api/queues/%2F/$QUEUE" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("messages", 0))' 2>/dev/null || echo "")
    echo "$(( $(date +%s) - start )),$(rss 1),$(rss 2),$(rss 3),$m" >>"$OUT/rss.csv"
    sleep 5
  done
) &
SAMPLER=$!
per=$(( N / PRODUCERS ))
t0=$(date +%s)
"$BIN" perf -h "$uris" --quorum-queue -u "$QUEUE" -x "$PRODUCERS" -y 0 -s "$SIZE" -f persistent \
  -c 1000 -C "$per" -i 10 >"$OUT/publish.log" 2>&1
t1=$(date +%s)
sleep 15  # freed memory goes back to the system (jemalloc's decay)
count=$(api "/api/queues/%2F/$QUEUE" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("messages"))')
{
  echo "published $((per * PRODUCERS)) x $SIZE B in $((t1 - t0)) s ($(( per * PRODUCERS / (t1 - t0 + 1) )) msg/s); queue count $count"
  for i in 1 2 3; do
    echo "n$i: RSS now $(( $(rss "$i") / 1024 )) MiB, max $(awk -F, -v c=$((i + 1)) 'NR>1 && $c>m {m=$c} END {print int(m/1024)}' "$OUT/rss.csv") MiB; group dir $(du -sm "$DIR/n$i/quorum" | cut -f1) MiB"
  done
} | tee "$OUT/summary.txt"
# KILL=1: the leader is killed (-9) with the backlog held: how long until a survivor leads the
# queue and counts every message, and, once the killed node is started again, how long until it
# has opened its replica (its whole log read back) and knows the leader.
if [ "${KILL:-0}" = 1 ]; then
  apiq() { curl -sf -u guest:guest "http://127.0.0.1:$((BASE + 10000 + $1))/api/queues/%2F/$QUEUE"; }
  field() { python3 -c "import json,sys; print(json.load(sys.stdin).get('$1'))" 2>/dev/null; }
  leader=$(apiq 1 | field leader)
  k=${leader#warren}; k=${k%%@*}
  s=$(( k % 3 + 1 ))
  kill -9 "$(cat "$DIR/n$k.pid")"
  t0=$(date +%s.%N)
  until [ "$(apiq "$s" | field leader)" != "$leader" ] && [ "$(apiq "$s" | field leader)" != None ] \
        && [ "$(apiq "$s" | field messages)" = "$count" ]; do sleep 0.1; done
  t1=$(date +%s.%N)
  newleader=$(apiq "$s" | field leader)
  n=${newleader#warren}; n=${n%%@*}
  WARREN_COOKIE="${WARREN_COOKIE:-warren-cluster-cookie}" nohup "$BIN" server --node-name "warren$k@localhost" \
    --data-dir "$DIR/n$k" --amqp-port $((BASE + k)) --http-port $((BASE + 10000 + k)) \
    --cluster-listen "127.0.0.1:$((BASE + 20000 + k))" \
    --cluster-peers "127.0.0.1:$((BASE + 20001)),127.0.0.1:$((BASE + 20002)),127.0.0.1:$((BASE + 20003))" \
    >>"$DIR/n$k.log" 2>&1 &
  echo $! >"$DIR/n$k.pid"
  t2=$(date +%s.%N)
  until [ "$(apiq "$k" 2>/dev/null | field leader)" = "$newleader" ]; do sleep 0.2; done
  t3=$(date +%s.%N)
  sleep 10
  {
    echo "leader $leader killed: $newleader leads and counts $count after $(echo "$t1 - $t0" | bc) s (its RSS then $(( $(rss "$n") / 1024 )) MiB)"
    echo "warren$k restarted: its replica open (log read back) and following the leader after $(echo "$t3 - $t2" | bc) s; its RSS 10 s later $(( $(rss "$k") / 1024 )) MiB"
  } | tee -a "$OUT/summary.txt"
fi
if [ "${DRAIN:-0}" = 1 ]; then
  t0=$(date +%s)
  "$BIN" perf -h "$uris" -u "$QUEUE" -p -x 0 -y "$PRODUCERS" -q 1000 -A 100 --exit-when empty -i 10 >"$OUT/drain.log" 2>&1
  t1=$(date +%s)
  count=$(api "/api/queues/%2F/$QUEUE" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("messages"))')
  {
    echo "drained in $((t1 - t0)) s; queue count $count"
    for i in 1 2 3; do
      echo "n$i: max RSS over the whole run $(awk -F, -v c=$((i + 1)) 'NR>1 && $c>m {m=$c} END {print int(m/1024)}' "$OUT/rss.csv") MiB; group dir now $(du -sm "$DIR/n$i/quorum" | cut -f1) MiB"
    done
  } | tee -a "$OUT/summary.txt"
fi
