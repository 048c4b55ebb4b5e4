#!/bin/bash
# S4 (1 -> 1, 16 B, autoack) at each rate with 1 ms trains and with --pacing-us P, interleaved.
W=/work/bin-new/warren
rm -rf /tmp/wpace; mkdir -p /tmp/wpace
$W server --data-dir /tmp/wpace --amqp-port 5690 --http-port 15690 > /tmp/wpace.log 2>&1 &
BP=$!
sleep 2
tck=$(getconf CLK_TCK)
cpu() { awk -v t=$tck '{printf "%.2f", ($14+$15)/t}' /proc/$1/stat; }
for round in 1 2 3; do
for rate in ${RATES:-200000 400000 600000 720000}; do
  for p in 1000 ${PACE:-100}; do
    b0=$(cpu $BP)
    out=$( /usr/bin/time -f "gen_cpu %U %S" $W perf -h amqp://guest:guest@127.0.0.1:5690 -x 1 -y 1 -u s4 -a -s 16 -r $rate -z 10 --pacing-us $p 2>&1 )
    b1=$(cpu $BP)
    lat=$(echo "$out" | grep "consumer latency min" | grep -oE "[0-9/]+ µs")
    recv=$(echo "$out" | grep "receiving rate avg" | grep -oE "[0-9]+ msg/s")
    gen=$(echo "$out" | grep gen_cpu | awk '{print $2+$3}')
    echo "round=$round rate=$rate pacing_us=$p recv=$recv lat(min/p50/p75/p95/p99)=$lat gen_cpu_s=$gen broker_cpu_s=$(echo "$b1 - $b0" | bc)"
  done
done
done
kill $BP
