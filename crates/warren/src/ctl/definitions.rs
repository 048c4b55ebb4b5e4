//! Definitions in RabbitMQ's JSON format: export_definitions, import_definitions.

use std::io::Write;

use serde_json::Value;

use super::api::{fail, Api, Failure};
use super::view::{info, write_failed};

/// `export_definitions`: to FILE, or to stdout for "-" (then with no banner, so the output
/// is only the JSON).
pub(super) fn export_definitions(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    file: &str,
) -> Result<(), Failure> {
    let defs = api.must(
        "GET",
        "/api/definitions",
        None,
        "the broker has no definitions endpoint".into(),
    )?;
    let text = serde_json::to_string_pretty(&defs).map_err(|e| fail(e.to_string()))?;
    if file == "-" {
        writeln!(out, "{text}").map_err(write_failed)?;
    } else {
        std::fs::write(file, text + "\n").map_err(|e| fail(format!("cannot write {file}: {e}")))?;
        info(quiet, format!("Exported definitions to \"{file}\""));
    }
    Ok(())
}

/// `import_definitions`: from FILE, or from stdin for "-"; checked to be JSON before it is
/// sent.
pub(super) fn import_definitions(api: &Api, quiet: bool, file: &str) -> Result<(), Failure> {
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| fail(format!("reading stdin: {e}")))?
    } else {
        std::fs::read_to_string(file).map_err(|e| fail(format!("cannot read {file}: {e}")))?
    };
    let defs: Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("{file} is not valid JSON: {e}")))?;
    info(quiet, format!("Importing definitions from \"{file}\" ..."));
    api.call("POST", "/api/definitions", Some(&defs), &[])?;
    Ok(())
}
