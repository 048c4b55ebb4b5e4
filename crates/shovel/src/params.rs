//! A shovel's parameter value as RabbitMQ 3.10's `rabbit_shovel_parameters` checks and reads it
//! (AMQP 0-9-1 at both ends): the checks with RabbitMQ's texts ([`validate`]) and the
//! definition the worker runs ([`ShovelDef::parse`]). Keys of the pre-3.7 form
//! (`delete-after`, `prefetch-count`, `add-forward-headers`, `add-timestamp-header`,
//! `publish-properties`) are read as RabbitMQ reads them, under their newer names' defaults.

use serde_json::{Map, Value};

use crate::uri::Endpoint;

/// The source's messages are acked: after the destination confirmed them, after they were
/// published, or never (consumed with no-ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    OnConfirm,
    OnPublish,
    NoAck,
}

impl AckMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::OnConfirm => "on-confirm",
            AckMode::OnPublish => "on-publish",
            AckMode::NoAck => "no-ack",
        }
    }
}

/// When the shovel deletes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAfter {
    Never,
    /// Once it moved as many messages as the source queue held when it started.
    QueueLength,
    /// Once it moved this many messages.
    Count(u64),
}

/// Where the shovel reads from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A queue, declared (durable, with `src-queue-args`) unless it exists.
    Queue {
        name: String,
        args: Map<String, Value>,
    },
    /// A server-named exclusive queue bound to the exchange with the key.
    Exchange { name: String, key: String },
}

/// Where a message goes: the destination's overrides of the message's exchange and key.
#[derive(Debug, Clone, PartialEq)]
pub enum Dest {
    /// Published to the default exchange with the queue's name (declared durable, with
    /// `dest-queue-args`, unless it exists).
    Queue {
        name: String,
        args: Map<String, Value>,
    },
    /// Published to this exchange (`None`: the message's own) with this key (`None`: the
    /// message's own).
    Exchange {
        name: Option<String>,
        key: Option<String>,
    },
}

/// A dynamic shovel, read from its parameter value.
#[derive(Debug, Clone, PartialEq)]
pub struct ShovelDef {
    pub src_uris: Vec<Endpoint>,
    pub dest_uris: Vec<Endpoint>,
    pub source: Source,
    pub dest: Dest,
    pub ack_mode: AckMode,
    pub prefetch: u16,
    /// Seconds before a failed shovel starts again; 0: it stays down.
    pub reconnect_delay: f64,
    pub delete_after: DeleteAfter,
    pub add_forward_headers: bool,
    pub add_timestamp_header: bool,
    /// Properties set on every message it publishes (`dest-publish-properties`).
    pub publish_properties: Map<String, Value>,
    /// Arguments of its basic.consume (`src-consumer-args`, RabbitMQ 3.12+).
    pub consumer_args: Map<String, Value>,
}

/// The keys RabbitMQ 3.10 (and 3.12's `src-consumer-args`) accepts for AMQP 0-9-1 at both
/// ends, with the check each gets, in the order RabbitMQ checks them (its problems come out in
/// the reverse of this order, as its `rabbit_parameter_validation:proplist` gathers them).
const KEYS: &[(&str, Check)] = &[
    ("reconnect-delay", Check::Number),
    ("ack-mode", Check::AckMode),
    ("src-protocol", Check::Protocol),
    ("dest-protocol", Check::Protocol),
    ("src-uri", Check::Uri),
    ("src-exchange", Check::Binary),
    ("src-exchange-key", Check::Binary),
    ("src-queue", Check::Binary),
    ("src-queue-args", Check::Table),
    ("prefetch-count", Check::Number),
    ("src-prefetch-count", Check::Number),
    ("delete-after", Check::DeleteAfter),
    ("src-delete-after", Check::DeleteAfter),
    ("src-consumer-args", Check::Table),
    ("dest-uri", Check::Uri),
    ("dest-exchange", Check::Binary),
    ("dest-exchange-key", Check::Binary),
    ("dest-queue", Check::QueueName),
    ("dest-queue-args", Check::Table),
    ("add-forward-headers", Check::Boolean),
    ("add-timestamp-header", Check::Boolean),
    ("dest-add-forward-headers", Check::Boolean),
    ("dest-add-timestamp-header", Check::Boolean),
    ("publish-properties", Check::Properties),
    ("dest-publish-properties", Check::Properties),
];

const MANDATORY: &[&str] = &["src-uri", "dest-uri"];

#[derive(Debug, Clone, Copy)]
enum Check {
    Uri,
    Binary,
    QueueName,
    Number,
    Boolean,
    Table,
    DeleteAfter,
    AckMode,
    Protocol,
    Properties,
}

