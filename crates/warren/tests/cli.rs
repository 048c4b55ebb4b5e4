//! The real `warren` binary: flags, configuration errors, start-up and clean shutdown.

mod common;
use common::free_port;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_warren"))
}

/// `warren server` on `port` with its data in `data`, stderr piped.
fn server(port: u16, data: &std::path::Path) -> std::process::Child {
    bin()
        .args([
            "server",
            "--amqp-port",
            &port.to_string(),
            "--http-port",
            &free_port().to_string(),
            "--data-dir",
        ])
        .arg(data)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts")
}

fn wait_for_port(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn help_explains_every_server_flag() {
    let out = bin().args(["server", "--help"]).output().expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--amqp-port",
        "--http-port",
        "--data-dir",
        "--config",
        "--node-name",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help:\n{text}");
    }
}

#[test]
fn bad_config_is_a_clear_error() {
    let dir = tempdir();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "amqp_prot = 1\n").expect("write");
    let err = refused_config(&cfg);
    assert!(
        err.contains("invalid config file") && err.contains("amqp_prot"),
        "{err}"
    );

    let out = bin()
        .args(["server", "--config", "/nonexistent/warren.toml"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
}

#[test]
fn bad_node_name_is_a_clear_error() {
    let dir = tempdir();
    for bad in ["two words", "a@b@c", "@host", "name@"] {
        let out = bin()
            .args(["server", "--node-name", bad, "--data-dir"])
            .arg(dir.join("data"))
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("node_name must be NAME@HOST"), "{bad}: {err}");
    }
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, "node_name = \"x y\"\n").expect("write");
    assert!(refused_config(&cfg).contains("node_name must be NAME@HOST"));
}

