//! Policies: named regexes over queue (and exchange) names that supply arguments. The
//! highest-priority matching policy applies. For queues, as RabbitMQ's classic queue merges
//! them: `message-ttl`, `expires`, `max-length` and `max-length-bytes` take the lower of the
//! policy's and the queue argument's value (and `consumer-timeout`, as RabbitMQ 4.3 merges it);
//! `dead-letter-exchange`, `dead-letter-routing-key` and `overflow` take the queue argument when
//! it is set. Queues are re-evaluated whenever a
//! policy changes and when they are declared. For exchanges, `alternate-exchange` applies
//! unless the exchange has its own argument; the vhost keeps its policies to apply it to
//! exchanges declared later.

use regex::Regex;
use serde_json::Value;

use crate::access::{Access, PolicyDef};
use crate::queue::{Overflow, QueueArgs, QueueRef};

/// Keys RabbitMQ 3.10 (core and the default plugins) accepts in a policy definition. Those
/// Warren does not act on are accepted and ignored, so definitions from RabbitMQ import.
const IGNORED_KEYS: &[&str] = &[
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
    "queue-master-locator",
    "queue-mode",
    "delivery-limit",
    "max-age",
    "stream-max-segment-size-bytes",
    "initial-cluster-size",
    "dead-letter-strategy",
    "queue-leader-locator",
    "federation-upstream",
    "federation-upstream-set",
    "federation-upstream-pattern",
];

fn validation_failed(why: String) -> String {
    format!("Validation failed\n\n{why}\n")
}

/// Erlang's rendering of a JSON value in RabbitMQ's validation texts.
fn erl(v: &Value) -> String {
    match v {
        Value::String(s) => format!("<<\"{s}\">>"),
        other => other.to_string(),
    }
}

/// Checks a policy as RabbitMQ does; the error is RabbitMQ's text.
pub fn validate(p: &PolicyDef) -> Result<(), String> {
    if p.definition.is_empty() {
        return Err(validation_failed("no policy provided".into()));
    }
    if let Err(e) = Regex::new(&p.pattern) {
        return Err(validation_failed(format!(
            "pattern should be regular expression but is invalid: {e}"
        )));
    }
    if !matches!(p.apply_to.as_str(), "queues" | "exchanges" | "all") {
        return Err(validation_failed(format!(
            "apply-to '{}' unrecognised; should be 'queues', 'exchanges' or 'all'",
            p.apply_to
        )));
    }
    let unknown: Vec<String> = p
        .definition
        .iter()
        .filter(|(k, _)| !known(k))
        .map(|(k, v)| format!("{{<<\"{k}\">>,{}}}", erl(v)))
        .collect();
    if !unknown.is_empty() {
        return Err(validation_failed(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        )));
    }
    for (k, v) in &p.definition {
        let non_neg = || v.as_i64().is_some_and(|n| n >= 0);
        let bad = |what: &str| {
            Err(validation_failed(format!(
                "{} is not a valid {what}",
                erl(v)
            )))
        };
        match k.as_str() {
            "message-ttl" if !non_neg() => return bad("message TTL"),
            "expires" if v.as_i64().is_none_or(|n| n < 1) => return bad("queue expiry"),
            "max-length" if !non_neg() => return bad("maximum length"),
            "max-length-bytes" if !non_neg() => return bad("maximum length (in bytes)"),
            "dead-letter-exchange" if !v.is_string() => return bad("dead letter exchange name"),
            "dead-letter-routing-key" if !v.is_string() => {
                return bad("dead letter exchange routing key")
            }
            "overflow"
                if !matches!(
                    v.as_str(),
                    Some("drop-head" | "reject-publish" | "reject-publish-dlx")
                ) =>
            {
                return bad("overflow value")
            }
            "alternate-exchange" if !v.is_string() => return bad("alternate exchange name"),
            "delayed-retry-type" if !v.is_string() => return bad("delayed retry type"),
            "delayed-retry-min" | "delayed-retry-max" | "delayed-retry-multiplier"
                if v.as_i64().is_none_or(|n| n < 1) =>
            {
                return bad("delayed retry setting")
            }
            "consumer-timeout" if !non_neg() => return bad("consumer timeout"),
            // Streams' keys (RabbitMQ 3.10 crashes, 500, on a non-string max-age).
            "max-age"
                if v.as_str()
                    .is_none_or(|s| crate::queue::stream::parse_age(s).is_err()) =>
            {
                return bad("max age")
            }
            "stream-max-segment-size-bytes" if !non_neg() => return bad("segment size"),
            // The federation plugin's keys (their upstreams are `crates/federation`'s).
            "federation-upstream" if !v.is_string() => return bad("federation upstream name"),
            "federation-upstream-set" if !v.is_string() => {
                return bad("federation upstream set name")
            }
            "federation-upstream-pattern" => match v.as_str() {
                None => return bad("federation upstream pattern name"),
                // RabbitMQ's text ends with Erlang's compile error; this one, the regex
                // crate's.
                Some(s) => {
                    if let Err(e) = Regex::new(s) {
                        return Err(validation_failed(format!(
                            "could not compile pattern {s} to a regular expression. Error: {e}"
                        )));
                    }
                }
            },
            _ => {}
        }
    }
    let federation_keys = [
        "federation-upstream",
        "federation-upstream-set",
        "federation-upstream-pattern",
    ];
    if federation_keys
        .iter()
        .filter(|k| p.definition.contains_key(**k))
        .count()
        > 1
    {
        return Err(validation_failed(
            "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together".into(),
        ));
    }
    let text = |k: &str| p.definition.get(k).and_then(Value::as_str);
    let num = |k: &str| p.definition.get(k).and_then(Value::as_i64);
    if let Err((k, why)) = crate::queue::args::Retry::from_parts(
        text("delayed-retry-type"),
        num("delayed-retry-min"),
        num("delayed-retry-max"),
        num("delayed-retry-multiplier"),
    ) {
        return Err(validation_failed(format!("delayed-retry-{k}: {why}")));
    }
    Ok(())
}

