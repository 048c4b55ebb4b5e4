#!/usr/bin/env bash
# Issue 31, item 4: the replicated queue group's deterministic simulation (crates/sim, turmoil),
# a long campaign: SEEDS seeds from FROM, each with 3 and 5 members, in JOBS processes. Prints
# the failing seeds (rerun one: target/release/warren-sim --from S --seeds 1 --members N
# --verbose) and a summary; results go to docs/reliability.md by hand.
#   SEEDS=10000 bench/sim.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEEDS="${SEEDS:-10000}"
FROM="${FROM:-1}"
JOBS="${JOBS:-$(nproc)}"
cargo build --release -q -p warren-sim --manifest-path "$ROOT/Cargo.toml"
# The build's commit (a working tree with changes is marked so).
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates || echo +changes)"
BIN="$ROOT/target/release/warren-sim"
OUT="${OUT:-$(mktemp -d /tmp/warren-sim-campaign.XXXX)}"
mkdir -p "$OUT"
per=$(( (SEEDS + JOBS - 1) / JOBS ))
start=$(date +%s)
pids=()
for ((j = 0; j < JOBS; j++)); do
  f=$(( FROM + j * per ))
  n=$(( SEEDS - j * per < per ? SEEDS - j * per : per ))
  [ "$n" -le 0 ] && break
  "$BIN" --from "$f" --seeds "$n" --members 3,5 >"$OUT/job$j.txt" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$OUT"/job*.txt | grep '^FAIL' || true
runs=$(cat "$OUT"/job*.txt | awk '/ runs \(/ {s += $1} END {print s + 0}')
failed=$(cat "$OUT"/job*.txt | grep -c '^FAIL' || true)
confirmed=$(cat "$OUT"/job*.txt | grep -oE '[0-9]+ confirmed messages' | awk '{s += $1} END {print s + 0}')
crashes=$(cat "$OUT"/job*.txt | grep -oE '[0-9]+ crashes' | awk '{s += $1} END {print s + 0}')
partitions=$(cat "$OUT"/job*.txt | grep -oE '[0-9]+ partitions' | awk '{s += $1} END {print s + 0}')
echo "seeds $FROM..$((FROM + SEEDS - 1)) x members 3,5: $runs runs, $failed failed; $confirmed confirmed messages, $crashes crashes (torn tails), $partitions partitions; $(( $(date +%s) - start )) s on $JOBS jobs (built at $COMMIT)"
exit $rc
