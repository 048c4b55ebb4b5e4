#!/usr/bin/env bash
# The x-delayed-message exchange under load (bench/delayedbench, a Go load generator):
#   1. lateness: publish at R msg/s for T s with x-delay D ms, one consumer; lateness = arrival -
#      due (due = publish time + D, taken by the publisher). Warren and LavinMQ 2.8.2 (its built-in
#      x-delayed-message exchange) alternate, rate by rate, ROUNDS rounds; the median per rate is
#      printed. RabbitMQ 3.10 (/work/shared/bench/rabbitmq.sh) has no delayed-message plugin.
#   2. pending: a fresh Warren takes PENDING_N transient 16-byte messages with x-delay 1 h (none
#      come due) as fast as confirms in windows of 1000 allow (stopped after PENDING_MAX_TIME);
#      then the broker's VmRSS/VmHWM, the exchange's messages_delayed and the data dir's size.
#
#      Also, per rate and round, Warren with x-delay 0 (routed at once: the same path without the
#      delay store, so the machine's and generator's own latency at that rate) unless CONTROL=0.
#   3. mix: a fresh Warren takes MIX_N delayed messages (x-delay 1 h), each after MIX-1 messages
#      with no x-delay and an unbound routing key (dropped at once), then RSS as in 2.
#
#   bench/delayed.sh [lateness] [pending] [mix]     (all by default)
#   env: RATES ("1000 5000 10000 20000 50000"), DURATION (10s), DELAY (1000), ROUNDS (3),
#        LAVINMQ (1: compare with LavinMQ), CONTROL (1), PENDING_N (10000000),
#        PENDING_MAX_TIME (4m), MIX (500), MIX_N (10000),
#        WARREN_BIN, SHARED (../shared), OUT (a fresh dir under /tmp: raw outputs, kept)
# Warren: 127.0.0.1:5701 (HTTP 15701), its own data dir, removed after. LavinMQ: lavinmq.sh's
# 127.0.0.1:5674 with a fresh data dir, stopped after if this script started it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
BIN=${WARREN_BIN:-$ROOT/target/release/warren}
RATES=${RATES:-1000 5000 10000 20000 50000}
DURATION=${DURATION:-10s}
DELAY=${DELAY:-1000}
ROUNDS=${ROUNDS:-3}
LAVINMQ=${LAVINMQ:-1}
PENDING_N=${PENDING_N:-10000000}
PENDING_MAX_TIME=${PENDING_MAX_TIME:-4m}
OUT=${OUT:-$(mktemp -d /tmp/delayed-bench-XXXXXX)}
MODES=${*:-lateness pending mix}
CONTROL=${CONTROL:-1}
MIX=${MIX:-500}
MIX_N=${MIX_N:-10000}
W_URI=amqp://guest:guest@127.0.0.1:5701/%2f
L_URI=amqp://guest:guest@127.0.0.1:${LAVINMQ_PORT:-5674}/%2f
mkdir -p "$OUT"
[ -x "$BIN" ] || (cd "$ROOT" && nice cargo build --release -p warren)
GEN=$OUT/delayedbench
(cd "$HERE/delayedbench" && GOFLAGS=-mod=mod go build -o "$GEN" .)

WPID=""; WDATA=""; LSTARTED=0; LDATA=""
stop_warren() {
  [ -n "$WPID" ] || return 0
  kill -TERM "$WPID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$WPID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$WPID" 2>/dev/null || true
  wait "$WPID" 2>/dev/null || true
  WPID=""; rm -rf "$WDATA"
}
start_warren() {
  WDATA=$(mktemp -d /tmp/warren-delayed-XXXXXX)
  "$BIN" server --amqp-port 5701 --http-port 15701 --data-dir "$WDATA" >"$OUT/warren-$1.log" 2>&1 &
  WPID=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/5701) 2>/dev/null && return 0; sleep 0.1; done
  echo "warren did not start; see $OUT/warren-$1.log"; exit 1
}
cleanup() {
  stop_warren
  if [ "$LSTARTED" = 1 ]; then "$SHARED/bench/lavinmq.sh" stop || true; rm -rf "$LDATA"; fi
}
trap cleanup EXIT
cpu_s() { awk '{printf "%.2f", ($14+$15)/100}' "/proc/$1/stat"; }   # utime+stime, USER_HZ 100

