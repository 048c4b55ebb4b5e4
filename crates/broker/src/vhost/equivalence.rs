//! Whether a redeclare matches what exists: RabbitMQ's `assert_args_equivalence` and its 406
//! `inequivalent arg` texts. Pure functions of the arguments, with no vhost state.

use warren_protocol::{FieldTable, FieldValue};

use crate::error::{AmqpError, AmqpResult};

/// Queue arguments compared on redeclare, as RabbitMQ's `assert_args_equivalence` does.
const EQUIVALENT_QUEUE_ARGS: &[&str] = &[
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-message-ttl",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
];

/// A stream's (`rabbit_stream_queue`'s `queue_arguments`, in its order).
const EQUIVALENT_STREAM_ARGS: &[&str] = &[
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
];

pub(super) fn check_args_equivalent(
    name: &str,
    vhost: &str,
    got: &FieldTable,
    cur: &FieldTable,
) -> AmqpResult<()> {
    let keys = if crate::queue_type::is_stream(cur) {
        EQUIVALENT_STREAM_ARGS
    } else {
        EQUIVALENT_QUEUE_ARGS
    };
    check_args_equivalent_of("queue", keys, name, vhost, got, cur)
}

/// RabbitMQ's `assert_args_equivalence` over `keys` of a `what` ("queue", "exchange").
pub(super) fn check_args_equivalent_of(
    what: &str,
    keys: &[&str],
    name: &str,
    vhost: &str,
    got: &FieldTable,
    cur: &FieldTable,
) -> AmqpResult<()> {
    for key in keys {
        let (a, b) = (got.get(key), cur.get(key));
        if a == b {
            continue;
        }
        // RabbitMQ takes a missing x-queue-type as 'classic' here.
        if *key == "x-queue-type" {
            let classic = |v: Option<&FieldValue>| matches!(v, Some(FieldValue::LongStr(s)) if &s[..] == b"classic");
            if (a.is_none() && classic(b)) || (classic(a) && b.is_none()) {
                continue;
            }
        }
        let describe = |v: Option<&FieldValue>| match v {
            None => "none".to_string(),
            Some(v) => format!(
                "the value '{}' of type '{}'",
                crate::queue::display_value(v),
                crate::queue::type_name(v)
            ),
        };
        let (ga, gb) = match (a, b) {
            (Some(x), Some(y)) => {
                // Both given: RabbitMQ compares the values only, so integers of any type are
                // equal, as are a longstr and a binary with the same bytes (a `long` from the
                // HTTP API equals a client's `signedint`).
                let ints = x.as_i64().is_some() && x.as_i64() == y.as_i64();
                let strs = matches!(
                    (x, y),
                    (FieldValue::LongStr(p) | FieldValue::Bytes(p), FieldValue::LongStr(q) | FieldValue::Bytes(q)) if p == q
                );
                if ints || strs {
                    continue;
                }
                (
                    format!("'{}'", crate::queue::display_value(x)),
                    format!("'{}'", crate::queue::display_value(y)),
                )
            }
            _ => (describe(a), describe(b)),
        };
        return Err(AmqpError::precondition_failed(format!("inequivalent arg '{key}' for {what} '{name}' in vhost '{vhost}': received {ga} but current is {gb}")));
    }
    Ok(())
}

/// An exchange type as RabbitMQ prints the atom: quoted when it is not a plain atom
/// (`'x-consistent-hash'`), so the 406 text reads `''x-consistent-hash''` as RabbitMQ's does.
pub(super) fn erl_atom(s: &str) -> String {
    let plain = s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@');
    if plain {
        s.to_string()
    } else {
        format!("'{s}'")
    }
}

pub(super) fn inequivalent(
    what: &str,
    arg: &str,
    name: &str,
    vhost: &str,
    got: impl std::fmt::Display,
    cur: impl std::fmt::Display,
) -> AmqpError {
    AmqpError::precondition_failed(format!("inequivalent arg '{arg}' for {what} '{name}' in vhost '{vhost}': received '{got}' but current is '{cur}'"))
}
