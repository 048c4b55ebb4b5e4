//! `x-queue-type`: `classic` is what Warren has; `quorum` and `stream` are accepted with
//! RabbitMQ's validation (durable, not exclusive, not auto-delete) and served by a durable
//! classic queue until replication exists (a log line says so).

use warren_protocol::FieldValue;

use crate::error::{AmqpError, AmqpResult};
use crate::vhost::QueueSpec;

/// Validates a new queue's `x-queue-type` against its properties, in RabbitMQ's words.
pub fn check(spec: &QueueSpec<'_>, vhost: &str) -> AmqpResult<()> {
    let what = format!("queue '{}' in vhost '{vhost}'", spec.name);
    let kind = match spec.arguments.get("x-queue-type") {
        None => return Ok(()),
        Some(FieldValue::LongStr(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(v) => {
            return Err(AmqpError::precondition_failed(format!(
                "invalid arg 'x-queue-type' for {what}: {{unacceptable_type,{}}}",
                crate::queue::type_name(v)
            )))
        }
    };
    match kind.as_str() {
        "classic" => return Ok(()),
        "quorum" | "stream" => {}
        other => {
            return Err(AmqpError::precondition_failed(format!(
                "invalid arg 'x-queue-type' for {what}: \"unsupported queue type '{other}'\""
            )))
        }
    }
    let bad = |p: &str| {
        Err(AmqpError::precondition_failed(format!(
            "invalid property '{p}' for {what}"
        )))
    };
    if !spec.durable {
        return bad("non-durable");
    }
    if spec.exclusive {
        return bad("exclusive-owner");
    }
    if spec.auto_delete {
        return bad("auto-delete");
    }
    tracing::info!(vhost, queue = spec.name, queue_type = %kind, "queue type served by a durable classic queue (no replication yet)");
    Ok(())
}
