//! Queues on other nodes. A [`RemoteQueue`] stands in a node's routing table for a queue whose
//! home is another node; what a channel does to it travels over the link to the home node,
//! where the queue is an ordinary local queue:
//!
//! - publish: a `PUBLISH` frame; with confirms, the home answers `CONFIRM` once the message is
//!   enqueued (and, if persistent on a durable queue, fsynced), or nacks a refused publish.
//! - consume: a request registers a consumer at the home whose sink ([`LinkSink`]) frames each
//!   delivery (`DELIVER`) to the consumer's node, which hands it to the channel. The queue's
//!   own credit (the consumer's prefetch) holds, and a window of unconfirmed deliveries per
//!   consumer (`CREDIT` frames return it) bounds what is in flight even without a prefetch.
//! - ack, reject, nack: `SETTLE` frames back to the home.
//! - get, counts, purge: requests.
//!
//! When a link goes down, the home requeues what it had delivered over it and drops those
//! consumers; the consumer's node cancels its consumers of that node's queues and nacks the
//! publishes still waiting for a confirm.
//!
//! This file: the bookkeeping both sides share ([`Remote`]) and the frames both send. Beside it:
//! `queue.rs` ([`RemoteQueue`], the publishing and consuming node's side), `proxy.rs` ([`Proxy`],
//! a consumer here of a queue there), `sink.rs` ([`LinkSink`], a consumer there of a queue here),
//! `serve.rs` (the home's answers to requests), `inbound.rs` (what a node does with the one-way
//! frames from another, and with a link that went down) and `wire.rs` (frame kinds, message
//! encoding).

mod inbound;
mod kind;
mod proxy;
mod queue;
mod serve;
mod sink;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::{BufMut, Bytes};
use parking_lot::Mutex;

use super::link::Link;
use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::queue::{Queue, QueuedMessage, Settled};

pub use crate::queue::Counts;
pub use inbound::{on_batch_end, on_link_down, on_message};
pub use proxy::Proxy;
pub use queue::RemoteQueue;
pub use serve::serve_request;
pub use sink::LinkSink;
pub(crate) use wire::{get_message, put_message};
pub use wire::{
    K_CANCEL, K_CANCEL_OK, K_CONFIRM, K_CREDIT, K_DELIVER, K_PUBLISH, K_PUB_CREDIT, K_SETTLE,
};

/// This node's remote-queue bookkeeping.
#[derive(Default)]
pub struct Remote {
    next_id: AtomicU64,
    /// Publishes sent with a confirm, by (link, forward id).
    confirms: Mutex<HashMap<(usize, u64), Arc<ConfirmHandle>>>,
    /// This node's consumers of remote queues, by consumer key.
    proxies: Mutex<HashMap<u64, Arc<Proxy>>>,
    /// Consumers of this node's queues on other nodes, by (link, their consumer key).
    served: Mutex<HashMap<(usize, u64), Arc<LinkSink>>>,
    /// basic.get deliveries to other nodes awaiting their ack, by (link, delivery id).
    gets: Mutex<HashMap<(usize, u64), GetDelivery>>,
    /// Delivery credit owed to homes for the current read batches: (link, consumer key, n).
    credit_owed: Mutex<Vec<(Arc<Link>, u64, u32)>>,
    /// Settles from other nodes gathered over a read batch, applied per queue at its end.
    settles: Mutex<Vec<SettleBatch>>,
    /// Publish credit owed to publishing nodes for the current read batches.
    owed: Mutex<Vec<Owed>>,
    /// Recently forwarded-to queues by (vhost, name), so a forwarded publish costs no registry
    /// lookup.
    recent: Mutex<Vec<(Bytes, Bytes, std::sync::Weak<Queue>)>>,
}

/// Settles of one kind from one link for one queue: (link, queue, how, what).
type SettleBatch = (Arc<Link>, Arc<Queue>, u8, Vec<Settled>);
/// Publish credit owed over a link for a queue.
type Owed = (Arc<Link>, Arc<Queue>, u32);

/// A basic.get delivery: its queue and what settling it gives back.
type GetDelivery = (Arc<Queue>, Settled);

/// A publish forwarded from another node waits on a queue here: its node gets a `CONFIRM` frame.
impl crate::confirm::ConfirmTarget for Link {
    fn confirmed(self: Arc<Self>, seq: u64, ok: bool) {
        send_confirm(&self, seq, ok)
    }
}

/// Confirms (or nacks) a forwarded publish to the node it came from.
pub fn send_confirm(link: &Link, id: u64, ok: bool) {
    link.send_run(
        K_CONFIRM,
        0,
        |_| {},
        |b| {
            b.put_u64(id);
            b.put_u8(ok as u8);
        },
    );
}

/// Settles one delivery at its home; `consumer` is the consumer's key + 1, or 0 for a
/// basic.get.
fn send_settle(link: &Link, how: u8, consumer: u64, id: u64) {
    let key = (consumer as u128) << 8 | how as u128;
    link.send_run(
        K_SETTLE,
        key,
        |b| {
            b.put_u8(how);
            b.put_u64(consumer);
        },
        |b| b.put_u64(id),
    );
}

/// Names a link in the maps above (a link's entries go when it does).
fn lid(link: &Arc<Link>) -> usize {
    Arc::as_ptr(link) as usize
}

fn entry(id: u64, msg: Message, redelivered: bool) -> QueuedMessage {
    warren_queue::Entry {
        seq: id,
        msg: Arc::new(msg),
        redelivered,
        expires_at_ms: None,
        logged: false,
    }
}
