//! Queue arguments (`x-…`) with RabbitMQ's meaning and validation: a wrong type or value is a
//! 406 naming the argument, in RabbitMQ's words.

use warren_protocol::{FieldTable, FieldValue};

use crate::error::{AmqpError, AmqpResult};

/// What happens to a publish into a full queue (`x-overflow`).
pub use warren_queue::Overflow;

/// The parsed arguments a queue acts on. Absent arguments cost nothing on the message path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueArgs {
    /// `x-max-length`, `x-max-length-bytes`: limits on ready messages.
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    /// `x-message-ttl` in ms.
    pub message_ttl_ms: Option<u64>,
    /// `x-max-priority`: number of priority levels above 0.
    pub max_priority: Option<u8>,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    /// `x-expires` in ms: the queue is deleted after being unused this long.
    pub expires_ms: Option<u64>,
    /// `x-single-active-consumer`: only one consumer receives at a time.
    pub single_active_consumer: bool,
    /// `x-delayed-retry-*`: a requeued message comes back after a delay.
    pub retry: Option<Retry>,
    /// `x-consumer-timeout` in ms (0 is "not set"): the consumer timeout of this queue's
    /// deliveries, unless their consumer sets its own.
    pub consumer_timeout_ms: Option<u64>,
    /// `x-delivery-limit` (quorum queues): a message returned more often than this is
    /// dead-lettered (reason `delivery_limit`) or dropped.
    pub delivery_limit: Option<u64>,
    /// `x-dead-letter-strategy: at-least-once` (quorum queues): a dead-lettered message stays in
    /// the queue until the dead-letter targets have it. In force only with `x-overflow:
    /// reject-publish` and a dead-letter exchange, as in RabbitMQ ([`QueueArgs::dead_letter_at_least_once`]).
    pub at_least_once: bool,
}

/// Which requeues are delayed (RabbitMQ 4.3's `x-delayed-retry-type`). Over AMQP 0-9-1, as in
/// RabbitMQ 4.3, a `basic.reject` with requeue is a failed delivery (its count goes up) and a
/// `basic.nack` with requeue a returned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOn {
    All,
    Failed,
    Returned,
}

/// Retry with back-off: attempt `n` (1 for the first requeue) waits `min * n` (linear, RabbitMQ
/// 4.3), or `min * multiplier^(n-1)` with a multiplier (LavinMQ's exponential form), capped by
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub on: RetryOn,
    pub min_ms: u64,
    pub max_ms: Option<u64>,
    pub multiplier: Option<u64>,
}

impl Retry {
    /// The delay of attempt `n`: the queue core's formula (`warren_queue::replicated::Backoff`,
    /// which a replicated queue keeps in its state), capped at 2^32-1 ms as LavinMQ caps it.
    pub fn delay_ms(&self, attempt: u64) -> u64 {
        warren_queue::replicated::Backoff {
            on_reject: true,
            on_nack: true,
            min_ms: self.min_ms,
            max_ms: self.max_ms,
            multiplier: self.multiplier,
        }
        .delay_ms(attempt)
    }

    /// Whether a requeue by `basic.reject` (`failed`) or `basic.nack` is delayed.
    pub fn applies(&self, failed: bool) -> bool {
        match self.on {
            RetryOn::All => true,
            RetryOn::Failed => failed,
            RetryOn::Returned => !failed,
        }
    }

    /// From the four settings (type, min, max, multiplier); `Ok(None)` when disabled.
    pub fn from_parts(
        on: Option<&str>,
        min: Option<i64>,
        max: Option<i64>,
        multiplier: Option<i64>,
    ) -> Result<Option<Retry>, (&'static str, String)> {
        let on = match on {
            // Setting only the minimum enables it, as LavinMQ's x-delayed-retry-min does.
            None if min.is_some() => RetryOn::All,
            None | Some("disabled") => return Ok(None),
            Some("all") => RetryOn::All,
            Some("failed") => RetryOn::Failed,
            Some("returned") => RetryOn::Returned,
            Some(other) => return Err(("type", format!("{{invalid_value,<<\"{other}\">>}}"))),
        };
        let positive = |k: &'static str, v: Option<i64>| match v {
            Some(n) if n < 1 => Err((k, format!("{{value_not_positive,{n}}}"))),
            v => Ok(v.map(|n| n as u64)),
        };
        let min_ms = positive("min", min)?.unwrap_or(1000);
        let max_ms = positive("max", max)?;
        if let Some(m) = max_ms.filter(|m| *m < min_ms) {
            return Err(("max", format!("{{less_than_min,{m}}}")));
        }
        Ok(Some(Retry {
            on,
            min_ms,
            max_ms,
            multiplier: positive("multiplier", multiplier)?,
        }))
    }
}

