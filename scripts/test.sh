#!/usr/bin/env bash
# Runs every test of the project and installs what the tests need:
#   1. cargo tests (unit tests next to the code, and crates/warren/tests/ against the real binary);
#   2. the Python interop suite (pika; venv in .venv-interop) against the real binary;
#   3. the Go interop suite (amqp091-go) against the real binary;
#   4. a bounded part of both interop suites in cluster mode (tests/interop/cluster_mode.sh).
# Between 1 and 2, a bounded fuzzing run of the protocol decoders and the queue state machine
# (scripts/fuzz.sh), the benchmark page renderer's own test (bench/test_report.py: a fixture,
# no load, no timing), and the structure checker (scripts/check_structure.py: no file over 800
# lines; no import cycle among the broker's parts, nor among the modules of queue, store, mgmt,
# cluster, shovel and federation), and the docs' link checker (scripts/check_links.py: every relative link and
# anchor resolves).
# CARGO_TARGET_DIR is honoured. Exits non-zero if anything fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TERM_COLOR=never
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

need() { command -v "$1" >/dev/null 2>&1 || { echo "test.sh: '$1' is required (install it first)" >&2; exit 1; }; }
need cargo; need python3; need go

# crates/warren/tests/perf.rs renders the `warren perf` HTML report in a real headless browser.
if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium (Debian's package; for the warren perf report test)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "test.sh: could not install chromium; the report rendering tests will be skipped" >&2
fi
# tests/interop/python/test_ui.py drives the management web UI in headless chromium through
# Selenium and Debian's chromedriver (same version as Debian's chromium; nothing is downloaded).
if ! command -v chromedriver >/dev/null 2>&1; then
  echo "== installing chromium-driver (Debian's package; for the management UI test)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium-driver; } >/dev/null 2>&1 \
    || echo "test.sh: could not install chromium-driver; the management UI test will be skipped" >&2
fi
# The fuzz step needs nightly and cargo-fuzz: installed now if missing (crates.io), so that a
# failed install stops the run at once rather than after the cargo tests.
echo "== fuzz setup (scripts/fuzz.sh --setup: nightly and cargo-fuzz)"
scripts/fuzz.sh --setup
echo "== cargo build (release)"
cargo build --release --locked -p warren
echo "== cargo test"
cargo test --release --locked --workspace

echo "== fuzz (scripts/fuzz.sh: every target, ${FUZZ_SECONDS:-30} s each; installs nightly and cargo-fuzz if missing, fails if it cannot)"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}" scripts/fuzz.sh

echo "== bench/test_report.py (the benchmark page renderer on a fixture)"
python3 bench/test_report.py

# The structure checker, tested on fixture crates first. It fails the run on any crates/*/src
# file over 800 lines, on an import cycle among the broker's parts (its top-level modules, each
# with its files: the layers of docs/ARCHITECTURE.md), and on one among the modules of queue,
# store, mgmt, cluster, shovel, federation and stream-protocol.
echo "== scripts/check_structure.py (file sizes; the broker's layers; import cycles of queue, store, mgmt, cluster, shovel, federation and stream-protocol)"
python3 scripts/test_check_structure.py
python3 scripts/check_structure.py --crate crates/queue --crate crates/store --crate crates/mgmt --crate crates/cluster --crate crates/shovel --crate crates/federation --crate crates/stream-protocol
python3 scripts/check_structure.py --layers --crate crates/broker

# The docs' relative links (README.md, docs/**/*.md, examples/**/*.md): every path exists and
# every #anchor into a Markdown page names one of its headings. The checker is tested first.
echo "== scripts/check_links.py (relative links of README.md and docs/ resolve)"
python3 scripts/test_check_links.py
python3 scripts/check_links.py

export WARREN_BIN="$TARGET_DIR/release/warren"
echo "== interop: python (pika)"
tests/interop/python/run.sh
echo "== interop: go (amqp091-go)"
tests/interop/go/run.sh
# Cluster mode (WARREN_CLUSTER=1): the same clients through node 2 of a 3-node cluster whose
# queues (but the exclusive ones) all live on nodes 1 and 3 (min-masters, ballast on node 2), so
# every AMQP method goes through the forwarding between nodes. A bounded part (about 80 s): the
# AMQP semantics files of the Python suite and most of the Go suite; the whole mode is
# `tests/interop/cluster_mode.sh --full`.
echo "== interop through a cluster node (tests/interop/cluster_mode.sh: python and go against node 2 of 3, queues on the others)"
tests/interop/cluster_mode.sh
# The PromQL of RabbitMQ's published Grafana dashboards through a real Prometheus (Debian's
# package) against a 3-node cluster under load (about 45 s; a report: it fails only when its
# harness does, e.g. a query refused or a node's identity exported twice). docs/prometheus.md.
if command -v prometheus >/dev/null 2>&1; then
  echo "== bench/prometheus_dashboards.py (the dashboards' queries through Prometheus, 3-node cluster)"
  python3 bench/prometheus_dashboards.py
else
  echo "== skipped bench/prometheus_dashboards.py: no prometheus (apt-get install prometheus)"
fi
echo "== all tests passed"
