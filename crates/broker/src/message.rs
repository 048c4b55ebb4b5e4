//! A published message, shared by every queue it was routed to.

use bytes::Bytes;
use warren_protocol::properties::BasicProperties;
use warren_protocol::{ByteString, FieldTable, FieldValue};

use crate::error::AmqpError;

#[derive(Debug)]
pub struct Message {
    pub exchange: ByteString,
    pub routing_key: ByteString,
    /// Property flags and values as the publisher sent them; delivered verbatim.
    pub properties: Bytes,
    pub body: Bytes,
    pub persistent: bool,
    /// From the `priority` property, read only when the publisher set it.
    pub priority: Option<u8>,
    /// From the `expiration` property (ms), read only when the publisher set it.
    pub expiration_ms: Option<u64>,
    /// The bytes this message was read from when another node forwarded it here.
    pub forwarded: Forwarded,
}

/// A message as the node that forwarded it here encoded it (`cluster::remote::wire`), kept so
/// that sending it on (a delivery to a consumer on another node, a basic.get from one) writes
/// those bytes as they came instead of encoding the fields again. Only the decoder makes one,
/// from the very bytes the fields were sliced from, and a [`Message`] is not changed once
/// made (a changed copy, such as a dead-lettered one, is built with [`Forwarded::NONE`]), so
/// the bytes always say what the fields say.
///
/// Boxed: a message built here (most of them) then carries 8 bytes for it, not 32, and an
/// `Arc<Message>` stays in jemalloc's 192-byte size class (see the test below).
#[derive(Debug, Clone, Default)]
pub struct Forwarded(Option<Box<Bytes>>);

impl Forwarded {
    /// Built on this node: encoded from its fields when forwarded.
    pub const NONE: Forwarded = Forwarded(None);

    pub(crate) fn new(wire: Bytes) -> Forwarded {
        Forwarded(Some(Box::new(wire)))
    }

    pub(crate) fn bytes(&self) -> Option<&Bytes> {
        self.0.as_deref()
    }
}

impl warren_queue::Payload for Message {
    #[inline]
    fn body_len(&self) -> u64 {
        self.body.len() as u64
    }
    #[inline]
    fn priority(&self) -> Option<u8> {
        self.priority
    }
    #[inline]
    fn expiration_ms(&self) -> Option<u64> {
        self.expiration_ms
    }
}

impl Message {
    /// Bytes this message holds in memory, for queue accounting.
    pub fn size(&self) -> usize {
        self.body.len() + self.properties.len()
    }
}

/// The extra routing keys of RabbitMQ's sender-selected distribution: the long strings in the
/// `CC` and `BCC` header arrays, in that order (other entries are skipped, as RabbitMQ's
/// `rabbit_basic:header_routes` skips them). Either header as anything but an array makes the
/// message invalid, with RabbitMQ's text.
pub fn header_routes(headers: &FieldTable) -> Result<Vec<ByteString>, AmqpError> {
    let mut keys = Vec::new();
    for name in ["CC", "BCC"] {
        match headers.get(name) {
            None => {}
            Some(FieldValue::Array(routes)) => keys.extend(routes.iter().filter_map(|v| match v {
                FieldValue::LongStr(b) => ByteString::try_from(b.clone()).ok(),
                _ => None,
            })),
            Some(other) => {
                return Err(AmqpError::precondition_failed(format!(
                    "invalid message: {{unacceptable_type_in_header,\"{name}\",{}}}",
                    type_name(other)
                )))
            }
        }
    }
    Ok(keys)
}

/// RabbitMQ's name for a field value's type, as it appears in error texts.
pub fn type_name(v: &FieldValue) -> &'static str {
    match v {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) | FieldValue::U64(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(..) => "decimal",
        FieldValue::LongStr(_) => "longstr",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
        FieldValue::Bytes(_) => "binary",
    }
}

/// A message coming back for another attempt, with its `x-delivery-count` header (RabbitMQ 4's
/// name for it) raised, and the number of that attempt.
pub fn next_attempt(m: &Message) -> (Message, u64) {
    let props = BasicProperties::decode(&m.properties).unwrap_or_default();
    let attempt = props
        .headers
        .as_ref()
        .and_then(|h| h.get("x-delivery-count"))
        .and_then(|v| v.as_i64())
        .map_or(1, |n| n.max(0) as u64 + 1);
    (with_delivery_count(m, attempt), attempt)
}

/// `m` with its `x-delivery-count` header set to `n` (a quorum queue's count of returns).
pub fn with_delivery_count(m: &Message, n: u64) -> Message {
    let mut props = BasicProperties::decode(&m.properties).unwrap_or_default();
    let h = props.headers.get_or_insert_with(Default::default);
    h.0.retain(|(k, _)| &**k != "x-delivery-count");
    h.insert("x-delivery-count", FieldValue::I64(n as i64));
    Message {
        exchange: m.exchange.clone(),
        routing_key: m.routing_key.clone(),
        properties: props.to_bytes(),
        body: m.body.clone(),
        persistent: m.persistent,
        priority: m.priority,
        expiration_ms: m.expiration_ms,
        forwarded: Forwarded::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every queued message is an `Arc<Message>`: its 16-byte header and the message must stay
    /// within jemalloc's 192-byte size class (the next is 224), or every message in memory
    /// costs 32 bytes more.
    #[test]
    fn a_message_fits_its_size_class() {
        assert!(
            16 + std::mem::size_of::<Message>() <= 192,
            "{}",
            std::mem::size_of::<Message>()
        );
    }

    #[test]
    fn header_routes_take_long_strings_from_cc_then_bcc() {
        let mut h = FieldTable::new();
        h.insert("BCC", FieldValue::Array(vec![FieldValue::str("b")]));
        h.insert(
            "CC",
            FieldValue::Array(vec![
                FieldValue::str("a"),
                FieldValue::I32(5),
                FieldValue::Bytes(Bytes::from_static(b"x")),
                FieldValue::str(""),
            ]),
        );
        h.insert("cc", FieldValue::Array(vec![FieldValue::str("lower")]));
        let keys = header_routes(&h).expect("valid");
        assert_eq!(keys, vec!["a", "", "b"]);
    }

    #[test]
    fn header_routes_refuse_a_non_array() {
        let mut h = FieldTable::new();
        h.insert("CC", FieldValue::str("a"));
        let e = header_routes(&h).expect_err("invalid");
        assert_eq!(e.code, 406);
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
        );
    }
}
