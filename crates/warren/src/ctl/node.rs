//! The node itself, through `/api/warren/…` (what only rabbitmqctl does): stop_app,
//! start_app, status, environment, set_vm_memory_high_watermark.

use std::io::Write;

use serde_json::{json, Value};

use super::api::{Api, Failure};
use super::view::{info, list, write_failed};

/// `stop_app`: AMQP stops being served; the process and its HTTP API stay.
pub(super) fn stop_app(api: &Api, quiet: bool) -> Result<(), Failure> {
    info(
        quiet,
        format!(
            "Stopping rabbit application on node {} ...",
            api.node_name()?
        ),
    );
    api.must(
        "POST",
        "/api/warren/stop_app",
        None,
        "the broker has no stop_app endpoint".into(),
    )?;
    Ok(())
}

pub(super) fn start_app(api: &Api, quiet: bool) -> Result<(), Failure> {
    info(quiet, format!("Starting node {} ...", api.node_name()?));
    api.must(
        "POST",
        "/api/warren/start_app",
        None,
        "the broker has no start_app endpoint".into(),
    )?;
    Ok(())
}

pub(super) fn status(api: &Api, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    let s = api.must(
        "GET",
        "/api/warren/status",
        None,
        "the broker has no status endpoint".into(),
    )?;
    let node = s.get("node").and_then(Value::as_str).unwrap_or("");
    info(quiet, format!("Status of node {node} ..."));
    write!(out, "{}", status_text(&s)).map_err(write_failed)
}

pub(super) fn environment(api: &Api, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    let env = api.must(
        "GET",
        "/api/warren/environment",
        None,
        "the broker has no environment endpoint".into(),
    )?;
    info(
        quiet,
        format!("Application environment of node {} ...", api.node_name()?),
    );
    writeln!(out, "{}", environment_text(&env)).map_err(write_failed)
}

/// `set_vm_memory_high_watermark`: the arguments are checked here first (exit 65), as
/// rabbitmqctl checks them.
pub(super) fn set_vm_memory_high_watermark(
    api: &Api,
    quiet: bool,
    args: &[String],
) -> Result<(), Failure> {
    let (body, shown) = watermark_arg(args)?;
    info(
        quiet,
        format!(
            "Setting memory threshold on {} to {shown} ...",
            api.node_name()?
        ),
    );
    api.must(
        "PUT",
        "/api/warren/vm_memory_high_watermark",
        Some(&body),
        "the broker has no vm_memory_high_watermark endpoint".into(),
    )?;
    Ok(())
}

/// Bytes as rabbitmqctl's status prints them: gigabytes (10^9) to 4 decimals.
fn gb(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("{:?} gb", (b as f64 / 1e9 * 10_000.0).round() / 10_000.0),
        None => "unknown".into(),
    }
}

