#!/usr/bin/env bash
# A/B of two warren builds under `warren perf`, alternating, ROUNDS rounds (default 3):
#   bench/ab.sh BIN_A BIN_B [perf flags...]     (default flags: -x 1 -y 1 -a -s 16 -z 10)
# Each build is started fresh on 127.0.0.1:27672 for each run; BIN_A's perf is the generator.
set -u
A="$1"; B="$2"; shift 2
FLAGS=("$@"); [ ${#FLAGS[@]} -gt 0 ] || FLAGS=(-x 1 -y 1 -a -s 16 -z 10)
for r in $(seq 1 "${ROUNDS:-3}"); do
  for b in "$A" "$B"; do
    rm -rf /tmp/ab-data; mkdir -p /tmp/ab-data
    $b server --amqp-port 27672 --http-port 27673 --data-dir /tmp/ab-data >/dev/null 2>&1 &
    pid=$!
    sleep 1.5
    out=$("$A" perf -h amqp://guest:guest@127.0.0.1:27672 "${FLAGS[@]}" 2>&1 | grep -iE "receiving rate avg" | tail -1)
    echo "round $r $b: $out"
    kill $pid; wait $pid 2>/dev/null
  done
done
