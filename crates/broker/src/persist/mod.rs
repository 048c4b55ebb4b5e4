//! Durable logs: what the persister writes (`Logged`, a queue's `MessageLog`) and how a message
//! is stored (`encode_message`, `decode_message`). The persister itself, group commit, is in
//! `group.rs`. A persistent message consumed and acked while still buffered is never written.

use crate::clock::unix_ms;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;

use crate::confirm::ConfirmHandle;
use crate::message::Message;

mod group;
pub use group::Persister;

/// What a classic queue and the persister need of a queue's log: the store's
/// [`warren_store::QueueLog`] on disk, or a test's log in memory (`queue/tests.rs`). A queue
/// holds it boxed: one indirect call per enqueue and ack, which callgrind counts in the noise
/// of a persistent publish (docs/benchmarks.md, issue 30's layers).
pub trait MessageLog: Send {
    /// Buffers an enqueue; `confirm` comes back from [`MessageLog::write_pending`] once
    /// written, or from an ack that cancels it first. A `volatile` record (a transient message
    /// paged out) is not recovered.
    fn enqueue(
        &mut self,
        seq: u64,
        data: Bytes,
        confirm: Option<Arc<ConfirmHandle>>,
        volatile: bool,
    );
    /// The message left the queue: the confirm of an enqueue not yet written, if any.
    fn ack(&mut self, seq: u64) -> Option<Arc<ConfirmHandle>>;
    /// Every enqueue from `from` to `to` that `live` holds left (a paged tail dropped at once).
    fn ack_range(
        &mut self,
        from: u64,
        to: u64,
        live: &dyn Fn(u64) -> bool,
    ) -> Vec<Arc<ConfirmHandle>>;
    /// A cursor over what was recovered at open, the first of which is `first_seq`.
    fn cursor_at_start(&self, first_seq: u64) -> warren_store::Cursor;
    /// A cursor for enqueues from `next_seq` on, none of which is written yet.
    fn cursor_at_end(&self, next_seq: u64) -> warren_store::Cursor;
    /// About `max_bytes` of enqueues from `cursor` on that `keep` holds, in seq order.
    fn read(
        &self,
        cursor: &mut warren_store::Cursor,
        max_bytes: usize,
        keep: &dyn Fn(u64) -> bool,
    ) -> std::io::Result<Vec<(u64, Bytes)>>;
    /// Writes what is buffered (the caller fsyncs the files it returns).
    fn write_pending(&mut self) -> warren_store::Written<Arc<ConfirmHandle>>;
    /// Bytes written since it was opened (the persister's statistics).
    fn bytes_written(&self) -> u64;
    /// Removes the log; the confirms it still held.
    fn destroy(self: Box<Self>) -> Vec<Arc<ConfirmHandle>>;
}

impl MessageLog for warren_store::QueueLog<Arc<ConfirmHandle>> {
    fn enqueue(
        &mut self,
        seq: u64,
        data: Bytes,
        confirm: Option<Arc<ConfirmHandle>>,
        volatile: bool,
    ) {
        warren_store::QueueLog::enqueue(self, seq, data, confirm, volatile)
    }
    fn ack(&mut self, seq: u64) -> Option<Arc<ConfirmHandle>> {
        warren_store::QueueLog::ack(self, seq)
    }
    fn ack_range(
        &mut self,
        from: u64,
        to: u64,
        live: &dyn Fn(u64) -> bool,
    ) -> Vec<Arc<ConfirmHandle>> {
        warren_store::QueueLog::ack_range(self, from, to, live)
    }
    fn cursor_at_start(&self, first_seq: u64) -> warren_store::Cursor {
        warren_store::QueueLog::cursor_at_start(self, first_seq)
    }
    fn cursor_at_end(&self, next_seq: u64) -> warren_store::Cursor {
        warren_store::QueueLog::cursor_at_end(self, next_seq)
    }
    fn read(
        &self,
        cursor: &mut warren_store::Cursor,
        max_bytes: usize,
        keep: &dyn Fn(u64) -> bool,
    ) -> std::io::Result<Vec<(u64, Bytes)>> {
        warren_store::QueueLog::read(self, cursor, max_bytes, keep)
    }
    fn write_pending(&mut self) -> warren_store::Written<Arc<ConfirmHandle>> {
        warren_store::QueueLog::write_pending(self)
    }
    fn bytes_written(&self) -> u64 {
        self.bytes_written
    }
    fn destroy(self: Box<Self>) -> Vec<Arc<ConfirmHandle>> {
        warren_store::QueueLog::destroy(*self)
    }
}

/// What the persister writes: a classic queue's log or a stream's. Its buffered records are
/// written by `write_log` under the owner's lock; `synced` runs after the group's fsync.
pub trait Logged: Send + Sync {
    /// Joins the next group; false if already in it.
    fn join_batch(&self) -> bool;
    fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>>;
    /// The group holding this owner's last write is on disk (`ok`) or failed.
    fn synced(&self, _ok: bool) {}
    fn log_name(&self) -> &str;
}

