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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::ByteString;

use super::link::{get_str, put_str, Link};
use super::Cluster;
use crate::channel::Offer;
use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::{
    Consumer, DeliverySink, Enqueued, Queue, QueueArgs, QueueOptions, QueueRef, QueuedMessage,
    Settled,
};

pub const K_PUBLISH: u8 = 16;
pub const K_CONFIRM: u8 = 17;
pub const K_DELIVER: u8 = 18;
pub const K_SETTLE: u8 = 19;
pub const K_CREDIT: u8 = 20;
pub const K_CANCEL: u8 = 21;
/// The home took `n` forwarded publishes to a queue: the publishing node may send more.
pub const K_PUB_CREDIT: u8 = 22;

const Q_CONSUME: u8 = 1;
const Q_CANCEL: u8 = 2;
const Q_GET: u8 = 3;
const Q_COUNTS: u8 = 4;
const Q_PURGE: u8 = 5;

const SETTLE_ACK: u8 = 0;
const SETTLE_REQUEUE: u8 = 1;
const SETTLE_DISCARD: u8 = 2;

/// Deliveries in flight to one remote consumer before its node confirms them (frames them to
/// its channel, and not while that channel's output is full: `Proxy::withhold`): bounds the
/// consumer node's memory when the consumer has no prefetch.
const WINDOW: u32 = 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long remote counts (message_count, consumer_count) are reused.
const COUNTS_TTL: Duration = Duration::from_millis(500);
/// Above this much unsent output on a link, publishers to its queues are held back.
const LINK_PRESSURE_BYTES: usize = 8 << 20;
/// Publishes forwarded to one remote queue and not yet taken by its home (credit flow across
/// the link: the home withholds credit while its queue is pressured, as a local channel stops
/// reading its socket).
const PUBLISH_WINDOW: u32 = 8192;

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

/// A queue whose home is another node.
pub struct RemoteQueue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    args: arc_swap::ArcSwap<QueueArgs>,
    pub home: String,
    cluster: std::sync::Weak<Cluster>,
    deleted: AtomicBool,
    counts: Mutex<Option<(std::time::Instant, Counts)>>,
    /// Forwarded publishes its home has not credited yet.
    in_flight: AtomicU32,
    relieved: tokio::sync::Notify,
    cached_link: arc_swap::ArcSwapOption<Link>,
    /// Names its runs of publishes on the link (unique for the process's life, unlike an
    /// address a later queue could reuse).
    run_key: u64,
}

static NEXT_RUN_KEY: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub messages: u32,
    pub consumers: u32,
    pub unacked: u32,
}

/// A consumer on this node of a remote queue.
pub struct Proxy {
    consumer: Arc<Consumer>,
    queue: Arc<RemoteQueue>,
    /// Deliveries that came before the consume-ok was sent (`Some` until then).
    early: Mutex<Option<Vec<QueuedMessage>>>,
    /// Credit for deliveries taken while the consumer's connection output was full: owed to
    /// the home over this link once it drains, so a consumer that does not read holds at most
    /// a window on this node, not whatever its queue has.
    withheld: Mutex<Option<(Arc<Link>, u32)>>,
}

impl std::fmt::Debug for RemoteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteQueue({}@{})", self.name, self.home)
    }
}

