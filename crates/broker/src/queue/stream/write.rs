//! Writing a stream: a publish numbers and buffers its message under the lock; the persister
//! writes the buffer as one chunk (`Logged`), then `synced` commits its offsets and wakes the
//! readers at the end. Retention drops whole segments past the limits in force.

use crate::clock::unix_ms;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use warren_protocol::properties::BasicProperties;
use warren_protocol::FieldValue;

use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::persist::Logged;
use crate::queue::Enqueued;

use super::{Inner, Stream, PENDING_HIGH_BYTES, TAIL_BYTES, TAIL_MSGS};

impl Stream {
    /// Appends `msg` with the next offset; its confirm completes once the chunk is fsynced.
    pub fn publish(
        self: &Arc<Self>,
        msg: Arc<Message>,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Enqueued {
        // Encoded outside the lock with a placeholder offset, patched under it.
        let (mut data, props, patch) = encode_with_offset(&msg);
        if let Some(group) = self.group.get() {
            // Numbered when its group's entry is applied (`replica`).
            return group.publish(data.freeze(), patch, confirm.cloned());
        }
        let ts = unix_ms();
        let mut g = self.inner.lock();
        if g.deleted {
            return Enqueued::Gone;
        }
        let offset = g.log.next_offset();
        data[patch..patch + 8].copy_from_slice(&offset.to_be_bytes());
        let data = data.freeze();
        let m = Arc::new(Message {
            exchange: msg.exchange.clone(),
            routing_key: msg.routing_key.clone(),
            properties: data.slice(props.clone()),
            body: data.slice(props.end..),
            persistent: msg.persistent,
            priority: msg.priority,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        });
        g.log.append(ts, data, confirm.cloned());
        self.cache(&mut g, m);
        drop(g);
        self.stats.publish.fetch_add(1, Ordering::Relaxed);
        self.persister.mark_dirty(self);
        Enqueued::Accepted
    }

    /// Keeps the message just appended in the tail cache; holds publishers back above
    /// `PENDING_HIGH_BYTES` waiting for the group write.
    pub(super) fn cache(&self, g: &mut Inner, m: Arc<Message>) {
        g.tail_bytes += m.body.len() as u64;
        g.tail.push_back(m);
        while g.tail.len() > TAIL_MSGS || (g.tail_bytes > TAIL_BYTES && g.tail.len() > 1) {
            if let Some(old) = g.tail.pop_front() {
                g.tail_bytes -= old.body.len() as u64;
                g.tail_first += 1;
            }
        }
        if g.log.pending_bytes() > PENDING_HIGH_BYTES {
            self.pressure.store(true, Ordering::Relaxed);
        }
    }

    /// Deletes old segments past the limits in force.
    pub(super) fn enforce_retention(&self) {
        let l = self.limits();
        if l.max_bytes.is_none() && l.max_age_ms.is_none() {
            return;
        }
        let min_ts = l.max_age_ms.map(|a| unix_ms().saturating_sub(a));
        let mut g = self.inner.lock();
        let removed = g.log.retain(l.max_bytes, min_ts);
        if removed > 0 {
            self.first.store(g.log.first_offset(), Ordering::Relaxed);
            let (first, segments) = (g.log.first_offset(), g.log.segment_count());
            drop(g);
            tracing::debug!(stream = %self.name, removed, first, segments, "stream retention");
        }
    }

    /// The sweeper's periodic visit: retention by age.
    pub fn may_expire(&self) -> bool {
        self.limits.load().max_age_ms.is_some()
    }

    pub fn expire(&self) {
        self.enforce_retention();
    }
}

/// The stored form of `msg` (`persist::encode_message`'s layout, no deadline) with an
/// `x-stream-offset` long header appended to its properties; returns the bytes, where the
/// properties are, and where the offset's 8 bytes go.
pub(super) fn encode_with_offset(msg: &Message) -> (BytesMut, std::ops::Range<usize>, usize) {
    let mut p = BasicProperties::decode(&msg.properties).unwrap_or_default();
    let mut h = p.headers.take().unwrap_or_default();
    h.0.retain(|(k, _)| &**k != "x-stream-offset");
    h.0.push(("x-stream-offset".into(), FieldValue::I64(0)));
    p.headers = Some(h);
    let props: Bytes = p.to_bytes();
    // The header was appended last to the table, so its value is the last match.
    const KEY: &[u8] = b"\x0fx-stream-offsetl";
    let at = props
        .windows(KEY.len())
        .rposition(|w| w == KEY)
        .map_or(0, |i| i + KEY.len());
    let mut b = BytesMut::with_capacity(
        7 + msg.exchange.len() + msg.routing_key.len() + props.len() + msg.body.len(),
    );
    b.put_u8(0);
    b.put_u8(msg.exchange.len() as u8);
    b.put_slice(msg.exchange.as_bytes());
    b.put_u8(msg.routing_key.len() as u8);
    b.put_slice(msg.routing_key.as_bytes());
    b.put_u32(props.len() as u32);
    let start = b.len();
    b.put_slice(&props);
    let end = b.len();
    b.put_slice(&msg.body);
    (b, start..end, start + at)
}

impl Logged for Stream {
    fn join_batch(&self) -> bool {
        !self.in_batch.swap(true, Ordering::AcqRel)
    }

    fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        self.in_batch.store(false, Ordering::Release);
        let mut g = self.inner.lock();
        if g.deleted {
            return Ok((Vec::new(), Vec::new()));
        }
        let before = g.log.bytes_written;
        let segments = g.log.segment_count();
        // A replicated stream's entries are chunks of their own: one write each.
        let (mut tokens, mut files) = (Vec::new(), Vec::<Arc<std::fs::File>>::new());
        let r = loop {
            match g.log.write_pending() {
                Ok((t, file, end)) => {
                    tokens.extend(t);
                    if let Some(f) = file.filter(|f| !files.iter().any(|x| Arc::ptr_eq(x, f))) {
                        files.push(f);
                    }
                    g.in_flight = end;
                    if !g.log.has_pending() {
                        break Ok((std::mem::take(&mut tokens), std::mem::take(&mut files)));
                    }
                }
                Err((e, t)) => {
                    tokens.extend(t);
                    break Err((e, std::mem::take(&mut tokens)));
                }
            }
        };
        self.persister
            .bytes
            .fetch_add(g.log.bytes_written - before, Ordering::Relaxed);
        let rotated = g.log.segment_count() != segments;
        let r = match r {
            Ok(written) => Ok(written),
            Err((e, tokens)) => {
                self.freeze_checkpoint();
                // Those offsets are lost: drop them from the cache too, readers skip the gap.
                let keep = g.log.written();
                g.in_flight = keep;
                let first = g.tail_first;
                while g.tail_first + g.tail.len() as u64 > first && !g.tail.is_empty() {
                    let _ = g.tail.pop_back();
                }
                g.tail_first = keep;
                g.tail_bytes = 0;
                Err((e, tokens))
            }
        };
        drop(g);
        if self.pressured() && self.inner.lock().log.pending_bytes() < PENDING_HIGH_BYTES / 2 {
            self.pressure.store(false, Ordering::Relaxed);
            self.relieved.notify_waiters();
        }
        if rotated || self.limits.load().max_bytes.is_some() {
            self.enforce_retention();
        }
        r
    }

    fn synced(&self, ok: bool) {
        let to = self.inner.lock().in_flight;
        // A failed fsync: the data may still be on disk; its publishes were nacked, and the
        // offsets are not delivered until a later group's fsync covers them.
        if !ok || to <= self.committed.load(Ordering::SeqCst) {
            return;
        }
        self.committed.store(to, Ordering::SeqCst);
        self.durable_upto(to);
        self.grown.notify_waiters();
        for r in self.readers.lock().iter() {
            if r.at_end.load(Ordering::SeqCst) {
                r.wake.notify_one();
            }
        }
    }

    fn log_name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_header_is_patched_in_place() {
        let m = Message {
            exchange: "".into(),
            routing_key: "s".into(),
            properties: BasicProperties::default().to_bytes(),
            body: Bytes::from_static(b"hi"),
            persistent: false,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let (mut b, props, patch) = encode_with_offset(&m);
        b[patch..patch + 8].copy_from_slice(&42u64.to_be_bytes());
        let b = b.freeze();
        let (back, _) = crate::persist::decode_message(&b).expect("decodes");
        assert_eq!(&back.body[..], b"hi");
        assert_eq!(back.properties, b.slice(props));
        let p = BasicProperties::decode(&back.properties).expect("props");
        assert_eq!(
            p.headers.and_then(|h| h.get("x-stream-offset").cloned()),
            Some(FieldValue::I64(42))
        );
    }
}
