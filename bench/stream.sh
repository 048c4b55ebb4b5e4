#!/usr/bin/env bash
# Streams against classic queues with `warren perf`, on one Warren started here (loopback).
#
#   bench/stream.sh             env: STREAM_T (seconds per run, 8), STREAM_SIZE (bytes, 100),
#                               STREAM_ROUNDS (3), STREAM_LONG_S (0: skip; else seconds of the
#                               long-stream RSS run), WARREN_BIN, DATA (a fresh dir, removed after)
#
# Scenarios (1 producer, persistent, confirms with 1000 in flight, prefetch 1000):
#   write  publish only, no consumer, for STREAM_T s            (durable classic queue vs stream)
#   live   publish and consume at once, for STREAM_T s          (classic vs stream, default offset)
#   read   one consumer reads what `write` stored               (classic: drains it; stream:
#                                                                x-stream-offset=first)
# Each is run STREAM_ROUNDS times on a fresh queue; the median rate is printed.
# STREAM_LONG_S > 0: publish 12-byte messages into one stream with no consumer for that long,
# sampling the broker's RSS every 5 s (rss.csv), to show memory does not grow with the stream.
#
# Output: bench/results/stream-<UTC stamp>/ (every perf output, summary.txt).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
T=${STREAM_T:-8}
SIZE=${STREAM_SIZE:-100}
ROUNDS=${STREAM_ROUNDS:-3}
LONG=${STREAM_LONG_S:-0}
BIN=${WARREN_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/warren}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$ROOT/bench/results/stream-$STAMP
DATA=${DATA:-$(mktemp -d /tmp/warren-stream-XXXXXX)}
mkdir -p "$OUT"
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p warren)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(port); HTTP=$(port)
URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
PID=""
cleanup() {
  [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT
"$BIN" server --amqp-port "$PORT" --http-port "$HTTP" --data-dir "$DATA" 2>>"$OUT/warren.log" &
PID=$!
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 0.05; done

perf() { "$BIN" perf -h "$URI" "$@"; }
rate() { awk -v k="$2" '$0 ~ k" rate avg" {print $(NF-1)}' "$1"; }
confirmed() { sed -n 's/.*confirmed \([0-9]*\),.*/\1/p' "$1"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

COMMON=(-s "$SIZE" -f persistent --auto-delete false)
for kind in classic stream; do
  qa=()
  [ "$kind" = stream ] && qa=(-qa x-queue-type=stream)
  for r in $(seq 1 "$ROUNDS"); do
    q="bench-$kind-$r"
    perf -x 1 -y 0 -u "$q" "${qa[@]}" "${COMMON[@]}" -c 1000 -z "$T" >"$OUT/write-$kind-$r.txt" 2>&1
    n=$(confirmed "$OUT/write-$kind-$r.txt")
    ca=()
    [ "$kind" = stream ] && ca=(-ca x-stream-offset=first)
    perf -x 0 -y 1 -u "$q" -p "${qa[@]}" "${COMMON[@]}" -q 1000 -A 100 "${ca[@]}" -D "$n" \
      >"$OUT/read-$kind-$r.txt" 2>&1
    perf -x 1 -y 1 -u "live-$q" "${qa[@]}" "${COMMON[@]}" -c 1000 -q 1000 -A 100 -z "$T" \
      >"$OUT/live-$kind-$r.txt" 2>&1
  done
done

{
  echo "warren perf, $ROUNDS rounds of ${T}s, ${SIZE}-byte persistent messages, confirms 1000, prefetch 1000; median msg/s"
  printf '%-8s %12s %12s %12s %12s\n' kind write read live-send live-recv
  for kind in classic stream; do
    w=$(for r in $(seq 1 "$ROUNDS"); do rate "$OUT/write-$kind-$r.txt" sending; done | median)
    rd=$(for r in $(seq 1 "$ROUNDS"); do rate "$OUT/read-$kind-$r.txt" receiving; done | median)
    ls=$(for r in $(seq 1 "$ROUNDS"); do rate "$OUT/live-$kind-$r.txt" sending; done | median)
    lr=$(for r in $(seq 1 "$ROUNDS"); do rate "$OUT/live-$kind-$r.txt" receiving; done | median)
    printf '%-8s %12s %12s %12s %12s\n' "$kind" "$w" "$rd" "$ls" "$lr"
  done
} | tee "$OUT/summary.txt"

if [ "$LONG" -gt 0 ]; then
  echo "t_s,rss_kb,disk_mb" >"$OUT/rss.csv"
  perf -x 2 -y 0 -u long -qa x-queue-type=stream -s 12 -f persistent --auto-delete false -c 2000 -z "$LONG" \
    >"$OUT/long.txt" 2>&1 &
  LP=$!
  t0=$(date +%s)
  while kill -0 "$LP" 2>/dev/null; do
    echo "$(( $(date +%s) - t0 )),$(awk '/^VmRSS/{print $2}' /proc/"$PID"/status),$(du -sm "$DATA" | cut -f1)" >>"$OUT/rss.csv"
    sleep 5
  done
  wait "$LP" || true
  echo "long stream: $(confirmed "$OUT/long.txt") messages in ${LONG}s; RSS (kB) first/last/max:" \
    "$(awk -F, 'NR==2{f=$2} NR>1{l=$2; if($2>m)m=$2} END{print f"/"l"/"m}' "$OUT/rss.csv")," \
    "disk $(tail -1 "$OUT/rss.csv" | cut -d, -f3) MB" | tee -a "$OUT/summary.txt"
fi
echo "results: $OUT"