impl RemoteQueue {
    pub fn new(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        home: String,
        cluster: &Arc<Cluster>,
    ) -> Arc<RemoteQueue> {
        Arc::new(RemoteQueue {
            name,
            vhost,
            args: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            home,
            cluster: Arc::downgrade(cluster),
            deleted: AtomicBool::new(false),
            counts: Mutex::new(None),
            in_flight: AtomicU32::new(0),
            relieved: tokio::sync::Notify::new(),
            cached_link: arc_swap::ArcSwapOption::empty(),
            run_key: NEXT_RUN_KEY.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.args.load()
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        self.args.store(Arc::new(a));
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Relaxed)
    }

    /// The cluster and the open link to the home node (cached: every publish asks), dialed
    /// if there is none yet (followers are linked to each other only once one needs to).
    fn link(&self) -> Option<(Arc<Cluster>, Arc<Link>)> {
        let c = self.cluster.upgrade()?;
        if let Some(l) = self.cached_link.load_full().filter(|l| !l.is_closed()) {
            return Some((c, l));
        }
        let addr = c.addr_of(&self.home)?;
        let l = match c.links.get(&addr) {
            Some(l) => l,
            None => {
                let handle = tokio::runtime::Handle::try_current().ok()?;
                let links = c.links.clone();
                tokio::task::block_in_place(|| handle.block_on(links.link(&addr))).ok()?
            }
        };
        self.cached_link.store(Some(l.clone()));
        Some((c, l))
    }

    /// The home node is down: RabbitMQ 3.10's answer for a classic queue whose node is gone.
    pub fn down(&self) -> AmqpError {
        AmqpError::not_found(format!(
            "home node '{}' of durable {} is down or inaccessible",
            self.home,
            self.describe()
        ))
    }

    /// A request to the home node, from synchronous code on a tokio worker.
    fn request(&self, op: u8, fill: impl FnOnce(&mut BytesMut)) -> AmqpResult<Bytes> {
        let c = self.cluster.upgrade().ok_or_else(|| self.down())?;
        let addr = c.addr_of(&self.home).ok_or_else(|| self.down())?;
        let mut b = BytesMut::new();
        b.put_u8(op);
        put_str(&mut b, &self.vhost);
        put_str(&mut b, &self.name);
        fill(&mut b);
        let handle = tokio::runtime::Handle::current();
        let links = c.links.clone();
        let r = tokio::task::block_in_place(|| {
            handle.block_on(links.call(&addr, super::SERVICE_QUEUE, &b, REQUEST_TIMEOUT))
        });
        match r {
            Ok(mut reply) => {
                if reply.is_empty() {
                    return Err(AmqpError::internal_error("empty reply"));
                }
                if reply.get_u8() == 0 {
                    Ok(reply)
                } else {
                    let code = if reply.len() >= 2 {
                        reply.get_u16()
                    } else {
                        541
                    };
                    let text = String::from_utf8_lossy(&reply).into_owned();
                    Err(AmqpError {
                        code,
                        text,
                        class_id: 0,
                        method_id: 0,
                    })
                }
            }
            Err(_) => Err(self.down()),
        }
    }

    /// Runs `f` with the open link to the home: the cached one without touching a reference
    /// count (every publish and ack comes here, from every thread), else [`Self::link`]'s.
    fn with_link<R>(&self, f: impl FnOnce(&Arc<Link>) -> R) -> Option<R> {
        {
            let cached = self.cached_link.load();
            if let Some(l) = cached.as_ref().filter(|l| !l.is_closed()) {
                return Some(f(l));
            }
        }
        let (_, l) = self.link()?;
        Some(f(&l))
    }

    pub fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        self.with_link(|link| self.publish_on(link, msg, confirm))
            .unwrap_or(Enqueued::Rejected)
    }

    fn publish_on(
        &self,
        link: &Arc<Link>,
        msg: Arc<Message>,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Enqueued {
        let id = match confirm {
            Some(h) => {
                let Some(c) = self.cluster.upgrade() else {
                    return Enqueued::Rejected;
                };
                let id = c.remote.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                c.remote.confirms.lock().insert((lid(link), id), h.clone());
                id
            }
            None => 0,
        };
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        link.send_run(
            K_PUBLISH,
            self.run_key as u128,
            |b| {
                put_str(b, &self.vhost);
                put_str(b, &self.name);
            },
            |b| put_message(b, &id.to_be_bytes(), &msg),
        );
        Enqueued::Accepted
    }

    pub fn pressured(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= PUBLISH_WINDOW
            || self
                .cached_link
                .load()
                .as_ref()
                .is_some_and(|l| l.pending_bytes() > LINK_PRESSURE_BYTES)
    }

    pub async fn stall(&self, max: Duration) {
        crate::limits::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    fn credited(&self, n: u32) {
        let left = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                Some(x.saturating_sub(n))
            })
            .map_or(0, |x| x.saturating_sub(n));
        if left < PUBLISH_WINDOW {
            self.relieved.notify_waiters();
        }
    }

    pub fn get(
        self: &Arc<Self>,
        ack_mode: bool,
        take: impl FnOnce(&QueuedMessage, u32),
    ) -> AmqpResult<bool> {
        let mut r = self.request(Q_GET, |b| b.put_u8(ack_mode as u8))?;
        if r.is_empty() || r.get_u8() == 0 {
            return Ok(false);
        }
        let (Some(id), Some(left), Some(redelivered)) =
            (get_u64(&mut r), get_u32(&mut r), get_u8(&mut r))
        else {
            return Err(AmqpError::internal_error("malformed get reply"));
        };
        let msg =
            get_message(&mut r).ok_or_else(|| AmqpError::internal_error("malformed get reply"))?;
        let m = entry(id, msg, redelivered != 0);
        take(&m, left);
        Ok(true)
    }