if [[ " $MODES " == *" lateness "* ]]; then
  start_warren lateness
  if [ "$LAVINMQ" = 1 ]; then
    if [ "$("$SHARED/bench/lavinmq.sh" status)" = up ]; then
      echo "LavinMQ already running: using it as it is"
    else
      LDATA=$(mktemp -d /tmp/lavinmq-delayed-XXXXXX)
      LAVINMQ_DATA=$LDATA "$SHARED/bench/lavinmq.sh" start; LSTARTED=1
    fi
    LPID=$("$SHARED/bench/lavinmq.sh" pid)
  fi
  RES=$OUT/lateness.txt; : >"$RES"
  for round in $(seq "$ROUNDS"); do
    for r in $RATES; do
      for b in warren lavinmq warren-x-delay-0; do
        [ "$b" = lavinmq ] && [ "$LAVINMQ" != 1 ] && continue
        [ "$b" = warren-x-delay-0 ] && [ "$CONTROL" != 1 ] && continue
        if [ "$b" = lavinmq ]; then uri=$L_URI; pid=$LPID; else uri=$W_URI; pid=$WPID; fi
        d=$DELAY; [ "$b" = warren-x-delay-0 ] && d=0
        c0=$(cpu_s "$pid")
        line=$("$GEN" -mode lateness -uri "$uri" -rate "$r" -duration "$DURATION" -delay "$d" \
          | tee -a "$OUT/lateness-$b.log" | grep '^RESULT' || true)
        c1=$(cpu_s "$pid")
        rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
        echo "round=$round broker=$b $line broker_cpu_s=$(echo "$c1 - $c0" | bc) rss_kb=$rss" | tee -a "$RES"
      done
    done
  done
  echo; echo "lateness, median of $ROUNDS rounds (x-delay $DELAY ms, $DURATION per rate):"
  python3 - "$RES" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    if "p50_ms" in kv:
        rows[(kv["broker"], int(kv["rate"]))].append(kv)
keys = ["recv_rate", "min_ms", "p50_ms", "p99_ms", "p999_ms", "max_ms", "early_pct", "broker_cpu_s"]
print("| broker | rate msg/s | runs | received/sent | recv msg/s | lateness min ms | p50 ms | p99 ms | p99.9 ms | max ms | over 2 ms early | broker CPU s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (b, r) in sorted(rows, key=lambda k: (k[1], k[0])):
    rs = rows[(b, r)]
    med = {k: statistics.median(float(x[k]) for x in rs) for k in keys}
    got = sum(int(x["received"]) for x in rs); sent = sum(int(x["sent"]) for x in rs)
    print(f"| {b} | {r:,} | {len(rs)} | {got:,}/{sent:,} | {med['recv_rate']:,.0f} | {med['min_ms']:.1f} | {med['p50_ms']:.2f} | "
          f"{med['p99_ms']:.2f} | {med['p999_ms']:.2f} | {med['max_ms']:.1f} | {med['early_pct']:.1f}% | {med['broker_cpu_s']:.1f} |")
PY
  stop_warren
  if [ "$LSTARTED" = 1 ]; then "$SHARED/bench/lavinmq.sh" stop || true; rm -rf "$LDATA"; LSTARTED=0; fi
fi

if [[ " $MODES " == *" pending "* ]]; then
  start_warren pending
  sleep 1
  echo "pending: baseline $(grep -E 'VmRSS' /proc/$WPID/status | tr -s ' \t' ' ')"
  # RSS every 5 s while publishing.
  ( while kill -0 "$WPID" 2>/dev/null; do
      echo "$(date +%s) $(awk '/VmRSS/{print $2}' /proc/$WPID/status) $(du -sk "$WDATA" 2>/dev/null | cut -f1)"; sleep 5
    done ) >"$OUT/pending-rss.txt" &
  SAMPLER=$!
  t0=$(date +%s.%N)
  "$GEN" -mode pending -uri "$W_URI" -n "$PENDING_N" -max-time "$PENDING_MAX_TIME" -keep | tee "$OUT/pending.log"
  sleep 2
  kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true
  delayed=$(curl -s -u guest:guest http://127.0.0.1:15701/api/exchanges/%2f/delayed-bench \
    | python3 -c 'import sys, json; print(json.load(sys.stdin).get("messages_delayed"))')
  echo "pending: messages_delayed $delayed; $(grep -E 'VmRSS|VmHWM' /proc/$WPID/status | tr -s ' \t\n' ' ');" \
    "data dir $(du -sk "$WDATA" | cut -f1) kB ($(find "$WDATA" -name '*.bkt' | wc -l) spill files);" \
    "broker CPU $(cpu_s "$WPID") s" | tee -a "$OUT/pending.log"
  echo "RSS samples (unix_s rss_kb data_kb): $OUT/pending-rss.txt"
  stop_warren
fi
if [[ " $MODES " == *" mix "* ]]; then
  start_warren mix
  sleep 1
  echo "mix: baseline $(grep -E 'VmRSS' /proc/$WPID/status | tr -s ' \t' ' ')"
  "$GEN" -mode pending -uri "$W_URI" -n "$MIX_N" -mix "$MIX" -max-time "$PENDING_MAX_TIME" -keep | tee "$OUT/mix.log"
  sleep 2
  delayed=$(curl -s -u guest:guest http://127.0.0.1:15701/api/exchanges/%2f/delayed-bench \
    | python3 -c 'import sys, json; print(json.load(sys.stdin).get("messages_delayed"))')
  echo "mix: messages_delayed $delayed; $(grep -E 'VmRSS|VmHWM' /proc/$WPID/status | tr -s ' \t\n' ' ');" \
    "data dir $(du -sk "$WDATA" | cut -f1) kB" | tee -a "$OUT/mix.log"
  stop_warren
fi
echo "raw outputs: $OUT"
