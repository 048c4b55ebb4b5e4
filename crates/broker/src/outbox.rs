//! A connection's pending output. Any task may append frames (a queue dispatching to a consumer
//! on this connection, the connection's own replies). A connection task that produced output for
//! outboxes during a read batch flushes them at the end of the batch, writing straight to each
//! socket whose writer is idle; otherwise the connection's writer task takes the whole buffer at
//! once. Either way many frames go out per syscall.
//!
//! Bounded: past `OUTBOX_HIGH_BYTES` queues stop dispatching to this connection's consumers and
//! register to be woken once the writer has drained below `OUTBOX_LOW_BYTES`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use std::cell::RefCell;

use bytes::{Buf, BufMut, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use warren_protocol::frame::{self, FRAME_END, FRAME_OVERHEAD};
use warren_protocol::Method;

use crate::flow::SpaceWaiter;
use crate::limits::{OUTBOX_HIGH_BYTES, OUTBOX_LOW_BYTES, SEND_TIMEOUT_MS};
use crate::message::Message;

/// Who waits for this outbox to drain (`flow.rs`, link 1), held weakly.
type Waiter = Weak<dyn SpaceWaiter>;

fn same(w: &Waiter, p: *const ()) -> bool {
    w.as_ptr() as *const () == p
}

#[derive(Default)]
struct Inner {
    buf: BytesMut,
    /// Queues and streams that held back deliveries because this outbox was full.
    waiting: Vec<Waiter>,
    /// No more output is accepted; the writer flushes and stops.
    closed: bool,
    /// The writer task holds a taken buffer: nobody else may write to the socket meanwhile.
    writing: bool,
    sock: Option<Arc<OwnedWriteHalf>>,
}

pub struct Outbox {
    inner: Mutex<Inner>,
    notify: Notify,
    /// Set while the buffer is above the high mark; read without the lock by dispatchers.
    full: AtomicBool,
    /// Count of writes, so the heartbeat timer knows whether anything went out lately.
    pub writes: AtomicU64,
    /// Octets written to the socket (the management API's `send_oct`).
    pub sent_octets: AtomicU64,
    /// Negotiated frame_max, for splitting bodies.
    pub frame_max: std::sync::atomic::AtomicU32,
    /// Octets waiting in the buffer (not yet taken by a writer): the reader stops processing
    /// a client's requests above `OUTBOX_READ_PAUSE_BYTES`, so replies it never reads cannot
    /// pile up without bound.
    pending: AtomicUsize,
    /// Notified when a writer takes the buffer (space opened for a paused reader).
    space: Notify,
    /// A socket write that makes no progress for this long fails the connection.
    pub send_timeout_ms: AtomicU64,
    /// Why the writer stopped on an error; the reader ends the connection with it.
    failure: Mutex<Option<String>>,
    failed: Notify,
}

/// The write side of a client socket. Plain TCP keeps the `try_write` fast path (straight
/// writes at the end of a read batch); any other stream (TLS) goes through the writer task.
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Io(Box<dyn AsyncWrite + Send + Unpin>),
}

thread_local! {
    /// Outboxes that received output during the current read batch of the connection running on
    /// this thread; flushed once at the end of the batch (nats-server's `flushClients`).
    static BATCH: RefCell<Option<Vec<Arc<Outbox>>>> = const { RefCell::new(None) };
}

/// Starts collecting outboxes to flush at [`end_batch`] instead of waking their writers one by
/// one. Only for synchronous code: nothing may await between the two calls.
pub fn begin_batch() {
    BATCH.with(|b| *b.borrow_mut() = Some(Vec::new()));
}

/// Flushes every outbox written during the batch: straight to its socket when its writer is
/// idle (no task wake-up, one syscall for all the batch's frames), else through the writer.
pub fn end_batch() {
    let list = BATCH.with(|b| b.borrow_mut().take()).unwrap_or_default();
    for o in list {
        o.flush_now();
    }
}

