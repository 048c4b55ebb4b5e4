//! Dead-lettering: the republished copy of a message, with RabbitMQ's `x-death` bookkeeping.

use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;
use warren_protocol::{FieldTable, FieldValue};

use crate::message::{header_routes, Message};

pub use warren_queue::Reason;

/// Drops from `targets` each queue a dead letter would cycle back into, by RabbitMQ 3.10's rule
/// (`rabbit_dead_letter:detect_cycles`): a queue is a cycle when it already appears in the
/// message's `x-death` (its new entry included) and no entry from the newest back to that
/// queue's, both included, has reason `rejected`. A cycle with a rejection in it was driven by
/// a client, so it is allowed; one made only of expiries, length limits and delivery limits
/// would loop for ever. `properties` are the dead letter's (what [`dead_lettered`] made, or a
/// delay store's held copy of it); `name` gives a target's queue name (generic, so that this
/// file needs nothing of the queue handle's). Each dropped target is logged at debug level.
pub fn drop_cycles<T>(properties: &bytes::Bytes, targets: &mut Vec<T>, name: impl Fn(&T) -> &str) {
    if targets.is_empty() {
        return;
    }
    let Some(deaths) = deaths_of(properties) else {
        return;
    };
    targets.retain(|q| {
        let cycle = is_cycle(&deaths, name(q));
        if cycle {
            tracing::debug!(queue = name(q), path = ?deaths.iter().map(|d| d.0.as_deref().unwrap_or("?")).collect::<Vec<_>>(),
                "dead letter dropped: it would cycle back into a queue it died in with no rejection on the way");
        }
        !cycle
    });
}

/// A message's `x-death` entries, newest first: (queue, whether the reason is `rejected`). An
/// entry that is not a table, or has no queue, reads as `(None, true)`: something a client put
/// there, so no cycle through it is "fully automatic" (as RabbitMQ reads it).
fn deaths_of(properties: &bytes::Bytes) -> Option<Vec<(Option<String>, bool)>> {
    let props = BasicProperties::decode(properties).ok()?;
    let headers = props.headers?;
    let Some(FieldValue::Array(deaths)) = headers.get("x-death") else {
        return None;
    };
    Some(
        deaths
            .iter()
            .map(|d| match d {
                FieldValue::Table(t) => match t.get("queue").and_then(|v| v.as_str()) {
                    Some(q) => (
                        Some(q.to_string()),
                        t.get("reason").and_then(|v| v.as_str()) == Some("rejected"),
                    ),
                    None => (None, true),
                },
                _ => (None, true),
            })
            .collect(),
    )
}

/// RabbitMQ's `is_cycle`: `queue` appears in `deaths` (newest first), and no entry from the
/// newest back to its first appearance, both included, is a rejection.
fn is_cycle(deaths: &[(Option<String>, bool)], queue: &str) -> bool {
    for (q, rejected) in deaths {
        if *rejected {
            return false;
        }
        if q.as_deref() == Some(queue) {
            return true;
        }
    }
    false
}