    /// Acks, rejects and requeues go home; `consumer` 0 is a basic.get.
    fn settle_as(&self, how: u8, msgs: impl IntoIterator<Item = Settled>) {
        self.with_link(|link| {
            for (consumer, m) in msgs {
                send_settle(link, how, consumer.map_or(0, |k| k + 1), m.seq);
            }
        });
    }

    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>) {
        self.settle_as(SETTLE_ACK, msgs)
    }

    pub fn discard(&self, msgs: impl IntoIterator<Item = Settled>) {
        self.settle_as(SETTLE_DISCARD, msgs)
    }

    pub fn requeue(&self, msgs: impl IntoIterator<Item = Settled>) {
        self.settle_as(SETTLE_REQUEUE, msgs)
    }

    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        on_added: impl FnOnce(),
    ) -> AmqpResult<()> {
        let cluster = self.cluster.upgrade().ok_or_else(|| self.down())?;
        let proxy = Arc::new(Proxy {
            consumer: c.clone(),
            queue: self.clone(),
            early: Mutex::new(Some(Vec::new())),
            withheld: Mutex::new(None),
        });
        cluster.remote.proxies.lock().insert(c.key, proxy.clone());
        let r = self.request(Q_CONSUME, |b| {
            b.put_u64(c.key);
            put_str(b, &c.tag);
            b.put_u8(c.no_ack as u8);
            b.put_u8(c.exclusive as u8);
            b.put_i64(c.priority);
            b.put_u16(c.prefetch);
        });
        if let Err(e) = r {
            cluster.remote.proxies.lock().remove(&c.key);
            return Err(e);
        }
        on_added();
        // Under the lock: a delivery the link reader brings meanwhile waits, then goes after
        // these, so the consumer sees the queue's order.
        let mut early = proxy.early.lock();
        for m in early.take().unwrap_or_default() {
            proxy.deliver(&m);
        }
        drop(early);
        self.counts.lock().take();
        Ok(())
    }

    pub fn remove_consumer(&self, c: &Arc<Consumer>) {
        if let Some(cluster) = self.cluster.upgrade() {
            cluster.remote.proxies.lock().remove(&c.key);
        }
        if let Some((_, link)) = self.link() {
            // Fire and forget: the home removes it and keeps its unacked deliveries until they
            // are settled (or the link goes).
            let mut b = BytesMut::new();
            b.put_u8(Q_CANCEL);
            put_str(&mut b, &self.vhost);
            put_str(&mut b, &self.name);
            b.put_u64(c.key);
            tokio::spawn(async move {
                let _ = link.call(super::SERVICE_QUEUE, &b, REQUEST_TIMEOUT).await;
            });
        }
        self.counts.lock().take();
    }

    pub fn counts(&self) -> Counts {
        if let Some((at, c)) = *self.counts.lock() {
            if at.elapsed() < COUNTS_TTL {
                return c;
            }
        }
        let c = match self.request(Q_COUNTS, |_| {}) {
            Ok(mut r) => Counts {
                messages: get_u32(&mut r).unwrap_or(0),
                consumers: get_u32(&mut r).unwrap_or(0),
                unacked: get_u32(&mut r).unwrap_or(0),
            },
            Err(_) => Counts::default(),
        };
        *self.counts.lock() = Some((std::time::Instant::now(), c));
        c
    }

    /// The counts, or the error a declare or delete should answer when the home is down.
    pub fn counts_checked(&self) -> AmqpResult<Counts> {
        self.counts.lock().take();
        let mut r = self.request(Q_COUNTS, |_| {})?;
        Ok(Counts {
            messages: get_u32(&mut r).unwrap_or(0),
            consumers: get_u32(&mut r).unwrap_or(0),
            unacked: get_u32(&mut r).unwrap_or(0),
        })
    }

    pub fn purge(&self) -> u32 {
        self.counts.lock().take();
        self.request(Q_PURGE, |_| {})
            .ok()
            .and_then(|mut r| get_u32(&mut r))
            .unwrap_or(0)
    }

    /// This node's consumers of it.
    pub fn local_consumers(&self) -> Vec<Arc<Consumer>> {
        let Some(c) = self.cluster.upgrade() else {
            return Vec::new();
        };
        let me = self as *const RemoteQueue;
        let out = c
            .remote
            .proxies
            .lock()
            .values()
            .filter(|p| Arc::as_ptr(&p.queue) == me)
            .map(|p| p.consumer.clone())
            .collect();
        out
    }

    /// Deleted (applied on every node): this node's consumers of it are cancelled.
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        self.deleted.store(true, Ordering::Relaxed);
        let consumers = self.local_consumers();
        if let Some(c) = self.cluster.upgrade() {
            let mut p = c.remote.proxies.lock();
            for x in &consumers {
                p.remove(&x.key);
            }
        }
        (0, consumers)
    }
}

