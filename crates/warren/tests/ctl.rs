//! `warren ctl` against the real binary: a broker started on free ports, commands run as a user
//! would, their output and exit status checked; users and permissions survive kill -9.

mod common;
use common::free_port;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Broker {
    child: Child,
    http: u16,
    data: PathBuf,
}

impl Broker {
    fn start(data: PathBuf) -> Broker {
        let (amqp, http) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_warren"))
            .args([
                "server",
                "--amqp-port",
                &amqp.to_string(),
                "--http-port",
                &http.to_string(),
                "--data-dir",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(data.with_extension("log")).expect("log"))
            .spawn()
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", http)).is_err() {
            assert!(Instant::now() < deadline, "management API did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker { child, http, data }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_warren"))
            .args(["ctl", "--url", &format!("http://127.0.0.1:{}", self.http)])
            .args(args)
            .output()
            .expect("ctl runs")
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.ctl(args);
        assert!(
            o.status.success(),
            "{args:?} failed: {}\nbroker log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-ctl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}

#[test]
fn users_vhosts_permissions_and_listings() {
    let dir = tempdir("main");
    let b = Broker::start(dir.join("data"));
    assert_eq!(
        b.ok(&["list_users"]),
        "user\ttags\nguest\t[administrator]\n"
    );
    b.ok(&["add_user", "alice", "pw1"]);
    let dup = b.ctl(&["add_user", "alice", "pw1"]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&dup.stderr).contains("user 'alice' already exists"));
    b.ok(&["set_user_tags", "alice", "monitoring", "policymaker"]);
    b.ok(&["add_vhost", "tenant"]);
    b.ok(&["set_permissions", "-p", "tenant", "alice", "^a", "^b", "^c"]);
    assert_eq!(
        b.ok(&["list_users"]),
        "user\ttags\nalice\t[monitoring, policymaker]\nguest\t[administrator]\n"
    );
    assert_eq!(b.ok(&["list_vhosts"]), "name\n/\ntenant\n");
    assert_eq!(
        b.ok(&["list_permissions", "-p", "tenant"]),
        "user\tconfigure\twrite\tread\nalice\t^a\t^b\t^c\nguest\t.*\t.*\t.*\n"
    );
    // Queues, exchanges, bindings with chosen columns.
    let defs = dir.join("defs.json");
    std::fs::write(
        &defs,
        r#"{"queues":[{"name":"q1","vhost":"tenant","durable":true,"auto_delete":false,"arguments":{"x-max-length":5}}],
            "exchanges":[{"name":"x1","vhost":"tenant","type":"fanout","durable":true,"auto_delete":false,"internal":false,"arguments":{}}],
            "bindings":[{"source":"x1","vhost":"tenant","destination":"q1","destination_type":"queue","routing_key":"","arguments":{}}]}"#,
    )
    .expect("write");
    b.ok(&["import_definitions", defs.to_str().expect("path")]);
    assert_eq!(
        b.ok(&[
            "list_queues",
            "-p",
            "tenant",
            "name",
            "messages",
            "consumers",
            "durable",
            "arguments"
        ]),
        "name\tmessages\tconsumers\tdurable\targuments\nq1\t0\t0\ttrue\t{\"x-max-length\":5}\n"
    );
    let xs = b.ok(&["list_exchanges", "-p", "tenant", "name", "type"]);
    assert!(xs.starts_with("name\ttype\n\tdirect\n"), "{xs}");
    assert!(xs.contains("x1\tfanout\n"), "{xs}");
    let bs = b.ok(&["list_bindings", "-p", "tenant"]);
    assert!(bs.contains("x1\texchange\tq1\tqueue\t\t[]\n"), "{bs}");
    b.ok(&[
        "set_policy",
        "-p",
        "tenant",
        "--apply-to",
        "queues",
        "cap",
        "^q",
        r#"{"max-length":2}"#,
    ]);
    assert_eq!(
        b.ok(&["list_policies", "-p", "tenant"]),
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\ntenant\tcap\t^q\tqueues\t{\"max-length\":2}\t0\n"
    );
    let bad = b.ctl(&["set_policy", "bad", ".*", r#"{"max-priority":3}"#]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("are not recognised policy settings"));
    b.ok(&["clear_policy", "-p", "tenant", "cap"]);
    b.ok(&["purge_queue", "-p", "tenant", "q1"]);
    b.ok(&["delete_queue", "-p", "tenant", "q1"]);
    assert_eq!(b.ok(&["list_queues", "-p", "tenant"]), "name\tmessages\n");
    let out = b.ok(&["export_definitions", "-"]);
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    let alice = doc["users"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "alice"))
        .expect("alice exported");
    assert_eq!(alice["hashing_algorithm"], "rabbit_password_hashing_sha256");
    assert_eq!(
        b.ok(&["list_connections"]),
        "user\tpeer_host\tpeer_port\tstate\n"
    );
}

#[test]
fn unknown_names_and_unreachable_broker_are_clear_errors() {
    let dir = tempdir("errors");
    let b = Broker::start(dir.join("data"));
    for (args, text) in [
        (
            vec!["delete_user", "nobody"],
            "user 'nobody' does not exist",
        ),
        (
            vec!["change_password", "nobody", "x"],
            "user 'nobody' does not exist",
        ),
        (
            vec!["delete_vhost", "nowhere"],
            "vhost 'nowhere' does not exist",
        ),
        (
            vec!["list_queues", "-p", "nowhere"],
            "vhost 'nowhere' does not exist",
        ),
        (
            vec!["purge_queue", "nope"],
            "queue 'nope' in vhost '/' does not exist",
        ),
        (
            vec!["close_connection", "nope", "bye"],
            "connection 'nope' does not exist",
        ),
        (
            vec!["set_permissions", "nobody", ".*", ".*", ".*"],
            "user 'nobody' or vhost '/' does not exist",
        ),
        (vec!["list_queues", "bogus"], "unknown queue column 'bogus'"),
    ] {
        let o = b.ctl(&args);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(text), "{args:?}: {err}");
    }
    let wrong = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args([
            "ctl",
            "--url",
            &format!("http://127.0.0.1:{}", b.http),
            "--password",
            "nope",
            "list_users",
        ])
        .output()
        .expect("runs");
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("Login failed"));
    let port = free_port();
    let o = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["ctl", "--node", &format!("127.0.0.1:{port}"), "list_users"])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(69));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unable to reach the broker's management API")
    );
}

