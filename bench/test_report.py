#!/usr/bin/env python3
"""Unit test of bench/report.py on a tiny fixture in a temp dir.

    python3 bench/test_report.py [-v]

Checks the medians and ratios in the scenario, sweep and cores tables, that relative links of the
sections are rewritten for the page, that every SVG is well-formed XML, that the newest results
(or the ones --results names) are used, that a render is byte-for-byte repeatable and that
--check tells a stale page apart. No timing is asserted.
"""
import contextlib
import importlib.util
import io
import os
import shutil
import tempfile
import unittest
import xml.etree.ElementTree as ET

spec = importlib.util.spec_from_file_location("report", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                      "report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

RUNS_HEAD = "scenario\tbroker\ttool\tround\tsend_rate\trecv_rate\tp50_us\tp99_us\tbroker_cpu_s\trecv_msgs\tsecs"
# S1: Warren 100/120/110 k, LavinMQ 50/40/55 k, RabbitMQ 20/30/ - (round 3 not measured).
# Per-round Warren/LavinMQ: 2.0, 3.0, 2.0 -> median 2.00, spread 2.00-3.00.
# Per-round Warren/RabbitMQ: 5.0, 4.0 -> median 4.50, spread 4.00-5.00.
# CPU-s/M Warren: 2 s / 2M = 1.00, 3.6 s / 2.4M = 1.50 (recv_msgs empty: rate x secs), 1.1 s / 2.2M = 0.50
#   -> median 1.00; RabbitMQ 4 s / 0.4M = 10, 9 s / 0.6M = 15, round 3 none -> 12.50.
RUNS = [
    "S1\twarren\twarren-perf\t1\t100000\t100000\t50\t1000\t2\t2000000\t20",
    "S1\tlavinmq\twarren-perf\t1\t50000\t50000\t50\t3000\t4\t1000000\t20",
    "S1\trabbitmq\twarren-perf\t1\t20000\t20000\t50\t9000\t4\t400000\t20",
    "S1\tlavinmq\twarren-perf\t2\t40000\t40000\t50\t5000\t4\t800000\t20",
    "S1\trabbitmq\twarren-perf\t2\t30000\t30000\t50\t7000\t9\t600000\t20",
    "S1\twarren\twarren-perf\t2\t120000\t120000\t50\t2000\t3.6\t\t20",
    "S1\trabbitmq\twarren-perf\t3\t\t\t\t\t0\t\t20",
    "S1\twarren\twarren-perf\t3\t110000\t110000\t50\t1500\t1.1\t2200000\t20",
    "S1\tlavinmq\twarren-perf\t3\t55000\t55000\t50\t4000\t2.2\t1100000\t20",
    # lavinmqperf without latency (p99 empty), one round, no RabbitMQ.
    "S1\twarren\tlavinmqperf\t1\t60000\t60000\t\t\t1\t1200000\t20",
    "S1\tlavinmq\tlavinmqperf\t1\t30000\t30000\t\t\t1\t600000\t20",
    # The sweep's own runs land in runs.tsv too; with a sweep.tsv they get no scenario table.
    "S4-1000\twarren\twarren-perf\t1\t1000\t1000\t40\t160\t0.2\t15000\t15",
]
SWEEP = [
    "broker\ttool\tround\trate_attempted\tsend_rate\trecv_rate\tp50_us\tp99_us\tp99_after_first_us",
    "warren\twarren-perf\t1\t1000\t1000\t1000\t40\t900\t150",
    "warren\twarren-perf\t2\t1000\t1000\t1000\t40\t800\t250",
    "lavinmq\twarren-perf\t1\t1000\t1000\t1000\t40\t5000\t",
    "warren\twarren-perf\t1\tunlimited\t900000\t880000\t9000\t20000\t18000",
    "lavinmq\twarren-perf\t1\tunlimited\t500000\t490000\t9000\t60000\t50000",
]
CORES = [
    "round\tbroker\tgenerator\tbroker_cores\tgenerator_cores\trecv_rate\tcpu_s_per_M",
    "1\twarren\twarren\t1\t0-1\t800000\t1.20",
    "1\twarren\twarren\t2\t0-1\t1600000\t1.40",
    "2\twarren\twarren\t1\t0-1\t1000000\t1.30",
    "2\twarren\twarren\t2\t0-1\t1500000\t-",
]


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def run(*argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return report.main(list(argv))


def row(page, first_cell, after):
    """The table row starting with FIRST_CELL after the line containing AFTER, as a list of cells."""
    lines = page.split("\n")
    start = next(i for i, ln in enumerate(lines) if after in ln)
    for ln in lines[start:]:
        if ln.startswith(f"| {first_cell} |"):
            return [c.strip() for c in ln.strip("|").split("|")]
    raise AssertionError(f"no row {first_cell!r} after {after!r}")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="report-test-")
        res = os.path.join(self.root, "bench", "results")
        self.perf = os.path.join(res, "perf-20260102T000000Z")
        write(os.path.join(self.perf, "runs.tsv"), [RUNS_HEAD] + RUNS)
        write(os.path.join(self.perf, "header.md"), ["- command: `ROUNDS=3 bench/perf.sh S1`", "- machine: fixture"])
        write(os.path.join(self.perf, "commands.tsv"), ["scenario\ttool\tcommand",
                                                        "S1\twarren-perf\twarren perf -h $URI -x 1 -y 1 -a -s 16",
                                                        "S4-unlimited\twarren-perf\twarren perf -h $URI -z 15",
                                                        "S4-1000\twarren-perf\twarren perf -h $URI -r 1000 -z 15"])
        write(os.path.join(self.perf, "sweep.tsv"), SWEEP)
        # Older: must lose to the newer directory unless named.
        self.old = os.path.join(res, "perf-20260101T000000Z")
        write(os.path.join(self.old, "runs.tsv"), [RUNS_HEAD, "S9\twarren\twarren-perf\t1\t7\t7\t\t\t1\t7\t1"])
        write(os.path.join(res, "cores-20260102T000000Z", "runs.tsv"), CORES)
        write(os.path.join(self.root, "docs", "benchmarks", "sections", "10-x.md"),
              ["## Extra", "", "See [the note](../notes/a.md#b), [web](https://example.org/x) and",
               "![chart](../../img/c.svg).", "", "```", "[code](../notes/a.md)", "```"])

    def tearDown(self):
        shutil.rmtree(self.root)

    def page(self):
        with open(os.path.join(self.root, "docs", "benchmarks.md"), encoding="utf-8") as f:
            return f.read()

    def test_tables(self):
        self.assertEqual(run("--root", self.root), 0)
        p = self.page()
        self.assertIn("# Benchmarks: Warren vs RabbitMQ 3.10 and LavinMQ 2.8.2", p)
        self.assertIn("- machine: fixture", p)  # header.md verbatim
        self.assertIn("`warren perf -h $URI -x 1 -y 1 -a -s 16`", p)
        r = row(p, "warren perf", "### S1")
        # generator | W | L | R | W/L | W/R | CPU W | CPU L | CPU R | p99 W | p99 L | p99 R
        self.assertEqual(r[1:4], ["110,000", "50,000", "25,000"])
        self.assertEqual(r[4], "2.00<br><sub>2.00–3.00</sub>")
        self.assertEqual(r[5], "4.50<br><sub>4.00–5.00</sub>")
        self.assertEqual(r[6:9], ["1.00", "4.00", "12.50"])
        self.assertEqual(r[9:12], ["1.50 ms", "4.00 ms", "8.00 ms"])
        r = row(p, "lavinmqperf", "### S1")
        self.assertEqual(r[1:6], ["60,000", "30,000", "–", "2.00", "–"])
        self.assertEqual(r[9:12], ["–", "–", "–"])
        self.assertNotIn("### S4-1000", p)  # covered by the sweep
        self.assertNotIn("S9", p)  # the older results directory

    def test_sweep_and_cores(self):
        run("--root", self.root)
        p = self.page()
        r = row(p, "1,000", "### Generator: warren perf")
        # median of 150 and 250 after the first second; LavinMQ has none: its whole-run p99, marked
        self.assertEqual(r, ["1,000", "200 µs", "1,000", "5.00 ms †", "1,000"])
        r = row(p, "unlimited", "### Generator: warren perf")
        self.assertEqual(r, ["unlimited", "18.0 ms", "880,000", "50.0 ms", "490,000"])
        self.assertIn("with this generator:\n\n- `warren perf -h $URI -r 1000 -z 15`\n"
                      "- `warren perf -h $URI -z 15`\n", p)  # in rate order
        r = row(p, "warren perf", "## Cores")
        # 1 core: median(800k, 1M) = 900k; 2 cores: 1.55M; per round 2.0 and 1.5; CPU 1.25, then 1.40 ('-' skipped)
        self.assertEqual(r, ["warren perf", "Warren", "900,000", "1,550,000", "1.75<br><sub>1.50–2.00</sub>",
                             "1.25", "1.40"])

    def test_targets(self):
        run("--root", self.root)
        p = self.page()
        t = "## Targets of issue 34"
        # S1 CPU-s/M: Warren 1.00 against LavinMQ 4.00 (warren perf); 0.83 against 1.67 (lavinmqperf).
        self.assertEqual(row(p, "S1: Warren's CPU-s/M ≤ 0.6x LavinMQ's", t),
                         ["S1: Warren's CPU-s/M ≤ 0.6x LavinMQ's", "warren perf", "0.25x (1.00 against 4.00)",
                          "**met**"])
        self.assertEqual(row(p, "S1: Warren's rate ≥ LavinMQ's", t)[1:], ["warren perf", "2.00x", "**met**"])
        # The sweep: LavinMQ kept up at 1,000 only ('unlimited' is no rate to keep up with).
        self.assertEqual(row(p, "S4: Warren's p99 below LavinMQ's at every rate it keeps up with", t)[2:],
                         ["lower at 1 of 1 rates LavinMQ kept up with", "**met**"])
        # Highest 880,000: 80% is 704,000, and the sweep stops at 1,000.
        self.assertEqual(row(p, "S4: p99 under 1 ms up to 80% of Warren's highest rate", t)[2:],
                         ["highest rate 880,000; p99 under 1 ms at 1 of 1 rates up to 704,000; swept only to 1,000",
                          "not met"])
        self.assertNotIn("S2P:", p)  # not in this run

    def test_sections_and_svgs(self):
        run("--root", self.root)
        p = self.page()
        self.assertIn("See [the note](benchmarks/notes/a.md#b), [web](https://example.org/x) and", p)
        self.assertIn("![chart](img/c.svg).", p)
        self.assertIn("[code](../notes/a.md)", p)  # code blocks stay as written
        self.assertTrue(p.rstrip().endswith("[benchmark notes](benchmarks/notes/README.md)."))
        img = os.path.join(self.root, "docs", "benchmarks", "img")
        svgs = sorted(os.listdir(img))
        self.assertEqual(svgs, ["cores.svg", "sweep-warren-perf.svg", "throughput.svg"])
        for s in svgs:
            root = ET.parse(os.path.join(img, s)).getroot()
            self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg")
            self.assertIn(f"](benchmarks/img/{s})", p)

    def test_repeatable_and_check(self):
        run("--root", self.root)
        first = self.page()
        self.assertEqual(run("--root", self.root, "--check"), 0)
        run("--root", self.root)
        self.assertEqual(self.page(), first)
        with open(os.path.join(self.root, "docs", "benchmarks.md"), "a", encoding="utf-8") as f:
            f.write("edited\n")
        self.assertEqual(run("--root", self.root, "--check"), 1)
        self.assertTrue(self.page().endswith("edited\n"))  # --check writes nothing
        stale = os.path.join(self.root, "docs", "benchmarks", "img", "old.svg")
        run("--root", self.root)
        with open(stale, "w", encoding="utf-8") as f:
            f.write("<svg/>")
        self.assertEqual(run("--root", self.root, "--check"), 1)
        run("--root", self.root)
        self.assertFalse(os.path.exists(stale))

    def test_results_override(self):
        self.assertEqual(run("--root", self.root, "--results", self.old), 0)
        p = self.page()
        self.assertIn("### S9", p)
        self.assertIn("`perf-20260101T000000Z` (scenarios)", p)
        # Kinds the named directory lacks still come from the newest.
        self.assertIn("`perf-20260102T000000Z` (latency sweep)", p)
        self.assertIn("`cores-20260102T000000Z` (cores)", p)

    def test_sections_only_keeps_the_measured_part(self):
        run("--root", self.root)
        measured = self.page().split("## Extra")[0]
        shutil.rmtree(os.path.join(self.root, "bench", "results"))
        write(os.path.join(self.root, "docs", "benchmarks", "sections", "20-y.md"), ["## Later", "", "A [link](../notes/c.md)."])
        self.assertEqual(run("--root", self.root, "--sections-only", "--check"), 1)
        self.assertEqual(run("--root", self.root, "--sections-only"), 0)
        p = self.page()
        self.assertTrue(p.startswith(measured), "the measured part is kept as it was")
        self.assertIn("## Later\n\nA [link](benchmarks/notes/c.md).", p)
        self.assertTrue(p.rstrip().endswith("[benchmark notes](benchmarks/notes/README.md)."))
        self.assertEqual(run("--root", self.root, "--sections-only", "--check"), 0)
        self.assertTrue(os.path.isfile(os.path.join(self.root, "docs", "benchmarks", "img", "throughput.svg")))

    def test_no_results(self):
        shutil.rmtree(os.path.join(self.root, "bench", "results"))
        self.assertEqual(run("--root", self.root), 0)
        self.assertIn("No `bench/perf.sh` results yet.", self.page())


if __name__ == "__main__":
    unittest.main()
