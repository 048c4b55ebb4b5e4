//! `warren perf` against a real `warren server` over TCP: bounded and timed runs checked through
//! the JSON output, flag errors through the exit code, and the HTML report rendered in a real
//! headless Chromium (the DOM after its script ran must hold a chart point per sample).

mod common;
use common::free_port;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_warren"))
}

fn tempdir() -> PathBuf {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    let d = std::env::temp_dir().join(format!("warren-perf-{}-{}", std::process::id(), h.finish()));
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// A `warren server` on free ports, stopped on drop.
struct Broker {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Broker {
    fn start() -> Broker {
        let dir = tempdir();
        let port = free_port();
        let child = bin()
            .args(["server", "--amqp-port", &port.to_string(), "--http-port"])
            .arg(free_port().to_string())
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stderr(Stdio::null())
            .spawn()
            .expect("server starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "broker did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker { child, port, dir }
    }

    fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `warren perf ARGS`, bounded by a watchdog so a hang fails instead of blocking the suite.
fn perf(args: &[&str]) -> Output {
    let mut child = bin()
        .arg("perf")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "warren perf {args:?} did not finish:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ok(args: &[&str]) -> String {
    let out = perf(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "warren perf {args:?} failed ({:?}):\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("json written");
    serde_json::from_str(&text).expect("valid JSON")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn bounded_run_receives_every_message_sent() {
    let b = Broker::start();
    let dir = tempdir();
    let out = dir.join("run.json");
    let stdout = ok(&[
        "-h",
        &b.uri(),
        "-x",
        "2",
        "-y",
        "1",
        "-u",
        "perf-bounded",
        "-C",
        "3000",
        "-s",
        "64",
        "-c",
        "100",
        "-q",
        "200",
        "-A",
        "10",
        "-D",
        "6000",
        "--json",
        out.to_str().expect("utf8"),
    ]);
    assert!(stdout.contains("sending rate avg:"), "{stdout}");
    let j = json(&out);
    assert_eq!(j["mode"], "single");
    let t = &j["runs"][0]["summary"]["totals"];
    assert_eq!(u(&t["sent"]), 6000, "2 producers x 3000: {t}");
    assert_eq!(u(&t["confirmed"]), 6000, "{t}");
    assert_eq!(u(&t["nacked"]), 0);
    assert_eq!(u(&t["received"]), 6000, "every message consumed: {t}");
    let lat = &j["runs"][0]["summary"]["latency_us"];
    assert!(
        u(&lat["p99"]) >= u(&lat["p50"]) && u(&lat["p50"]) >= u(&lat["min"]),
        "{lat}"
    );
    assert!(j["runs"][0]["error"].is_null());
    let _ = std::fs::remove_dir_all(dir);
}

/// Send timestamps are on the system's monotonic clock, as PerfTest's `System.nanoTime`: a
/// drain run measures the age of messages another run published (the S6 fill-then-drain).
#[test]
fn latency_is_measured_across_processes() {
    let b = Broker::start();
    let dir = tempdir();
    let common = ["-h", &b.uri(), "-u", "perf-age", "-ad", "false"];
    ok(&[
        &common[..],
        &["-x", "1", "-y", "0", "-C", "200", "-z", "30"],
    ]
    .concat());
    std::thread::sleep(Duration::from_millis(1500));
    let out = dir.join("drain.json");
    let o = out.to_str().expect("path");
    ok(&[
        &common[..],
        &[
            "-x", "0", "-y", "1", "-ew", "empty", "-z", "30", "--json", o,
        ],
    ]
    .concat());
    let summary = &json(&out)["runs"][0]["summary"];
    assert_eq!(u(&summary["totals"]["received"]), 200);
    let p50 = u(&summary["latency_us"]["p50"]);
    assert!(
        (1_500_000..60_000_000).contains(&p50),
        "the drain's median latency is the backlog's age (>= 1.5 s), got {p50} µs"
    );
}

#[test]
fn timed_run_with_queue_pattern_samples_every_second() {
    let b = Broker::start();
    let dir = tempdir();
    let out = dir.join("run.json");
    ok(&[
        "-h",
        &b.uri(),
        "-x",
        "2",
        "-y",
        "2",
        "-qp",
        "perf-pattern-%d",
        "-qpf",
        "1",
        "-qpt",
        "2",
        "-r",
        "500",
        "-f",
        "persistent",
        "-c",
        "50",
        "-q",
        "50",
        "-z",
        "3",
        "--json",
        out.to_str().expect("utf8"),
    ]);
    let j = json(&out);
    assert_eq!(
        j["scenario"]["queues"],
        serde_json::json!(["perf-pattern-1", "perf-pattern-2"])
    );
    let run = &j["runs"][0];
    let samples = run["samples"].as_array().expect("samples");
    assert!(
        samples.len() >= 2,
        "one sample per second of a 3 s run: {}",
        samples.len()
    );
    let t = &run["summary"]["totals"];
    assert!(
        u(&t["sent"]) > 0 && u(&t["confirmed"]) > 0 && u(&t["received"]) > 0,
        "{t}"
    );
    assert!(u(&t["received"]) <= u(&t["sent"]), "{t}");
    assert!(samples
        .iter()
        .any(|s| s["received"].as_f64().unwrap_or(0.0) > 0.0));
    assert!(run["summary"]["confirm_latency_us"]["p99"].is_u64());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn mandatory_publishes_to_nowhere_come_back() {
    let b = Broker::start();
    let dir = tempdir();
    let out = dir.join("run.json");
    ok(&[
        "-h",
        &b.uri(),
        "-x",
        "1",
        "-y",
        "0",
        "-e",
        "amq.direct",
        "-k",
        "no-such-binding",
        "-f",
        "mandatory",
        "-c",
        "10",
        "-C",
        "200",
        "--json",
        out.to_str().expect("utf8"),
    ]);
    let t = &json(&out)["runs"][0]["summary"]["totals"];
    assert_eq!(
        (u(&t["sent"]), u(&t["returned"]), u(&t["received"])),
        (200, 200, 0),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_flags_exit_2_with_a_clear_error() {
    for (args, want) in [
        (&["--no-such-flag"][..], "--no-such-flag"),
        (&["-qp", "q-%d"][..], "--queue-pattern-from"),
        (&["-a", "-A", "5"][..], "autoack"),
        (&["-x", "0", "-y", "0"][..], "nothing to do"),
        (&["-h", "http://localhost"][..], "amqp://"),
        // Refused by validation, before any connection is tried.
        (&["-qq"][..], "--quorum-queue (-qq) needs a named queue"),
        (
            &["-s", "5"][..],
            "--size 5 is below the minimum of 12 bytes",
        ),
    ] {
        let out = perf(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = perf(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--uri",
        "--queue-pattern",
        "--sweep",
        "--report",
        "--consumer-latency",
    ] {
        assert!(help.contains(flag), "{flag} missing from help:\n{help}");
    }
}

#[test]
fn unreachable_broker_is_a_clear_error() {
    let port = free_port(); // nothing listens there
    let out = perf(&["-h", &format!("amqp://127.0.0.1:{port}"), "-z", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot connect"), "{err}");
}

#[test]
fn connections_are_spread_across_the_uris() {
    let (a, b) = (Broker::start(), Broker::start());
    let dir = tempdir();
    let out = dir.join("spread.json");
    // Consumer i and producer i land on URI i mod 2: each broker carries one pair.
    ok(&[
        "-h",
        &format!("{},{}", a.uri(), b.uri()),
        "-x",
        "2",
        "-y",
        "2",
        "-u",
        "perf-spread",
        "-C",
        "500",
        "-D",
        "500",
        "--json",
        out.to_str().expect("utf8"),
    ]);
    let j = json(&out);
    assert_eq!(j["scenario"]["uris"].as_array().map(Vec::len), Some(2));
    let t = &j["runs"][0]["summary"]["totals"];
    assert_eq!((u(&t["sent"]), u(&t["received"])), (1000, 1000), "{t}");
    // With the second URI dead, the clients meant for it fail, naming it.
    let dead = free_port();
    let out = perf(&[
        "-h",
        &format!("{},amqp://127.0.0.1:{dead}", a.uri()),
        "-x",
        "2",
        "-y",
        "0",
        "-z",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{dead}")), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn compare_runs_both_brokers_and_prints_ratios() {
    let (a, b) = (Broker::start(), Broker::start());
    let dir = tempdir();
    let out = dir.join("cmp.json");
    let stdout = ok(&[
        "-h",
        &a.uri(),
        "--compare",
        &b.uri(),
        "--rounds",
        "1",
        "-x",
        "1",
        "-y",
        "1",
        "-u",
        "perf-cmp",
        "-C",
        "2000",
        "--json",
        out.to_str().expect("utf8"),
    ]);
    assert!(stdout.contains("A/B"), "{stdout}");
    let j = json(&out);
    assert_eq!(j["runs"].as_array().map(Vec::len), Some(2));
    for r in j["runs"].as_array().expect("runs") {
        assert_eq!(
            u(&r["summary"]["totals"]["received"]),
            2000,
            "{}",
            r["label"]
        );
    }
    let rows = j["compare"].as_array().expect("rows");
    let send = rows
        .iter()
        .find(|r| r["figure"] == "send rate (msg/s)")
        .expect("send row");
    assert!(send["ratio"].as_f64().is_some_and(|r| r > 0.0), "{send}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Debian's Chromium, if installed (scripts/test.sh installs it).
fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !p.is_empty() {
                return Some(PathBuf::from(p));
            }
        }
    }
    None
}

/// The DOM of a page after its scripts ran, from headless Chromium with no network.
fn rendered_dom(chrome: &Path, page: &Path) -> String {
    let profile = tempdir();
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(profile);
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The markup of the element that starts at the first match of `start`, up to `end`.
fn section<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let i = dom
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in the DOM"));
    let j = dom[i..].find(end).map_or(dom.len(), |j| i + j);
    &dom[i..j]
}

#[test]
fn report_renders_in_a_browser_with_a_point_per_sample() {
    let Some(chrome) = chromium() else {
        eprintln!("SKIPPED: no chromium on PATH (scripts/test.sh installs Debian's chromium)");
        return;
    };
    let b = Broker::start();
    let dir = tempdir();
    let (js, page, svg) = (dir.join("r.json"), dir.join("r.html"), dir.join("r.svg"));
    ok(&[
        "-h",
        &b.uri(),
        "-x",
        "1",
        "-y",
        "1",
        "-u",
        "perf-report",
        "-r",
        "1000",
        "-c",
        "20",
        "-z",
        "3",
        "--json",
        js.to_str().expect("utf8"),
        "--report",
        page.to_str().expect("utf8"),
        "--svg",
        svg.to_str().expect("utf8"),
    ]);
    let j = json(&js);
    let samples = j["runs"][0]["samples"].as_array().expect("samples");
    let n = samples.len();
    assert!(n >= 2, "{n} samples");
    let with_latency = samples
        .iter()
        .filter(|s| s["latency_us"].is_object())
        .count();
    let dom = rendered_dom(&chrome, &page);
    // The page's script ran: it marks the body with the number of charts and builds the table.
    assert!(
        dom.contains(r#"data-rendered="3""#),
        "rates, latency, confirm latency charts"
    );
    let rates = section(&dom, r#"data-chart="rates-0""#, "</svg>");
    // sent, confirmed, nacked, received: one circle per sample each.
    assert_eq!(rates.matches("<circle").count(), 4 * n, "rates chart");
    for series in ["sent", "confirmed", "nacked", "received"] {
        assert!(
            rates.contains(&format!(r#"data-series="{series}" data-points="{n}""#)),
            "{series} series"
        );
    }
    let latency = section(&dom, r#"data-chart="latency-0""#, "</svg>");
    assert_eq!(
        latency.matches("<circle").count(),
        5 * with_latency,
        "latency chart"
    );
    let table = section(&dom, r#"id="samples-0""#, "</table>");
    assert_eq!(
        table.matches("<tr>").count(),
        n + 1,
        "header row and a row per sample"
    );
    let svg_text = std::fs::read_to_string(&svg).expect("svg written");
    assert_eq!(
        svg_text.matches(r#"class="chart""#).count(),
        2,
        "rates and latency"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sweep_report_has_a_point_per_step() {
    let Some(chrome) = chromium() else {
        eprintln!("SKIPPED: no chromium on PATH (scripts/test.sh installs Debian's chromium)");
        return;
    };
    let b = Broker::start();
    let dir = tempdir();
    let (js, page) = (dir.join("s.json"), dir.join("s.html"));
    let stdout = ok(&[
        "-h",
        &b.uri(),
        "-x",
        "1",
        "-y",
        "1",
        "-u",
        "perf-sweep",
        // A durable queue across the steps: with PerfTest's auto-delete default, the previous
        // step's consumer, still being closed on a loaded machine, could delete the queue the
        // next step had just declared (404 on its consume; seen once in CI).
        "--auto-delete",
        "false",
        "-a",
        "--sweep",
        "500,2000,unlimited",
        "-z",
        "1",
        "--json",
        js.to_str().expect("utf8"),
        "--report",
        page.to_str().expect("utf8"),
    ]);
    assert!(stdout.contains("attempted msg/s | sent msg/s"), "{stdout}");
    let j = json(&js);
    let points = j["sweep"].as_array().expect("sweep points");
    assert_eq!(points.len(), 3);
    assert_eq!(points[0]["attempted"].as_f64(), Some(500.0));
    assert!(points[2]["attempted"].is_null(), "unlimited");
    assert!(
        points
            .iter()
            .all(|p| p["received"].as_f64().unwrap_or(0.0) > 0.0),
        "{points:?}"
    );
    let dom = rendered_dom(&chrome, &page);
    let chart = section(&dom, r#"data-chart="sweep-rates""#, "</svg>");
    assert!(
        chart.contains(r#"data-series="sent" data-points="3""#),
        "{chart}"
    );
    assert!(chart.contains(r#"data-series="received" data-points="3""#));
    assert_eq!(chart.matches("<circle").count(), 6);
    assert!(dom.contains(r#"data-chart="sweep-latency""#));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--report` can be watched live: while the run goes, the file holds the samples so far and
/// reloads itself; the finished report does not.
#[test]
fn report_is_rewritten_live_while_the_run_goes() {
    let b = Broker::start();
    let dir = tempdir();
    let page = dir.join("live.html");
    let mut run = bin()
        .args([
            "perf",
            "-h",
            &b.uri(),
            "-x",
            "1",
            "-y",
            "1",
            "-u",
            "perf-live",
        ])
        .args(["-r", "500", "-z", "5", "--report"])
        .arg(&page)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf starts");
    // Two samples in, the page is there, marked live, with a point per sample so far.
    let deadline = Instant::now() + Duration::from_secs(20);
    let live = loop {
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        if text.contains(r#"data-points="2""#) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no live report with two samples: {text:.300}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(live.contains(r#"<meta http-equiv="refresh" content="1">"#));
    assert!(live.contains(r#"id="live""#), "says it is running");
    assert!(run.wait().expect("perf ends").success());
    let done = std::fs::read_to_string(&page).expect("final report");
    assert!(
        !done.contains("http-equiv=\"refresh\""),
        "the final report stays still"
    );
    assert!(!done.contains(r#"id="live""#));
    assert!(done.contains(r#"data-points="5""#) || done.contains(r#"data-points="6""#));
    let _ = std::fs::remove_dir_all(dir);
}