impl QueueArgs {
    /// Dead letters are kept until their targets have them: `at-least-once` with `x-overflow:
    /// reject-publish` and a dead-letter exchange (RabbitMQ falls back to at-most-once
    /// otherwise).
    pub fn dead_letter_at_least_once(&self) -> bool {
        self.at_least_once
            && self.overflow == Overflow::RejectPublish
            && self.dead_letter_exchange.is_some()
    }

    /// Parses and validates; `what` names the queue in errors ("queue 'q' in vhost '/'").
    pub fn parse(args: &FieldTable, what: &str) -> AmqpResult<QueueArgs> {
        let invalid = |key: &str, why: String| {
            AmqpError::precondition_failed(format!("invalid arg '{key}' for {what}: {why}"))
        };
        let int = |key: &str| -> AmqpResult<Option<i64>> {
            match args.get(key) {
                None => Ok(None),
                Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                    invalid(key, format!("\"expected integer, got {}\"", type_name(v)))
                }),
            }
        };
        let non_neg = |key: &str| -> AmqpResult<Option<u64>> {
            match int(key)? {
                Some(n) if n < 0 => Err(invalid(key, format!("{{value_negative,{n}}}"))),
                other => Ok(other.map(|n| n as u64)),
            }
        };
        // RabbitMQ's checks for the string arguments answer `{unacceptable_type,T}`.
        let string = |key: &str| -> AmqpResult<Option<String>> {
            match args.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(|| invalid(key, format!("{{unacceptable_type,{}}}", type_name(v)))),
            }
        };
        let overflow = match string("x-overflow")?.as_deref() {
            None | Some("drop-head") => Overflow::DropHead,
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            Some(_) => return Err(invalid("x-overflow", "invalid_overflow".to_string())),
        };
        let max_priority = match non_neg("x-max-priority")? {
            None => None,
            Some(n) if n <= 255 => Some(n as u8),
            Some(n) => {
                return Err(invalid(
                    "x-max-priority",
                    format!("{{max_value_exceeded,{n}}}"),
                ))
            }
        };
        // rabbit_channel checks the dead-letter exchange's type itself, in other words.
        let dead_letter_exchange = match args.get("x-dead-letter-exchange") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| {
                        AmqpError::precondition_failed(format!(
                            "invalid type '{}' for arg 'x-dead-letter-exchange' in {what}",
                            type_name(v)
                        ))
                    })?
                    .to_string(),
            ),
        };
        let retry = Retry::from_parts(
            string("x-delayed-retry-type")?.as_deref(),
            int("x-delayed-retry-min")?,
            int("x-delayed-retry-max")?,
            int("x-delayed-retry-multiplier")?,
        )
        .map_err(|(k, why)| invalid(&format!("x-delayed-retry-{k}"), why))?;
        Ok(QueueArgs {
            retry,
            max_length: non_neg("x-max-length")?,
            max_length_bytes: non_neg("x-max-length-bytes")?,
            overflow,
            message_ttl_ms: non_neg("x-message-ttl")?,
            max_priority,
            dead_letter_exchange,
            dead_letter_routing_key: string("x-dead-letter-routing-key")?,
            expires_ms: match int("x-expires")? {
                None => None,
                Some(n) if n > 0 => Some(n as u64),
                Some(0) => return Err(invalid("x-expires", "{value_zero,0}".to_string())),
                Some(n) => return Err(invalid("x-expires", format!("{{value_negative,{n}}}"))),
            },
            consumer_timeout_ms: non_neg("x-consumer-timeout")?.filter(|&n| n > 0),
            delivery_limit: non_neg("x-delivery-limit")?,
            at_least_once: match string("x-dead-letter-strategy")?.as_deref() {
                None | Some("at-most-once") => false,
                Some("at-least-once") => true,
                Some(_) => {
                    return Err(invalid(
                        "x-dead-letter-strategy",
                        "invalid_dlx_strategy".to_string(),
                    ))
                }
            },
            single_active_consumer: match args.get("x-single-active-consumer") {
                None => false,
                Some(warren_protocol::FieldValue::Bool(b)) => *b,
                Some(v) => {
                    return Err(invalid(
                        "x-single-active-consumer",
                        format!("{{unacceptable_type,{}}}", type_name(v)),
                    ))
                }
            },
        })
    }
}

