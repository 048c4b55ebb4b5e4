#!/bin/bash
# S4 (1 -> 1, 16 B, autoack, warren perf with 1 ms trains) at each rate against two builds
# running side by side (base on 5690, flush on 5691), interleaved, the order alternating.
P=/work/bin-new/warren
rm -rf /tmp/wab-a /tmp/wab-b; mkdir -p /tmp/wab-a /tmp/wab-b
/work/bin-new/warren server --data-dir /tmp/wab-a --amqp-port 5690 --http-port 15690 > /tmp/wab-a.log 2>&1 &
A=$!
/work/bin-flush/warren server --data-dir /tmp/wab-b --amqp-port 5691 --http-port 15691 > /tmp/wab-b.log 2>&1 &
B=$!
sleep 2
tck=$(getconf CLK_TCK)
cpu() { awk -v t=$tck '{printf "%.2f", ($14+$15)/t}' /proc/$1/stat; }
for round in 1 2 3; do
for rate in ${RATES:-200000 400000 600000 720000 unlimited}; do
  if [ $((round % 2)) = 1 ]; then order="base flush"; else order="flush base"; fi
  for b in $order; do
    if [ $b = base ]; then port=5690; pid=$A; else port=5691; pid=$B; fi
    r=(-r $rate); [ $rate = unlimited ] && r=()
    b0=$(cpu $pid)
    out=$( /usr/bin/time -f "gen_cpu %U %S" $P perf -h amqp://guest:guest@127.0.0.1:$port -x 1 -y 1 -u s4 -a -s 16 "${r[@]}" -z 10 2>&1 )
    b1=$(cpu $pid)
    lat=$(echo "$out" | grep "consumer latency min" | grep -oE "[0-9/]+ µs")
    recv=$(echo "$out" | grep "receiving rate avg" | grep -oE "[0-9]+ msg/s")
    gen=$(echo "$out" | grep gen_cpu | awk '{print $2+$3}')
    echo "round=$round rate=$rate build=$b recv=$recv lat(min/p50/p75/p95/p99)=$lat gen_cpu_s=$gen broker_cpu_s=$(echo "$b1 - $b0" | bc)"
  done
done
done
kill $A $B
