//! A shovelled message's properties. They travel as AMQP encodes them (the flags and values of
//! a content header, as the broker keeps them), so a message moved between two local ends is
//! never decoded; they are decoded only to change them (`dest-publish-properties`, the
//! forward and timestamp headers), and converted to and from the AMQP client's type at a
//! remote end with that client's own codec.

use bytes::Bytes;
use bytestring::ByteString;
use serde_json::{Map, Value};
use warren_protocol::properties::BasicProperties;
use warren_protocol::{FieldTable, FieldValue};

/// RabbitMQ's header listing the shovels a message went through, newest first.
pub const SHOVELLED: &str = "x-shovelled";
/// RabbitMQ's header with the time (seconds) the shovel moved it.
pub const SHOVELLED_TIMESTAMP: &str = "x-shovelled-timestamp";

/// What the destination changes in every message: nothing, unless asked.
#[derive(Debug, Clone, Default)]
pub struct Amend {
    /// `dest-publish-properties`.
    pub set: Map<String, Value>,
    /// The `x-shovelled` entry (`dest-add-forward-headers`), without the time.
    pub forward: Option<FieldTable>,
    /// `dest-add-timestamp-header`.
    pub timestamp: bool,
}

impl Amend {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.forward.is_none() && !self.timestamp
    }

    /// `raw` with the changes made; `raw` itself when there are none. Properties that do not
    /// decode go on unchanged (the broker that accepted them keeps them as they came).
    pub fn apply(&self, raw: Bytes, now_secs: u64) -> Bytes {
        if self.is_empty() {
            return raw;
        }
        let Ok(mut p) = BasicProperties::decode(&raw) else {
            return raw;
        };
        for (k, v) in &self.set {
            set_property(&mut p, k, v);
        }
        if self.forward.is_some() || self.timestamp {
            let headers = p.headers.get_or_insert_with(FieldTable::new);
            if let Some(entry) = &self.forward {
                prepend_table(headers, SHOVELLED, entry.clone());
            }
            if self.timestamp {
                headers.0.retain(|(k, _)| &**k != SHOVELLED_TIMESTAMP);
                headers
                    .0
                    .push((SHOVELLED_TIMESTAMP.into(), FieldValue::I64(now_secs as i64)));
            }
        }
        p.to_bytes()
    }
}

/// `raw` properties with `entry` prepended to the array header `key` (RabbitMQ's
/// `prepend_table_header`); `raw` unchanged if it does not decode.
pub fn prepend_header_table(raw: Bytes, key: &str, entry: FieldTable) -> Bytes {
    let Ok(mut p) = BasicProperties::decode(&raw) else {
        return raw;
    };
    prepend_table(p.headers.get_or_insert_with(FieldTable::new), key, entry);
    p.to_bytes()
}

/// A field table as the client's type (through the AMQP encoding both share).
pub fn table_to_client(t: &FieldTable) -> lapin::types::FieldTable {
    let raw = BasicProperties {
        headers: Some(t.clone()),
        ..Default::default()
    }
    .to_bytes();
    to_client(&raw)
        .and_then(|p| p.headers().clone())
        .unwrap_or_default()
}

/// RabbitMQ's `rabbit_basic:prepend_table_header`: `entry` goes first in the array under
/// `key`, which is made one if it was absent (a value of another type is replaced).
fn prepend_table(headers: &mut FieldTable, key: &str, entry: FieldTable) {
    match headers.0.iter_mut().find(|(k, _)| &**k == key) {
        Some((_, FieldValue::Array(items))) => items.insert(0, FieldValue::Table(entry)),
        Some((_, v)) => *v = FieldValue::Array(vec![FieldValue::Table(entry)]),
        None => headers.0.push((
            key.into(),
            FieldValue::Array(vec![FieldValue::Table(entry)]),
        )),
    }
}

fn set_property(p: &mut BasicProperties, key: &str, v: &Value) {
    let s = || v.as_str().map(ByteString::from);
    let n = || v.as_u64();
    match key {
        "content_type" => p.content_type = s(),
        "content_encoding" => p.content_encoding = s(),
        "delivery_mode" => p.delivery_mode = n().map(|x| x.min(255) as u8),
        "priority" => p.priority = n().map(|x| x.min(255) as u8),
        "correlation_id" => p.correlation_id = s(),
        "reply_to" => p.reply_to = s(),
        "expiration" => p.expiration = s(),
        "message_id" => p.message_id = s(),
        "timestamp" => p.timestamp = n(),
        "type" => p.kind = s(),
        "user_id" => p.user_id = s(),
        "app_id" => p.app_id = s(),
        "cluster_id" => p.cluster_id = s(),
        _ => {}
    }
}