#[test]
fn users_and_permissions_survive_kill_9() {
    let dir = tempdir("restart");
    let data = dir.join("data");
    let mut b = Broker::start(data.clone());
    b.ok(&["add_user", "bob", "pw"]);
    b.ok(&["add_vhost", "v2"]);
    b.ok(&["set_permissions", "-p", "v2", "bob", ".*", "", "^r"]);
    b.ok(&["delete_user", "guest"]);
    let _ = b.child.kill();
    let _ = b.child.wait();
    drop(b);
    let b = Broker::start(data);
    // guest is gone, so ctl logs in as bob... who is not a management user.
    let o = b.ctl(&["--username", "bob", "--password", "pw", "list_users"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Not management user"));
    let o = b.ctl(&["list_users"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("Login failed"));
    assert!(b.data.join("access.json").exists());
    let text = std::fs::read_to_string(b.data.join("access.json")).expect("read");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(doc["users"].as_array().map(Vec::len), Some(1));
    assert_eq!(doc["permissions"][0]["read"], "^r");
    assert!(doc["vhosts"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v["name"] == "v2")));
}

#[test]
fn vhost_and_user_limits_set_list_clear_and_survive_kill_9() {
    let dir = tempdir("limits");
    let data = dir.join("data");
    let mut b = Broker::start(data.clone());
    b.ok(&["add_vhost", "lim"]);
    b.ok(&[
        "set_vhost_limits",
        "-p",
        "lim",
        r#"{"max-connections": 10, "max-queues": 5}"#,
    ]);
    assert_eq!(
        b.ok(&["list_vhost_limits", "-p", "lim"]),
        "{\"max-connections\":10,\"max-queues\":5}\n"
    );
    // set_vhost_limits replaces the whole definition, as rabbitmqctl's does.
    b.ok(&["set_vhost_limits", "-p", "lim", r#"{"max-queues": -1}"#]);
    assert_eq!(
        b.ok(&["list_vhost_limits", "-p", "lim"]),
        "{\"max-queues\":-1}\n"
    );
    assert_eq!(b.ok(&["list_vhost_limits", "-p", "/"]), "");
    assert_eq!(
        b.ok(&["list_vhost_limits", "--global"]),
        "vhost\tlimits\nlim\t{\"max-queues\":-1}\n"
    );
    b.ok(&["add_user", "carol", "pw"]);
    b.ok(&["set_user_limits", "carol", r#"{"max-connections": 2}"#]);
    b.ok(&["set_user_limits", "carol", r#"{"max-channels": 5}"#]);
    assert_eq!(
        b.ok(&["list_user_limits", "--user", "carol"]),
        "{\"max-channels\":5,\"max-connections\":2}\n"
    );
    b.ok(&["clear_user_limits", "carol", "max-connections"]);
    assert_eq!(
        b.ok(&["list_user_limits", "--global"]),
        "user\tlimits\ncarol\t{\"max-channels\":5}\n"
    );
    for (args, text) in [
        (
            vec!["set_user_limits", "carol", r#"{"max-channels": "lots"}"#],
            "max-channels should be a number",
        ),
        (
            vec!["set_vhost_limits", "-p", "lim", r#"{"max-channels": 1}"#],
            "Unrecognised terms",
        ),
        (
            vec!["set_vhost_limits", "-p", "nowhere", r#"{"max-queues": 1}"#],
            "vhost 'nowhere' does not exist",
        ),
        (
            vec!["list_user_limits", "--user", "nobody"],
            "user 'nobody' does not exist",
        ),
    ] {
        let o = b.ctl(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(text), "{args:?}: {err}");
    }
    let doc: serde_json::Value =
        serde_json::from_str(&b.ok(&["export_definitions", "-"])).expect("json");
    assert_eq!(
        doc["parameters"],
        serde_json::json!([{"vhost": "lim", "component": "vhost-limits", "name": "limits",
                            "value": {"max-queues": -1}}])
    );
    let _ = b.child.kill();
    let _ = b.child.wait();
    drop(b);
    let b = Broker::start(data);
    assert_eq!(
        b.ok(&["list_vhost_limits", "-p", "lim"]),
        "{\"max-queues\":-1}\n"
    );
    assert_eq!(
        b.ok(&["list_user_limits", "--user", "carol"]),
        "{\"max-channels\":5}\n"
    );
    b.ok(&["clear_vhost_limits", "-p", "lim"]);
    b.ok(&["clear_user_limits", "carol", "all"]);
    assert_eq!(b.ok(&["list_vhost_limits", "--global"]), "vhost\tlimits\n");
    assert_eq!(b.ok(&["list_user_limits", "--global"]), "user\tlimits\n");
}