/// The copy of `msg` to publish to the dead-letter exchange `dlx`: headers gain an `x-death`
/// entry (count incremented if this queue and reason are already there, and moved first), the
/// `x-first-death-*` headers are set once, and `expiration` is removed (kept in the entry).
/// Also returns the extra routing keys to route it with: its `CC` keys, unless
/// `dl_routing_key` replaces every key (the `CC` header is then removed, as in RabbitMQ).
/// RabbitMQ also re-routes to the `BCC` keys of the original publish; Warren keeps no record
/// of those once the header is stripped (docs/compat.md).
pub fn dead_lettered(
    msg: &Message,
    queue: &str,
    reason: Reason,
    dlx: &str,
    dl_routing_key: Option<&str>,
    now_s: u64,
) -> (Message, Vec<ByteString>) {
    let mut props = BasicProperties::decode(&msg.properties).unwrap_or_default();
    let mut headers = props.headers.take().unwrap_or_default();
    // Validated at publish; a stored message from before cannot fail here either.
    let cc = header_routes(&headers).unwrap_or_default();
    let mut deaths = match headers.get("x-death") {
        Some(FieldValue::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    let same = |t: &FieldTable| {
        t.get("queue").and_then(|v| v.as_str()) == Some(queue)
            && t.get("reason").and_then(|v| v.as_str()) == Some(reason.as_str())
    };
    let existing = deaths
        .iter()
        .position(|d| matches!(d, FieldValue::Table(t) if same(t)));
    let entry = match existing.map(|i| deaths.remove(i)) {
        Some(FieldValue::Table(mut t)) => {
            let count = t.get("count").and_then(|v| v.as_i64()).unwrap_or(0) + 1;
            t.insert("count", FieldValue::I64(count));
            t.insert("time", FieldValue::Timestamp(now_s));
            t
        }
        _ => {
            let mut t = FieldTable::new();
            t.insert("count", FieldValue::I64(1));
            t.insert("reason", FieldValue::str(reason.as_str()));
            t.insert("queue", FieldValue::str(queue));
            t.insert("time", FieldValue::Timestamp(now_s));
            t.insert("exchange", FieldValue::str(&msg.exchange));
            let keys = std::iter::once(&msg.routing_key).chain(&cc);
            t.insert(
                "routing-keys",
                FieldValue::Array(keys.map(|k| FieldValue::str(k)).collect()),
            );
            if let Some(e) = &props.expiration {
                t.insert("original-expiration", FieldValue::str(e));
            }
            t
        }
    };
    deaths.insert(0, FieldValue::Table(entry));
    headers.insert("x-death", FieldValue::Array(deaths));
    for (k, v) in [
        ("x-first-death-reason", reason.as_str()),
        ("x-first-death-queue", queue),
        ("x-first-death-exchange", &msg.exchange),
    ] {
        if headers.get(k).is_none() {
            headers.insert(k, FieldValue::str(v));
        }
    }
    let extra = if dl_routing_key.is_some() {
        headers.0.retain(|(k, _)| &**k != "CC");
        Vec::new()
    } else {
        cc
    };
    props.headers = Some(headers);
    props.expiration = None;
    let m = Message {
        exchange: ByteString::from(dlx),
        routing_key: dl_routing_key
            .map(ByteString::from)
            .unwrap_or_else(|| msg.routing_key.clone()),
        properties: props.to_bytes(),
        body: msg.body.clone(),
        persistent: msg.persistent,
        priority: msg.priority,
        expiration_ms: None,
        forwarded: crate::message::Forwarded::NONE,
    };
    (m, extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn deaths(entries: &[(&str, &str)]) -> Vec<(Option<String>, bool)> {
        let mut h = FieldTable::new();
        let arr = entries
            .iter()
            .map(|(q, r)| {
                let mut t = FieldTable::new();
                t.insert("queue", FieldValue::str(q));
                t.insert("reason", FieldValue::str(r));
                FieldValue::Table(t)
            })
            .collect();
        h.insert("x-death", FieldValue::Array(arr));
        let props = BasicProperties {
            headers: Some(h),
            ..Default::default()
        }
        .to_bytes();
        deaths_of(&props).expect("x-death")
    }

    #[test]
    fn cycles_are_found_as_rabbitmq_finds_them() {
        // Expired from q into an exchange that routes back to q: a cycle for q only.
        let d = deaths(&[("q", "expired")]);
        assert!(is_cycle(&d, "q"));
        assert!(!is_cycle(&d, "observer"));
        // q -> p (maxlen) -> q: q and p are both in the path with no rejection.
        let d = deaths(&[("p", "maxlen"), ("q", "expired")]);
        assert!(is_cycle(&d, "q") && is_cycle(&d, "p"));
        // A rejection anywhere from the newest entry back to the queue's breaks the cycle.
        let d = deaths(&[("p", "expired"), ("q", "rejected")]);
        assert!(
            is_cycle(&d, "p"),
            "p's own entry is newer than the rejection"
        );
        assert!(!is_cycle(&d, "q"));
        let d = deaths(&[("q", "rejected")]);
        assert!(!is_cycle(&d, "q"), "a rejected dead letter never cycles");
        let d = deaths(&[("p", "expired"), ("x", "rejected"), ("q", "expired")]);
        assert!(!is_cycle(&d, "q"));
        // An entry a client wrote (no queue) counts as a break too.
        let mut h = FieldTable::new();
        let mut t = FieldTable::new();
        t.insert("queue", FieldValue::str("q"));
        t.insert("reason", FieldValue::str("expired"));
        h.insert(
            "x-death",
            FieldValue::Array(vec![FieldValue::str("junk"), FieldValue::Table(t)]),
        );
        let props = BasicProperties {
            headers: Some(h),
            ..Default::default()
        }
        .to_bytes();
        assert!(!is_cycle(&deaths_of(&props).expect("x-death"), "q"));
    }

    #[test]
    fn a_dead_letter_made_here_cycles_into_its_own_queue() {
        let m = Message {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            properties: BasicProperties::default().to_bytes(),
            body: Bytes::from_static(b"b"),
            persistent: false,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let (d, _) = dead_lettered(&m, "q", Reason::Expired, "dlx", None, 1);
        assert!(is_cycle(&deaths_of(&d.properties).expect("x-death"), "q"));
        let (d, _) = dead_lettered(&m, "q", Reason::Rejected, "dlx", None, 1);
        assert!(!is_cycle(&deaths_of(&d.properties).expect("x-death"), "q"));
        let (d2, _) = dead_lettered(&d, "p", Reason::MaxLen, "dlx", None, 2);
        let path = deaths_of(&d2.properties).expect("x-death");
        assert!(is_cycle(&path, "p") && !is_cycle(&path, "q"));
    }

    #[test]
    fn x_death_counts_and_first_death() {
        let props = BasicProperties {
            expiration: Some("100".into()),
            ..Default::default()
        };
        let m = Message {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            properties: props.to_bytes(),
            body: Bytes::from_static(b"b"),
            persistent: false,
            priority: None,
            expiration_ms: Some(100),
            forwarded: crate::message::Forwarded::NONE,
        };
        let (d1, _) = dead_lettered(&m, "q", Reason::Expired, "dlx", None, 5);
        assert_eq!((&*d1.exchange, &*d1.routing_key), ("dlx", "rk"));
        let (d2, _) = dead_lettered(&d1, "q", Reason::Expired, "dlx", Some("k2"), 6);
        let p = BasicProperties::decode(&d2.properties).expect("decodes");
        assert_eq!(p.expiration, None);
        let h = p.headers.expect("headers");
        let Some(FieldValue::Array(deaths)) = h.get("x-death") else {
            panic!("x-death")
        };
        assert_eq!(deaths.len(), 1);
        let FieldValue::Table(e) = &deaths[0] else {
            panic!("entry")
        };
        assert_eq!(e.get("count"), Some(&FieldValue::I64(2)));
        assert_eq!(
            e.get("original-expiration").and_then(|v| v.as_str()),
            Some("100")
        );
        assert_eq!(
            h.get("x-first-death-exchange").and_then(|v| v.as_str()),
            Some("ex")
        );
        assert_eq!(&*d2.routing_key, "k2");
    }

    #[test]
    fn cc_keys_route_again_unless_a_dead_letter_key_replaces_them() {
        let mut h = FieldTable::new();
        h.insert(
            "CC",
            FieldValue::Array(vec![FieldValue::str("a"), FieldValue::str("b")]),
        );
        let m = Message {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            properties: BasicProperties {
                headers: Some(h),
                ..Default::default()
            }
            .to_bytes(),
            body: Bytes::from_static(b"b"),
            persistent: false,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let keys_of = |d: &Message| {
            let h = BasicProperties::decode(&d.properties)
                .expect("decodes")
                .headers
                .expect("headers");
            let Some(FieldValue::Array(deaths)) = h.get("x-death") else {
                panic!("x-death")
            };
            let FieldValue::Table(e) = &deaths[0] else {
                panic!("entry")
            };
            let Some(FieldValue::Array(keys)) = e.get("routing-keys") else {
                panic!("routing-keys")
            };
            let keys: Vec<String> = keys
                .iter()
                .filter_map(|k| k.as_str())
                .map(String::from)
                .collect();
            (keys, h.get("CC").is_some())
        };
        let (same, extra) = dead_lettered(&m, "q", Reason::Rejected, "dlx", None, 1);
        assert_eq!(extra, vec!["a", "b"]);
        assert_eq!(
            keys_of(&same),
            (vec!["rk".into(), "a".into(), "b".into()], true)
        );
        let (new_key, extra) = dead_lettered(&m, "q", Reason::Rejected, "dlx", Some("k"), 1);
        assert!(extra.is_empty());
        assert_eq!(&*new_key.routing_key, "k");
        assert_eq!(
            keys_of(&new_key),
            (vec!["rk".into(), "a".into(), "b".into()], false)
        );
    }
}
