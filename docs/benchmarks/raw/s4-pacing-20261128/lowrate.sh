#!/bin/bash
# S4 at 1,000 msg/s (1 -> 1, 16 B, autoack), warren perf, Warren (5690) and LavinMQ 2.8.2 (5674)
# alternating, 5 rounds of 15 s; prints the per-second p99s after the first second too.
W=/work/main/target/release/warren
rm -rf /tmp/wlow; mkdir -p /tmp/wlow
$W server --data-dir /tmp/wlow --amqp-port 5690 --http-port 15690 > /tmp/wlow.log 2>&1 &
WP=$!
/work/shared/bench/lavinmq.sh start > /dev/null 2>&1
sleep 2
for round in 1 2 3 4 5; do
  if [ $((round % 2)) = 1 ]; then order="warren lavinmq"; else order="lavinmq warren"; fi
  for b in $order; do
    port=5690; [ $b = lavinmq ] && port=5674
    out=$($W perf -h amqp://guest:guest@127.0.0.1:$port -x 1 -y 1 -u low -a -s 16 -r 1000 -z 15 2>&1)
    lat=$(echo "$out" | grep "consumer latency min" | grep -oE "[0-9/]+ µs")
    p99s=$(echo "$out" | grep -oE "99th consumer latency: [0-9/]+" | awk -F/ '{print $NF}' | tail -n +2 | sort -n | awk '{a[NR]=$1} END {print "per-second p99 median", a[int((NR+1)/2)], "max", a[NR]}')
    echo "round=$round broker=$b lat(min/p50/p75/p95/p99)=$lat $p99s"
  done
done
kill $WP