impl Proxy {
    /// Sends the withheld credit home (the consumer's output drained).
    pub fn release_credit(&self) {
        if let Some((link, n)) = self.withheld.lock().take() {
            link.send(K_CREDIT, |b| {
                b.put_u64(self.consumer.key);
                b.put_u32(n);
            });
        }
    }

    /// Credit for `n` deliveries just pushed: withheld while the consumer's output is full.
    /// False if it is not: the caller credits them with the rest of the read.
    fn withhold(self: &Arc<Self>, link: &Arc<Link>, n: u32) -> bool {
        if n == 0 || !self.consumer.sink.hold_credit(self) {
            return false;
        }
        {
            let mut w = self.withheld.lock();
            match w.as_mut() {
                Some((l, owed)) if Arc::ptr_eq(l, link) => *owed += n,
                _ => *w = Some((link.clone(), n)),
            }
        }
        // Drained between the check and the record: its wake found nothing to release.
        if !self.consumer.sink.hold_credit(self) {
            self.release_credit();
        }
        true
    }

    fn deliver(&self, m: &QueuedMessage) {
        let q = QueueRef::Remote(self.queue.clone());
        if !self.consumer.sink.push(&self.consumer, q.clone(), m) && !self.consumer.no_ack {
            // The channel is closing: back to the queue at once.
            q.requeue([(Some(self.consumer.key), m.clone())]);
        }
    }
}

/// A remote consumer's deliveries awaiting settlement.
#[derive(Default)]
struct Unacked(std::collections::VecDeque<(u64, Settled)>);

impl Unacked {
    fn remove(&mut self, id: u64) -> Option<Settled> {
        if self.0.front().is_some_and(|(f, _)| *f == id) {
            return self.0.pop_front().map(|(_, m)| m);
        }
        let i = self.0.binary_search_by_key(&id, |(x, _)| *x).ok()?;
        self.0.remove(i).map(|(_, m)| m)
    }
}

/// A consumer of a queue here whose channel is on another node.
pub struct LinkSink {
    link: Arc<Link>,
    /// The consumer's key on its node.
    remote_key: u64,
    queue: Arc<Queue>,
    consumer: Mutex<Option<Arc<Consumer>>>,
    next_delivery: AtomicU64,
    /// By delivery id, ascending (ids are handed out in order; acks mostly come in order).
    unacked: Mutex<Unacked>,
    in_flight: AtomicU32,
    /// Out of window: dispatch again when credit comes back.
    waiting: AtomicBool,
    /// Deliveries start once the consume-ok is on its way.
    started: AtomicBool,
}