fn known(k: &str) -> bool {
    matches!(
        k,
        "message-ttl"
            | "expires"
            | "max-length"
            | "max-length-bytes"
            | "overflow"
            | "dead-letter-exchange"
            | "dead-letter-routing-key"
            | "alternate-exchange"
            | "delayed-retry-type"
            | "delayed-retry-min"
            | "delayed-retry-max"
            | "delayed-retry-multiplier"
            | "consumer-timeout"
    ) || IGNORED_KEYS.contains(&k)
}

/// The policy that applies to a queue named `name` among `policies` (of its vhost): the
/// highest priority among those whose pattern matches; ties go to the first name.
pub fn matching<'a>(policies: &'a [PolicyDef], name: &str, queue: bool) -> Option<&'a PolicyDef> {
    let mut best: Option<&PolicyDef> = None;
    for p in policies {
        let kind_ok =
            p.apply_to == "all" || p.apply_to == if queue { "queues" } else { "exchanges" };
        if !kind_ok || !Regex::new(&p.pattern).is_ok_and(|r| r.is_match(name)) {
            continue;
        }
        if best.is_none_or(|b| p.priority > b.priority) {
            best = Some(p);
        }
    }
    best
}

/// The `alternate-exchange` of the policy applying to the exchange `name`. Only the
/// highest-priority matching policy applies, as in RabbitMQ, even when it has no such key.
pub fn alternate_exchange<'a>(policies: &'a [PolicyDef], name: &str) -> Option<&'a str> {
    matching(policies, name, false)?
        .definition
        .get("alternate-exchange")?
        .as_str()
}

/// A queue's arguments in force: its declared ones merged with `policy`'s.
pub fn effective(
    declared: &QueueArgs,
    arguments: &warren_protocol::FieldTable,
    policy: Option<&PolicyDef>,
) -> QueueArgs {
    let mut a = declared.clone();
    let Some(p) = policy else { return a };
    let d = &p.definition;
    let num = |k: &str| {
        d.get(k)
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .map(|n| n as u64)
    };
    let min = |arg: Option<u64>, pol: Option<u64>| match (arg, pol) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    a.message_ttl_ms = min(a.message_ttl_ms, num("message-ttl"));
    a.expires_ms = min(a.expires_ms, num("expires").filter(|n| *n > 0));
    a.max_length = min(a.max_length, num("max-length"));
    a.max_length_bytes = min(a.max_length_bytes, num("max-length-bytes"));
    // RabbitMQ 4.3 takes the lower of the queue's argument and the policy's; 0 is "not set".
    a.consumer_timeout_ms = min(
        a.consumer_timeout_ms,
        num("consumer-timeout").filter(|n| *n > 0),
    );
    // A quorum queue's key (RabbitMQ ignores it for other types).
    let text = |k: &str| d.get(k).and_then(Value::as_str).map(String::from);
    if crate::queue::args::is_quorum(arguments) {
        a.delivery_limit = min(a.delivery_limit, num("delivery-limit"));
        if arguments.get("x-dead-letter-strategy").is_none() {
            a.at_least_once = text("dead-letter-strategy").as_deref() == Some("at-least-once");
        }
    }
    if a.dead_letter_exchange.is_none() {
        a.dead_letter_exchange = text("dead-letter-exchange");
    }
    if a.dead_letter_routing_key.is_none() {
        a.dead_letter_routing_key = text("dead-letter-routing-key");
    }
    // The queue's own x-delayed-retry-* arguments win as a whole over the policy's.
    if a.retry.is_none()
        && !arguments
            .0
            .iter()
            .any(|(k, _)| k.starts_with("x-delayed-retry-"))
    {
        a.retry = crate::queue::args::Retry::from_parts(
            d.get("delayed-retry-type").and_then(Value::as_str),
            d.get("delayed-retry-min").and_then(Value::as_i64),
            d.get("delayed-retry-max").and_then(Value::as_i64),
            d.get("delayed-retry-multiplier").and_then(Value::as_i64),
        )
        .ok()
        .flatten();
    }
    if arguments.get("x-overflow").is_none() {
        a.overflow = match text("overflow").as_deref() {
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            _ => Overflow::DropHead,
        };
    }
    a
}

