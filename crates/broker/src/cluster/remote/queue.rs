//! The publishing and consuming node's side: a [`RemoteQueue`] stands in for a queue whose home
//! is another node, and sends what is done to it there (publishes and settles in runs, consumes,
//! gets, counts and purges as requests), holding publishers back on the home's credit.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;

use super::proxy::Proxy;
use super::wire::{
    get_message, get_u32, get_u64, get_u8, put_message, K_PUBLISH, Q_CANCEL, Q_CONSUME, Q_COUNTS,
    Q_GET, Q_PURGE, Q_SYNC, SETTLE_ACK, SETTLE_DISCARD, SETTLE_REQUEUE,
};
use super::{entry, lid, send_settle};
use crate::cluster::link::{put_str, Link};
use crate::cluster::Cluster;
use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::{
    Consumer, Counts, Enqueued, QueueArgs, QueueOptions, QueueRef, QueuedMessage, Settled,
};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long remote counts (message_count, consumer_count) are reused.
const COUNTS_TTL: Duration = Duration::from_millis(500);
/// Above this much unsent output on a link, publishers to its queues are held back.
const LINK_PRESSURE_BYTES: usize = 8 << 20;
/// Publishes forwarded to one remote queue and not yet taken by its home (credit flow across
/// the link: the home withholds credit while its queue is pressured, as a local channel stops
/// reading its socket).
const PUBLISH_WINDOW: u32 = 8192;

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
    pub(super) in_flight: AtomicU32,
    pub(super) relieved: tokio::sync::Notify,
    cached_link: arc_swap::ArcSwapOption<Link>,
    /// Names its runs of publishes on the link (unique for the process's life, unlike an
    /// address a later queue could reuse).
    run_key: u64,
    /// This node's consumers of it that hold deliveries back for a channel-wide prefetch.
    holding: Mutex<Vec<std::sync::Weak<Proxy>>>,
}