impl DeliverySink for LinkSink {
    fn offer(&self, c: &Arc<Consumer>, _q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        if self.link.is_closed() || c.cancelled.load(Ordering::Relaxed) {
            return Offer::NoCredit;
        }
        if !self.started.load(Ordering::Acquire) {
            self.waiting.store(true, Ordering::Release);
            return Offer::NoCredit;
        }
        // A full window is this consumer's connection falling behind, as a full outbox is
        // for a local one: the queue may then hold back its publishers.
        if self.in_flight.load(Ordering::Relaxed) >= WINDOW {
            return Offer::OutboxFull;
        }
        let id = self.next_delivery.fetch_add(1, Ordering::Relaxed);
        if !c.no_ack {
            self.unacked
                .lock()
                .0
                .push_back((id, (Some(c.key), m.clone())));
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.link.send_run(
            K_DELIVER,
            self.remote_key as u128,
            |b| b.put_u64(self.remote_key),
            |b| {
                let mut pre = [0u8; 9];
                pre[..8].copy_from_slice(&id.to_be_bytes());
                pre[8] = m.redelivered as u8;
                put_message(b, &pre, &m.msg)
            },
        );
        Offer::Delivered
    }

    fn wait_for_space(&self, _q: &Arc<Queue>) {
        self.waiting.store(true, Ordering::Release);
    }

    fn cancelled(&self, _c: &Consumer) {
        self.link.send(K_CANCEL, |b| b.put_u64(self.remote_key));
    }
}

impl LinkSink {
    fn credit(&self, n: u32) {
        let left = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                Some(x.saturating_sub(n))
            })
            .map_or(0, |x| x.saturating_sub(n));
        // Half a window at a time, so a dispatch delivers a batch, not one message.
        if left <= WINDOW / 2 && self.waiting.swap(false, Ordering::AcqRel) {
            self.queue.dispatch();
        }
    }

    /// Its consumer leaves the queue; what it was delivered stays unacked until settled.
    fn remove(&self) {
        if let Some(c) = self.consumer.lock().take() {
            c.cancelled.store(true, Ordering::Relaxed);
            let removed = self.queue.remove_consumer(&c);
            if removed.auto_delete_now {
                spawn_delete(&self.queue);
            }
        }
    }
}

/// Deletes an auto-delete queue whose last consumer left, off the link's reader.
fn spawn_delete(q: &Arc<Queue>) {
    let (name, owner) = (q.name.clone(), q.owner());
    tokio::spawn(async move {
        if let Some(o) = owner {
            tokio::task::block_in_place(|| o.delete_unused_queue(&name));
        }
    });
}

// ---- the home node's side ----

fn error_reply(e: AmqpError) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(1);
    b.put_u16(e.code);
    b.put_slice(e.text.as_bytes());
    b.freeze()
}