/// Sets `q`'s arguments in force from the vhost's policies.
pub fn apply(access: &Access, q: &QueueRef) {
    let policies = access.policies_of(q.vhost());
    let p = matching(&policies, q.name(), true);
    q.set_effective_args(effective(&q.options().args, &q.options().arguments, p));
    if let Some(s) = q.stream() {
        s.set_policy(p.map(|p| &p.definition));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pol(name: &str, pattern: &str, prio: i64, def: &str) -> PolicyDef {
        PolicyDef {
            vhost: "/".into(),
            name: name.into(),
            pattern: pattern.into(),
            apply_to: "queues".into(),
            definition: serde_json::from_str(def).expect("json"),
            priority: prio,
        }
    }

    #[test]
    fn validation_texts_match_rabbitmq() {
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"foo":1}"#)).expect_err("unknown"),
            "Validation failed\n\n[{<<\"foo\">>,1}] are not recognised policy settings\n"
        );
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"max-length":"x"}"#)).expect_err("type"),
            "Validation failed\n\n<<\"x\">> is not a valid maximum length\n"
        );
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"expires":0}"#)).expect_err("zero"),
            "Validation failed\n\n0 is not a valid queue expiry\n"
        );
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"consumer-timeout":-1}"#)).expect_err("negative"),
            "Validation failed\n\n-1 is not a valid consumer timeout\n"
        );
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"consumer-timeout":"1s"}"#)).expect_err("type"),
            "Validation failed\n\n<<\"1s\">> is not a valid consumer timeout\n"
        );
        assert!(validate(&pol("p", ".*", 0, r#"{"consumer-timeout":0}"#)).is_ok());
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"max-age":"1x"}"#)).expect_err("unit"),
            "Validation failed\n\n<<\"1x\">> is not a valid max age\n"
        );
        assert_eq!(
            validate(&pol(
                "p",
                ".*",
                0,
                r#"{"stream-max-segment-size-bytes":-1}"#
            ))
            .expect_err("negative"),
            "Validation failed\n\n-1 is not a valid segment size\n"
        );
        assert!(validate(&pol("p", ".*", 0, r#"{"max-age":"7D"}"#)).is_ok());
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"federation-upstream":5}"#)).expect_err("type"),
            "Validation failed\n\n5 is not a valid federation upstream name\n"
        );
        assert_eq!(
            validate(&pol(
                "p",
                ".*",
                0,
                r#"{"federation-upstream":"a","federation-upstream-set":"all"}"#
            ))
            .expect_err("both"),
            "Validation failed\n\ncannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together\n"
        );
        assert!(validate(&pol("p", ".*", 0, r#"{"federation-upstream-set":"all"}"#)).is_ok());
        assert_eq!(
            validate(&pol("p", ".*", 0, r#"{"federation-upstream-pattern":5}"#)).expect_err("type"),
            "Validation failed\n\n5 is not a valid federation upstream pattern name\n"
        );
        assert!(validate(&pol(
            "p",
            ".*",
            0,
            r#"{"federation-upstream-pattern":"(("}"#
        ))
        .expect_err("regex")
        .starts_with("Validation failed\n\ncould not compile pattern (( to a regular expression."));
        assert!(validate(&pol(
            "p",
            ".*",
            0,
            r#"{"federation-upstream-pattern":"a","federation-upstream-set":"all"}"#
        ))
        .expect_err("both")
        .contains("together"));
        assert!(validate(&pol(
            "p",
            ".*",
            0,
            r#"{"federation-upstream-pattern":"^a"}"#
        ))
        .is_ok());
        assert!(validate(&pol("p", ".*", 0, r#"{"max-priority":5}"#)).is_err());
        assert!(validate(&pol("p", "(", 0, r#"{"max-length":5}"#)).is_err());
        assert!(validate(&pol("p", ".*", 0, "{}")).is_err());
        assert!(validate(&pol(
            "p",
            ".*",
            0,
            r#"{"max-length":5,"dead-letter-exchange":"d"}"#
        ))
        .is_ok());
    }

    #[test]
    fn highest_priority_wins_and_arguments_merge_as_rabbitmq() {
        let ps = vec![
            pol("low", "^a", 1, r#"{"max-length":5}"#),
            pol(
                "high",
                "^ab",
                2,
                r#"{"max-length":10,"dead-letter-exchange":"pdlx","overflow":"reject-publish"}"#,
            ),
        ];
        assert_eq!(
            matching(&ps, "abc", true).map(|p| p.name.as_str()),
            Some("high")
        );
        assert_eq!(
            matching(&ps, "ax", true).map(|p| p.name.as_str()),
            Some("low")
        );
        assert!(matching(&ps, "ax", false).is_none());
        assert!(matching(&ps, "b", true).is_none());
        let mut t = warren_protocol::FieldTable::new();
        t.insert("x-max-length", warren_protocol::FieldValue::I32(3));
        t.insert(
            "x-dead-letter-exchange",
            warren_protocol::FieldValue::str("qdlx"),
        );
        let declared = QueueArgs::parse(&t, "q").expect("args");
        let a = effective(&declared, &t, matching(&ps, "abc", true));
        assert_eq!(a.max_length, Some(3));
        assert_eq!(a.dead_letter_exchange.as_deref(), Some("qdlx"));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        let a = effective(
            &QueueArgs::default(),
            &Default::default(),
            matching(&ps, "abc", true),
        );
        assert_eq!(a.max_length, Some(10));
        assert_eq!(a.dead_letter_exchange.as_deref(), Some("pdlx"));
    }

    #[test]
    fn consumer_timeout_takes_the_lower_of_argument_and_policy() {
        let ps = vec![pol("ct", ".*", 0, r#"{"consumer-timeout":2000}"#)];
        let with = |ms: i64| {
            let mut t = warren_protocol::FieldTable::new();
            t.insert("x-consumer-timeout", warren_protocol::FieldValue::I64(ms));
            let declared = QueueArgs::parse(&t, "q").expect("args");
            effective(&declared, &t, matching(&ps, "q", true)).consumer_timeout_ms
        };
        assert_eq!(with(1000), Some(1000));
        assert_eq!(with(5000), Some(2000));
        assert_eq!(with(0), Some(2000), "0 is not set");
        let none = effective(&QueueArgs::default(), &Default::default(), None);
        assert_eq!(none.consumer_timeout_ms, None);
        let zero = vec![pol("ct", ".*", 0, r#"{"consumer-timeout":0}"#)];
        let a = effective(
            &QueueArgs::default(),
            &Default::default(),
            matching(&zero, "q", true),
        );
        assert_eq!(a.consumer_timeout_ms, None);
    }

    #[test]
    fn alternate_exchange_comes_from_the_one_applying_exchange_policy() {
        let mut ae = pol("ae", "^orders", 1, r#"{"alternate-exchange":"unrouted"}"#);
        ae.apply_to = "exchanges".into();
        let mut all = pol("all", "^orders\\.eu", 5, r#"{"max-length":3}"#);
        all.apply_to = "all".into();
        let queues_only = pol("q", ".*", 9, r#"{"alternate-exchange":"wrong"}"#);
        assert!(validate(&ae).is_ok());
        let ps = vec![ae, all, queues_only];
        assert_eq!(alternate_exchange(&ps, "orders.us"), Some("unrouted"));
        // A higher-priority policy without the key applies instead, so no AE (RabbitMQ applies
        // one policy per object).
        assert_eq!(alternate_exchange(&ps, "orders.eu"), None);
        assert_eq!(alternate_exchange(&ps, "billing"), None);
        assert!(validate(&pol("p", ".*", 0, r#"{"alternate-exchange":1}"#)).is_err());
    }
}