impl Outbox {
    pub fn new(frame_max: u32) -> Arc<Outbox> {
        Arc::new(Outbox {
            inner: Mutex::new(Inner::default()),
            notify: Notify::new(),
            full: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            sent_octets: AtomicU64::new(0),
            frame_max: std::sync::atomic::AtomicU32::new(frame_max),
            pending: AtomicUsize::new(0),
            space: Notify::new(),
            send_timeout_ms: AtomicU64::new(SEND_TIMEOUT_MS),
            failure: Mutex::new(None),
            failed: Notify::new(),
        })
    }

    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Appends output under the lock. If the writer is idle and the buffer was empty, the output
    /// is flushed at the end of the current read batch, or the writer is woken.
    pub fn push(self: &Arc<Self>, f: impl FnOnce(&mut BytesMut)) {
        let mut g = self.inner.lock();
        if g.closed {
            return;
        }
        let kick = g.buf.is_empty() && !g.writing;
        f(&mut g.buf);
        self.pending.store(g.buf.len(), Ordering::Relaxed);
        if g.buf.len() >= OUTBOX_HIGH_BYTES {
            self.full.store(true, Ordering::Relaxed);
        }
        drop(g);
        if kick {
            let batched = BATCH.with(|b| match &mut *b.borrow_mut() {
                Some(list) => {
                    if !list.iter().any(|o| Arc::ptr_eq(o, self)) {
                        list.push(self.clone());
                    }
                    true
                }
                None => false,
            });
            if !batched {
                self.notify.notify_one();
            }
        }
    }

    pub fn method(self: &Arc<Self>, channel: u16, m: &Method) {
        self.push(|b| frame::write_method(b, channel, m));
    }

    /// Writes the buffer to the socket now if the writer is idle; what does not fit goes to
    /// the writer.
    fn flush_now(&self) {
        let mut g = self.inner.lock();
        if g.writing || g.buf.is_empty() {
            return;
        }
        let Some(sock) = g.sock.clone() else {
            drop(g);
            self.notify.notify_one();
            return;
        };
        match sock.try_write(&g.buf) {
            Ok(n) => {
                g.buf.advance(n);
                self.pending.store(g.buf.len(), Ordering::Relaxed);
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.sent_octets.fetch_add(n as u64, Ordering::Relaxed);
                self.space.notify_one();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {} // the writer meets the error and ends the connection
        }
        let rest = !g.buf.is_empty();
        let waiting = if self.full.load(Ordering::Relaxed) && g.buf.len() < OUTBOX_LOW_BYTES {
            self.full.store(false, Ordering::Relaxed);
            std::mem::take(&mut g.waiting)
        } else {
            Vec::new()
        };
        drop(g);
        if rest {
            self.notify.notify_one();
        }
        for w in waiting {
            if let Some(w) = w.upgrade() {
                w.space();
            }
        }
    }

    #[cfg(test)]
    pub fn take_for_test(&self, into: &mut BytesMut) {
        into.extend_from_slice(&self.inner.lock().buf.split());
    }

    /// Registers `w` to be woken when this outbox drains; false if it has room already (the
    /// caller retries at once: the drain that would have woken it may be past).
    pub fn wait_for_space(&self, w: Arc<dyn SpaceWaiter>) -> bool {
        let mut g = self.inner.lock();
        let p = Arc::as_ptr(&w) as *const ();
        if !g.waiting.iter().any(|x| same(x, p)) {
            g.waiting.push(Arc::downgrade(&w));
        }
        drop(g);
        self.is_full()
    }

    /// Octets queued and not yet taken by a writer.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Resolves once a writer has taken the buffer (or at once if one did since the last call).
    pub async fn space(&self) {
        self.space.notified().await
    }

    /// Resolves with the reason once the writer has failed (write error or send timeout).
    pub async fn failed(&self) -> String {
        loop {
            if let Some(why) = self.failure.lock().clone() {
                return why;
            }
            self.failed.notified().await;
        }
    }

    /// Stops accepting output; the writer exits after flushing what is buffered.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.notify.notify_one();
    }

    /// The writer loop: takes everything buffered, writes it, repeats. Returns when closed and
    /// drained, or on a write error; then the socket's write half is shut.
    pub async fn run_writer(self: Arc<Self>, sock: WriteHalf) -> std::io::Result<()> {
        let r = match sock {
            WriteHalf::Tcp(sock) => {
                let sock = Arc::new(sock);
                self.inner.lock().sock = Some(sock.clone());
                self.write_loop(&mut Sink::Tcp(&sock)).await
            }
            WriteHalf::Io(mut io) => {
                let r = self.write_loop(&mut Sink::Io(&mut io)).await;
                let _ = io.shutdown().await;
                r
            }
        };
        {
            let mut g = self.inner.lock();
            g.sock = None;
            g.closed = true;
        }
        if let Err(e) = &r {
            let why = if e.kind() == std::io::ErrorKind::TimedOut {
                format!(
                    "socket write timed out after {} ms (client not reading)",
                    self.send_timeout_ms.load(Ordering::Relaxed)
                )
            } else {
                format!("write error: {e}")
            };
            *self.failure.lock() = Some(why);
            self.failed.notify_one();
        }
        r
    }

