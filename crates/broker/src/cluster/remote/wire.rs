//! The forwarding protocol's bytes: the one-way frame kinds, the queue requests and settle
//! kinds, and a message's encoding in publish, deliver and get frames, with the readers that
//! take them apart.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use warren_protocol::ByteString;

use crate::message::{Forwarded, Message};

pub const K_PUBLISH: u8 = 16;
pub const K_CONFIRM: u8 = 17;
pub const K_DELIVER: u8 = 18;
pub const K_SETTLE: u8 = 19;
pub const K_CREDIT: u8 = 20;
pub const K_CANCEL: u8 = 21;
/// The home took `n` forwarded publishes to a queue: the publishing node may send more.
pub const K_PUB_CREDIT: u8 = 22;
/// The home removed a consumer (a `Q_CANCEL`, after its auto-delete queue is deleted): sent in
/// the bulk lane, after every delivery made to that consumer, so when it arrives nothing more
/// for the consumer is on the wire.
pub const K_CANCEL_OK: u8 = 23;

pub(super) const Q_CONSUME: u8 = 1;
pub(super) const Q_CANCEL: u8 = 2;
pub(super) const Q_GET: u8 = 3;
pub(super) const Q_COUNTS: u8 = 4;
pub(super) const Q_PURGE: u8 = 5;
/// Answered once the settles that came before it on the link are applied.
pub(super) const Q_SYNC: u8 = 6;

pub(super) const SETTLE_ACK: u8 = 0;
pub(super) const SETTLE_REQUEUE: u8 = 1;
pub(super) const SETTLE_DISCARD: u8 = 2;

/// A message's fixed-size fields, after the caller's own (`pre`): lengths, flags, priority,
/// expiration.
const MESSAGE_HEAD: usize = 2 + 2 + 4 + 4 + 1 + 1 + 8;
const PRE_MAX: usize = 16;

/// Writes `pre` (the item's own fixed fields, up to 16 bytes) and `m`: the fixed fields in one
/// copy, then the four variable ones. Every `put_*` of `BytesMut` is a bounds check and a call
/// to `memcpy`; writing each field on its own made encoding a forwarded message cost more
/// instructions than routing it (callgrind).
pub(crate) fn put_message(b: &mut BytesMut, pre: &[u8], m: &Message) {
    if let Some(wire) = m.forwarded.bytes() {
        // As another node encoded it: sent on as it came (a delivery from the queue's node).
        b.reserve(pre.len() + wire.len());
        b.put_slice(pre);
        b.put_slice(wire);
        return;
    }
    let mut head = [0u8; PRE_MAX + MESSAGE_HEAD];
    let n = pre.len();
    head[..n].copy_from_slice(pre);
    head[n..n + 2].copy_from_slice(&(m.exchange.len() as u16).to_be_bytes());
    head[n + 2..n + 4].copy_from_slice(&(m.routing_key.len() as u16).to_be_bytes());
    head[n + 4..n + 8].copy_from_slice(&(m.properties.len() as u32).to_be_bytes());
    head[n + 8..n + 12].copy_from_slice(&(m.body.len() as u32).to_be_bytes());
    head[n + 12] = m.persistent as u8
        | (m.priority.is_some() as u8) << 1
        | (m.expiration_ms.is_some() as u8) << 2;
    head[n + 13] = m.priority.unwrap_or(0);
    head[n + 14..n + 22].copy_from_slice(&m.expiration_ms.unwrap_or(0).to_be_bytes());
    let fields: [&[u8]; 4] = [
        m.exchange.as_bytes(),
        m.routing_key.as_bytes(),
        &m.properties,
        &m.body,
    ];
    b.reserve(n + MESSAGE_HEAD + fields.iter().map(|f| f.len()).sum::<usize>());
    b.put_slice(&head[..n + MESSAGE_HEAD]);
    for f in fields.into_iter().filter(|f| !f.is_empty()) {
        b.put_slice(f);
    }
}

/// A message as [`put_message`] wrote it, to be handed to a consumer here: its bytes are not
/// kept.
pub(crate) fn get_message(b: &mut Bytes) -> Option<Message> {
    read_message(b, false)
}

/// A message forwarded to its queue here, which may send it on to a consumer on another node:
/// it keeps its bytes ([`Forwarded`]), so that sending it on writes them as they came.
pub(crate) fn get_forwarded(b: &mut Bytes) -> Option<Message> {
    read_message(b, true)
}

fn read_message(b: &mut Bytes, keep: bool) -> Option<Message> {
    if b.len() < MESSAGE_HEAD {
        return None;
    }
    let h = &b[..MESSAGE_HEAD];
    let exchange_len = u16::from_be_bytes([h[0], h[1]]) as usize;
    let key_len = u16::from_be_bytes([h[2], h[3]]) as usize;
    let props_len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let body_len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let (flags, priority) = (h[12], h[13]);
    let expiration = u64::from_be_bytes(h[14..22].try_into().ok()?);
    // Where the routing key, the properties and the body start.
    let k = MESSAGE_HEAD + exchange_len;
    let p = k + key_len;
    let body = p + props_len;
    if b.len() < body + body_len {
        return None;
    }
    // The message's bytes, kept whole ([`Forwarded`]) and sliced into its fields, as the AMQP
    // decoder slices a frame: no copy, no allocation.
    let wire = b.split_to(body + body_len);
    Some(Message {
        exchange: ByteString::try_from(wire.slice(MESSAGE_HEAD..k)).ok()?,
        routing_key: ByteString::try_from(wire.slice(k..p)).ok()?,
        properties: wire.slice(p..body),
        body: wire.slice(body..),
        persistent: flags & 1 != 0,
        priority: (flags & 2 != 0).then_some(priority),
        expiration_ms: (flags & 4 != 0).then_some(expiration),
        forwarded: if keep {
            Forwarded::new(wire)
        } else {
            Forwarded::NONE
        },
    })
}

