//! `federation-upstream` and `federation-upstream-set` values as RabbitMQ 3.10's
//! `rabbit_federation_parameters` checks them (texts checked against RabbitMQ 3.10.8), and the
//! upstream a link runs ([`Upstream`]).

use serde_json::{Map, Value};
use warren_shovel::params::erl;
use warren_shovel::uri::Endpoint;

/// The keys both an upstream and an upstream set's entries take, in RabbitMQ's order (its
/// problems come out in the reverse order).
const SHARED: &[(&str, Check)] = &[
    ("exchange", Check::Binary),
    ("queue", Check::Binary),
    ("consumer-tag", Check::Binary),
    ("prefetch-count", Check::Number),
    ("reconnect-delay", Check::Number),
    ("max-hops", Check::Number),
    ("expires", Check::Number),
    ("message-ttl", Check::Number),
    ("trust-user-id", Check::Boolean),
    ("ack-mode", Check::AckMode),
    ("ha-policy", Check::Binary),
    ("bind-nowait", Check::Boolean),
    ("resource-cleanup-mode", Check::Cleanup),
    ("channel-use-mode", Check::ChannelUse),
];

#[derive(Debug, Clone, Copy)]
enum Check {
    Uri,
    Binary,
    Number,
    Boolean,
    AckMode,
    Cleanup,
    ChannelUse,
}

fn check_one(key: &str, check: Check, v: &Value) -> Result<(), String> {
    let got = || erl(v);
    let one_of = |options: &[&str]| -> Result<(), String> {
        match v.as_str() {
            Some(s) if options.contains(&s) => Ok(()),
            Some(_) => Err(format!(
                "{key} should be one of [{}], actually was {}",
                options
                    .iter()
                    .map(|o| format!("<<\"{o}\">>"))
                    .collect::<Vec<_>>()
                    .join(","),
                got()
            )),
            None => Err(format!("{key} should be binary, actually was {}", got())),
        }
    };
    match check {
        Check::Uri => warren_shovel::params::check_uris(key, v),
        Check::Binary if v.is_string() => Ok(()),
        Check::Binary => Err(format!("{key} should be binary, actually was {}", got())),
        Check::Number if v.is_number() => Ok(()),
        Check::Number => Err(format!("{key} should be a number, actually was {}", got())),
        Check::Boolean if v.is_boolean() => Ok(()),
        Check::Boolean => Err(format!("{key} should be boolean, actually was {}", got())),
        Check::AckMode => one_of(&["no-ack", "on-publish", "on-confirm"]),
        Check::Cleanup => one_of(&["default", "never"]),
        Check::ChannelUse => one_of(&["multiple", "single"]),
    }
}

/// RabbitMQ's `proplist` check of one object: the first key (`uri` or `upstream`,
/// mandatory), then the shared ones; problems in reverse order, unknown keys first.
fn check_object(name: &str, first: (&str, Check), v: &Value) -> Vec<String> {
    let Some(o) = v.as_object() else {
        return vec![format!("{name} not a list {}", erl(v))];
    };
    let mut gathered = Vec::new();
    for (key, check) in std::iter::once(&first).chain(SHARED.iter()) {
        match o.get(*key) {
            Some(v) => {
                if let Err(e) = check_one(key, *check, v) {
                    gathered.push(e);
                }
            }
            None if *key == first.0 => gathered.push(format!("Key \"{key}\" not found in {name}")),
            None => {}
        }
    }
    let unknown: Vec<String> = o
        .iter()
        .filter(|(k, _)| *k != first.0 && !SHARED.iter().any(|(key, _)| key == k))
        .map(|(k, v)| format!("{{<<\"{k}\">>,{}}}", erl(v)))
        .collect();
    if !unknown.is_empty() {
        gathered.push(format!(
            "Unrecognised terms [{}] in {name}",
            unknown.join(",")
        ));
    }
    gathered.reverse();
    gathered
}