/// The `x-shovelled` entry RabbitMQ 3.10 writes for a dynamic shovel.
pub fn forward_entry(
    cluster_name: &str,
    vhost: &str,
    name: &str,
    src_uri: &str,
    dest_uri: &str,
    ends: &[(&str, String)],
) -> FieldTable {
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    let mut t = FieldTable::new();
    for (k, v) in [
        ("shovelled-by", cluster_name),
        ("shovel-type", "dynamic"),
        ("shovel-name", name),
        ("shovel-vhost", vhost),
        ("src-uri", src_uri),
        ("dest-uri", dest_uri),
    ] {
        t.0.push((k.into(), long(v)));
    }
    for (k, v) in ends {
        t.0.push(((*k).into(), long(v)));
    }
    t
}

/// The client's properties as AMQP encodes them (its own codec, so nothing is lost).
pub fn from_client(p: &lapin::BasicProperties) -> Bytes {
    use lapin::protocol::basic::gen_properties;
    match cookie_factory::gen_simple(gen_properties(p), Vec::new()) {
        Ok(v) => Bytes::from(v),
        // Writing to a Vec cannot run out of room; were it to fail, no properties.
        Err(_) => Bytes::from_static(&[0, 0]),
    }
}

/// Encoded properties as the client's type; `None` if they do not decode.
pub fn to_client(raw: &[u8]) -> Option<lapin::BasicProperties> {
    lapin::protocol::basic::parse_properties(raw)
        .ok()
        .map(|(_, p)| p)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(p: &BasicProperties) -> Bytes {
        p.to_bytes()
    }

    #[test]
    fn nothing_to_change_leaves_the_bytes() {
        let r = raw(&BasicProperties {
            content_type: Some("text/plain".into()),
            ..Default::default()
        });
        let out = Amend::default().apply(r.clone(), 1);
        assert_eq!(out.as_ptr(), r.as_ptr());
    }

    #[test]
    fn headers_and_properties_are_added() {
        let mut h = FieldTable::new();
        h.0.push(("x-app".into(), FieldValue::I32(7)));
        let r = raw(&BasicProperties {
            headers: Some(h),
            ..Default::default()
        });
        let a = Amend {
            set: json!({"delivery_mode": 2, "app_id": "mover"})
                .as_object()
                .cloned()
                .unwrap(),
            forward: Some(forward_entry(
                "c",
                "/",
                "s1",
                "amqp://",
                "amqp://",
                &[("src-queue", "a".into()), ("dest-queue", "b".into())],
            )),
            timestamp: true,
        };
        let once = a.apply(r, 1_700_000_000);
        let twice = BasicProperties::decode(&a.apply(once, 1_700_000_001)).unwrap();
        assert_eq!(twice.delivery_mode, Some(2));
        assert_eq!(twice.app_id.as_deref(), Some("mover"));
        let h = twice.headers.unwrap();
        assert!(h
            .0
            .iter()
            .any(|(k, v)| &**k == "x-app" && *v == FieldValue::I32(7)));
        let shovelled = h.0.iter().find(|(k, _)| &**k == SHOVELLED).unwrap();
        let FieldValue::Array(entries) = &shovelled.1 else {
            panic!("{shovelled:?}")
        };
        // Each pass prepends its entry, as RabbitMQ's do.
        assert_eq!(entries.len(), 2);
        let ts: Vec<_> =
            h.0.iter()
                .filter(|(k, _)| &**k == SHOVELLED_TIMESTAMP)
                .collect();
        assert_eq!(ts.len(), 1);
        assert_eq!(ts[0].1, FieldValue::I64(1_700_000_001));
    }

    #[test]
    fn client_properties_round_trip() {
        let mut h = FieldTable::new();
        h.0.push(("k".into(), FieldValue::LongStr(Bytes::from_static(b"v"))));
        let r = raw(&BasicProperties {
            content_type: Some("a/b".into()),
            headers: Some(h),
            delivery_mode: Some(2),
            priority: Some(3),
            timestamp: Some(99),
            ..Default::default()
        });
        let c = to_client(&r).unwrap();
        assert_eq!(c.delivery_mode(), &Some(2));
        assert_eq!(from_client(&c), r);
    }
}
