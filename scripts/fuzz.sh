#!/usr/bin/env bash
# Bounded fuzzing (fuzz/): the protocol decoders, and random command sequences against the queue
# state machine (queue_commands); each target runs FUZZ_SECONDS (default 60).
#   scripts/fuzz.sh [target...]     # default: every target
#   scripts/fuzz.sh --setup         # only install what it needs (below), then exit
# Needs a nightly toolchain and cargo-fuzz. Either one missing is installed first (rustup
# toolchain install nightly; cargo install cargo-fuzz --locked, from crates.io); an install that
# fails stops the script with exit 1, so scripts/test.sh fails rather than leave the fuzz targets
# out without a word. A crash stops the run with exit 1 and leaves the input in fuzz/artifacts/<target>/:
# fix the code, then copy the input to crates/protocol/tests/crashers/<target>/ (decoders) or
# crates/queue/tests/crashers/queue_commands/ (the queue), where the test suite replays it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
die() { echo "fuzz: FAILED: $*" >&2; exit 1; }
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: no nightly toolchain; installing it (rustup toolchain install nightly --profile minimal)"
  rustup toolchain install nightly --profile minimal \
    || die "could not install a nightly toolchain, which cargo-fuzz needs (rustup toolchain install nightly)"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is not installed; installing it (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked || die "could not install cargo-fuzz (cargo install cargo-fuzz --locked)"
  # cargo install writes to $CARGO_INSTALL_ROOT/bin or $CARGO_HOME/bin: cargo must find it there.
  cargo +nightly fuzz --version >/dev/null 2>&1 \
    || die "cargo-fuzz was installed but 'cargo +nightly fuzz' does not find it: put cargo's install bin folder on PATH"
fi
echo "fuzz: $(cargo +nightly fuzz --version) on $(rustc +nightly --version)"
if [[ "${1:-}" == "--setup" ]]; then
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
