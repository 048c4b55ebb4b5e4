//! `x-queue-type`: `classic`, `stream` (`queue/stream/`) and `quorum` (RabbitMQ's validation:
//! durable, not exclusive, not auto-delete). In a cluster a quorum queue is replicated
//! (`cluster/quorum/`); on a single node there is nothing to replicate to, and it is a durable
//! classic queue.

use warren_protocol::{FieldTable, FieldValue};

use crate::error::{AmqpError, AmqpResult};
use crate::queue::QueueArgs;
use crate::vhost::QueueSpec;

/// Arguments a queue type refuses: RabbitMQ 3.10 answers 406 `invalid arg 'K' for queue 'q' in
/// vhost '/' of queue type rabbit_classic_queue` (checked before the arguments' values).
const NOT_FOR_CLASSIC: &[&str] = &[
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-delivery-limit",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
    "x-dead-letter-strategy",
];
const NOT_FOR_QUORUM: &[&str] = &[
    "x-queue-mode",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-master-locator",
];
const NOT_FOR_STREAM: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-dead-letter-strategy",
    "x-queue-master-locator",
];

/// Validates a new queue's `x-queue-type` against its name, properties and arguments, and the
/// arguments only a declare checks (a recovered queue is not checked again), in RabbitMQ's words.
/// Returns the parsed arguments of a queue that may be declared.
/// Quorum queues take `x-max-priority` (RabbitMQ 4.3's quorum queue priorities, which their
/// replicated queue machine keeps; 3.10 refuses it).
pub fn check(spec: &QueueSpec<'_>, vhost: &str) -> AmqpResult<QueueArgs> {
    let what = format!("queue '{}' in vhost '{vhost}'", spec.name);
    let kind = match spec.arguments.get("x-queue-type") {
        None => "classic".to_string(),
        Some(FieldValue::LongStr(b)) => String::from_utf8_lossy(b).into_owned(),
        // rabbit_channel looks a server-named queue's type up first and crashes on one it does
        // not know: the connection is closed with a bare 541.
        Some(_) if spec.server_named => return Err(crash()),
        Some(v) => {
            return Err(AmqpError::precondition_failed(format!(
                "invalid arg 'x-queue-type' for {what}: {{unacceptable_type,{}}}",
                crate::queue::type_name(v)
            )))
        }
    };
    let (refused, module): (&[&str], &str) = match kind.as_str() {
        "classic" => (NOT_FOR_CLASSIC, "rabbit_classic_queue"),
        "quorum" => (NOT_FOR_QUORUM, "rabbit_quorum_queue"),
        "stream" => (NOT_FOR_STREAM, "rabbit_stream_queue"),
        _ if spec.server_named => return Err(crash()),
        _ => ([].as_slice(), ""),
    };
    if spec.server_named && kind != "classic" {
        return Err(AmqpError::precondition_failed(format!(
            "Cannot declare a server-named queue for type {module}"
        )));
    }
    // The values of the arguments this type takes are checked first, then the ones it refuses.
    let refused_key = spec
        .arguments
        .0
        .iter()
        .find(|(k, _)| refused.contains(&&**k));
    let args = if refused_key.is_some() {
        let mut taken = spec.arguments.clone();
        taken.0.retain(|(k, _)| !refused.contains(&&**k));
        check_declare_only(&taken, &what)?;
        QueueArgs::parse(&taken, &what)?
    } else {
        check_declare_only(spec.arguments, &what)?;
        QueueArgs::parse(spec.arguments, &what)?
    };
    if let Some((k, _)) = refused_key {
        return Err(AmqpError::precondition_failed(format!(
            "invalid arg '{}' for {what} of queue type {module}",
            &**k
        )));
    }
    match kind.as_str() {
        "classic" => return Ok(args),
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
    if kind == "stream" {
        check_stream_args(spec.arguments, &what)?;
    } else {
        crate::queue::args::initial_group_size(spec.arguments)?;
        check_leader_locator(spec.arguments, &what)?;
    }
    Ok(args)
}

/// RabbitMQ 3.10's checks of a stream's own arguments (`rabbit_stream_queue`), in its words.
fn check_stream_args(args: &FieldTable, what: &str) -> AmqpResult<()> {
    let invalid = |key: &str, why: String| {
        AmqpError::precondition_failed(format!("invalid arg '{key}' for {what}: {why}"))
    };
    let unacceptable = |key: &str, v: &FieldValue| {
        invalid(
            key,
            format!("{{unacceptable_type,{}}}", crate::queue::type_name(v)),
        )
    };
    let non_neg = |key: &str, zero_ok: bool| -> AmqpResult<()> {
        match args.get(key) {
            None => Ok(()),
            Some(v) => match v.as_i64() {
                None => Err(invalid(
                    key,
                    format!("\"expected integer, got {}\"", crate::queue::type_name(v)),
                )),
                Some(n) if n < 0 => Err(invalid(key, format!("{{value_negative,{n}}}"))),
                Some(0) if !zero_ok => Err(invalid(key, "{value_zero,0}".to_string())),
                Some(_) => Ok(()),
            },
        }
    };
    non_neg("x-max-length-bytes", true)?;
    non_neg("x-stream-max-segment-size-bytes", true)?;
    non_neg("x-initial-cluster-size", false)?;
    match args.get("x-max-age") {
        None => {}
        Some(FieldValue::LongStr(b)) => {
            match crate::queue::stream::parse_age(&String::from_utf8_lossy(b)) {
                Ok(_) => {}
                Err(crate::queue::stream::BadAge::NoDigits) => return Err(crash()),
                Err(crate::queue::stream::BadAge::Invalid) => {
                    return Err(invalid("x-max-age", "invalid_max_age".to_string()))
                }
            }
        }
        Some(v) => return Err(unacceptable("x-max-age", v)),
    }
    check_leader_locator(args, what)
}

/// `x-queue-leader-locator` of a quorum queue or a stream, as RabbitMQ 3.10 checks it
/// (`random` and `least-leaders` are its older names of `balanced`).
fn check_leader_locator(args: &FieldTable, what: &str) -> AmqpResult<()> {
    let why = match args.get("x-queue-leader-locator") {
        None => return Ok(()),
        Some(FieldValue::LongStr(b))
            if matches!(
                &b[..],
                b"client-local" | b"balanced" | b"random" | b"least-leaders"
            ) =>
        {
            return Ok(())
        }
        Some(FieldValue::LongStr(_)) => "invalid_queue_locator_arg".to_string(),
        Some(v) => format!("{{unacceptable_type,{}}}", crate::queue::type_name(v)),
    };
    Err(AmqpError::precondition_failed(format!(
        "invalid arg 'x-queue-leader-locator' for {what}: {why}"
    )))
}

/// rabbit_channel's bare 541 when its own code crashes (the connection is closed).
fn crash() -> AmqpError {
    AmqpError {
        code: warren_protocol::reply::INTERNAL_ERROR,
        text: "INTERNAL_ERROR".into(),
        class_id: 0,
        method_id: 0,
    }
}

/// Checks RabbitMQ makes of a declare's arguments that a queue does not otherwise act on, so a
/// recovered queue declared before they existed here is not refused at boot.
fn check_declare_only(args: &FieldTable, what: &str) -> AmqpResult<()> {
    let invalid = |key: &str, why: String| {
        AmqpError::precondition_failed(format!("invalid arg '{key}' for {what}: {why}"))
    };
    if let Some(FieldValue::LongStr(_)) = args.get("x-dead-letter-routing-key") {
        if args.get("x-dead-letter-exchange").is_none() {
            return Err(invalid(
                "x-dead-letter-routing-key",
                "routing_key_but_no_dlx_defined".to_string(),
            ));
        }
    }
    match args.get("x-queue-mode") {
        None => {}
        Some(FieldValue::LongStr(b)) if &b[..] == b"default" || &b[..] == b"lazy" => {}
        Some(FieldValue::LongStr(b)) => {
            return Err(invalid(
                "x-queue-mode",
                format!(
                    "\"unsupported queue mode '{}'\"",
                    String::from_utf8_lossy(b)
                ),
            ))
        }
        Some(v) => {
            return Err(invalid(
                "x-queue-mode",
                format!("{{unacceptable_type,{}}}", crate::queue::type_name(v)),
            ))
        }
    }
    Ok(())
}
