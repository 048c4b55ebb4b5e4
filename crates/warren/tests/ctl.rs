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
    amqp: u16,
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
                // Every node name in ctl's output comes from here.
                "--node-name",
                "warren@testhost",
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
        Broker {
            child,
            amqp,
            http,
            data,
        }
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

// ---- rabbitmqctl stand-in: node names, connections, channels, consumers, stop/start ----

use warren_perf::client::{ClientError, Conn};
use warren_perf::uri::AmqpUri;

/// A runtime for the AMQP clients these tests hold while `warren ctl` runs beside them.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

impl Broker {
    fn uri(&self, vhost: &str) -> AmqpUri {
        AmqpUri {
            host: "127.0.0.1".into(),
            port: self.amqp,
            user: "guest".into(),
            password: "guest".into(),
            vhost: vhost.into(),
        }
    }

    /// An open AMQP connection (warren-perf's client) named `name`, with channel 1 open.
    fn connect(&self, rt: &tokio::runtime::Runtime, name: &str, vhost: &str) -> Conn {
        rt.block_on(async {
            let mut c = Conn::open(&self.uri(vhost), name).await.expect("connect");
            c.channel_open(1).await.expect("channel.open");
            c
        })
    }

    /// Runs a command that must fail with `code`; returns its stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let o = self.ctl(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        err
    }
}

/// What the broker closed `c` with, seen by the client's next request: (code, text). The
/// close is asynchronous (as rabbitmqctl's): a request that reached the connection before the
/// close signal is answered, so a few more are tried, for at most 2 s.
fn closed_with(rt: &tokio::runtime::Runtime, c: &mut Conn) -> (u16, String) {
    for ch in 2..42 {
        match rt.block_on(c.channel_open(ch)) {
            Err(ClientError::Closed {
                what: "connection",
                code,
                text,
            }) => return (code, text),
            Ok(()) => std::thread::sleep(std::time::Duration::from_millis(50)),
            other => panic!("expected connection.close, got {other:?}"),
        }
    }
    panic!("the connection was not closed within 2 s");
}

/// `-n rabbit@host`, as scripts pass it to rabbitmqctl, is an Erlang node name: accepted and
/// ignored. `-n HOST[:PORT]` keeps naming the management API.
#[test]
fn node_names_are_accepted_and_ignored() {
    let dir = tempdir("node");
    let b = Broker::start(dir.join("data"));
    let url = format!("http://127.0.0.1:{}", b.http);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_warren"))
            .arg("ctl")
            .args(args)
            .output()
            .expect("runs")
    };
    for args in [
        vec!["-n", "rabbit@myhost", "--url", &url, "list_vhosts"],
        vec!["--url", &url, "list_vhosts", "-n", "rabbit@myhost"],
        vec![
            "--url",
            &url,
            "--node",
            "rabbit@myhost",
            "-q",
            "list_vhosts",
        ],
    ] {
        let o = run(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout), "name\n/\n");
    }
    let host = format!("127.0.0.1:{}", b.http);
    let o = run(&["-n", &host, "list_vhosts"]);
    assert!(o.status.success());
    let o = run(&["-n", &host, "--url", &url, "list_vhosts"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give one"));
    let help = run(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("Erlang node name"));
}

#[test]
fn connections_channels_and_consumers_list_as_rabbitmqctl_prints_them() {
    let dir = tempdir("lists");
    let b = Broker::start(dir.join("data"));
    let rt = runtime();
    let mut consumer = b.connect(&rt, "ctl-consumer", "/");
    let queue = rt.block_on(async {
        consumer.basic_qos(5).await.expect("qos");
        let q = consumer
            .queue_declare("", false, true, &warren_protocol::FieldTable::new())
            .await
            .expect("declare");
        consumer
            .basic_consume(&q, false, &Default::default())
            .await
            .expect("consume");
        q
    });
    let mut confirming = b.connect(&rt, "ctl-confirms", "/");
    rt.block_on(confirming.confirm_select())
        .expect("confirm.select");

    let out = b.ok(&[
        "list_connections",
        "pid",
        "name",
        "client_properties",
        "user",
    ]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows[0], ["pid", "name", "client_properties", "user"]);
    assert_eq!(rows.len(), 3, "{out}");
    let version = env!("CARGO_PKG_VERSION");
    let mut pids = Vec::new();
    for (row, name) in rows[1..].iter().zip(["ctl-consumer", "ctl-confirms"]) {
        // An Erlang pid's form: <node.1.N.0>.
        let pid = row[0];
        assert!(
            pid.starts_with("<warren@testhost.1.") && pid.ends_with(".0>"),
            "{pid}"
        );
        assert!(
            row[1].starts_with("127.0.0.1:")
                && row[1].ends_with(&format!(" -> 127.0.0.1:{}", b.amqp))
        );
        // In the client's order, as rabbitmqctl prints them.
        assert_eq!(
            row[2],
            format!(
                "[{{\"product\",\"warren-perf\"}},{{\"version\",\"{version}\"}},\
                 {{\"connection_name\",\"{name}\"}},{{\"capabilities\",[{{\"publisher_confirms\",true}},\
                 {{\"basic.nack\",true}},{{\"consumer_cancel_notify\",true}},\
                 {{\"connection.blocked\",true}},{{\"authentication_failure_close\",true}}]}}]"
            )
        );
        assert_eq!(row[3], "guest");
        pids.push(pid.to_string());
    }
    let out = b.ok(&[
        "list_connections",
        "protocol",
        "channels",
        "ssl",
        "timeout",
        "state",
    ]);
    assert_eq!(
        out,
        "protocol\tchannels\tssl\ttimeout\tstate\n{0,9,1}\t1\tfalse\t0\trunning\n{0,9,1}\t1\tfalse\t0\trunning\n"
    );

    let channel_pid = |conn_pid: &str| conn_pid.replace(".0>", ".1>");
    assert_eq!(
        b.ok(&["list_channels"]),
        format!(
            "pid\tuser\tconsumer_count\tmessages_unacknowledged\n{}\tguest\t1\t0\n{}\tguest\t0\t0\n",
            channel_pid(&pids[0]),
            channel_pid(&pids[1])
        )
    );
    assert_eq!(
        b.ok(&[
            "list_channels",
            "connection",
            "number",
            "prefetch_count",
            "global_prefetch_count",
            "confirm",
            "transactional"
        ]),
        format!(
            "connection\tnumber\tprefetch_count\tglobal_prefetch_count\tconfirm\ttransactional\n\
             {}\t1\t5\t0\tfalse\tfalse\n{}\t1\t0\t0\ttrue\tfalse\n",
            pids[0], pids[1]
        )
    );

    let out = b.ok(&["list_consumers"]);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("queue_name\tchannel_pid\tconsumer_tag\tack_required\tprefetch_count\tactive\targuments")
    );
    let row: Vec<&str> = lines.next().expect("a consumer").split('\t').collect();
    assert_eq!(row[0], queue);
    assert_eq!(row[1], channel_pid(&pids[0]));
    assert!(row[2].starts_with("amq.ctag-"), "{}", row[2]);
    assert_eq!(row[3..], ["true", "5", "true", "[]"]);
    assert_eq!(lines.next(), None);
    assert_eq!(
        b.ok(&["list_consumers", "-p", "/", "queue_name", "activity_status"]),
        format!("queue_name\tactivity_status\n{queue}\tup\n")
    );
    // -s: neither banner nor header, as rabbitmqctl's --silent.
    let o = b.ctl(&["-s", "list_consumers", "consumer_tag"]);
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("amq.ctag-"));
    b.fails(&["list_consumers", "-p", "nowhere"], 1);
    b.fails(&["list_channels", "bogus"], 1);
}