/// `warren server --config cfg` exits 1 at once; its stderr.
fn refused_config(cfg: &std::path::Path) -> String {
    let out = bin()
        .args(["server", "--config"])
        .arg(cfg)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn server_version_that_is_not_x_y_z_is_a_config_error() {
    let dir = tempdir();
    for bad in ["3.10", "3.10.8-rc1", "v3"] {
        let cfg = dir.join("version.toml");
        std::fs::write(
            &cfg,
            format!("[server_properties]\nproduct = \"RabbitMQ\"\nversion = \"{bad}\"\n"),
        )
        .expect("write");
        let out = bin()
            .args(["server", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.join("d"))
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("server_properties.version must be a plain x.y.z version")
                && err.contains(bad),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// connection.start's `product` and `version`: Warren's own by default, the configured ones
/// when `[server_properties]` sets them.
#[test]
fn server_properties_announce_the_configured_product_and_version() {
    fn start_frame(port: u16) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(b"AMQP\x00\x00\x09\x01").expect("write");
        let mut head = [0u8; 7];
        s.read_exact(&mut head).expect("frame header");
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut payload = vec![0u8; size];
        s.read_exact(&mut payload).expect("connection.start");
        payload
    }
    /// A field-table entry: short name, 'S', long string.
    fn entry(name: &str, value: &str) -> Vec<u8> {
        let mut e = vec![name.len() as u8];
        e.extend_from_slice(name.as_bytes());
        e.push(b'S');
        e.extend_from_slice(&(value.len() as u32).to_be_bytes());
        e.extend_from_slice(value.as_bytes());
        e
    }
    let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    let dir = tempdir();
    let port = free_port();
    let broker = KillOnDrop(server(port, &dir.join("default")));
    assert!(wait_for_port(port), "broker did not listen");
    let start = start_frame(port);
    assert!(has(&start, &entry("product", "Warren")));
    assert!(has(&start, &entry("version", env!("CARGO_PKG_VERSION"))));
    drop(broker);

    let cfg = dir.join("props.toml");
    std::fs::write(
        &cfg,
        "[server_properties]\nproduct = \"RabbitMQ\"\nversion = \"3.10.8\"\n",
    )
    .expect("write");
    let port = free_port();
    let _broker = KillOnDrop(
        bin()
            .args(["server", "--config"])
            .arg(&cfg)
            .args(["--amqp-port", &port.to_string()])
            .args(["--http-port", &free_port().to_string(), "--data-dir"])
            .arg(dir.join("configured"))
            .stderr(Stdio::null())
            .spawn()
            .expect("starts"),
    );
    assert!(wait_for_port(port), "broker did not listen");
    let start = start_frame(port);
    assert!(has(&start, &entry("product", "RabbitMQ")));
    assert!(has(&start, &entry("version", "3.10.8")));
    assert!(!has(&start, b"Warren\x07version"));
}

#[test]
fn port_in_use_is_a_clear_error() {
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    let dir = tempdir();
    let out = bin()
        .args(["server", "--amqp-port", &port.to_string(), "--data-dir"])
        .arg(dir.join("d"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen for AMQP"));
}

#[test]
fn serves_amqp_and_stops_cleanly_on_sigterm() {
    let dir = tempdir();
    let port = free_port();
    let data = dir.join("data");
    let mut child = server(port, &data);
    assert!(wait_for_port(port), "broker did not listen");
    assert!(data.is_dir(), "data dir created");

    // A wrong protocol header is answered with the one we speak, then the socket closes.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"HTTP/1.1").expect("write");
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("read until close");
    assert_eq!(got, b"AMQP\x00\x00\x09\x01");

    // A client mid-handshake when SIGTERM arrives does not hold up shutdown.
    let mut idle = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    idle.write_all(b"AMQP\x00\x00\x09\x01").expect("write");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "broker did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit:?}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(
        err.contains("shutting down") && err.contains("stopped"),
        "{err}"
    );
    // "Listening" is said once the data directory is open, with its absolute path and the UI's
    // address.
    let recovered = err.find("vhost recovered").expect("vhost recovered logged");
    let listening = err
        .find("warren listening for AMQP 0-9-1")
        .expect("listening logged");
    assert!(recovered < listening, "{err}");
    let abs = std::fs::canonicalize(&data).expect("data dir");
    assert!(err.contains(&abs.display().to_string()), "{err}");
    assert!(
        err.contains("management UI and HTTP API listening"),
        "{err}"
    );
    assert!(err.contains("url=http://127.0.0.1:"), "{err}");
}

/// A port taken for HTTP fails startup with a clear error, and nothing claims to be listening.
#[test]
fn http_port_in_use_fails_before_anything_says_listening() {
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let http = held.local_addr().expect("addr").port();
    let dir = tempdir();
    let out = bin()
        .args([
            "server",
            "--amqp-port",
            &free_port().to_string(),
            "--http-port",
            &http.to_string(),
            "--data-dir",
        ])
        .arg(dir.join("d"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen for HTTP"), "{err}");
    assert!(!err.contains("listening"), "{err}");
}

/// A broker whose stderr can no longer be written (its log reader went away, a full disk) keeps
/// serving: a log line that cannot be written is dropped, never a panic in the task that logged.
#[test]
fn keeps_serving_when_stderr_cannot_be_written() {
    let dir = tempdir();
    let port = free_port();
    let mut broker = KillOnDrop(server(port, &dir.join("data")));
    assert!(wait_for_port(port), "broker did not listen");
    // Every log line from now on fails with EPIPE. Each connection logs its open and close.
    drop(broker.0.stderr.take());
    let uri = format!("amqp://guest:guest@127.0.0.1:{port}");
    for round in 0..3 {
        let mut perf = bin()
            .args(["perf", "-h", &uri, "-x", "1", "-y", "1", "-C", "500"])
            .args(["-u", &format!("stderr-closed-{round}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perf starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = perf.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() > deadline {
                let _ = perf.kill();
                panic!("round {round}: no answer from a broker whose stderr is closed");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = perf.wait_with_output().expect("output");
        assert!(
            status.success(),
            "round {round}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        broker.0.try_wait().expect("wait").is_none(),
        "broker exited"
    );
    drop(broker);
    let _ = std::fs::remove_dir_all(dir);
}

/// A spawned broker, killed when dropped (also when a test fails), so none outlives its test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "warren-cli-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}
