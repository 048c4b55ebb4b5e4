//! Dead-lettering: the republished copy of a message, with RabbitMQ's `x-death` bookkeeping.

use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;
use warren_protocol::{FieldTable, FieldValue};

use crate::message::Message;

/// Why a message was dead-lettered, as written in `x-death`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Rejected,
    Expired,
    MaxLen,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::MaxLen => "maxlen",
        }
    }
}

/// The copy of `msg` to publish to the dead-letter exchange `dlx`: headers gain an `x-death`
/// entry (count incremented if this queue and reason are already there, and moved first), the
/// `x-first-death-*` headers are set once, and `expiration` is removed (kept in the entry).
pub fn dead_lettered(
    msg: &Message,
    queue: &str,
    reason: Reason,
    dlx: &str,
    dl_routing_key: Option<&str>,
    now_s: u64,
) -> Message {
    let mut props = BasicProperties::decode(&msg.properties).unwrap_or_default();
    let mut headers = props.headers.take().unwrap_or_default();
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
            t.insert(
                "routing-keys",
                FieldValue::Array(vec![FieldValue::str(&msg.routing_key)]),
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
    props.headers = Some(headers);
    props.expiration = None;
    Message {
        exchange: ByteString::from(dlx),
        routing_key: dl_routing_key
            .map(ByteString::from)
            .unwrap_or_else(|| msg.routing_key.clone()),
        properties: props.to_bytes(),
        body: msg.body.clone(),
        persistent: msg.persistent,
        priority: msg.priority,
        expiration_ms: None,
    }
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
        let d1 = dead_lettered(&m, "q", Reason::Expired, "dlx", None, 5);
        assert_eq!((&*d1.exchange, &*d1.routing_key), ("dlx", "rk"));
        let d2 = dead_lettered(&d1, "q", Reason::Expired, "dlx", Some("k2"), 6);
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
}