#[test]
fn close_connection_by_pid_or_name_and_close_all() {
    let dir = tempdir("close");
    let b = Broker::start(dir.join("data"));
    b.ok(&["add_vhost", "other"]);
    let rt = runtime();
    let mut by_pid = b.connect(&rt, "by-pid", "/");
    let mut by_name = b.connect(&rt, "by-name", "/");
    let out = b.ok(&["-q", "list_connections", "pid", "name", "client_properties"]);
    let find = |conn: &str| -> (String, String) {
        let row = out
            .lines()
            .find(|l| l.contains(&format!("\"connection_name\",\"{conn}\"")))
            .expect("listed");
        let mut cells = row.split('\t');
        let pid = cells.next().expect("pid").to_string();
        (pid, cells.next().expect("name").to_string())
    };
    let (pid, _) = find("by-pid");
    let (_, name) = find("by-name");
    b.ok(&["close_connection", &pid, "maintenance window"]);
    assert_eq!(
        closed_with(&rt, &mut by_pid),
        (320, "CONNECTION_FORCED - maintenance window".to_string())
    );
    b.ok(&["close_connection", &name, "by its name"]);
    assert_eq!(
        closed_with(&rt, &mut by_name),
        (320, "CONNECTION_FORCED - by its name".to_string())
    );
    let err = b.fails(&["close_connection", &pid, "again"], 1);
    assert!(
        err.contains(&format!("connection '{pid}' does not exist")),
        "{err}"
    );

    let mut in_root: Vec<Conn> = (0..2)
        .map(|i| b.connect(&rt, &format!("root-{i}"), "/"))
        .collect();
    let mut in_other = b.connect(&rt, "other", "other");
    let o = b.ctl(&["close_all_connections", "bye all"]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Closed 2 connections\n");
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("Closing all connections in vhost /, reason: bye all..."));
    for c in &mut in_root {
        assert_eq!(
            closed_with(&rt, c),
            (320, "CONNECTION_FORCED - bye all".to_string())
        );
    }
    assert_eq!(
        b.ok(&["close_all_connections", "--global", "everyone"]),
        "Closed 1 connections\n"
    );
    assert_eq!(
        closed_with(&rt, &mut in_other),
        (320, "CONNECTION_FORCED - everyone".to_string())
    );
}

