#!/usr/bin/env bash
# Bounded fuzzing (fuzz/): the protocol decoders, and random command sequences against the queue
# state machine (queue_commands); each target runs FUZZ_SECONDS (default 60).
#   scripts/fuzz.sh [target...]     # default: every target
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); without them it says so
# and exits 0. A crash stops the run with exit 1 and leaves the input in fuzz/artifacts/<target>/:
# fix the code, then copy the input to crates/protocol/tests/crashers/<target>/ (decoders) or
# crates/queue/tests/crashers/queue_commands/ (the queue), where the test suite replays it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: skipped, no nightly toolchain (rustup toolchain install nightly)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: skipped, cargo-fuzz is not installed (cargo install cargo-fuzz)"
  exit 0
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build >/dev/null
failed=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  log="$(mktemp)"
  # rss_limit: an input that makes the decoder allocate past it is a finding, not noise.
  if cargo +nightly fuzz run "$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 \
      -max_len=65536 >"$log" 2>&1; then
    echo "fuzz: $t clean ($(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1 | cut -d' ' -f2) runs in ${SECONDS_EACH}s)"
  else
    echo "fuzz: $t FAILED"
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20
    failed=1
  fi
  rm -f "$log"
done
exit "$failed"
