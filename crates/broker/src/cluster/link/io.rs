//! A link's tasks: registering a connected link, then its reader (frames to requests, replies
//! and the handler's messages, a read at a time) and its writer (both lanes in one write).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::{Link, Links, Out, KIND_FIRST_MESSAGE, KIND_REPLY, KIND_REPLY_ERR, KIND_REQUEST};

/// A peer's frame larger than this is a broken or hostile peer: the link is dropped.
const FRAME_MAX: usize = 256 << 20;

impl Links {
    /// Registers a connected link and starts its reader and writer.
    pub(super) fn start(
        self: &Arc<Self>,
        s: TcpStream,
        name: String,
        addr: String,
        dialed: bool,
    ) -> Arc<Link> {
        let link = Arc::new(Link {
            peer_name: name,
            peer_addr: addr.clone(),
            dialed,
            out: Mutex::new(Out::default()),
            bulk_len: AtomicUsize::new(0),
            wake_writer: Notify::new(),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            closed_notify: Notify::new(),
        });
        {
            let mut links = self.links.lock();
            if let Some(old) = links.get(&addr).filter(|l| !l.is_closed()) {
                // Both sides dialed: keep the one dialed by the node whose address sorts first.
                let keep_dialed_by_me = self.my_addr < addr;
                if old.dialed == keep_dialed_by_me {
                    let old = old.clone();
                    drop(links);
                    drop(s);
                    return old;
                }
                old.close();
            }
            links.insert(addr.clone(), link.clone());
        }
        tracing::info!(peer = %link.peer_name, addr = %addr, "inter-node link up");
        let (r, w) = s.into_split();
        tokio::spawn(write_loop(link.clone(), w));
        tokio::spawn(self.clone().read_loop(link.clone(), r));
        link
    }

    async fn read_loop(self: Arc<Self>, link: Arc<Link>, mut r: tokio::net::tcp::OwnedReadHalf) {
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let reason = 'outer: loop {
            let n = tokio::select! {
                n = r.read_buf(&mut buf) => n,
                _ = link.closed_notify.notified() => break 'outer "closed".to_string(),
            };
            match n {
                Ok(0) => break "peer closed the connection".to_string(),
                Err(e) => break e.to_string(),
                Ok(_) => {}
            }
            // Deliveries this read hands to connections go out in one write each.
            crate::outbox::begin_batch();
            let r = self.frames(&link, &mut buf);
            if let Some(h) = self.handler.get() {
                h.batch_end(&link);
            }
            crate::outbox::end_batch();
            if let Err(e) = r {
                break 'outer e;
            }
            if link.is_closed() {
                break "closed".to_string();
            }
        };
        link.close();
        {
            let mut links = self.links.lock();
            if links
                .get(&link.peer_addr)
                .is_some_and(|l| Arc::ptr_eq(l, &link))
            {
                links.remove(&link.peer_addr);
            }
        }
        tracing::info!(peer = %link.peer_name, addr = %link.peer_addr, reason = %reason, "inter-node link down");
        if let Some(h) = self.handler.get() {
            h.link_down(&link);
        }
    }

    fn frames(&self, link: &Arc<Link>, buf: &mut BytesMut) -> Result<(), String> {
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len == 0 || len > FRAME_MAX {
                return Err(format!("bad frame length {len}"));
            }
            if buf.len() < 4 + len {
                buf.reserve(4 + len - buf.len());
                break;
            }
            buf.advance(4);
            let mut frame = buf.split_to(len).freeze();
            let kind = frame.get_u8();
            self.frame(link, kind, frame)?;
        }
        Ok(())
    }

    fn frame(&self, link: &Arc<Link>, kind: u8, mut frame: Bytes) -> Result<(), String> {
        match kind {
            KIND_REQUEST => {
                if frame.len() < 9 {
                    return Err("short request".into());
                }
                let id = frame.get_u64();
                let service = frame.get_u8();
                let Some(h) = self.handler.get().cloned() else {
                    return Err("no handler".into());
                };
                let fut = h.request(link, service, frame);
                let link = link.clone();
                tokio::spawn(async move {
                    let (kind, body) = match fut.await {
                        Ok(b) => (KIND_REPLY, b),
                        Err(t) => (KIND_REPLY_ERR, Bytes::from(t)),
                    };
                    link.send(kind, |b| {
                        b.put_u64(id);
                        b.put_slice(&body);
                    });
                });
            }
            KIND_REPLY | KIND_REPLY_ERR => {
                if frame.len() < 8 {
                    return Err("short reply".into());
                }
                let id = frame.get_u64();
                if let Some(tx) = link.pending.lock().remove(&id) {
                    let r = if kind == KIND_REPLY {
                        Ok(frame)
                    } else {
                        Err(String::from_utf8_lossy(&frame).into_owned())
                    };
                    let _ = tx.send(r);
                }
            }
            k if k >= KIND_FIRST_MESSAGE => {
                if let Some(h) = self.handler.get() {
                    h.message(link, k, frame);
                }
            }
            k => return Err(format!("unknown frame kind {k}")),
        }
        Ok(())
    }
}

async fn write_loop(link: Arc<Link>, mut w: tokio::net::tcp::OwnedWriteHalf) {
    let (mut control, mut bulk) = (
        BytesMut::with_capacity(64 * 1024),
        BytesMut::with_capacity(64 * 1024),
    );
    loop {
        let notified = link.wake_writer.notified();
        if link.is_closed() {
            break;
        }
        {
            let mut out = link.out.lock();
            // Control first: a heartbeat queued behind a burst of bulk output goes before it.
            std::mem::swap(&mut out.control, &mut control);
            std::mem::swap(&mut out.bulk, &mut bulk);
            // The runs' frames are the writer's now: later items start new ones.
            out.control_run = None;
            out.bulk_run = None;
            link.bulk_len.store(0, Ordering::Relaxed);
        }
        if control.is_empty() && bulk.is_empty() {
            notified.await;
            continue;
        }
        // Both lanes in one vectored write, control first.
        let mut both = (&mut control).chain(&mut bulk);
        if let Err(e) = w.write_all_buf(&mut both).await {
            tracing::debug!(peer = %link.peer_name, error = %e, "inter-node write failed");
            link.close();
            return;
        }
        control.clear();
        bulk.clear();
    }
    let _ = w.shutdown().await;
}
