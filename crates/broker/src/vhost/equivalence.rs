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
    let keys = if crate::queue::args::is_stream(cur) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn table(pairs: &[(&str, FieldValue)]) -> FieldTable {
        let mut t = FieldTable::new();
        for (k, v) in pairs {
            t.insert(k, v.clone());
        }
        t
    }

    fn s(v: &'static str) -> FieldValue {
        FieldValue::LongStr(Bytes::from_static(v.as_bytes()))
    }

    #[test]
    fn values_compare_whatever_their_encoding() {
        // A `long` from the HTTP API equals a client's `signedint`; a binary equals a longstr.
        let got = table(&[
            ("x-max-length", FieldValue::I64(10)),
            (
                "x-dead-letter-exchange",
                FieldValue::Bytes(Bytes::from_static(b"dlx")),
            ),
        ]);
        let cur = table(&[
            ("x-max-length", FieldValue::I32(10)),
            ("x-dead-letter-exchange", s("dlx")),
        ]);
        assert!(check_args_equivalent("q", "/", &got, &cur).is_ok());
    }

    #[test]
    fn a_missing_queue_type_is_classic() {
        let none = FieldTable::new();
        let classic = table(&[("x-queue-type", s("classic"))]);
        let quorum = table(&[("x-queue-type", s("quorum"))]);
        assert!(check_args_equivalent("q", "/", &none, &classic).is_ok());
        assert!(check_args_equivalent("q", "/", &classic, &none).is_ok());
        let e = check_args_equivalent("q", "/", &none, &quorum).expect_err("quorum is not classic");
        assert_eq!(e.code, warren_protocol::reply::PRECONDITION_FAILED);
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received none but current is the value 'quorum' of type 'longstr'"
        );
    }

    #[test]
    fn a_different_value_is_refused_in_rabbitmqs_words() {
        let got = table(&[("x-max-length", FieldValue::I32(10))]);
        let cur = table(&[("x-max-length", FieldValue::I32(20))]);
        let e = check_args_equivalent("q", "v", &got, &cur).expect_err("10 is not 20");
        assert_eq!(e.code, warren_protocol::reply::PRECONDITION_FAILED);
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost 'v': received '10' but current is '20'"
        );
        let ttl = table(&[("x-message-ttl", FieldValue::I32(5))]);
        let e =
            check_args_equivalent("q", "v", &FieldTable::new(), &ttl).expect_err("none is not 5");
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost 'v': received none but current is the value '5' of type 'signedint'"
        );
    }

    #[test]
    fn only_the_listed_arguments_are_compared() {
        // Not an argument RabbitMQ compares for a queue.
        let got = table(&[("x-custom", s("a"))]);
        let cur = table(&[("x-custom", s("b"))]);
        assert!(check_args_equivalent("q", "/", &got, &cur).is_ok());
        // A stream compares its own list: x-max-age, but not a classic queue's x-message-ttl.
        let stream = |extra: (&str, FieldValue)| table(&[("x-queue-type", s("stream")), extra]);
        let got = stream(("x-message-ttl", FieldValue::I32(1)));
        let cur = stream(("x-message-ttl", FieldValue::I32(2)));
        assert!(check_args_equivalent("s", "/", &got, &cur).is_ok());
        let got = stream(("x-max-age", s("1D")));
        let cur = stream(("x-max-age", s("7D")));
        assert!(check_args_equivalent("s", "/", &got, &cur).is_err());
        // An exchange compares what its caller lists.
        let got = table(&[("alternate-exchange", s("ae1"))]);
        let cur = table(&[("alternate-exchange", s("ae2"))]);
        let e = check_args_equivalent_of("exchange", &["alternate-exchange"], "x", "/", &got, &cur)
            .expect_err("ae1 is not ae2");
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': received 'ae1' but current is 'ae2'"
        );
        assert!(check_args_equivalent_of("exchange", &[], "x", "/", &got, &cur).is_ok());
    }

    #[test]
    fn exchange_types_print_as_erlang_atoms() {
        assert_eq!(erl_atom("direct"), "direct");
        assert_eq!(erl_atom("x-consistent-hash"), "'x-consistent-hash'");
        assert_eq!(erl_atom("Topic"), "'Topic'");
        let e = inequivalent(
            "exchange",
            "type",
            "x",
            "/",
            erl_atom("x-consistent-hash"),
            "direct",
        );
        assert_eq!(e.code, warren_protocol::reply::PRECONDITION_FAILED);
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': received ''x-consistent-hash'' but current is 'direct'"
        );
    }
}