/// A `federation-upstream` value.
pub fn validate_upstream(name: &str, v: &Value) -> Result<(), Vec<String>> {
    let problems = check_object(name, ("uri", Check::Uri), v);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A `federation-upstream-set` value: a list of objects naming an upstream each.
pub fn validate_set(name: &str, v: &Value) -> Result<(), Vec<String>> {
    let Some(items) = v.as_array() else {
        return Err(vec![format!(
            "{name} should be list, actually was {}",
            erl(v)
        )]);
    };
    let problems: Vec<String> = items
        .iter()
        .flat_map(|i| check_object(name, ("upstream", Check::Binary), i))
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// An upstream as a link runs it: the upstream's value with a set entry's overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub uris: Vec<Endpoint>,
    /// The upstream exchange's name (`exchange`; default: the downstream's).
    pub exchange: Option<String>,
    /// The upstream queue's name (`queue`; default: the downstream's).
    pub queue: Option<String>,
    /// A queue link's consumer tag upstream (`consumer-tag`; RabbitMQ's default:
    /// `federation-link-NAME`).
    pub consumer_tag: String,
    pub prefetch: u16,
    pub reconnect_delay: f64,
    pub max_hops: i32,
    pub expires: Option<i64>,
    pub message_ttl: Option<i64>,
    pub ack_mode: warren_shovel::params::AckMode,
    /// `resource-cleanup-mode` `never`: an exchange link that is no longer wanted leaves its
    /// queue and internal exchange on the upstream (`default`: it deletes them).
    pub keep_resources: bool,
}

impl Upstream {
    /// `value` (a `federation-upstream`) with `overrides` (its entry in a set) on top, with
    /// RabbitMQ's defaults: prefetch 1,000, reconnect delay 5 s, 1 hop, on-confirm.
    pub fn read(
        name: &str,
        value: &Value,
        overrides: &Map<String, Value>,
    ) -> Result<Upstream, String> {
        let mut v = value.as_object().cloned().unwrap_or_default();
        for (k, x) in overrides {
            if k != "upstream" {
                v.insert(k.clone(), x.clone());
            }
        }
        let uris: Vec<String> = match v.get("uri") {
            Some(Value::String(u)) => vec![u.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            _ => Vec::new(),
        };
        if uris.is_empty() {
            return Err(format!("upstream {name} has no uri"));
        }
        let num = |k: &str| v.get(k).and_then(Value::as_f64);
        Ok(Upstream {
            name: name.to_string(),
            uris: uris
                .iter()
                .map(|u| warren_shovel::uri::parse(u))
                .collect::<Result<_, _>>()?,
            exchange: v.get("exchange").and_then(Value::as_str).map(String::from),
            queue: v.get("queue").and_then(Value::as_str).map(String::from),
            consumer_tag: v
                .get("consumer-tag")
                .and_then(Value::as_str)
                .map_or_else(|| format!("federation-link-{name}"), String::from),
            prefetch: num("prefetch-count").map_or(1000, |n| n.clamp(0.0, 65535.0) as u16),
            reconnect_delay: num("reconnect-delay").unwrap_or(5.0).max(0.0),
            max_hops: num("max-hops").map_or(1, |n| n.clamp(1.0, i32::MAX as f64) as i32),
            expires: num("expires").map(|n| n as i64),
            message_ttl: num("message-ttl").map(|n| n as i64),
            ack_mode: match v.get("ack-mode").and_then(Value::as_str) {
                Some("no-ack") => warren_shovel::params::AckMode::NoAck,
                Some("on-publish") => warren_shovel::params::AckMode::OnPublish,
                _ => warren_shovel::params::AckMode::OnConfirm,
            },
            keep_resources: v.get("resource-cleanup-mode").and_then(Value::as_str) == Some("never"),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rabbitmq_texts() {
        assert_eq!(
            validate_upstream("up1", &json!({})).unwrap_err(),
            ["Key \"uri\" not found in up1"]
        );
        assert_eq!(
            validate_upstream("up1", &json!({"uri": 5})).unwrap_err(),
            ["uri should be list, actually was 5"]
        );
        assert_eq!(
            validate_upstream(
                "up1",
                &json!({"uri": "amqp://x", "max-hops": "a", "colour": 1})
            )
            .unwrap_err(),
            [
                "Unrecognised terms [{<<\"colour\">>,1}] in up1",
                "max-hops should be a number, actually was <<\"a\">>"
            ]
        );
        assert_eq!(
            validate_upstream("up1", &json!({"uri": "amqp://x", "ack-mode": "x", "expires": "1"}))
                .unwrap_err(),
            [
                "ack-mode should be one of [<<\"no-ack\">>,<<\"on-publish\">>,<<\"on-confirm\">>], actually was <<\"x\">>",
                "expires should be a number, actually was <<\"1\">>"
            ]
        );
        assert!(validate_upstream(
            "up1",
            &json!({"uri": ["amqp://a", "amqp://b"], "bind-nowait": true, "consumer-tag": "t",
                "resource-cleanup-mode": "never", "channel-use-mode": "single",
                "trust-user-id": false, "prefetch-count": 10, "reconnect-delay": 1,
                "message-ttl": 5, "exchange": "e", "queue": "q", "ha-policy": "all"})
        )
        .is_ok());
        assert_eq!(
            validate_set("set1", &json!([{}])).unwrap_err(),
            ["Key \"upstream\" not found in set1"]
        );
        assert!(validate_set("set1", &json!([{"upstream": "up1", "max-hops": 2}])).is_ok());
    }

    #[test]
    fn an_upstream_with_a_sets_overrides() {
        let u = Upstream::read(
            "up1",
            &json!({"uri": "amqp://h", "max-hops": 1, "prefetch-count": 50}),
            json!({"upstream": "up1", "max-hops": 3})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!((u.max_hops, u.prefetch), (3, 50));
        assert_eq!(u.reconnect_delay, 5.0);
        assert_eq!(u.ack_mode, warren_shovel::params::AckMode::OnConfirm);
    }
}
