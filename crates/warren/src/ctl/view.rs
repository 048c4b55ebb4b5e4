//! Output as rabbitmqctl prints it: banners on stderr, tab-separated tables on stdout, JSON
//! values as table cells and Erlang terms.

use std::io::Write;

use serde_json::Value;

use super::api::{fail, Failure};

/// What the global output flags ask for.
#[derive(Clone, Copy)]
pub(super) struct View {
    /// No informational banner lines.
    pub(super) quiet: bool,
    /// Listings start with their header line.
    pub(super) headers: bool,
}

/// An informational banner ("Listing …"): on stderr, so stdout stays parseable; none if quiet.
pub(super) fn info(quiet: bool, s: String) {
    if !quiet {
        eprintln!("{s}");
    }
}

/// The failure for output that could not be written.
pub(super) fn write_failed(e: std::io::Error) -> Failure {
    fail(format!("writing output: {e}"))
}

/// A JSON value as rabbitmqctl prints it in a table cell.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            let items: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            format!("[{}]", items.join(", "))
        }
        Some(Value::Object(o)) if o.is_empty() => "[]".into(),
        Some(other) => other.to_string(),
    }
}

/// Whether listings print their header line (-s and --no-table-headers drop it).
pub(super) static HEADERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Prints `rows` as a table of `columns` (a header line first, unless -s or
/// --no-table-headers); `lookup` gives a row's value for a column.
pub(super) fn table(
    out: &mut impl Write,
    columns: &[&str],
    rows: &[Value],
    lookup: impl Fn(&Value, &str) -> Option<Value>,
) -> Result<(), Failure> {
    if HEADERS.load(std::sync::atomic::Ordering::Relaxed) {
        writeln!(out, "{}", columns.join("\t")).map_err(write_failed)?;
    }
    for r in rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| cell(lookup(r, c).as_ref()))
            .collect();
        writeln!(out, "{}", cells.join("\t")).map_err(write_failed)?;
    }
    Ok(())
}

/// The columns a listing prints: those `given` (each one of `known`), or `default`.
pub(super) fn columns<'a>(
    given: &'a [String],
    default: &[&'a str],
    known: &[&str],
    what: &str,
) -> Result<Vec<&'a str>, Failure> {
    let cols: Vec<&str> = if given.is_empty() {
        default.to_vec()
    } else {
        given.iter().map(String::as_str).collect()
    };
    for c in &cols {
        if !known.contains(c) {
            return Err(fail(format!(
                "unknown {what} column '{c}'; known: {}",
                known.join(", ")
            )));
        }
    }
    Ok(cols)
}

/// A JSON array's items; anything else (a 404's `None` included) is no items.
pub(super) fn list(v: Option<Value>) -> Vec<Value> {
    match v {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    }
}

/// A row's value for a column of the same name (the usual `table` lookup).
pub(super) fn field(r: &Value, c: &str) -> Option<Value> {
    r.get(c).cloned()
}

/// A value of `/api/warren/…` as rabbitmqctl prints the Erlang term: a table
/// (`{"table": [[k, v], …]}`) is `[{"k",v},…]`, a list `[v,…]`, a string `"…"`.
pub(super) fn erlang_term(v: &Value) -> String {
    match v {
        Value::Object(o) => match o.get("table") {
            Some(Value::Array(pairs)) => {
                let items: Vec<String> = pairs
                    .iter()
                    .map(|p| match p.as_array().map(Vec::as_slice) {
                        Some([k, v]) => format!(
                            "{{{},{}}}",
                            erlang_string(k.as_str().unwrap_or("")),
                            erlang_term(v)
                        ),
                        _ => erlang_term(p),
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => v.to_string(),
        },
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(erlang_term).collect::<Vec<_>>().join(",")
        ),
        Value::String(s) => erlang_string(s),
        Value::Null => "undefined".into(),
        other => other.to_string(),
    }
}

/// A string as an Erlang string literal.
fn erlang_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
