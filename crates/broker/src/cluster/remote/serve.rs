//! The home node's answers to queue requests from other nodes: consume (a [`LinkSink`] at the
//! queue), cancel, get, counts and purge.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::ByteString;

use super::lid;
use super::sink::{LinkSink, Unacked};
use super::wire::{
    get_u64, get_u8, put_message, K_CANCEL_OK, Q_CANCEL, Q_CONSUME, Q_COUNTS, Q_GET, Q_PURGE,
    Q_SYNC,
};
use crate::cluster::link::{get_str, Link};
use crate::cluster::Cluster;
use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Consumer, Queue, QueueRef};

fn error_reply(e: AmqpError) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(1);
    b.put_u16(e.code);
    b.put_slice(e.text.as_bytes());
    b.freeze()
}

pub(super) fn local_queue(c: &Cluster, vhost: &str, name: &str) -> AmqpResult<Arc<Queue>> {
    let b = c
        .broker()
        .ok_or_else(|| AmqpError::internal_error("stopping"))?;
    let v = b
        .vhost(vhost)
        .ok_or_else(|| AmqpError::not_found(format!("no vhost '{vhost}'")))?;
    match v.queue(name) {
        Some(QueueRef::Local(q)) => Ok(q),
        _ => Err(v.no_queue(name)),
    }
}

/// A queue request from another node.
pub async fn serve_request(
    c: &Arc<Cluster>,
    link: &Arc<Link>,
    mut body: Bytes,
) -> Result<Bytes, String> {
    let op = get_u8(&mut body).ok_or("short request")?;
    let vhost = get_str(&mut body).ok_or("short request")?;
    let name = get_str(&mut body).ok_or("short request")?;
    match op {
        Q_CANCEL => {
            let key = get_u64(&mut body).ok_or("short request")?;
            cancel(c, link, key);
            return Ok(Bytes::from_static(&[0]));
        }
        Q_SYNC => {
            super::inbound::apply_settles(c, link);
            return Ok(Bytes::from_static(&[0]));
        }
        _ => {}
    }
    let q = match local_queue(c, &vhost, &name) {
        Ok(q) => q,
        Err(e) => return Ok(error_reply(e)),
    };
    let mut out = BytesMut::new();
    out.put_u8(0);
    match op {
        Q_CONSUME => {
            let key = get_u64(&mut body).ok_or("short request")?;
            let tag = get_str(&mut body).ok_or("short request")?;
            let (no_ack, exclusive) = (get_u8(&mut body) == Some(1), get_u8(&mut body) == Some(1));
            let priority = get_u64(&mut body).ok_or("short request")? as i64;
            let prefetch = (body.len() >= 2)
                .then(|| body.get_u16())
                .ok_or("short request")?;
            let sink = Arc::new(LinkSink {
                link: link.clone(),
                remote_key: key,
                queue: q.clone(),
                consumer: Mutex::new(None),
                next_delivery: AtomicU64::new(1),
                unacked: Mutex::new(Unacked::default()),
                in_flight: AtomicU32::new(0),
                waiting: AtomicBool::new(false),
                started: AtomicBool::new(false),
            });
            let consumer = Arc::new(Consumer {
                key: crate::queue::consumer_key(),
                tag: ByteString::from(tag),
                sink: sink.clone(),
                queue: QueueRef::Local(q.clone()),
                no_ack,
                exclusive,
                priority,
                prefetch,
                cancelled: AtomicBool::new(false),
                // The consumer's own node checks its timeout.
                timeout_ms: None,
            });
            if let Err(e) = q.add_consumer(consumer.clone(), || {}) {
                return Ok(error_reply(e));
            }
            *sink.consumer.lock() = Some(consumer);
            c.remote
                .served
                .lock()
                .insert((lid(link), key), sink.clone());
            // Deliveries start now; one that reaches the consumer's node before this reply is
            // held there until its consume-ok is sent (`Proxy::early`).
            let reply = out.freeze();
            sink.started.store(true, Ordering::Release);
            q.dispatch();
            return Ok(reply);
        }
        Q_GET => {
            let ack_mode = get_u8(&mut body) == Some(1);
            let mut got = None;
            q.get(ack_mode, |m, left| got = Some((m.clone(), left)));
            match got {
                None => out.put_u8(0),
                Some((m, left)) => {
                    let id = c.remote.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                    if ack_mode {
                        c.remote
                            .gets
                            .lock()
                            .insert((lid(link), id), (q.clone(), (None, m.clone())));
                    }
                    out.put_u8(1);
                    out.put_u64(id);
                    out.put_u32(left);
                    out.put_u8(m.redelivered as u8);
                    put_message(&mut out, &[], &m.msg);
                }
            }
        }
        Q_COUNTS => {
            // A declare through another node: the lease starts again, as a declare here does.
            if get_u8(&mut body) == Some(1) {
                q.touch();
            }
            out.put_u32(q.message_count());
            out.put_u32(q.consumer_count());
            out.put_u32(q.unacked_count());
        }
        Q_PURGE => out.put_u32(q.purge()),
        op => return Err(format!("unknown queue request {op}")),
    }
    Ok(out.freeze())
}

/// A consumer on the other end of `link` is cancelled: it leaves the queue (an auto-delete queue
/// it was the last consumer of is deleted, and every running node has applied that), and then
/// `K_CANCEL_OK` goes after the deliveries already framed for it, so its node answers
/// `basic.cancel-ok` with nothing more for it on the way. What it was delivered stays unacked
/// until settled. A consumer (or queue) already gone is answered the same.
fn cancel(c: &Arc<Cluster>, link: &Arc<Link>, key: u64) {
    let sink = c.remote.served.lock().get(&(lid(link), key)).cloned();
    if let Some(s) = sink {
        if s.remove() {
            let (name, owner) = (s.queue.name.clone(), s.queue.owner());
            if let Some(o) = owner {
                tokio::task::block_in_place(|| o.delete_unused_queue(&name));
            }
        }
        if s.unacked.lock().0.is_empty() {
            c.remote.served.lock().remove(&(lid(link), key));
        }
    }
    link.send(K_CANCEL_OK, |b| b.put_u64(key));
}
