#!/usr/bin/env bash
# Instructions per message on the publish path, under callgrind, for one or more warren builds:
#   bench/callgrind.sh BIN [BIN...]       (ROUNDS=1 MSGS=30000 RATE=3000 PERF_EXTRA= ACKS=auto)
# Each build serves `warren perf -x 1 -y 1 -a -s 16 -r RATE -C MSGS` (16 B transient messages,
# autoack, driven natively by the first BIN's perf) under `valgrind --tool=callgrind`; prints the
# inclusive instructions per message of the publish path's functions. PERF_EXTRA adds perf flags:
# `PERF_EXTRA="-f persistent"` measures persistent messages to a durable queue, where the queue's
# log (Queue::publish) and the persister's write (write_log) are on the path. ACKS=manual drops
# -a: the consumer acks each message, and the ack's path (ChannelShared::take) is listed. Counts repeat within ~1%;
# whole-process totals move with the number of read batches (timing), so compare the rows.
set -euo pipefail
MSGS="${MSGS:-30000}"; RATE="${RATE:-3000}"; ROUNDS="${ROUNDS:-1}"; PERF_EXTRA="${PERF_EXTRA:-}"
case "${ACKS:-auto}" in auto) ACK_FLAG=(-a) ;; manual) ACK_FLAG=() ;; *) echo "ACKS is auto or manual" >&2; exit 2 ;; esac
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN...]" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is required" >&2; exit 1; }
PERF_BIN="$1"
work="$(mktemp -d /tmp/warren-cg.XXXXXX)"
FUNCS='warren_broker::channel::Channel::publish|warren_broker::channel::Channel::route|warren_broker::vhost::VHost::route|warren_broker::queue::Queue::publish|warren_queue::(.*<impl )?State<.*>>?::publish|warren_queue::(.*<impl )?State<.*>>?::deliver|warren_broker::channel::ChannelShared::offer|warren_broker::queue::(paging::)?(<impl )?(warren_broker::queue::)?Queue>?::write_log|ChannelShared>::take|Channel::settle'
printf '%-28s %s\n' build 'function: instructions per message'
for r in $(seq 1 "$ROUNDS"); do
  for bin in "$@"; do
    port=$((20000 + RANDOM % 20000)); http=$((port + 1))
    out="$work/cg.$(basename "$bin").$r.out"
    rm -rf "$work/data"; mkdir -p "$work/data"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" server --amqp-port "$port" \
      --http-port "$http" --data-dir "$work/data" >"$work/server.log" 2>&1 &
    vg=$!
    for _ in $(seq 1 120); do
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
      sleep 0.5
    done
    "$PERF_BIN" perf -h "amqp://guest:guest@127.0.0.1:$port" -x 1 -y 1 -u cgq "${ACK_FLAG[@]}" -s 16 -r "$RATE" \
      -C "$MSGS" $PERF_EXTRA >"$work/perf.log" 2>&1 || { echo "perf failed:"; tail -5 "$work/perf.log"; }
    kill -TERM "$vg"; wait "$vg" || true
    echo "== $bin (round $r)"
    # Call-site lines ("=> file:function (Nx)") carry the inclusive cost of each call.
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null \
      | grep -E "=> .*($FUNCS) \(" \
      | awk -v n="$MSGS" '{c=$1; gsub(",","",c); f=$0; sub(/.*\.rs:/,"",f); sub(/ \(.*/,"",f);
          # A method in an impl block of a child module is named <mod>::<impl Type>::m: shown
          # as Type::m, so that rows compare across builds that moved code between files.
          if (match(f, /<impl /)) {
            rest = substr(f, RSTART + 6); k = split(rest, parts, "::"); m = parts[k]
            t = substr(rest, 1, length(rest) - length(m) - 2); f = substr(t, 1, length(t) - 1) "::" m
          }
          if (!(f in best) || c+0 > best[f]) best[f]=c+0}
          END {for (f in best) printf "  %8.0f  %s\n", best[f]/n, f}' \
      | sort -rn
  done
done
rm -rf "$work"