fn local_queue(c: &Cluster, vhost: &str, name: &str) -> AmqpResult<Arc<Queue>> {
    let b = c
        .broker()
        .ok_or_else(|| AmqpError::internal_error("stopping"))?;
    let v = b
        .vhost(vhost)
        .ok_or_else(|| AmqpError::not_found(format!("no vhost '{vhost}'")))?;
    match v.queue(name) {
        Some(QueueRef::Local(q)) => Ok(q),
        // A replicated queue is served here while this node leads it.
        Some(QueueRef::Quorum(q)) => match q.leg() {
            Some(QueueRef::Local(l)) => Ok(l),
            _ => Err(AmqpError::not_found(format!(
                "{} is not led by this node (its leader changed)",
                q.describe()
            ))),
        },
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
    let q = match local_queue(c, &vhost, &name) {
        Ok(q) => q,
        // The queue is gone; its consumer with it.
        Err(_) if op == Q_CANCEL => return Ok(Bytes::from_static(&[0])),
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
        Q_CANCEL => {
            let key = get_u64(&mut body).ok_or("short request")?;
            let sink = c.remote.served.lock().get(&(lid(link), key)).cloned();
            if let Some(s) = sink {
                s.remove();
                if s.unacked.lock().0.is_empty() {
                    c.remote.served.lock().remove(&(lid(link), key));
                }
            }
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
            out.put_u32(q.message_count());
            out.put_u32(q.consumer_count());
            out.put_u32(q.unacked_count());
        }
        Q_PURGE => out.put_u32(q.purge()),
        op => return Err(format!("unknown queue request {op}")),
    }
    Ok(out.freeze())
}

/// A one-way frame from another node.
pub fn on_message(c: &Arc<Cluster>, link: &Arc<Link>, kind: u8, mut body: Bytes) {
    match kind {
        K_PUBLISH => {
            let (Some(vhost), Some(name), Some(n)) = (
                get_bytes(&mut body),
                get_bytes(&mut body),
                get_u32(&mut body),
            ) else {
                return;
            };
            let q = forwarded_to(c, &vhost, &name);
            let mut took = 0;
            for _ in 0..n {
                let Some(id) = get_u64(&mut body) else { break };
                let Some(msg) = get_message(&mut body) else {
                    break;
                };
                let Some(q) = &q else {
                    // Not taken here: deleted meanwhile, led by another node now (a replicated
                    // queue), or not known yet (this node has just restarted and not replayed
                    // its metadata). Nacked, never confirmed: a confirm must mean stored. A
                    // publisher that resends to a queue that is really gone gets it
                    // unroutable, and confirmed then. The publishing node's credit goes with
                    // the queue.
                    if id != 0 {
                        send_confirm(link, id, false);
                    }
                    continue;
                };
                let msg = Arc::new(msg);
                let storing = id != 0 && q.stores(&msg);
                let handle = storing.then(|| ConfirmHandle::for_target(link.clone(), id, 1));
                let r = q.publish(msg, handle.as_ref());
                if !storing || r != Enqueued::Accepted {
                    match handle {
                        Some(h) => {
                            h.done(r != Enqueued::Rejected);
                        }
                        None if id != 0 => send_confirm(link, id, r != Enqueued::Rejected),
                        None => {}
                    }
                }
                took += 1;
            }
            let Some(q) = q else { return };
            let mut owed = c.remote.owed.lock();
            match owed
                .iter_mut()
                .find(|(l, oq, _)| Arc::ptr_eq(l, link) && Arc::ptr_eq(oq, &q))
            {
                Some(o) => o.2 += took,
                None => owed.push((link.clone(), q, took)),
            }
        }
        K_PUB_CREDIT => {
            let (Some(vhost), Some(name), Some(n)) =
                (get_str(&mut body), get_str(&mut body), get_u32(&mut body))
            else {
                return;
            };
            let rq = c
                .broker()
                .and_then(|b| b.vhost(&vhost))
                .and_then(|v| v.queue(&name))
                .and_then(|q| q.remote_leg());
            if let Some(rq) = rq {
                rq.credited(n);
            }
        }
        K_CONFIRM => {
            let Some(n) = get_u32(&mut body) else { return };
            let done: Vec<(Arc<ConfirmHandle>, bool)> = {
                let mut confirms = c.remote.confirms.lock();
                (0..n)
                    .map_while(|_| Some((get_u64(&mut body)?, get_u8(&mut body)?)))
                    .filter_map(|(id, ok)| Some((confirms.remove(&(lid(link), id))?, ok == 1)))
                    .collect()
            };
            crate::confirm::complete_all(done);
        }
        K_DELIVER => {
            let (Some(key), Some(n)) = (get_u64(&mut body), get_u32(&mut body)) else {
                return;
            };
            let proxy = c.remote.proxies.lock().get(&key).cloned();
            let mut got = 0;
            for _ in 0..n {
                let (Some(id), Some(redelivered)) = (get_u64(&mut body), get_u8(&mut body)) else {
                    break;
                };
                let Some(msg) = get_message(&mut body) else {
                    break;
                };
                got += 1;
                let m = entry(id, msg, redelivered != 0);
                match &proxy {
                    Some(p) => {
                        let mut early = p.early.lock();
                        match early.as_mut() {
                            Some(v) => v.push(m),
                            None => {
                                drop(early);
                                p.deliver(&m);
                            }
                        }
                    }
                    // Its consumer is gone: straight back.
                    None => send_settle(link, SETTLE_REQUEUE, key + 1, id),
                }
            }
            if proxy.as_ref().is_some_and(|p| p.withhold(link, got)) {
                return;
            }
            let mut owed = c.remote.credit_owed.lock();
            match owed
                .iter_mut()
                .find(|(l, k, _)| *k == key && Arc::ptr_eq(l, link))
            {
                Some(o) => o.2 += got,
                None => owed.push((link.clone(), key, got)),
            }
        }
        K_SETTLE => {
            let (Some(how), Some(consumer), Some(n)) =
                (get_u8(&mut body), get_u64(&mut body), get_u32(&mut body))
            else {
                return;
            };
            let n = (n as usize).min(body.len() / 8);
            let ids = (0..n).map(|_| body.get_u64());
            let peer = lid(link);
            let mut settles = c.remote.settles.lock();
            let mut add = |q: &Arc<Queue>, m: Settled| match settles.last_mut() {
                Some((l, sq, h, v)) if Arc::ptr_eq(l, link) && Arc::ptr_eq(sq, q) && *h == how => {
                    v.push(m)
                }
                _ => settles.push((link.clone(), q.clone(), how, vec![m])),
            };
            if consumer == 0 {
                // basic.get deliveries: a run may hold several queues' (one home, one link).
                let mut gets = c.remote.gets.lock();
                for id in ids {
                    if let Some((q, m)) = gets.remove(&(peer, id)) {
                        add(&q, m);
                    }
                }
                return;
            }
            let key = consumer - 1;
            let Some(sink) = c.remote.served.lock().get(&(peer, key)).cloned() else {
                return;
            };
            let mut u = sink.unacked.lock();
            for id in ids {
                if let Some(m) = u.remove(id) {
                    add(&sink.queue, m);
                }
            }
            let drained = u.0.is_empty();
            drop(u);
            if drained && sink.consumer.lock().is_none() {
                c.remote.served.lock().remove(&(peer, key));
            }
        }
        K_CREDIT => {
            let (Some(key), Some(n)) = (get_u64(&mut body), get_u32(&mut body)) else {
                return;
            };
            let sink = c.remote.served.lock().get(&(lid(link), key)).cloned();
            if let Some(s) = sink {
                s.credit(n);
            }
        }
        K_CANCEL => {
            let Some(key) = get_u64(&mut body) else {
                return;
            };
            let p = c.remote.proxies.lock().remove(&key);
            if let Some(p) = p {
                crate::channel::notify_cancelled(std::slice::from_ref(&p.consumer));
            }
        }
        _ => tracing::debug!(kind, "unknown inter-node message"),
    }
}

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

/// The queue a forwarded publish names, from the recent ones when it is there.
fn forwarded_to(c: &Cluster, vhost: &Bytes, name: &Bytes) -> Option<Arc<Queue>> {
    {
        let recent = c.remote.recent.lock();
        for (v, n, q) in recent.iter() {
            if v == vhost && n == name {
                if let Some(q) = q.upgrade().filter(|q| !q.is_deleted()) {
                    return Some(q);
                }
            }
        }
    }
    let q = local_queue(
        c,
        std::str::from_utf8(vhost).ok()?,
        std::str::from_utf8(name).ok()?,
    )
    .ok()?;
    let mut recent = c.remote.recent.lock();
    recent.retain(|(v, n, w)| w.strong_count() > 0 && !(v == vhost && n == name));
    if recent.len() >= 64 {
        recent.remove(0);
    }
    recent.push((vhost.clone(), name.clone(), Arc::downgrade(&q)));
    Some(q)
}

/// After a read from `link`: credit the publishes it brought, now for queues keeping up, once
/// relieved for pressured ones.
pub fn on_batch_end(c: &Arc<Cluster>, link: &Arc<Link>) {
    let settles = take_for(&mut c.remote.settles.lock(), link, |s| &s.0);
    for (_, q, how, msgs) in settles {
        match how {
            SETTLE_ACK => q.settle(msgs, true),
            SETTLE_REQUEUE => q.requeue(msgs),
            _ => q.discard(msgs, true),
        }
    }
    let credit = take_for(&mut c.remote.credit_owed.lock(), link, |o| &o.0);
    for (l, key, n) in credit {
        l.send(K_CREDIT, |b| {
            b.put_u64(key);
            b.put_u32(n);
        });
    }
    let mine = take_for(&mut c.remote.owed.lock(), link, |o| &o.0);
    for (l, q, n) in mine {
        if !q.pressured() {
            pub_credit(&l, &q, n);
            continue;
        }
        tokio::spawn(async move {
            while q.pressured() && !l.is_closed() {
                q.stall(Duration::from_millis(crate::limits::CREDIT_RECHECK_MS))
                    .await;
            }
            pub_credit(&l, &q, n);
        });
    }
}

/// The entries of `all` for `link`, taken out. Usually every entry is (one link brings most of
/// a node's traffic): then the vector is taken whole, without sorting or allocating.
fn take_for<T>(all: &mut Vec<T>, link: &Arc<Link>, of: impl Fn(&T) -> &Arc<Link>) -> Vec<T> {
    if all.iter().all(|x| Arc::ptr_eq(of(x), link)) {
        return std::mem::take(all);
    }
    let (mine, rest) = all.drain(..).partition(|x| Arc::ptr_eq(of(x), link));
    *all = rest;
    mine
}

fn pub_credit(l: &Link, q: &Queue, n: u32) {
    l.send(K_PUB_CREDIT, |b| {
        put_str(b, &q.vhost);
        put_str(b, &q.name);
        b.put_u32(n);
    });
}

/// A link went down: requeue what went over it, cancel consumers of its node's queues, nack
/// publishes waiting for its confirms.
pub fn on_link_down(c: &Arc<Cluster>, link: &Arc<Link>) {
    let peer = &lid(link);
    let sinks: Vec<Arc<LinkSink>> = {
        let mut s = c.remote.served.lock();
        let keys: Vec<_> = s.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| s.remove(&k)).collect()
    };
    for s in sinks {
        s.remove();
        let msgs: Vec<Settled> = s.unacked.lock().0.drain(..).map(|(_, m)| m).collect();
        s.queue.requeue(msgs);
    }
    let gets: Vec<GetDelivery> = {
        let mut g = c.remote.gets.lock();
        let keys: Vec<_> = g.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| g.remove(&k)).collect()
    };
    for (q, m) in gets {
        q.requeue([m]);
    }
    let confirms: Vec<Arc<ConfirmHandle>> = {
        let mut m = c.remote.confirms.lock();
        let keys: Vec<_> = m.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| m.remove(&k)).collect()
    };
    crate::confirm::complete_all(confirms.into_iter().map(|h| (h, false)));
    let name = link.peer_name.clone();
    let proxies: Vec<Arc<Proxy>> = {
        let mut p = c.remote.proxies.lock();
        let keys: Vec<u64> = p
            .iter()
            .filter(|(_, x)| x.queue.home == name)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter().filter_map(|k| p.remove(&k)).collect()
    };
    let consumers: Vec<Arc<Consumer>> = proxies.into_iter().map(|p| p.consumer.clone()).collect();
    crate::channel::notify_cancelled(&consumers);
    // Publishers held back by that node's credit are let go (their publishes now fail fast).
    if let Some(b) = c.broker() {
        for v in b.vhosts() {
            for q in v.snapshot().queues.values() {
                if let Some(r) = q.remote_leg().filter(|r| r.home == name) {
                    r.in_flight.store(0, Ordering::Relaxed);
                    r.relieved.notify_waiters();
                }
            }
        }
    }
}