/// The properties `dest-publish-properties` may set, and whether each is a number.
const PROPERTIES: &[(&str, bool)] = &[
    ("content_type", false),
    ("content_encoding", false),
    ("delivery_mode", true),
    ("priority", true),
    ("correlation_id", false),
    ("reply_to", false),
    ("expiration", false),
    ("message_id", false),
    ("timestamp", true),
    ("type", false),
    ("user_id", false),
    ("app_id", false),
    ("cluster_id", false),
];

/// An Erlang term as RabbitMQ's `~p` prints the JSON value it decoded.
pub fn erl(v: &Value) -> String {
    match v {
        Value::String(s) => format!("<<\"{s}\">>"),
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(erl).collect::<Vec<_>>().join(",")),
        Value::Object(o) => format!(
            "[{}]",
            o.iter()
                .map(|(k, v)| format!("{{<<\"{k}\">>,{}}}", erl(v)))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// RabbitMQ's checks of a shovel's value, each problem in its words; `name` is the shovel's.
pub fn validate(name: &str, value: &Value) -> Result<(), Vec<String>> {
    let Some(def) = value.as_object() else {
        return Err(vec![format!(
            "{name} should be a map, actually was {}",
            erl(value)
        )]);
    };
    let mut problems = Vec::new();
    // The source and destination (validate_amqp091_src/_dest), then each key.
    match (def.get("src-exchange"), def.get("src-queue")) {
        (None, None) => problems.push("Must specify 'src-exchange' or 'src-queue'".to_string()),
        (Some(_), Some(_)) => {
            problems.push("Cannot specify 'src-exchange' and 'src-queue'".to_string())
        }
        _ => {}
    }
    let delete_after = def
        .get("src-delete-after")
        .or_else(|| def.get("delete-after"));
    if delete_after.is_some_and(Value::is_i64)
        && def.get("ack-mode").and_then(Value::as_str) == Some("no-ack")
    {
        problems.push("Cannot specify 'no-ack' and numerical 'delete-after'".to_string());
    }
    if def.contains_key("dest-exchange") && def.contains_key("dest-queue") {
        problems.push("Cannot specify 'dest-exchange' and 'dest-queue'".to_string());
    }
    // Each key in RabbitMQ's order, gathered in reverse, the unknown keys first.
    let mut gathered = Vec::new();
    for (key, check) in KEYS {
        match def.get(*key) {
            Some(v) => {
                if let Err(e) = check_one(key, *check, v) {
                    gathered.push(e);
                }
            }
            None if MANDATORY.contains(key) => {
                gathered.push(format!("Key \"{key}\" not found in {name}"))
            }
            None => {}
        }
    }
    let unknown: Vec<String> = def
        .iter()
        .filter(|(k, _)| !KEYS.iter().any(|(key, _)| key == k))
        .map(|(k, v)| format!("{{<<\"{k}\">>,{}}}", erl(v)))
        .collect();
    if !unknown.is_empty() {
        gathered.push(format!(
            "Unrecognised terms [{}] in {name}",
            unknown.join(",")
        ));
    }
    problems.extend(gathered.into_iter().rev());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// RabbitMQ's check of a URI key (a shovel's ends, a federation upstream's `uri`): one URI or
/// a list of them, each a valid AMQP URI.
pub fn check_uris(key: &str, v: &Value) -> Result<(), String> {
    match v {
        Value::String(s) => crate::uri::parse(s).map(|_| ()),
        Value::Array(items) => {
            for i in items {
                match i {
                    Value::String(s) => crate::uri::parse(s).map(|_| ())?,
                    _ => return Err(format!("{key} should be binary, actually was {}", erl(i))),
                }
            }
            Ok(())
        }
        _ => Err(format!("{key} should be list, actually was {}", erl(v))),
    }
}

fn check_one(key: &str, check: Check, v: &Value) -> Result<(), String> {
    let got = || erl(v);
    match check {
        Check::Uri => check_uris(key, v),
        Check::Binary => match v {
            Value::String(_) => Ok(()),
            _ => Err(format!("{key} should be binary, actually was {}", got())),
        },
        Check::QueueName => match v {
            Value::String(s) if s.len() <= 255 => Ok(()),
            Value::String(_) => Err(format!(
                "{key} should be less than 255 bytes, actually was {}",
                got()
            )),
            _ => Err(format!("{key} should be binary, actually was {}", got())),
        },
        Check::Number => match v {
            Value::Number(_) => Ok(()),
            _ => Err(format!("{key} should be a number, actually was {}", got())),
        },
        Check::Boolean => match v {
            Value::Bool(_) => Ok(()),
            _ => Err(format!("{key} should be boolean, actually was {}", got())),
        },
        Check::Table => match v {
            Value::Object(_) => Ok(()),
            _ => Err(format!("{key} should be a map, actually was {}", got())),
        },
        Check::DeleteAfter => match v {
            Value::String(s) if s == "never" || s == "queue-length" => Ok(()),
            Value::Number(n) if n.as_u64().is_some() => Ok(()),
            _ => Err(format!(
                "{key} should be a number greater than or equal to 0, \"never\" or \"queue-length\", actually was {}",
                got()
            )),
        },
        Check::AckMode => match v.as_str() {
            Some("no-ack" | "on-publish" | "on-confirm") => Ok(()),
            _ if v.is_string() => Err(format!(
                "{key} should be one of [<<\"no-ack\">>,<<\"on-publish\">>,<<\"on-confirm\">>], actually was {}",
                got()
            )),
            _ => Err(format!("{key} should be binary, actually was {}", got())),
        },
        Check::Protocol => match v.as_str() {
            Some("amqp091") => Ok(()),
            // RabbitMQ's AMQP 1.0 shovel: not in Warren.
            Some("amqp10") => Err(format!("{key} amqp10 is not supported by Warren")),
            _ if v.is_string() => Err(format!(
                "{key} should be one of [<<\"amqp10\">>,<<\"amqp091\">>], actually was {}",
                got()
            )),
            _ => Err(format!("{key} should be binary, actually was {}", got())),
        },
        Check::Properties => {
            let Value::Object(props) = v else {
                return Err(format!("{key} should be a map, actually was {}", got()));
            };
            for (k, pv) in props {
                match PROPERTIES.iter().find(|(name, _)| name == k) {
                    None => {
                        return Err(format!(
                            "Unrecognised terms [{{<<\"{k}\">>,{}}}] in {key}",
                            erl(pv)
                        ))
                    }
                    Some((_, true)) if !pv.is_number() => {
                        return Err(format!("{k} should be a number, actually was {}", erl(pv)))
                    }
                    Some((_, false)) if !pv.is_string() => {
                        return Err(format!("{k} should be binary, actually was {}", erl(pv)))
                    }
                    _ => {}
                }
            }
            Ok(())
        }
    }
}

impl ShovelDef {
    /// The definition a valid value describes, with RabbitMQ's defaults: `on-confirm`, a
    /// prefetch of 1,000, a reconnect delay of 1 s, never deleted.
    pub fn parse(name: &str, value: &Value) -> Result<ShovelDef, Vec<String>> {
        validate(name, value)?;
        let def = value.as_object().cloned().unwrap_or_default();
        let s = |k: &str| def.get(k).and_then(Value::as_str).map(str::to_string);
        let table = |k: &str| {
            def.get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let flag = |new: &str, old: &str| {
            def.get(new)
                .or_else(|| def.get(old))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let uris = |k: &str| -> Result<Vec<Endpoint>, Vec<String>> {
            let list = match def.get(k) {
                Some(Value::String(u)) => vec![u.clone()],
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect(),
                _ => Vec::new(),
            };
            if list.is_empty() {
                return Err(vec![format!("{k} should name at least one URI")]);
            }
            list.iter()
                .map(|u| crate::uri::parse(u).map_err(|e| vec![e]))
                .collect()
        };
        let source = match s("src-queue") {
            Some(name) => Source::Queue {
                name,
                args: table("src-queue-args"),
            },
            None => Source::Exchange {
                name: s("src-exchange").unwrap_or_default(),
                key: s("src-exchange-key").unwrap_or_default(),
            },
        };
        let dest = match s("dest-queue") {
            Some(name) => Dest::Queue {
                name,
                args: table("dest-queue-args"),
            },
            None => Dest::Exchange {
                name: s("dest-exchange"),
                key: s("dest-exchange-key"),
            },
        };
        let ack_mode = match def.get("ack-mode").and_then(Value::as_str) {
            Some("no-ack") => AckMode::NoAck,
            Some("on-publish") => AckMode::OnPublish,
            _ => AckMode::OnConfirm,
        };
        let prefetch = def
            .get("src-prefetch-count")
            .or_else(|| def.get("prefetch-count"))
            .and_then(Value::as_f64)
            .map(|n| n.clamp(0.0, u16::MAX as f64) as u16)
            .unwrap_or(1000);
        let delete_after = match def
            .get("src-delete-after")
            .or_else(|| def.get("delete-after"))
        {
            Some(Value::String(s)) if s == "queue-length" => DeleteAfter::QueueLength,
            Some(Value::Number(n)) => DeleteAfter::Count(n.as_i64().unwrap_or(0).max(0) as u64),
            _ => DeleteAfter::Never,
        };
        Ok(ShovelDef {
            src_uris: uris("src-uri")?,
            dest_uris: uris("dest-uri")?,
            source,
            dest,
            ack_mode,
            prefetch,
            reconnect_delay: def
                .get("reconnect-delay")
                .and_then(Value::as_f64)
                .unwrap_or(1.0)
                .max(0.0),
            delete_after,
            add_forward_headers: flag("dest-add-forward-headers", "add-forward-headers"),
            add_timestamp_header: flag("dest-add-timestamp-header", "add-timestamp-header"),
            publish_properties: def
                .get("dest-publish-properties")
                .or_else(|| def.get("publish-properties"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            consumer_args: table("src-consumer-args"),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn problems(v: Value) -> Vec<String> {
        validate("s1", &v).unwrap_err()
    }

    #[test]
    fn rabbitmq_texts_for_what_it_refuses() {
        assert_eq!(
            problems(json!({"src-uri": "amqp://", "dest-uri": "amqp://"})),
            ["Must specify 'src-exchange' or 'src-queue'"]
        );
        assert_eq!(
            problems(json!({"src-uri": "amqp://", "dest-uri": "amqp://",
                "src-queue": "a", "src-exchange": "x"})),
            ["Cannot specify 'src-exchange' and 'src-queue'"]
        );
        assert_eq!(
            problems(json!({"src-uri": "amqp://", "src-queue": "a"})),
            ["Key \"dest-uri\" not found in s1"]
        );
        assert_eq!(
            problems(
                json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "dest-queue": "b", "dest-exchange": "x"})
            ),
            ["Cannot specify 'dest-exchange' and 'dest-queue'"]
        );
        assert_eq!(
            problems(
                json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "ack-mode": "no-ack", "src-delete-after": 5})
            ),
            ["Cannot specify 'no-ack' and numerical 'delete-after'"]
        );
        assert_eq!(
            problems(json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "ack-mode": "sometimes"})),
            ["ack-mode should be one of [<<\"no-ack\">>,<<\"on-publish\">>,<<\"on-confirm\">>], actually was <<\"sometimes\">>"]
        );
        assert_eq!(
            problems(json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "src-delete-after": "later"})),
            ["src-delete-after should be a number greater than or equal to 0, \"never\" or \"queue-length\", actually was <<\"later\">>"]
        );
        assert_eq!(
            problems(
                json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "src-prefetch-count": "ten", "reconnect-delay": true})
            ),
            [
                "src-prefetch-count should be a number, actually was <<\"ten\">>",
                "reconnect-delay should be a number, actually was true"
            ]
        );
        assert_eq!(
            problems(
                json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "colour": "blue"})
            ),
            ["Unrecognised terms [{<<\"colour\">>,<<\"blue\">>}] in s1"]
        );
        assert_eq!(
            problems(json!({"src-uri": "http://x", "dest-uri": "amqp://", "src-queue": "a"})).len(),
            1
        );
        assert_eq!(
            problems(
                json!({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
                "dest-publish-properties": {"delivery_mode": "2"}})
            ),
            ["delivery_mode should be a number, actually was <<\"2\">>"]
        );
    }

    #[test]
    fn defaults_and_both_spellings() {
        let d = ShovelDef::parse(
            "s",
            &json!({"src-uri": "amqp://", "src-queue": "a", "dest-uri": ["amqp://h1", "amqp://h2:5673/v"]}),
        )
        .unwrap();
        assert_eq!(d.ack_mode, AckMode::OnConfirm);
        assert_eq!(d.prefetch, 1000);
        assert_eq!(d.reconnect_delay, 1.0);
        assert_eq!(d.delete_after, DeleteAfter::Never);
        assert_eq!(d.dest_uris.len(), 2);
        assert_eq!(
            d.dest,
            Dest::Exchange {
                name: None,
                key: None
            }
        );
        let d = ShovelDef::parse(
            "s",
            &json!({"src-uri": "amqp://", "src-exchange": "x", "src-exchange-key": "k",
                "dest-uri": "amqp://", "dest-queue": "b", "prefetch-count": 10,
                "delete-after": "queue-length", "add-forward-headers": true,
                "ack-mode": "on-publish", "dest-add-timestamp-header": true}),
        )
        .unwrap();
        assert_eq!(
            d.source,
            Source::Exchange {
                name: "x".into(),
                key: "k".into()
            }
        );
        assert_eq!(d.prefetch, 10);
        assert_eq!(d.delete_after, DeleteAfter::QueueLength);
        assert!(d.add_forward_headers && d.add_timestamp_header);
        assert_eq!(d.ack_mode, AckMode::OnPublish);
        let d = ShovelDef::parse(
            "s",
            &json!({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                "src-delete-after": 7}),
        )
        .unwrap();
        assert_eq!(d.delete_after, DeleteAfter::Count(7));
    }
}