    async fn write_loop(&self, sock: &mut Sink<'_>) -> std::io::Result<()> {
        let timeout =
            std::time::Duration::from_millis(self.send_timeout_ms.load(Ordering::Relaxed));
        // Empty until the first swap: it then holds what the pushers' buffer grew to, so an
        // idle connection (whose replies go out through `flush_now`) holds no spare at all.
        let mut spare = BytesMut::new();
        loop {
            let (closed, waiting) = {
                let mut g = self.inner.lock();
                std::mem::swap(&mut g.buf, &mut spare);
                self.pending.store(0, Ordering::Relaxed);
                g.writing = !spare.is_empty();
                let waiting = if self.full.load(Ordering::Relaxed) && g.buf.len() < OUTBOX_LOW_BYTES
                {
                    self.full.store(false, Ordering::Relaxed);
                    std::mem::take(&mut g.waiting)
                } else {
                    Vec::new()
                };
                (g.closed, waiting)
            };
            self.space.notify_one();
            for w in waiting {
                if let Some(w) = w.upgrade() {
                    w.space();
                }
            }
            if spare.is_empty() {
                if closed {
                    return Ok(());
                }
                self.notify.notified().await;
                continue;
            }
            match sock {
                Sink::Tcp(sock) => {
                    let mut at = 0;
                    while at < spare.len() {
                        // No progress for the send timeout: the client stopped reading.
                        tokio::time::timeout(timeout, sock.writable())
                            .await
                            .map_err(|_| std::io::ErrorKind::TimedOut)??;
                        match sock.try_write(&spare[at..]) {
                            Ok(n) => at += n,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Sink::Io(io) => {
                    let mut at = 0;
                    while at < spare.len() {
                        let n = tokio::time::timeout(timeout, io.write(&spare[at..]))
                            .await
                            .map_err(|_| std::io::ErrorKind::TimedOut)??;
                        if n == 0 {
                            return Err(std::io::ErrorKind::WriteZero.into());
                        }
                        at += n;
                    }
                    tokio::time::timeout(timeout, io.flush())
                        .await
                        .map_err(|_| std::io::ErrorKind::TimedOut)??;
                }
            }
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.sent_octets
                .fetch_add(spare.len() as u64, Ordering::Relaxed);
            spare.clear();
            if spare.capacity() > 4 * 1024 * 1024 {
                spare = BytesMut::with_capacity(64 * 1024);
            }
        }
    }
}

enum Sink<'a> {
    Tcp(&'a OwnedWriteHalf),
    Io(&'a mut Box<dyn AsyncWrite + Send + Unpin>),
}

/// Encodes a message's content header and body frames (split to frame_max) after a method frame
/// already written (basic.get-ok, basic.return), with the publisher's raw properties.
pub fn write_content(buf: &mut BytesMut, channel: u16, frame_max: u32, msg: &Message) {
    content(buf, channel, frame_max, msg, false);
}

/// basic.deliver and the message's content, written as a few fused byte runs: this is the
/// hottest encode (11 appends per small message instead of ~30 field by field, measured with
/// callgrind), and going through `Method::BasicDeliver` would also clone three strings.
pub fn write_delivery(
    buf: &mut BytesMut,
    channel: u16,
    frame_max: u32,
    consumer_tag: &str,
    delivery_tag: u64,
    redelivered: bool,
    msg: &Message,
) {
    let ctag = short_str(consumer_tag);
    let ex = short_str(&msg.exchange);
    let rk = short_str(&msg.routing_key);
    let method_size = 4 + 1 + ctag.len() + 8 + 1 + 1 + ex.len() + 1 + rk.len();
    buf.reserve(7 + method_size + content_size(frame_max, msg));
    let [c0, c1] = channel.to_be_bytes();
    let [s0, s1, s2, s3] = (method_size as u32).to_be_bytes();
    let [t0, t1, t2, t3, t4, t5, t6, t7] = delivery_tag.to_be_bytes();
    // Frame header, class 60 method 60, consumer-tag length | delivery tag, redelivered,
    // exchange length.
    #[rustfmt::skip]
    let head = [frame::FRAME_METHOD, c0, c1, s0, s1, s2, s3, 0, 60, 0, 60, ctag.len() as u8];
    #[rustfmt::skip]
    let mid = [t0, t1, t2, t3, t4, t5, t6, t7, redelivered as u8, ex.len() as u8];
    buf.put_slice(&head);
    buf.put_slice(ctag);
    buf.put_slice(&mid);
    buf.put_slice(ex);
    buf.put_slice(&[rk.len() as u8]);
    buf.put_slice(rk);
    content(buf, channel, frame_max, msg, true);
}

fn short_str(s: &str) -> &[u8] {
    &s.as_bytes()[..s.len().min(255)]
}

fn body_chunk(frame_max: u32) -> usize {
    if frame_max == 0 {
        usize::MAX
    } else {
        frame_max as usize - FRAME_OVERHEAD
    }
}

/// Octets `content` appends, including the end octet of a preceding frame.
fn content_size(frame_max: u32, msg: &Message) -> usize {
    let frames = msg.body.len().div_ceil(body_chunk(frame_max));
    1 + 7 + 12 + msg.properties.len() + 1 + frames * FRAME_OVERHEAD + msg.body.len()
}

/// The content header and body frames; `close_previous` first writes the end octet of the
/// frame before, so that it shares an append with the header's start.
fn content(buf: &mut BytesMut, channel: u16, frame_max: u32, msg: &Message, close_previous: bool) {
    let [c0, c1] = channel.to_be_bytes();
    let [s0, s1, s2, s3] = ((12 + msg.properties.len()) as u32).to_be_bytes();
    let [b0, b1, b2, b3, b4, b5, b6, b7] = (msg.body.len() as u64).to_be_bytes();
    // End of the previous frame | header frame: type, channel, size, class 60, weight 0, body size.
    #[rustfmt::skip]
    let header = [
        FRAME_END, frame::FRAME_HEADER, c0, c1, s0, s1, s2, s3, 0, 60, 0, 0,
        b0, b1, b2, b3, b4, b5, b6, b7,
    ];
    buf.put_slice(if close_previous {
        &header
    } else {
        &header[1..]
    });
    buf.put_slice(&msg.properties);
    for part in msg.body.chunks(body_chunk(frame_max)) {
        let [l0, l1, l2, l3] = (part.len() as u32).to_be_bytes();
        buf.put_slice(&[FRAME_END, frame::FRAME_BODY, c0, c1, l0, l1, l2, l3]);
        buf.put_slice(part);
    }
    buf.put_slice(&[FRAME_END]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use warren_protocol::method::BasicDeliver;

    /// The generic encoders of the protocol crate, frame by frame.
    fn reference(channel: u16, frame_max: u32, tag: u64, msg: &Message) -> BytesMut {
        let mut b = BytesMut::new();
        let m = Method::BasicDeliver(BasicDeliver {
            consumer_tag: "ctag".into(),
            delivery_tag: tag,
            redelivered: true,
            exchange: msg.exchange.clone(),
            routing_key: msg.routing_key.clone(),
        });
        frame::write_method(&mut b, channel, &m);
        frame::write_content_header(&mut b, channel, 60, msg.body.len() as u64, &msg.properties);
        let chunk = if frame_max == 0 {
            usize::MAX
        } else {
            frame_max as usize - 8
        };
        for part in msg.body.chunks(chunk) {
            frame::write_body_frame_header(&mut b, channel, part.len());
            b.put_slice(part);
            b.put_u8(FRAME_END);
        }
        b
    }

    #[test]
    fn fast_delivery_matches_generic_encoding() {
        for (body, frame_max) in [(0, 4096), (16, 0), (16, 4096), (10_000, 4096), (4088, 4096)] {
            let msg = Message {
                exchange: "ex".into(),
                routing_key: "rk".into(),
                properties: Bytes::from_static(&[0x10, 0, 2]),
                body: Bytes::from(vec![7u8; body]),
                persistent: false,
                priority: None,
                expiration_ms: None,
                forwarded: crate::message::Forwarded::NONE,
            };
            let mut fast = BytesMut::new();
            write_delivery(
                &mut fast,
                7,
                frame_max,
                "ctag",
                0x0102_0304_0506_0708,
                true,
                &msg,
            );
            let want = reference(7, frame_max, 0x0102_0304_0506_0708, &msg);
            assert_eq!(fast, want, "body {body}, frame_max {frame_max}");
            assert_eq!(
                fast.len(),
                7 + 4 + 5 + 8 + 1 + 3 + 3 + 1 + content_size(frame_max, &msg) - 1
            );
        }
    }

    #[test]
    fn body_split_to_frame_max() {
        let msg = Message {
            exchange: "".into(),
            routing_key: "q".into(),
            properties: Bytes::from_static(&[0, 0]),
            body: Bytes::from(vec![7u8; 10_000]),
            persistent: false,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
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
