//! Dead-lettering: the republished copy of a message, with RabbitMQ's `x-death` bookkeeping.

use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;
use warren_protocol::{FieldTable, FieldValue};

use crate::message::{header_routes, Message};

pub use warren_queue::Reason;

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
    };
    (m, extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