/// Writes what `log` buffers (`None`: nothing to write), counting the bytes in `persister`'s
/// totals; for a [`Logged::write_log`] over a queue log.
pub fn write_counted<L: MessageLog + ?Sized>(
    log: Option<&mut L>,
    persister: Option<&Arc<Persister>>,
) -> warren_store::Written<Arc<ConfirmHandle>> {
    let Some(log) = log else {
        return Ok((Vec::new(), Vec::new()));
    };
    let before = log.bytes_written();
    let r = log.write_pending();
    if let Some(p) = persister {
        p.bytes
            .fetch_add(log.bytes_written() - before, Ordering::Relaxed);
    }
    r
}

/// A message as stored in a queue log: `flags u8 | [deadline u64] | exchange | routing key |
/// properties | body`. Flag bit 0: a TTL deadline follows, in Unix milliseconds, so a message
/// read back after paging or a restart still expires on time.
pub fn encode_message(m: &Message, expires_at_ms: Option<u64>) -> Bytes {
    let mut b = BytesMut::with_capacity(
        11 + m.exchange.len() + m.routing_key.len() + 4 + m.properties.len() + m.body.len(),
    );
    encode_message_into(&mut b, m, expires_at_ms);
    b.freeze()
}

/// [`encode_message`] appended to `b` (a replicated queue's entry holds many).
pub fn encode_message_into(b: &mut BytesMut, m: &Message, expires_at_ms: Option<u64>) {
    match expires_at_ms {
        Some(at) => {
            b.put_u8(1);
            let left = at.saturating_sub(crate::clock::now_ms());
            b.put_u64(unix_ms().saturating_add(left));
        }
        None => b.put_u8(0),
    }
    b.put_u8(m.exchange.len() as u8);
    b.put_slice(m.exchange.as_bytes());
    b.put_u8(m.routing_key.len() as u8);
    b.put_slice(m.routing_key.as_bytes());
    b.put_u32(m.properties.len() as u32);
    b.put_slice(&m.properties);
    b.put_slice(&m.body);
}

/// Where the properties' length sits, and the deadline if there is one.
fn header(data: &[u8]) -> Option<(usize, Option<u64>)> {
    let flags = *data.first()?;
    let (mut at, deadline) = if flags & 1 != 0 {
        (
            9,
            Some(u64::from_be_bytes(data.get(1..9)?.try_into().ok()?)),
        )
    } else {
        (1, None)
    };
    at += 1 + *data.get(at)? as usize;
    at += 1 + *data.get(at)? as usize;
    Some((at, deadline))
}

/// The body size of a stored message, without decoding it (queue accounting at recovery).
pub fn stored_body_len(data: &[u8]) -> u64 {
    header(data)
        .and_then(|(at, _)| {
            let n = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
            data.len().checked_sub(at + 4 + n)
        })
        .unwrap_or(0) as u64
}

/// Decodes a stored message and its deadline on the [`crate::clock::now_ms`] clock.
pub fn decode_message(data: &Bytes) -> Option<(Message, Option<u64>)> {
    let (props_at, deadline) = header(data)?;
    let short = |at: usize| -> Option<ByteString> {
        let n = *data.get(at)? as usize;
        data.get(at + 1..at + 1 + n)?;
        ByteString::try_from(data.slice(at + 1..at + 1 + n)).ok()
    };
    let x_at = if deadline.is_some() { 9 } else { 1 };
    let exchange = short(x_at)?;
    let routing_key = short(x_at + 1 + exchange.len())?;
    let at = props_at;
    let n = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
    let properties = data
        .get(at + 4..at + 4 + n)
        .map(|_| data.slice(at + 4..at + 4 + n))?;
    let body = data.slice(at + 4 + n..);
    let props = BasicProperties::decode(&properties).ok()?;
    let expiration_ms = props.expiration.and_then(|e| e.parse().ok());
    let expires_at =
        deadline.map(|d| crate::clock::now_ms().saturating_add(d.saturating_sub(unix_ms())));
    Some((
        Message {
            exchange,
            routing_key,
            properties,
            body,
            persistent: props.delivery_mode == Some(2),
            priority: props.priority,
            expiration_ms,
            forwarded: crate::message::Forwarded::NONE,
        },
        expires_at,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trip() {
        let props = BasicProperties {
            delivery_mode: Some(2),
            priority: Some(3),
            ..Default::default()
        };
        let m = Message {
            exchange: "x".into(),
            routing_key: "rk".into(),
            properties: props.to_bytes(),
            body: Bytes::from_static(b"body"),
            persistent: true,
            priority: Some(3),
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let stored = encode_message(&m, None);
        assert_eq!(stored_body_len(&stored), 4);
        let (d, deadline) = decode_message(&stored).expect("decodes");
        assert_eq!(
            (
                &*d.exchange,
                &*d.routing_key,
                &d.body[..],
                d.priority,
                d.persistent
            ),
            ("x", "rk", &b"body"[..], Some(3), true)
        );
        assert_eq!(deadline, None);
        assert!(decode_message(&Bytes::from_static(&[0, 5, b'a'])).is_none());
        // A deadline 10 s out is still about 10 s out when read back.
        let now = crate::clock::now_ms();
        let (_, deadline) =
            decode_message(&encode_message(&m, Some(now + 10_000))).expect("decodes");
        let left = deadline.expect("has a deadline").saturating_sub(now);
        assert!((1_000..=10_100).contains(&left), "{left}");
    }
}