/// A string as [`put_str`](crate::cluster::link::put_str) wrote it, as a slice of the frame.
pub(super) fn get_bytes(b: &mut Bytes) -> Option<Bytes> {
    if b.len() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    (b.len() >= n).then(|| b.split_to(n))
}

pub(super) fn get_u8(b: &mut Bytes) -> Option<u8> {
    (!b.is_empty()).then(|| b.get_u8())
}

pub(super) fn get_u32(b: &mut Bytes) -> Option<u32> {
    (b.len() >= 4).then(|| b.get_u32())
}

pub(super) fn get_u64(b: &mut Bytes) -> Option<u64> {
    (b.len() >= 8).then(|| b.get_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = Message {
            exchange: "x".into(),
            routing_key: "rk".into(),
            properties: Bytes::from_static(b"\x80\x00\x01"),
            body: Bytes::from_static(b"hello"),
            persistent: true,
            priority: Some(3),
            expiration_ms: None,
            forwarded: Forwarded::NONE,
        };
        let mut b = BytesMut::new();
        put_message(&mut b, &[], &m);
        let got = get_message(&mut b.freeze()).expect("decodes");
        assert_eq!(got.exchange, m.exchange);
        assert_eq!(got.routing_key, m.routing_key);
        assert_eq!(got.properties, m.properties);
        assert_eq!(got.body, m.body);
        assert!(got.persistent);
        assert_eq!(got.priority, Some(3));
        assert_eq!(got.expiration_ms, None);
        assert!(get_message(&mut Bytes::from_static(b"\x00")).is_none());
        // After the item's own fields; an empty exchange; a truncated message is refused.
        let m = Message {
            exchange: "".into(),
            expiration_ms: Some(60_000),
            priority: None,
            ..m
        };
        let mut b = BytesMut::new();
        put_message(&mut b, &[7, 7, 7], &m);
        let mut whole = b.freeze();
        assert_eq!(whole.split_to(3).as_ref(), &[7, 7, 7]);
        let mut cut = whole.slice(..whole.len() - 1);
        let got = get_message(&mut whole).expect("decodes");
        assert_eq!(got.exchange, "");
        assert_eq!(got.routing_key, "rk");
        assert_eq!(got.body, m.body);
        assert_eq!(got.expiration_ms, Some(60_000));
        assert_eq!(got.priority, None);
        assert!(whole.is_empty(), "read to its end");
        assert!(get_message(&mut cut).is_none());
    }

    /// A message forwarded here goes on in the bytes it came in, and a changed copy of it is
    /// encoded from its own fields.
    #[test]
    fn a_forwarded_message_goes_on_as_it_came() {
        let m = Message {
            exchange: "amq.direct".into(),
            routing_key: "rk".into(),
            properties: crate::message::with_delivery_count(
                &Message {
                    exchange: "".into(),
                    routing_key: "".into(),
                    properties: Bytes::new(),
                    body: Bytes::new(),
                    persistent: false,
                    priority: None,
                    expiration_ms: None,
                    forwarded: Forwarded::NONE,
                },
                1,
            )
            .properties,
            body: Bytes::from_static(b"body"),
            persistent: true,
            priority: Some(4),
            expiration_ms: Some(5),
            forwarded: Forwarded::NONE,
        };
        let mut sent = BytesMut::new();
        put_message(&mut sent, &[1, 2], &m);
        let sent = sent.freeze();
        let mut r = sent.slice(2..);
        assert!(get_message(&mut sent.slice(2..))
            .expect("decodes")
            .forwarded
            .bytes()
            .is_none());
        let got = get_forwarded(&mut r).expect("decodes");
        assert!(r.is_empty());
        assert_eq!(
            got.forwarded.bytes().map(|b| b.as_ref()),
            Some(&sent[2..]),
            "kept whole"
        );
        let mut again = BytesMut::new();
        put_message(&mut again, &[1, 2], &got);
        assert_eq!(again.as_ref(), sent.as_ref(), "sent on byte for byte");
        // What is written is the kept bytes, not a new encoding of the fields.
        let marked = Message {
            forwarded: Forwarded::new(Bytes::from_static(b"as it came")),
            ..get_message(&mut sent.slice(2..)).expect("decodes")
        };
        let mut b = BytesMut::new();
        put_message(&mut b, &[9], &marked);
        assert_eq!(b.as_ref(), b"\x09as it came");
        // A copy with another header is encoded from its fields, not from the kept bytes.
        let changed = crate::message::with_delivery_count(&got, 2);
        assert!(changed.forwarded.bytes().is_none());
        let mut b = BytesMut::new();
        put_message(&mut b, &[], &changed);
        let back = get_message(&mut b.freeze()).expect("decodes");
        assert_eq!(back.properties, changed.properties);
        assert_ne!(back.properties, got.properties);
        assert_eq!(back.body, got.body);
        assert_eq!(back.expiration_ms, Some(5));
        assert_eq!(back.priority, Some(4));
    }
}