/// stop_app closes every connection with 320 and refuses new ones while the HTTP API keeps
/// answering; start_app serves again on the same port with everything durable still there.
#[test]
fn stop_app_and_start_app() {
    let dir = tempdir("app");
    let b = Broker::start(dir.join("data"));
    let rt = runtime();
    let mut held = b.connect(&rt, "held", "/");
    rt.block_on(held.queue_declare("kept", true, false, &warren_protocol::FieldTable::new()))
        .expect("declare");
    let o = b.ctl(&["stop_app"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("Stopping rabbit application on node warren@testhost ..."));
    assert_eq!(
        closed_with(&rt, &mut held),
        (
            320,
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
                .to_string()
        )
    );
    let refused = TcpStream::connect(("127.0.0.1", b.amqp));
    assert!(refused.is_err(), "AMQP still accepting after stop_app");
    // The management API keeps serving, and the queue is still there.
    assert_eq!(b.ok(&["list_queues"]), "name\tmessages\nkept\t0\n");
    let status = b.ok(&["status"]);
    assert!(!status.contains("protocol: amqp,"), "{status}");
    assert!(status.contains("protocol: http,"), "{status}");
    assert_eq!(
        b.ok(&["list_connections"]),
        "user\tpeer_host\tpeer_port\tstate\n"
    );
    // Twice is no error, as in RabbitMQ.
    b.ok(&["stop_app"]);

    let o = b.ctl(&["start_app"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Starting node warren@testhost ..."));
    let mut again = b.connect(&rt, "again", "/");
    assert!(rt
        .block_on(again.exists(Some("kept"), None))
        .expect("passive declare"));
    let status = b.ok(&["status"]);
    assert!(
        status.contains(&format!(
            "Interface: 127.0.0.1, port: {}, protocol: amqp,",
            b.amqp
        )),
        "{status}"
    );
    b.ok(&["start_app"]);
}

#[test]
fn status_environment_and_memory_watermark() {
    let dir = tempdir("status");
    let b = Broker::start(dir.join("data"));
    let o = b.ctl(&["status"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Status of node warren@testhost ..."));
    let status = String::from_utf8_lossy(&o.stdout).into_owned();
    for line in [
        "Runtime\n\nOS PID: ",
        "RabbitMQ version: 3.10.8\n",
        "Node name: warren@testhost\n",
        "Alarms\n\n(none)\n",
        "Calculation strategy: rss\n",
        "Memory high watermark setting: 0.4 of available memory, computed to: ",
        "Low free disk space watermark: 0.05 gb\n",
        "Connection count: 0\nQueue count: 0\nVirtual host count: 1\n",
        &format!(
            "Interface: 127.0.0.1, port: {}, protocol: http, purpose: HTTP API\n",
            b.http
        ),
        // What Warren serves there: AMQP 0-9-1 only (RabbitMQ's line adds AMQP 1.0).
        &format!(
            "Interface: 127.0.0.1, port: {}, protocol: amqp, purpose: AMQP 0-9-1\n",
            b.amqp
        ),
    ] {
        assert!(status.contains(line), "{line:?} missing from:\n{status}");
    }
    let env = b.ok(&["environment"]);
    assert!(
        env.starts_with("[{rabbit,\n     [{channel_max,2047},\n"),
        "{env}"
    );
    assert!(
        env.contains("\n      {vm_memory_high_watermark,0.4}]},\n"),
        "{env}"
    );
    assert!(
        env.contains(&format!("{{tcp_listeners,[{{\"127.0.0.1\",{}}}]}}", b.amqp)),
        "{env}"
    );
    assert!(env.ends_with("]}]\n"), "{env}");

    // The threshold changes at once: a zero watermark is always exceeded.
    let o = b.ctl(&["set_vm_memory_high_watermark", "0"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("Setting memory threshold on warren@testhost to 0 ..."));
    assert!(b
        .ok(&["status"])
        .contains("Alarms\n\nMemory alarm on node warren@testhost\n"));
    b.ok(&["set_vm_memory_high_watermark", "0.4"]);
    assert!(b.ok(&["status"]).contains("Alarms\n\n(none)\n"));
    let o = b.ctl(&["set_vm_memory_high_watermark", "absolute", "2GB"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("to 2GB bytes ..."));
    assert!(b
        .ok(&["status"])
        .contains("Memory high watermark setting: 2.0 gb, computed to: 2.0 gb\n"));
    assert!(b
        .ok(&["environment"])
        .contains("{vm_memory_high_watermark,{absolute,2000000000}}"));
    b.ok(&["set_vm_memory_high_watermark", "absolute", "1k"]);
    assert!(b.ok(&["environment"]).contains("{absolute,1024}"));
    for (args, text) in [
        (
            vec!["set_vm_memory_high_watermark", "1.5"],
            "Error (argument validation): Bad argument: The threshold should be a fraction between 0.0 and 1.0",
        ),
        (vec!["set_vm_memory_high_watermark", "abc"], "Bad argument."),
        (
            vec!["set_vm_memory_high_watermark", "absolute", "1.5GB"],
            "The threshold should be an integer.",
        ),
        (
            vec!["set_vm_memory_high_watermark", "absolute", "10XB"],
            "Invalid units.",
        ),
    ] {
        let err = b.fails(&args, 65);
        assert!(err.contains(text), "{args:?}: {err}");
    }
}