/// Names a link in the maps above (a link's entries go when it does).
fn lid(link: &Arc<Link>) -> usize {
    Arc::as_ptr(link) as usize
}

// ---- encoding ----

fn entry(id: u64, msg: Message, redelivered: bool) -> QueuedMessage {
    warren_queue::Entry {
        seq: id,
        msg: Arc::new(msg),
        redelivered,
        expires_at_ms: None,
        logged: false,
    }
}

/// A message's fixed-size fields, after the caller's own (`pre`): lengths, flags, priority,
/// expiration.
const MESSAGE_HEAD: usize = 2 + 2 + 4 + 4 + 1 + 1 + 8;
const PRE_MAX: usize = 16;

/// Writes `pre` (the item's own fixed fields, up to 16 bytes) and `m`: the fixed fields in one
/// copy, then the four variable ones. Every `put_*` of `BytesMut` is a bounds check and a call
/// to `memcpy`; writing each field on its own made encoding a forwarded message cost more
/// instructions than routing it (callgrind).
fn put_message(b: &mut BytesMut, pre: &[u8], m: &Message) {
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

fn get_message(b: &mut Bytes) -> Option<Message> {
    if b.len() < MESSAGE_HEAD {
        return None;
    }
    let exchange_len = b.get_u16() as usize;
    let key_len = b.get_u16() as usize;
    let props_len = b.get_u32() as usize;
    let body_len = b.get_u32() as usize;
    let flags = b.get_u8();
    let priority = b.get_u8();
    let expiration = b.get_u64();
    if b.len() < exchange_len + key_len + props_len + body_len {
        return None;
    }
    // Slices of the frame, as the AMQP decoder makes them: no copy, no allocation.
    let exchange = ByteString::try_from(b.split_to(exchange_len)).ok()?;
    let routing_key = ByteString::try_from(b.split_to(key_len)).ok()?;
    let properties = b.split_to(props_len);
    let body = b.split_to(body_len);
    Some(Message {
        exchange,
        routing_key,
        properties,
        body,
        persistent: flags & 1 != 0,
        priority: (flags & 2 != 0).then_some(priority),
        expiration_ms: (flags & 4 != 0).then_some(expiration),
    })
}

/// A string as [`put_str`] wrote it, as a slice of the frame.
fn get_bytes(b: &mut Bytes) -> Option<Bytes> {
    if b.len() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    (b.len() >= n).then(|| b.split_to(n))
}

fn get_u8(b: &mut Bytes) -> Option<u8> {
    (!b.is_empty()).then(|| b.get_u8())
}

fn get_u32(b: &mut Bytes) -> Option<u32> {
    (b.len() >= 4).then(|| b.get_u32())
}

fn get_u64(b: &mut Bytes) -> Option<u64> {
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
}