static NEXT_RUN_KEY: AtomicU64 = AtomicU64::new(1);

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
            holding: Mutex::new(Vec::new()),
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
            handle.block_on(links.call(&addr, crate::cluster::SERVICE_QUEUE, &b, REQUEST_TIMEOUT))
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
        crate::flow::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    pub(super) fn credited(&self, n: u32) {
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
            cancelling: Mutex::new(None),
            cancel_asked: AtomicBool::new(false),
            held: Mutex::new(Default::default()),
            holding: AtomicBool::new(false),
        });
        cluster.remote.proxies.lock().insert(c.key, proxy.clone());
        let r = self.request(Q_CONSUME, |b| {
            b.put_u64(c.key);
            put_str(b, &c.tag);
            b.put_u8(c.no_ack as u8);
            b.put_u8(c.exclusive as u8);
            b.put_i64(c.priority);
            b.put_u16(effective_prefetch(c.prefetch, c.sink.channel_prefetch()));
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

    /// Cancels a consumer of it: returns once the home has removed it (and deleted the queue
    /// if it was auto-delete and this was its last consumer) and every delivery it made to
    /// the consumer before that has arrived here (see [`Proxy::deliver`] for what becomes of
    /// them), so the channel's cancel-ok promises what it does on a single node. What the
    /// consumer was delivered stays unacked at the home until settled (or the link goes).
    pub fn remove_consumer(&self, c: &Arc<Consumer>) {
        let Some(cluster) = self.cluster.upgrade() else {
            return;
        };
        let proxy = cluster.remote.proxies.lock().get(&c.key).cloned();
        let done = proxy.as_ref().map(|p| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            *p.cancelling.lock() = Some(tx);
            p.cancel_asked.store(true, Ordering::Release);
            rx
        });
        let asked = self.request(Q_CANCEL, |b| b.put_u64(c.key));
        if let (Ok(_), Some(rx)) = (asked, done) {
            // The reply may overtake the marker (it goes in the link's control lane).
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                tokio::task::block_in_place(|| {
                    h.block_on(async {
                        let _ = tokio::time::timeout(REQUEST_TIMEOUT, rx).await;
                    })
                });
            }
        }
        cluster.remote.proxies.lock().remove(&c.key);
        // What a channel-wide prefetch held back never reached the client: back to the queue
        // before the reply (a no-ack one, which the home forgot, to the client before it).
        if let Some(p) = &proxy {
            let held = p.take_held();
            if !held.is_empty() && c.no_ack {
                let q = QueueRef::Other(p.queue.clone());
                for m in &held {
                    c.sink.push(c, q.clone(), m);
                }
            } else if !held.is_empty() {
                self.requeue(held.into_iter().map(|m| (Some(c.key), m)));
                self.sync_settles();
            }
        }
        self.counts.lock().take();
    }

    /// Returns once the home has applied every settle this node sent it before (they travel
    /// one-way): a channel's close-ok then promises its requeues are done.
    pub fn sync_settles(&self) {
        let _ = self.request(Q_SYNC, |_| {});
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
    /// `touch`: a declare, which starts an `x-expires` lease again at the home before its
    /// declare-ok. The answer is what the reply reports (cached for the next reads).
    pub fn counts_checked(&self, touch: bool) -> AmqpResult<Counts> {
        self.counts.lock().take();
        let mut r = self.request(Q_COUNTS, |b| b.put_u8(touch as u8))?;
        let c = Counts {
            messages: get_u32(&mut r).unwrap_or(0),
            consumers: get_u32(&mut r).unwrap_or(0),
            unacked: get_u32(&mut r).unwrap_or(0),
        };
        *self.counts.lock() = Some((std::time::Instant::now(), c));
        Ok(c)
    }

    pub fn purge(&self) -> u32 {
        self.counts.lock().take();
        self.request(Q_PURGE, |_| {})
            .ok()
            .and_then(|mut r| get_u32(&mut r))
            .unwrap_or(0)
    }

    /// `p` holds deliveries back for its channel's channel-wide prefetch: flushed when the
    /// channel kicks its queues ([`RemoteQueue::dispatch`]).
    pub(super) fn hold(&self, p: &Arc<Proxy>) {
        let mut h = self.holding.lock();
        if !h.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(p))) {
            h.push(Arc::downgrade(p));
        }
    }

    /// The channel of a consumer of it made room (an ack under a channel-wide prefetch): its
    /// held deliveries go on, in order.
    pub fn dispatch(&self) {
        let holding = std::mem::take(&mut *self.holding.lock());
        let still: Vec<_> = holding
            .into_iter()
            .filter(|w| w.upgrade().is_some_and(|p| p.flush()))
            .collect();
        if !still.is_empty() {
            let mut h = self.holding.lock();
            for w in still {
                if !h.iter().any(|x| x.ptr_eq(&w)) {
                    h.push(w);
                }
            }
        }
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

    /// Deleted (applied on every node): this node's consumers of it are cancelled, but for
    /// one whose own cancel deleted it (an auto-delete queue's last): its proxy stays until the
    /// home's `K_CANCEL_OK`, sent once every running node has applied the delete.
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        self.deleted.store(true, Ordering::Relaxed);
        let Some(c) = self.cluster.upgrade() else {
            return (0, Vec::new());
        };
        let me = self as *const RemoteQueue;
        let mut p = c.remote.proxies.lock();
        let keys: Vec<u64> = p
            .iter()
            .filter(|(_, x)| Arc::as_ptr(&x.queue) == me && x.cancelling.lock().is_none())
            .map(|(k, _)| *k)
            .collect();
        let consumers = keys
            .into_iter()
            .filter_map(|k| p.remove(&k))
            .map(|x| x.consumer.clone())
            .collect();
        (0, consumers)
    }
}

/// The prefetch the home holds a consumer to: its own, and its channel's channel-wide one
/// (`basic.qos` with `global`) when that is lower. The home cannot see the channel's other
/// consumers: the shared count is kept on this node, which holds back what exceeds it
/// (`Proxy::held`); this bounds what it holds to the channel's limit per consumer.
fn effective_prefetch(own: u16, channel: u16) -> u16 {
    match (own, channel) {
        (0, ch) => ch,
        (own, 0) => own,
        (own, ch) => own.min(ch),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_channel_wide_prefetch_caps_the_consumers_own() {
        use super::effective_prefetch as e;
        assert_eq!(e(0, 0), 0);
        assert_eq!(e(10, 0), 10);
        assert_eq!(e(0, 1), 1);
        assert_eq!(e(10, 3), 3);
        assert_eq!(e(2, 3), 2);
    }
}