/// The number at `path` in `v`, if there is one.
fn num(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

/// The value at `path` in `v` as text (a string unquoted); empty if there is none.
fn text(v: &Value, path: &[&str]) -> String {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

/// `rabbitmqctl status`'s sections, from `/api/warren/status`.
fn status_text(s: &Value) -> String {
    let mut o = String::new();
    status_runtime(&mut o, s);
    status_alarms(&mut o, s);
    status_memory(&mut o, s);
    status_resources(&mut o, s);
    status_listeners(&mut o, s);
    o
}

/// status' Runtime section.
fn status_runtime(o: &mut String, s: &Value) {
    o.push_str("Runtime\n\n");
    o.push_str(&format!("OS PID: {}\n", text(s, &["os_pid"])));
    o.push_str("OS: Linux\n");
    o.push_str(&format!("Uptime (seconds): {}\n", text(s, &["uptime_s"])));
    o.push_str("Is under maintenance?: false\n");
    o.push_str(&format!(
        "RabbitMQ version: {}\n",
        text(s, &["rabbitmq_version"])
    ));
    o.push_str(&format!("Node name: {}\n", text(s, &["node"])));
    o.push_str(&format!(
        "Warren version: {}\n",
        text(s, &["warren_version"])
    ));
}

/// status' Alarms section.
fn status_alarms(o: &mut String, s: &Value) {
    let node = text(s, &["node"]);
    o.push_str("\nAlarms\n\n");
    let alarm = |k: &str| s.get("alarms").and_then(|a| a.get(k)) == Some(&Value::Bool(true));
    if !alarm("memory") && !alarm("disk") {
        o.push_str("(none)\n");
    }
    if alarm("disk") {
        o.push_str(&format!("Free disk space alarm on node {node}\n"));
    }
    if alarm("memory") {
        o.push_str(&format!("Memory alarm on node {node}\n"));
    }
}

/// status' Memory section.
fn status_memory(o: &mut String, s: &Value) {
    o.push_str("\nMemory\n\n");
    o.push_str(&format!(
        "Total memory used: {}\n",
        gb(num(s, &["memory", "used_bytes"]))
    ));
    o.push_str(&format!(
        "Calculation strategy: {}\n",
        text(s, &["memory", "strategy"])
    ));
    let limit = gb(num(s, &["memory", "limit_bytes"]));
    let setting = match s.get("memory").and_then(|m| m.get("watermark")) {
        Some(w) if w.get("absolute").is_some() => gb(num(w, &["absolute"])),
        Some(w) => format!("{} of available memory", text(w, &["fraction"])),
        None => String::new(),
    };
    o.push_str(&format!(
        "Memory high watermark setting: {setting}, computed to: {limit}\n"
    ));
}

/// status' File Descriptors, Free Disk Space and Totals sections.
fn status_resources(o: &mut String, s: &Value) {
    o.push_str("\nFile Descriptors\n\n");
    o.push_str(&format!(
        "Total: {}, limit: {}\n",
        text(s, &["file_descriptors", "open"]),
        text(s, &["file_descriptors", "limit"])
    ));
    o.push_str("\nFree Disk Space\n\n");
    o.push_str(&format!(
        "Low free disk space watermark: {}\n",
        gb(num(s, &["disk", "limit_bytes"]))
    ));
    o.push_str(&format!(
        "Free disk space: {}\n",
        gb(num(s, &["disk", "free_bytes"]))
    ));
    o.push_str("\nTotals\n\n");
    o.push_str(&format!(
        "Connection count: {}\n",
        text(s, &["totals", "connections"])
    ));
    o.push_str(&format!(
        "Queue count: {}\n",
        text(s, &["totals", "queues"])
    ));
    o.push_str(&format!(
        "Virtual host count: {}\n",
        text(s, &["totals", "vhosts"])
    ));
}

/// status' Listeners section.
fn status_listeners(o: &mut String, s: &Value) {
    o.push_str("\nListeners\n\n");
    for l in list(s.get("listeners").cloned()) {
        o.push_str(&format!(
            "Interface: {}, port: {}, protocol: {}, purpose: {}\n",
            text(&l, &["interface"]),
            text(&l, &["port"]),
            text(&l, &["protocol"]),
            text(&l, &["purpose"])
        ));
    }
}

/// `rabbitmqctl environment`'s layout of `[[app, [[key, term], …]], …]`.
fn environment_text(env: &Value) -> String {
    let apps: Vec<String> = list(Some(env.clone()))
        .iter()
        .map(|a| {
            let name = a.get(0).and_then(Value::as_str).unwrap_or("");
            let keys: Vec<String> = list(a.get(1).cloned())
                .iter()
                .map(|kv| {
                    format!(
                        "{{{},{}}}",
                        kv.get(0).and_then(Value::as_str).unwrap_or(""),
                        kv.get(1).and_then(Value::as_str).unwrap_or("")
                    )
                })
                .collect();
            format!("{{{name},\n     [{}]}}", keys.join(",\n      "))
        })
        .collect();
    format!("[{}]", apps.join(",\n "))
}

/// `set_vm_memory_high_watermark`'s arguments, checked as rabbitmqctl checks them (exit 65):
/// the request body, and the value as its banner shows it.
fn watermark_arg(args: &[String]) -> Result<(Value, String), Failure> {
    match args {
        [f] => match f.parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Ok((json!({ "fraction": x }), f.clone())),
            Ok(_) => Err(bad_argument(
                ": The threshold should be a fraction between 0.0 and 1.0",
            )),
            Err(_) => Err(bad_argument(".")),
        },
        [a, v] if a == "absolute" => {
            let bytes = absolute_bytes(v)?;
            Ok((json!({ "absolute": bytes }), format!("{v} bytes")))
        }
        _ => Err(bad_argument(": give FRACTION or absolute BYTES")),
    }
}

/// The bytes `absolute BYTES` names: digits, then a unit (k kiB M MiB G GiB = powers of
/// 1024, kB MB GB = of 1000); more than 0.
fn absolute_bytes(v: &str) -> Result<u64, Failure> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = v.split_at(digits);
    let Ok(n) = num.parse::<u64>() else {
        return Err(bad_argument("."));
    };
    let scale: u64 = match unit {
        "" => 1,
        "k" | "kiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u if u.starts_with('.') => {
            return Err(bad_argument(": The threshold should be an integer."))
        }
        _ => return Err(bad_argument(": Invalid units.")),
    };
    match n.checked_mul(scale) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(bad_argument(".")),
    }
}

/// An argument rabbitmqctl rejects too: exit status 65, its "Bad argument" wording.
fn bad_argument(why: &str) -> Failure {
    Failure {
        code: 65,
        message: format!("Bad argument{why}"),
    }
}
