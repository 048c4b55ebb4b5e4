//! A connection's pending output. Any task may append frames (a queue dispatching to a consumer
//! on this connection, the connection's own replies); the connection's writer task takes the
//! whole buffer at once and writes it with one syscall, so deliveries are coalesced.
//!
//! Bounded: past `OUTBOX_HIGH_BYTES` queues stop dispatching to this connection's consumers and
//! register to be woken once the writer has drained below `OUTBOX_LOW_BYTES`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use warren_protocol::frame::{self, FRAME_END, FRAME_OVERHEAD};
use warren_protocol::Method;

use crate::limits::{OUTBOX_HIGH_BYTES, OUTBOX_LOW_BYTES};
use crate::message::Message;
use crate::queue::Queue;

#[derive(Default)]
struct Inner {
    buf: BytesMut,
    /// Queues that held back deliveries because this outbox was full.
    waiting: Vec<Weak<Queue>>,
    /// No more output is accepted; the writer flushes and stops.
    closed: bool,
}

pub struct Outbox {
    inner: Mutex<Inner>,
    notify: Notify,
    /// Set while the buffer is above the high mark; read without the lock by dispatchers.
    full: AtomicBool,
    /// Count of writes, so the heartbeat timer knows whether anything went out lately.
    pub writes: AtomicU64,
    /// Negotiated frame_max, for splitting bodies.
    pub frame_max: std::sync::atomic::AtomicU32,
}

impl Outbox {
    pub fn new(frame_max: u32) -> Arc<Outbox> {
        Arc::new(Outbox {
            inner: Mutex::new(Inner::default()),
            notify: Notify::new(),
            full: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            frame_max: std::sync::atomic::AtomicU32::new(frame_max),
        })
    }

    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Appends output under the lock; wakes the writer if the buffer was empty.
    pub fn push(&self, f: impl FnOnce(&mut BytesMut)) {
        let mut g = self.inner.lock();
        if g.closed {
            return;
        }
        let was_empty = g.buf.is_empty();
        f(&mut g.buf);
        if g.buf.len() >= OUTBOX_HIGH_BYTES {
            self.full.store(true, Ordering::Relaxed);
        }
        drop(g);
        if was_empty {
            self.notify.notify_one();
        }
    }

    pub fn method(&self, channel: u16, m: &Method) {
        self.push(|b| frame::write_method(b, channel, m));
    }

    #[cfg(test)]
    pub fn take_for_test(&self, into: &mut BytesMut) {
        into.extend_from_slice(&self.inner.lock().buf.split());
    }

    /// Registers a queue to be woken when this outbox drains.
    pub fn wait_for_space(&self, q: &Arc<Queue>) {
        let mut g = self.inner.lock();
        if !g.waiting.iter().any(|w| w.as_ptr() == Arc::as_ptr(q)) {
            g.waiting.push(Arc::downgrade(q));
        }
    }

    /// Stops accepting output; the writer exits after flushing what is buffered.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.notify.notify_one();
    }

    /// The writer loop: takes everything buffered, writes it, repeats. Returns when closed and
    /// drained, or on a write error.
    pub async fn run_writer<W: tokio::io::AsyncWrite + Unpin>(self: Arc<Self>, mut sock: W) -> std::io::Result<()> {
        let mut spare = BytesMut::with_capacity(64 * 1024);
        loop {
            let (closed, waiting) = {
                let mut g = self.inner.lock();
                std::mem::swap(&mut g.buf, &mut spare);
                let waiting = if self.full.load(Ordering::Relaxed) && g.buf.len() < OUTBOX_LOW_BYTES {
                    self.full.store(false, Ordering::Relaxed);
                    std::mem::take(&mut g.waiting)
                } else {
                    Vec::new()
                };
                (g.closed, waiting)
            };
            for q in waiting.into_iter().filter_map(|w| w.upgrade()) {
                q.dispatch();
            }
            if spare.is_empty() {
                if closed {
                    let _ = sock.flush().await;
                    return Ok(());
                }
                self.notify.notified().await;
                continue;
            }
            sock.write_all(&spare).await?;
            self.writes.fetch_add(1, Ordering::Relaxed);
            spare.clear();
            if spare.capacity() > 4 * 1024 * 1024 {
                spare = BytesMut::with_capacity(64 * 1024);
            }
        }
    }
}

/// Encodes a delivery (basic.deliver or basic.get-ok already written by `method`), its content
/// header with the publisher's raw properties, and body frames split to frame_max.
pub fn write_content(buf: &mut BytesMut, channel: u16, frame_max: u32, msg: &Message) {
    frame::write_content_header(buf, channel, 60, msg.body.len() as u64, &msg.properties);
    let chunk = if frame_max == 0 { usize::MAX } else { frame_max as usize - FRAME_OVERHEAD };
    for part in msg.body.chunks(chunk) {
        frame::write_body_frame_header(buf, channel, part.len());
        buf.put_slice(part);
        buf.put_u8(FRAME_END);
    }
}

/// basic.deliver written field by field: this is the hottest encode, and going through
/// `Method::BasicDeliver` would clone three strings per message.
pub fn write_deliver(buf: &mut BytesMut, channel: u16, consumer_tag: &str, delivery_tag: u64, redelivered: bool, msg: &Message) {
    let at = frame::begin_frame(buf, frame::FRAME_METHOD, channel);
    buf.put_u16(60);
    buf.put_u16(60);
    put_short_str(buf, consumer_tag);
    buf.put_u64(delivery_tag);
    buf.put_u8(redelivered as u8);
    put_short_str(buf, &msg.exchange);
    put_short_str(buf, &msg.routing_key);
    frame::end_frame(buf, at);
}

fn put_short_str(buf: &mut BytesMut, s: &str) {
    let n = s.len().min(255);
    buf.put_u8(n as u8);
    buf.put_slice(&s.as_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use warren_protocol::method::BasicDeliver;

    #[test]
    fn fast_deliver_matches_generic_encoding() {
        let msg = Message { exchange: "ex".into(), routing_key: "rk".into(), properties: Bytes::from_static(&[0, 0]), body: Bytes::new(), persistent: false, priority: None, expiration_ms: None };
        let mut fast = BytesMut::new();
        write_deliver(&mut fast, 7, "ctag", 42, true, &msg);
        let mut slow = BytesMut::new();
        let m = Method::BasicDeliver(BasicDeliver { consumer_tag: "ctag".into(), delivery_tag: 42, redelivered: true, exchange: "ex".into(), routing_key: "rk".into() });
        frame::write_method(&mut slow, 7, &m);
        assert_eq!(fast, slow);
    }

    #[test]
    fn body_split_to_frame_max() {
        let msg = Message { exchange: "".into(), routing_key: "q".into(), properties: Bytes::from_static(&[0, 0]), body: Bytes::from(vec![7u8; 10_000]), persistent: false, priority: None, expiration_ms: None };
        let mut b = BytesMut::new();
        write_content(&mut b, 1, 4096, &msg);
        let dec = warren_protocol::FrameDecoder::new(4096);
        let mut n = 0;
        let mut total = 0;
        while let Some(f) = dec.decode(&mut b).expect("valid frames") {
            if f.kind == warren_protocol::FrameKind::Body {
                total += f.payload.len();
            }
            n += 1;
        }
        assert_eq!((n, total), (1 + 3, 10_000));
    }
}