/// Parses a per-message `expiration` property (milliseconds as decimal text), as RabbitMQ does.
pub fn parse_expiration(s: &str) -> AmqpResult<u64> {
    // As RabbitMQ 3.10 reads it (`rabbit_basic:parse_expiration`): Erlang's `string:to_integer`
    // (an optional sign, then digits, no leading space), nothing after the number, not
    // negative. No upper bound: Erlang's integers have none, and 3.10 takes 4294967296.
    let invalid =
        |why: String| AmqpError::precondition_failed(format!("invalid expiration '{s}': {why}"));
    let sign = usize::from(matches!(s.as_bytes().first(), Some(b'+' | b'-')));
    let digits = s.as_bytes()[sign..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 0 {
        return Err(invalid("no_integer".into()));
    }
    let (number, rest) = s.split_at(sign + digits);
    if !rest.is_empty() {
        let rest = rest.replace('\\', "\\\\").replace('"', "\\\"");
        return Err(invalid(format!("{{leftover_string,\"{rest}\"}}")));
    }
    if s.starts_with('-') && number[1..].bytes().any(|c| c != b'0') {
        let n = number.trim_start_matches('-').trim_start_matches('0');
        return Err(invalid(format!("{{value_negative,-{n}}}")));
    }
    // Beyond u64 (584 million years): never expires.
    Ok(number
        .trim_start_matches(['+', '-'])
        .parse::<u64>()
        .unwrap_or(u64::MAX))
}

pub use crate::message::type_name;

/// A field value as RabbitMQ prints it in error texts.
pub fn display_value(v: &FieldValue) -> String {
    if let Some(n) = v.as_i64() {
        return n.to_string();
    }
    match v {
        FieldValue::Bool(b) => b.to_string(),
        FieldValue::F32(f) => f.to_string(),
        FieldValue::F64(f) => f.to_string(),
        FieldValue::LongStr(b) | FieldValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Whether a declare's arguments make a quorum queue (replicated in a cluster).
pub fn is_quorum(args: &FieldTable) -> bool {
    matches!(args.get("x-queue-type"), Some(FieldValue::LongStr(b)) if &b[..] == b"quorum")
}

/// Whether a declare's arguments make a stream.
pub fn is_stream(args: &FieldTable) -> bool {
    matches!(args.get("x-queue-type"), Some(FieldValue::LongStr(b)) if &b[..] == b"stream")
}

/// `x-quorum-initial-group-size`, default 3, at most the cluster's size.
pub fn initial_group_size(args: &FieldTable) -> AmqpResult<usize> {
    match args.get("x-quorum-initial-group-size") {
        None => Ok(3),
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(AmqpError::precondition_failed(
                "invalid arg 'x-quorum-initial-group-size': must be a positive integer".to_string(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(k: &str, v: FieldValue) -> FieldTable {
        let mut t = FieldTable::new();
        t.insert(k, v);
        t
    }

    #[test]
    fn validation_texts() {
        let what = "queue 'q' in vhost '/'";
        let e =
            QueueArgs::parse(&t("x-max-length", FieldValue::str("5")), what).expect_err("string");
        assert_eq!(e.text, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': \"expected integer, got longstr\"");
        assert!(QueueArgs::parse(&t("x-max-length", FieldValue::I32(-1)), what).is_err());
        assert!(QueueArgs::parse(&t("x-max-priority", FieldValue::I32(256)), what).is_err());
        assert!(QueueArgs::parse(&t("x-overflow", FieldValue::str("nope")), what).is_err());
        let text = |k: &str, v: FieldValue| QueueArgs::parse(&t(k, v), what).expect_err(k).text;
        let pre = "PRECONDITION_FAILED - invalid arg";
        assert_eq!(
            text("x-max-priority", FieldValue::I32(-1)),
            format!("{pre} 'x-max-priority' for queue 'q' in vhost '/': {{value_negative,-1}}")
        );
        assert_eq!(
            text("x-max-priority", FieldValue::I32(256)),
            format!(
                "{pre} 'x-max-priority' for queue 'q' in vhost '/': {{max_value_exceeded,256}}"
            )
        );
        assert_eq!(
            text("x-overflow", FieldValue::str("nope")),
            format!("{pre} 'x-overflow' for queue 'q' in vhost '/': invalid_overflow")
        );
        assert_eq!(
            text("x-overflow", FieldValue::I32(1)),
            format!(
                "{pre} 'x-overflow' for queue 'q' in vhost '/': {{unacceptable_type,signedint}}"
            )
        );
        assert_eq!(
            text("x-dead-letter-routing-key", FieldValue::I32(1)),
            format!("{pre} 'x-dead-letter-routing-key' for queue 'q' in vhost '/': {{unacceptable_type,signedint}}")
        );
        assert_eq!(
            text("x-single-active-consumer", FieldValue::str("a")),
            format!("{pre} 'x-single-active-consumer' for queue 'q' in vhost '/': {{unacceptable_type,longstr}}")
        );
        assert_eq!(
            text("x-dead-letter-exchange", FieldValue::I32(1)),
            "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
        );
        assert_eq!(
            text("x-consumer-timeout", FieldValue::str("1s")),
            format!("{pre} 'x-consumer-timeout' for queue 'q' in vhost '/': \"expected integer, got longstr\"")
        );
        assert_eq!(
            text("x-consumer-timeout", FieldValue::I32(-5)),
            format!("{pre} 'x-consumer-timeout' for queue 'q' in vhost '/': {{value_negative,-5}}")
        );
        let a = QueueArgs::parse(&t("x-consumer-timeout", FieldValue::I64(1500)), what);
        assert_eq!(a.expect("valid").consumer_timeout_ms, Some(1500));
        let a = QueueArgs::parse(&t("x-consumer-timeout", FieldValue::I32(0)), what);
        assert_eq!(a.expect("valid").consumer_timeout_ms, None, "0 is not set");
        let a = QueueArgs::parse(&t("x-message-ttl", FieldValue::I64(0)), what).expect("valid");
        assert_eq!(a.message_ttl_ms, Some(0));
        assert_eq!(
            parse_expiration("soon").expect_err("bad").text,
            "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"
        );
        assert_eq!(parse_expiration("1500").expect("ok"), 1500);
        // RabbitMQ 3.10's answers (checked against it with pika).
        let err = |e: &str| parse_expiration(e).expect_err("bad").text;
        assert_eq!(
            err("100abc"),
            "PRECONDITION_FAILED - invalid expiration '100abc': {leftover_string,\"abc\"}"
        );
        assert_eq!(
            err("-1"),
            "PRECONDITION_FAILED - invalid expiration '-1': {value_negative,-1}"
        );
        assert_eq!(
            err(" 5"),
            "PRECONDITION_FAILED - invalid expiration ' 5': no_integer"
        );
        assert!(err("-1x").contains("{leftover_string,\"x\"}"));
        assert_eq!(parse_expiration("+5").expect("ok"), 5);
        assert_eq!(parse_expiration("-0").expect("ok"), 0);
        assert_eq!(parse_expiration("4294967296").expect("ok"), 4_294_967_296);
        assert_eq!(
            parse_expiration("99999999999999999999999").expect("ok"),
            u64::MAX
        );
    }
}
