#!/usr/bin/env bash
# Idle connections at scale: starts a fresh broker with a raised open-files limit and runs
# bench/idle_connections.py at each N given (default 10000 100000), over several loopback source
# addresses (one has about 28k ephemeral ports). Needs a hard open-files limit above the largest
# N (this 2-vCPU machine's is 20,000: 100,000 needs another machine). Loopback only.
#   bench/idle_scale.sh [BIN] [N...]      (BIN default target/release/warren)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/target/release/warren}"; shift || true
NS=("$@"); [ ${#NS[@]} -gt 0 ] || NS=(10000 100000)
PORT="${PORT:-5690}"; HTTP="${HTTP:-15690}"
ulimit -n "$(ulimit -Hn)"
echo "open-files limit $(ulimit -n); $(nproc) cores; $(uname -r)"
for n in "${NS[@]}"; do
  data="$(mktemp -d)"
  "$BIN" server --data-dir "$data" --amqp-port "$PORT" --http-port "$HTTP" >"$data.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  sources=$(( n / 20000 + 1 ))
  python3 "$ROOT/bench/idle_connections.py" --url "amqp://guest:guest@127.0.0.1:$PORT/" \
    --pid "$pid" --n "$n" --hold 10 --sources "$sources" || echo "idle_connections.py failed at $n"
  kill "$pid"; wait "$pid" || true
  rm -rf "$data" "$data.log"
done
