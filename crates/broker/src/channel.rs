//! A channel: publish assembly (method, header, body frames), consumers, the unacked map,
//! prefetch, publisher confirms and transactions.
//!
//! [`Channel`] is owned by its connection task. [`ChannelShared`] is the part queues touch when
//! they deliver from other tasks: the delivery-tag counter, the unacked list and prefetch counts,
//! under one small mutex, so that tags reach the socket in order.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::method::*;
use warren_protocol::properties::{self, BasicProperties, ContentHeader};
use warren_protocol::{frame, reply, ByteString, Method};

use crate::access::{exchange_resource, Access, Perm, PermCache, Resource};
use crate::confirm::Confirms;
use crate::consumer_timeout::{self as timeout, LeaseTarget, LEASE_EXCHANGE};
use crate::error::{AmqpError, AmqpResult};
use crate::message::{header_routes, Message};
use crate::metrics::{bump, delivered, ChannelStats};
use crate::outbox::{self, Outbox};
use crate::queue::args::parse_expiration;
use crate::queue::{Consumer, DeliverySink, Enqueued, Queue, QueueRef, QueuedMessage};
use crate::vhost::{ExchangeSpec, QueueSpec, VHost, DIRECT_REPLY_TO};

/// What a queue's offer of a message to a consumer came to.
pub enum Offer {
    Delivered,
    /// Prefetch exhausted, flow stopped, channel closing or consumer cancelled.
    NoCredit,
    /// The connection's outbox is above its high mark.
    OutboxFull,
}

/// A delivery awaiting ack.
struct Unacked {
    tag: u64,
    queue: QueueRef,
    msg: QueuedMessage,
    consumer: Option<Arc<Consumer>>,
    /// When it was delivered, moved forward by a lease extension ([`timeout::now_ms`]): it
    /// times out at `stamp` + its timeout.
    stamp: u64,
}

#[derive(Default)]
struct Deliveries {
    next_tag: u64,
    /// In ascending tag order (tags are assigned under this lock).
    unacked: VecDeque<Unacked>,
    /// basic.qos global=true limit (0 = none), and the count it applies to.
    global_prefetch: u16,
    global_unacked: u32,
    /// The broker's cap on unacked deliveries per channel (`limits.unacked_max_per_channel`,
    /// 0 = none); applies like a global prefetch the client cannot raise.
    unacked_max: u32,
    /// channel.flow active; false stops deliveries.
    paused: bool,
    closed: bool,
    /// Tags a consumer timeout took back: a late ack, nack or reject of one is ignored (as in
    /// RabbitMQ 4.3), not a 406. Bounded by `limits::RECLAIMED_TAGS_MAX`, oldest forgotten.
    reclaimed: BTreeSet<u64>,
}

pub struct ChannelShared {
    pub id: u16,
    pub outbox: Arc<Outbox>,
    deliveries: Mutex<Deliveries>,
    /// What `list_channels` shows of the channel's modes; only the channel's task writes it.
    pub modes: ChannelModes,
    /// Message counts (management API, Prometheus).
    pub stats: Arc<ChannelStats>,
}

/// A channel's settings as its task last set them, readable from the management side.
#[derive(Default)]
pub struct ChannelModes {
    /// basic.qos global=false: the prefetch given to consumers created afterwards.
    pub prefetch_count: AtomicU16,
    pub confirm: AtomicBool,
    pub transactional: AtomicBool,
}

impl ChannelShared {
    pub fn new(id: u16, outbox: Arc<Outbox>) -> Arc<ChannelShared> {
        Arc::new(ChannelShared {
            id,
            outbox,
            deliveries: Mutex::new(Deliveries {
                next_tag: 1,
                ..Default::default()
            }),
            modes: ChannelModes::default(),
            stats: Arc::default(),
        })
    }

    /// Closed (by either side, or with its connection): no longer listed.
    pub fn is_closed(&self) -> bool {
        self.deliveries.lock().closed
    }

    /// Deliveries awaiting ack, and the basic.qos global=true limit (0 = none).
    pub fn unacked_and_global_prefetch(&self) -> (usize, u16) {
        let d = self.deliveries.lock();
        (d.unacked.len(), d.global_prefetch)
    }

    /// Called by a queue (under its lock) to hand `m` to consumer `c`.
    pub fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        self.offer_from(c, || QueueRef::Local(q.clone()), m)
    }

    /// [`ChannelShared::offer`] for any queue kind (`q` names it in the unacked entry).
    #[inline]
    fn offer_from(
        &self,
        c: &Arc<Consumer>,
        q: impl FnOnce() -> QueueRef,
        m: &QueuedMessage,
    ) -> Offer {
        if c.cancelled.load(Ordering::Relaxed) {
            return Offer::NoCredit;
        }
        if self.outbox.is_full() {
            return Offer::OutboxFull;
        }
        let mut d = self.deliveries.lock();
        // The consumer's own prefetch is the queue's to check (its credit is queue state).
        if d.closed || d.paused {
            return Offer::NoCredit;
        }
        // A full channel-wide limit holds back no-ack consumers too, as RabbitMQ's limiter
        // does; their deliveries just do not count towards it.
        if d.global_prefetch > 0 && d.global_unacked >= d.global_prefetch as u32 {
            return Offer::NoCredit;
        }
        if !c.no_ack && d.unacked_max > 0 && d.unacked.len() >= d.unacked_max as usize {
            return Offer::NoCredit;
        }
        self.deliver_locked(&mut d, c, q, m);
        Offer::Delivered
    }

    /// Writes basic.deliver for `m` and records it unacked (under the deliveries lock).
    #[inline]
    fn deliver_locked(
        &self,
        d: &mut Deliveries,
        c: &Arc<Consumer>,
        q: impl FnOnce() -> QueueRef,
        m: &QueuedMessage,
    ) {
        let tag = d.next_tag;
        d.next_tag += 1;
        let frame_max = self.outbox.frame_max.load(Ordering::Relaxed);
        self.outbox.push(|b| {
            outbox::write_delivery(b, self.id, frame_max, &c.tag, tag, m.redelivered, &m.msg);
        });
        let st = &self.stats;
        delivered(
            &st.deliver,
            &st.deliver_no_ack,
            &st.redeliver,
            c.no_ack,
            m.redelivered,
        );
        if !c.no_ack {
            d.global_unacked += 1;
            d.unacked.push_back(Unacked {
                tag,
                queue: q(),
                msg: m.clone(),
                consumer: Some(c.clone()),
                stamp: timeout::now_ms(),
            });
        }
    }

    pub fn set_unacked_max(&self, max: u32) {
        self.deliveries.lock().unacked_max = max;
    }

    /// A limit shared by the channel's consumers is set (basic.qos global or the broker's
    /// cap): room it regains may go to any of the channel's queues.
    fn capped(&self) -> bool {
        let d = self.deliveries.lock();
        d.global_prefetch > 0 || d.unacked_max > 0
    }

    /// basic.get-ok for `m` (called under the queue lock).
    fn deliver_get(&self, q: &QueueRef, m: &QueuedMessage, remaining: u32, no_ack: bool) {
        let mut d = self.deliveries.lock();
        let st = &self.stats;
        delivered(
            &st.get,
            &st.get_no_ack,
            &st.redeliver,
            no_ack,
            m.redelivered,
        );
        let tag = d.next_tag;
        d.next_tag += 1;
        let frame_max = self.outbox.frame_max.load(Ordering::Relaxed);
        let ok = Method::BasicGetOk(BasicGetOk {
            delivery_tag: tag,
            redelivered: m.redelivered,
            exchange: m.msg.exchange.clone(),
            routing_key: m.msg.routing_key.clone(),
            message_count: remaining,
        });
        self.outbox.push(|b| {
            frame::write_method(b, self.id, &ok);
            outbox::write_content(b, self.id, frame_max, &m.msg);
        });
        if !no_ack {
            d.unacked.push_back(Unacked {
                tag,
                queue: q.clone(),
                msg: m.clone(),
                consumer: None,
                stamp: timeout::now_ms(),
            });
        }
    }

    /// Removes the deliveries an ack/nack/reject names. `multiple` with tag 0 means all.
    fn take(&self, tag: u64, multiple: bool) -> AmqpResult<Vec<Unacked>> {
        let mut d = self.deliveries.lock();
        let taken: Vec<Unacked> = if multiple {
            if tag != 0 && !d.unacked.iter().any(|u| u.tag == tag) && !d.reclaimed.contains(&tag) {
                return Err(unknown_tag(tag));
            }
            if !d.reclaimed.is_empty() {
                d.reclaimed.retain(|&t| tag != 0 && t > tag);
            }
            let n = if tag == 0 {
                d.unacked.len()
            } else {
                d.unacked.partition_point(|u| u.tag <= tag)
            };
            d.unacked.drain(..n).collect()
        } else {
            match d.unacked.binary_search_by_key(&tag, |u| u.tag) {
                Ok(i) => d.unacked.remove(i).into_iter().collect(),
                // Taken back by a consumer timeout: the client did not know yet.
                Err(_) if d.reclaimed.remove(&tag) => Vec::new(),
                Err(_) => return Err(unknown_tag(tag)),
            }
        };
        for u in &taken {
            if u.consumer.is_some() {
                d.global_unacked = d.global_unacked.saturating_sub(1);
            }
        }
        Ok(taken)
    }

    /// Puts back deliveries taken by a transaction that was rolled back.
    fn untake(&self, back: Vec<Unacked>) {
        let mut d = self.deliveries.lock();
        for u in back {
            if u.consumer.is_some() {
                d.global_unacked += 1;
            }
            let i = d.unacked.partition_point(|x| x.tag < u.tag);
            d.unacked.insert(i, u);
        }
    }
}

/// Whether no binding of a delayed exchange would take `msg` now (`targets` is left empty).
#[cold]
#[inline(never)]
fn unroutable_now(vhost: &VHost, msg: &Message, targets: &mut Vec<QueueRef>) -> bool {
    vhost.route_due(&msg.exchange, msg, targets);
    let none = targets.is_empty();
    targets.clear();
    none
}

/// Hands the requeued deliveries of queues with `x-delayed-retry-*` to their retry stores and
/// returns the others. Each leaves its queue once its store has it (on disk when it must be).
fn retry_later(taken: Vec<Unacked>, vhost: &Arc<VHost>, failed: bool) -> Vec<Unacked> {
    let mut rest = Vec::with_capacity(taken.len());
    for u in taken {
        let retry = u.queue.args().retry.filter(|r| r.applies(failed));
        let store = retry.and_then(|r| Some((r, vhost.retry_store(u.queue.name())?)));
        let Some((retry, store)) = store else {
            rest.push(u);
            continue;
        };
        let (msg, attempt) = crate::delayed::next_attempt(&u.msg.msg);
        let q = u.queue.clone();
        let settled = (u.consumer.map(|c| c.key), u.msg);
        let done = crate::confirm::ConfirmHandle::then(move |ok| {
            if ok {
                q.settle(std::iter::once(settled), true)
            } else {
                q.requeue(std::iter::once(settled))
            }
        });
        if !store.hold(msg, retry.delay_ms(attempt), Some(&done)) {
            done.done(true);
        }
    }
    rest
}

fn unknown_tag(tag: u64) -> AmqpError {
    AmqpError::precondition_failed(format!("unknown delivery tag {tag}"))
}

/// Settles, requeues or discards taken deliveries, one queue lock per run of the same queue.
fn finish(taken: Vec<Unacked>, how: Settle) {
    finish_with(taken, how, true)
}

/// [`finish`]; `dispatch` false leaves the settled queues undispatched (a requeue always
/// dispatches: its messages may go to any consumer of the queue).
fn finish_with(taken: Vec<Unacked>, how: Settle, dispatch: bool) {
    let mut taken = taken.into_iter().peekable();
    while let Some(first) = taken.next() {
        let q = first.queue.clone();
        let rest = std::iter::from_fn(|| taken.next_if(|u| u.queue.ptr_eq(&q)));
        // Each names the consumer it went to, whose credit the queue gives back.
        let msgs = std::iter::once(first)
            .chain(rest)
            .map(|u| (u.consumer.map(|c| c.key), u.msg));
        match how {
            Settle::Ack => q.settle(msgs, dispatch),
            Settle::Requeue => q.requeue(msgs),
            Settle::Discard => q.discard(msgs, dispatch),
        }
    }
}

/// What an ack, nack or reject does with the deliveries it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack,
    Requeue,
    /// Rejected without requeue: dropped or dead-lettered.
    Discard,
}

impl Settle {
    fn of(ack: bool, requeue: bool) -> Settle {
        match (ack, requeue) {
            (true, _) => Settle::Ack,
            (false, true) => Settle::Requeue,
            (false, false) => Settle::Discard,
        }
    }
}

enum PublishState {
    Idle,
    AwaitingHeader(BasicPublish),
    AwaitingBody {
        publish: BasicPublish,
        header: ContentHeader,
        body: BytesMut,
    },
}

/// Work a transaction holds until commit.
enum TxOp {
    /// The message, mandatory, and its CC/BCC routing keys.
    Publish(Message, bool, Vec<ByteString>),
    Settle(Vec<Unacked>, Settle),
}

/// What the connection gives a channel to act with.
pub struct Ctx<'a> {
    pub conn_id: u64,
    pub user: &'a str,
    /// The user holds the `impersonator` tag (at login, as RabbitMQ): any `user_id` is accepted.
    pub impersonator: bool,
    pub vhost: &'a Arc<VHost>,
    pub access: &'a Access,
    pub message_size_max_bytes: u64,
    /// Exclusive queues declared on this connection, deleted when it closes.
    pub exclusive_queues: &'a mut Vec<QueueRef>,
}

pub struct Channel {
    pub shared: Arc<ChannelShared>,
    publish: PublishState,
    consumers: HashMap<ByteString, Arc<Consumer>>,
    /// basic.qos global=false: the prefetch given to consumers created afterwards.
    consumer_prefetch: u16,
    /// The last queue declared on this channel, which an empty queue name refers to.
    last_queue: Option<ByteString>,
    confirm: bool,
    next_publish_seq: u64,
    /// Confirm bookkeeping, shared with durable queues that confirm after their fsync.
    confirms: Arc<Confirms>,
    tx: Option<Vec<TxOp>>,
    route_buf: Vec<QueueRef>,
    /// The name of this channel's direct reply-to pseudo-queue, once it consumes from it.
    direct_reply: Option<Arc<str>>,
    /// Queues this read batch published into that asked publishers to slow down.
    pub pressured: Vec<QueueRef>,
    /// Permission decisions already granted, so publishing does no regex work.
    perms: PermCache,
    /// This channel's place in its user's channel count (max-channels), given back on drop.
    pub place: Option<crate::admission::ChannelPlace>,
    /// The broker's `consumer_timeout` (ms, 0 = none), for deliveries whose consumer and queue
    /// set none.
    pub default_consumer_timeout: u64,
}

impl Channel {
    /// Whether a consumer lives on this channel (its connection must keep reading acks).
    pub fn has_consumers(&self) -> bool {
        !self.consumers.is_empty()
    }

    pub fn new(id: u16, outbox: Arc<Outbox>) -> Channel {
        let shared = ChannelShared::new(id, outbox.clone());
        Channel {
            confirms: Confirms::new(id, outbox, shared.stats.clone()),
            shared,
            publish: PublishState::Idle,
            consumers: HashMap::new(),
            consumer_prefetch: 0,
            last_queue: None,
            confirm: false,
            next_publish_seq: 1,
            tx: None,
            route_buf: Vec::new(),
            direct_reply: None,
            pressured: Vec::new(),
            perms: PermCache::default(),
            place: None,
            default_consumer_timeout: crate::limits::CONSUMER_TIMEOUT_MS,
        }
    }

    fn id(&self) -> u16 {
        self.shared.id
    }

    /// 403 unless the user holds `perm` on the named resource (where RabbitMQ checks it).
    fn allow(&mut self, ctx: &Ctx<'_>, perm: Perm, kind: Resource, name: &str) -> AmqpResult<()> {
        self.perms
            .check(ctx.access, ctx.user, &ctx.vhost.name, perm, kind, name)
    }

    fn reply(&self, m: impl Into<Method>) {
        self.shared.outbox.method(self.id(), &m.into());
    }

    /// An empty queue name means the last queue declared on this channel.
    fn queue_name(&self, name: &ByteString) -> AmqpResult<ByteString> {
        if !name.is_empty() {
            return Ok(name.clone());
        }
        self.last_queue
            .clone()
            .ok_or_else(|| AmqpError::not_found("no previously declared queue"))
    }

    /// queue.bind/unbind with an empty queue name and an empty routing key bind the last
    /// declared queue with its name as the key (RabbitMQ's `expand_routing_key_shortcut`).
    fn binding_key(&self, queue: &ByteString, key: &ByteString) -> AmqpResult<ByteString> {
        if queue.is_empty() && key.is_empty() {
            self.queue_name(queue)
        } else {
            Ok(key.clone())
        }
    }

    /// While a publish is being assembled: what the next frame must be.
    pub fn expecting_content(&self) -> Option<&'static str> {
        match self.publish {
            PublishState::Idle => None,
            PublishState::AwaitingHeader(_) => Some("content header for class 60"),
            PublishState::AwaitingBody { .. } => Some("content body"),
        }
    }

    pub fn handle_method(&mut self, m: Method, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let (class_id, method_id) = (m.class_id(), m.method_id());
        self.dispatch(m, ctx).map_err(|e| e.on(class_id, method_id))
    }

    fn dispatch(&mut self, m: Method, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        match m {
            Method::BasicPublish(p) => {
                if p.immediate {
                    return Err(AmqpError::not_implemented("immediate=true"));
                }
                self.publish = PublishState::AwaitingHeader(p);
            }
            Method::BasicAck(a) => self.settle(a.delivery_tag, a.multiple, false, true, None)?,
            Method::BasicNack(n) => {
                let retry = Some((ctx.vhost, false));
                self.settle(n.delivery_tag, n.multiple, n.requeue, false, retry)?
            }
            Method::BasicReject(r) => {
                let retry = Some((ctx.vhost, true));
                self.settle(r.delivery_tag, false, r.requeue, false, retry)?
            }
            Method::BasicQos(q) => {
                if q.prefetch_size != 0 {
                    return Err(AmqpError::not_implemented(format!(
                        "prefetch_size!=0 ({})",
                        q.prefetch_size
                    )));
                }
                if q.global {
                    self.shared.deliveries.lock().global_prefetch = q.prefetch_count;
                    self.kick_consumers();
                } else {
                    self.consumer_prefetch = q.prefetch_count;
                    self.shared
                        .modes
                        .prefetch_count
                        .store(q.prefetch_count, Ordering::Relaxed);
                }
                self.reply(BasicQosOk {});
            }
            Method::BasicConsume(c) => self.consume(c, ctx)?,
            Method::BasicCancel(c) => {
                if let Some(consumer) = self.consumers.remove(&c.consumer_tag) {
                    remove_consumer(vhost, &consumer);
                    // The reply consumer's pseudo-queue goes with it: consuming again makes a
                    // new one, and replies to the old name are dropped, as in RabbitMQ.
                    if self
                        .direct_reply
                        .as_ref()
                        .is_some_and(|q| **q == **consumer.queue.name())
                    {
                        if let Some(q) = self.direct_reply.take() {
                            vhost.drop_direct_reply_queue(&q);
                        }
                    }
                }
                if !c.nowait {
                    self.reply(BasicCancelOk {
                        consumer_tag: c.consumer_tag,
                    });
                }
            }
            Method::BasicGet(g) => {
                let name = self.queue_name(&g.queue)?;
                self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
                let q = vhost.queue_for(&name, ctx.conn_id)?.resolved()?;
                let shared = &self.shared;
                let got = q.get(!g.no_ack, |m, remaining| {
                    shared.deliver_get(&q, m, remaining, g.no_ack)
                })?;
                if !got {
                    bump(&self.shared.stats.get_empty, 1);
                    self.reply(BasicGetEmpty {
                        reserved_1: "".into(),
                    });
                }
            }
            Method::BasicRecover(r) => {
                self.recover(r.requeue)?;
                self.reply(BasicRecoverOk {});
            }
            Method::BasicRecoverAsync(r) => self.recover(r.requeue)?,
            Method::ExchangeDeclare(x) => {
                let xname = strip_cr_lf(&x.exchange);
                if !x.passive && !xname.is_empty() {
                    self.allow(ctx, Perm::Configure, Resource::Exchange, &xname)?;
                    if let Some(ae) = x
                        .arguments
                        .get("alternate-exchange")
                        .and_then(|v| v.as_str())
                    {
                        self.allow(ctx, Perm::Read, Resource::Exchange, &xname)?;
                        self.allow(ctx, Perm::Write, Resource::Exchange, ae)?;
                    }
                }
                vhost.declare_exchange(&ExchangeSpec {
                    name: &xname,
                    kind: &x.kind,
                    passive: x.passive,
                    durable: x.durable,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: &x.arguments,
                })?;
                if !x.nowait {
                    self.reply(ExchangeDeclareOk {});
                }
            }
            Method::ExchangeDelete(x) => {
                let xname = strip_cr_lf(&x.exchange);
                if !xname.is_empty() && !xname.starts_with("amq.") {
                    self.allow(ctx, Perm::Configure, Resource::Exchange, &xname)?;
                }
                vhost.delete_exchange(&xname, x.if_unused)?;
                if !x.nowait {
                    self.reply(ExchangeDeleteOk {});
                }
            }
            Method::ExchangeBind(b) => {
                let (dest, source) = (strip_cr_lf(&b.destination), strip_cr_lf(&b.source));
                self.allow(ctx, Perm::Write, Resource::Exchange, &dest)?;
                self.allow(ctx, Perm::Read, Resource::Exchange, &source)?;
                vhost.bind_exchange(&dest, &source, &b.routing_key, &b.arguments, true)?;
                if !b.nowait {
                    self.reply(ExchangeBindOk {});
                }
            }
            Method::ExchangeUnbind(b) => {
                let (dest, source) = (strip_cr_lf(&b.destination), strip_cr_lf(&b.source));
                self.allow(ctx, Perm::Write, Resource::Exchange, &dest)?;
                self.allow(ctx, Perm::Read, Resource::Exchange, &source)?;
                vhost.bind_exchange(&dest, &source, &b.routing_key, &b.arguments, false)?;
                if !b.nowait {
                    self.reply(ExchangeUnbindOk {});
                }
            }
            // RabbitMQ answers any declare of the direct reply-to pseudo-queue, passive or not,
            // whatever its flags and arguments, with declare-ok: 0 messages, 1 consumer; the
            // same for a requester's encoded name (`amq.rabbitmq.reply-to.<token>`, as its
            // replies' reply_to reads) while that requester consumes, else 404.
            Method::QueueDeclare(d) if d.queue.starts_with(DIRECT_REPLY_TO) => {
                let name = strip_cr_lf(&d.queue);
                if &*name != DIRECT_REPLY_TO && !vhost.direct_reply_exists(&name) {
                    return Err(vhost.no_queue(&name));
                }
                self.last_queue = Some(name.clone());
                if !d.nowait {
                    self.reply(QueueDeclareOk {
                        queue: name,
                        message_count: 0,
                        consumer_count: 1,
                    });
                }
            }
            Method::QueueDeclare(d) => {
                let name = strip_cr_lf(&d.queue);
                let server_named = name.is_empty() && !d.passive;
                let name = if server_named {
                    ByteString::from(gen_name("amq.gen-"))
                } else {
                    name
                };
                // A client-chosen 'amq.' name gets the reserved-prefix refusal from the vhost.
                if !d.passive && (server_named || !name.starts_with("amq.")) {
                    self.allow(ctx, Perm::Configure, Resource::Queue, &name)?;
                    if let Some(dlx) = d
                        .arguments
                        .get("x-dead-letter-exchange")
                        .and_then(|v| v.as_str())
                    {
                        self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
                        self.allow(ctx, Perm::Write, Resource::Exchange, dlx)?;
                    }
                }
                let q = vhost.declare_queue(&QueueSpec {
                    name: &name,
                    passive: d.passive,
                    durable: d.durable,
                    exclusive: d.exclusive,
                    auto_delete: d.auto_delete,
                    arguments: &d.arguments,
                    conn_id: ctx.conn_id,
                    server_named,
                    home: None,
                    members: None,
                })?;
                if !d.passive {
                    crate::policy::apply(ctx.access, &q);
                }
                if q.options().exclusive_owner == Some(ctx.conn_id)
                    && !ctx.exclusive_queues.iter().any(|x| x.ptr_eq(&q))
                {
                    ctx.exclusive_queues.push(q.clone());
                }
                self.last_queue = Some(name.clone());
                if !d.nowait {
                    self.reply(QueueDeclareOk {
                        queue: name,
                        message_count: q.message_count(),
                        consumer_count: q.consumer_count(),
                    });
                }
            }
            Method::QueueBind(b) => {
                let name = strip_cr_lf(&self.queue_name(&b.queue)?);
                let exchange = strip_cr_lf(&b.exchange);
                let key = self.binding_key(&b.queue, &b.routing_key)?;
                self.allow(ctx, Perm::Write, Resource::Queue, &name)?;
                self.allow(ctx, Perm::Read, Resource::Exchange, &exchange)?;
                // RabbitMQ's order: default exchange (403), source (404), queue (404), binding
                // arguments (406), then another connection's exclusive queue (405).
                vhost.bind_queue(
                    &name,
                    &exchange,
                    &key,
                    &b.arguments,
                    true,
                    Some(ctx.conn_id),
                )?;
                if !b.nowait {
                    self.reply(QueueBindOk {});
                }
            }
            Method::QueueUnbind(b) => {
                let name = strip_cr_lf(&self.queue_name(&b.queue)?);
                let exchange = strip_cr_lf(&b.exchange);
                let key = self.binding_key(&b.queue, &b.routing_key)?;
                self.allow(ctx, Perm::Write, Resource::Queue, &name)?;
                self.allow(ctx, Perm::Read, Resource::Exchange, &exchange)?;
                if vhost.queue(&name).is_some() {
                    vhost.queue_for(&name, ctx.conn_id)?;
                }
                vhost.bind_queue(&name, &exchange, &key, &b.arguments, false, None)?;
                self.reply(QueueUnbindOk {});
            }
            Method::QueuePurge(p) => {
                let name = self.queue_name(&p.queue)?;
                self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
                let q = vhost.queue_for(&name, ctx.conn_id)?;
                if q.stream().is_some() {
                    return Err(AmqpError::not_implemented(format!(
                        "queue.purge not supported by stream queues {}",
                        q.describe()
                    )));
                }
                let n = q.purge();
                if !p.nowait {
                    self.reply(QueuePurgeOk { message_count: n });
                }
            }
            Method::QueueDelete(d) => {
                let name = strip_cr_lf(&self.queue_name(&d.queue)?);
                self.allow(ctx, Perm::Configure, Resource::Queue, &name)?;
                let deleted =
                    vhost.delete_queue(&name, d.if_unused, d.if_empty, Some(ctx.conn_id))?;
                notify_cancelled(&deleted.consumers);
                ctx.exclusive_queues.retain(|q| **q.name() != *name);
                if !d.nowait {
                    self.reply(QueueDeleteOk {
                        message_count: deleted.message_count,
                    });
                }
            }
            Method::ConfirmSelect(c) => {
                if self.tx.is_some() {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                self.confirm = true;
                self.shared.modes.confirm.store(true, Ordering::Relaxed);
                if !c.nowait {
                    self.reply(ConfirmSelectOk {});
                }
            }
            Method::TxSelect(_) => {
                if self.confirm {
                    return Err(AmqpError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                if self.tx.is_none() {
                    self.tx = Some(Vec::new());
                }
                self.shared
                    .modes
                    .transactional
                    .store(true, Ordering::Relaxed);
                self.reply(TxSelectOk {});
            }
            Method::TxCommit(_) => {
                let ops = self.tx.as_mut().ok_or_else(|| {
                    AmqpError::precondition_failed("channel is not transactional")
                })?;
                let ops = std::mem::take(ops);
                let capped = self.shared.capped();
                let mut settled = false;
                for op in ops {
                    match op {
                        TxOp::Publish(msg, mandatory, cc) => {
                            self.route(msg, &cc, mandatory, vhost)?
                        }
                        TxOp::Settle(taken, how) => {
                            settled = true;
                            finish_with(taken, how, !capped);
                        }
                    }
                }
                // As for an ack outside a transaction: the room opened is the channel's.
                if capped && settled {
                    self.kick_consumers();
                }
                self.reply(TxCommitOk {});
            }
            Method::TxRollback(_) => {
                let ops = self.tx.as_mut().ok_or_else(|| {
                    AmqpError::precondition_failed("channel is not transactional")
                })?;
                for op in std::mem::take(ops).into_iter().rev() {
                    if let TxOp::Settle(taken, _) = op {
                        self.shared.untake(taken);
                    }
                }
                self.reply(TxRollbackOk {});
            }
            Method::ChannelFlow(f) => {
                if !f.active {
                    return Err(AmqpError::not_implemented("active=false"));
                }
                self.reply(ChannelFlowOk { active: true });
            }
            Method::ChannelFlowOk(_) => {}
            other => {
                return Err(AmqpError::command_invalid(format!(
                    "unexpected method {} on a channel",
                    other.name()
                )));
            }
        }
        Ok(())
    }

    fn consume(&mut self, c: BasicConsume, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let q = if &*c.queue == DIRECT_REPLY_TO {
            if !c.no_ack {
                return Err(AmqpError::precondition_failed(
                    "reply consumer cannot acknowledge",
                ));
            }
            if self.direct_reply.is_some() {
                return Err(AmqpError::precondition_failed("reply consumer already set"));
            }
            let q = ctx.vhost.new_direct_reply_queue();
            self.direct_reply = Some(q.name().clone());
            q
        } else {
            let name = self.queue_name(&c.queue)?;
            self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
            // A replicated queue's consumer belongs to its leader's leg: cancelled with it.
            ctx.vhost.queue_for(&name, ctx.conn_id)?.resolved()?
        };
        let tag = if c.consumer_tag.is_empty() {
            ByteString::from(gen_name("amq.ctag-"))
        } else {
            c.consumer_tag.clone()
        };
        if self
            .consumers
            .get(&tag)
            .is_some_and(|x| !x.cancelled.load(Ordering::Relaxed))
        {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        let priority = match c.arguments.get("x-priority") {
            None => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                AmqpError::precondition_failed(format!(
                    "invalid arg 'x-priority' for consumer '{tag}': \"expected integer, got {}\"",
                    crate::queue::type_name(v)
                ))
            })?,
        };
        let timeout_ms = match c.arguments.get("x-consumer-timeout") {
            None => None,
            Some(v) => match v.as_i64() {
                Some(n) if n >= 0 => Some(n as u64).filter(|&n| n > 0),
                Some(n) => {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid arg 'x-consumer-timeout' for consumer '{tag}': {{value_negative,{n}}}"
                    )))
                }
                None => {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid arg 'x-consumer-timeout' for consumer '{tag}': \"expected integer, got {}\"",
                        crate::queue::type_name(v)
                    )))
                }
            },
        };
        let consumer = Arc::new(Consumer {
            key: crate::queue::consumer_key(),
            tag: tag.clone(),
            sink: self.shared.clone(),
            queue: q.clone(),
            no_ack: c.no_ack,
            exclusive: c.exclusive,
            priority,
            prefetch: self.consumer_prefetch,
            cancelled: AtomicBool::new(false),
            timeout_ms,
        });
        let (outbox, id, nowait) = (&self.shared.outbox, self.id(), c.nowait);
        let consume_ok = || {
            if !nowait {
                outbox.method(
                    id,
                    &Method::BasicConsumeOk(BasicConsumeOk {
                        consumer_tag: tag.clone(),
                    }),
                );
            }
        };
        match q.stream() {
            Some(s) => {
                let start = crate::queue::stream::parse_start(c.arguments.get("x-stream-offset"))?;
                s.add_consumer(consumer.clone(), start, consume_ok)?
            }
            None => q.add_consumer(consumer.clone(), consume_ok)?,
        }
        self.consumers.insert(tag, consumer);
        Ok(())
    }

    /// basic.ack/nack/reject. `retry`: for a nack or reject (`true`), the vhost whose retry
    /// stores take requeued messages of queues with `x-delayed-retry-*`.
    fn settle(
        &mut self,
        tag: u64,
        multiple: bool,
        requeue: bool,
        ack: bool,
        retry: Option<(&Arc<VHost>, bool)>,
    ) -> AmqpResult<()> {
        let mut taken = self.shared.take(tag, multiple)?;
        let how = Settle::of(ack, requeue);
        if how != Settle::Ack {
            // RabbitMQ 3.10 closes the connection; what was taken goes back as credit.
            if let Some(u) = taken.iter().find(|u| u.queue.stream().is_some()) {
                let e = AmqpError::not_implemented(format!(
                    "basic.nack and basic.reject not supported by stream queues {}",
                    u.queue.describe()
                ));
                finish(taken, Settle::Ack);
                return Err(e);
            }
        }
        if let (Settle::Requeue, None, Some((vhost, failed))) = (how, &self.tx, retry) {
            if taken.iter().any(|u| u.queue.args().retry.is_some()) {
                taken = retry_later(taken, vhost, failed);
            }
        }
        if how == Settle::Ack {
            bump(&self.shared.stats.ack, taken.len() as u64);
        }
        if let Some(ops) = &mut self.tx {
            ops.push(TxOp::Settle(taken, how));
            return Ok(());
        }
        // Under a channel-wide limit the room an ack opens is the channel's: the settled
        // queue dispatching first would take it every time and starve the channel's others.
        let capped = self.shared.capped();
        finish_with(taken, how, !capped);
        if capped {
            self.kick_consumers();
        }
        Ok(())
    }

    fn recover(&mut self, requeue: bool) -> AmqpResult<()> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        let taken = self.shared.take(0, true)?;
        finish(taken, Settle::Requeue);
        // The channel-wide count dropped: queues with nothing to requeue may deliver again.
        if self.shared.capped() {
            self.kick_consumers();
        }
        Ok(())
    }

    /// Lets every queue this channel consumes from try again (after prefetch space opened),
    /// each once, starting from a random one as RabbitMQ's limiter resumes blocked queues:
    /// under a channel-wide limit the first queue dispatched takes the room, so a fixed order
    /// would serve the same queue every time.
    fn kick_consumers(&self) {
        use rand::Rng;
        let mut queues: Vec<&QueueRef> = Vec::with_capacity(self.consumers.len());
        for c in self.consumers.values() {
            if !queues.iter().any(|q| q.ptr_eq(&c.queue)) {
                queues.push(&c.queue);
            }
        }
        if queues.len() > 1 {
            let start = rand::thread_rng().gen_range(0..queues.len());
            queues.rotate_left(start);
        }
        for q in queues {
            q.dispatch();
        }
    }

    /// The 505 for a content frame of kind `got` arriving where something else was due.
    pub fn out_of_order(&self, got: &str) -> Option<AmqpError> {
        // Hot path (every header and body frame): compare states, build text only on error.
        let expected = match self.publish {
            PublishState::Idle => "method",
            PublishState::AwaitingHeader(_) => "content header",
            PublishState::AwaitingBody { .. } => "content body",
        };
        if expected == got {
            return None;
        }
        let want = self.expecting_content().unwrap_or("method frame");
        let short = want
            .split(" for")
            .next()
            .unwrap_or(want)
            .trim_end_matches(" frame");
        if short == got {
            return None;
        }
        let e =
            AmqpError::unexpected_frame(format!("expected {want}, got non {short} frame instead"));
        Some(if short == "method" || got == "method" {
            e
        } else {
            e.on(60, 40)
        })
    }

    /// A content header frame arrived.
    pub fn handle_header(
        &mut self,
        payload: &Bytes,
        max_size: u64,
    ) -> AmqpResult<Option<(BasicPublish, ContentHeader, Bytes)>> {
        if let Some(e) = self.out_of_order("content header") {
            return Err(e);
        }
        let PublishState::AwaitingHeader(publish) =
            std::mem::replace(&mut self.publish, PublishState::Idle)
        else {
            return Err(AmqpError::internal_error("publish state"));
        };
        let header = ContentHeader::decode(payload).map_err(|e| {
            AmqpError::frame_error(format!("cannot decode content header: {e}")).on(60, 40)
        })?;
        if header.class_id != 60 {
            return Err(AmqpError::unexpected_frame(format!(
                "expected content header for class 60, got one for class {} instead",
                header.class_id
            ))
            .on(60, 40));
        }
        if header.body_size > max_size {
            return Err(AmqpError::precondition_failed(format!(
                "message size {} is larger than configured max size {}",
                header.body_size, max_size
            ))
            .on(60, 40));
        }
        if header.body_size == 0 {
            return Ok(Some((publish, header, Bytes::new())));
        }
        self.publish = PublishState::AwaitingBody {
            publish,
            header,
            body: BytesMut::new(),
        };
        Ok(None)
    }

    /// A body frame arrived; returns the whole message once complete.
    pub fn handle_body(
        &mut self,
        payload: Bytes,
    ) -> AmqpResult<Option<(BasicPublish, ContentHeader, Bytes)>> {
        if let Some(e) = self.out_of_order("content body") {
            return Err(e);
        }
        let PublishState::AwaitingBody { header, body, .. } = &mut self.publish else {
            return Err(AmqpError::internal_error("publish state"));
        };
        let have = body.len() as u64 + payload.len() as u64;
        if have > header.body_size {
            return Err(AmqpError::frame_error(format!(
                "body larger than the {} bytes its header declared",
                header.body_size
            ))
            .on(60, 40));
        }
        if have < header.body_size {
            body.extend_from_slice(&payload);
            return Ok(None);
        }
        let PublishState::AwaitingBody {
            publish,
            header,
            body,
        } = std::mem::replace(&mut self.publish, PublishState::Idle)
        else {
            return Ok(None);
        };
        // A body in one frame stays a zero-copy slice of the read buffer.
        let whole = if body.is_empty() {
            payload
        } else {
            let mut body = body;
            body.extend_from_slice(&payload);
            body.freeze()
        };
        Ok(Some((publish, header, whole)))
    }

    /// A whole message was received: check it, route it, confirm it.
    pub fn publish(
        &mut self,
        publish: BasicPublish,
        header: ContentHeader,
        body: Bytes,
        ctx: &Ctx<'_>,
    ) -> AmqpResult<()> {
        // Not an exchange: a lease extension for this channel's own deliveries.
        if &*publish.exchange == LEASE_EXCHANGE {
            self.extend_lease(&publish.routing_key, &body);
            return Ok(());
        }
        let mut raw = header.raw_properties;
        // user-id (flag bit 4) and reply-to (bit 9): decode the properties only when set.
        if raw.len() >= 2 && (raw[1] & 0x10 != 0 || raw[0] & 0x02 != 0) {
            let mut props = BasicProperties::decode(&raw).map_err(|e| {
                AmqpError::frame_error(format!("cannot decode properties: {e}")).on(60, 40)
            })?;
            if let Some(u) = &props.user_id {
                if &**u != ctx.user && !ctx.impersonator {
                    return Err(AmqpError::precondition_failed(format!(
                        "user_id property set to '{u}' but authenticated user was '{}'",
                        ctx.user
                    ))
                    .on(60, 40));
                }
            }
            if props.reply_to.as_deref() == Some(DIRECT_REPLY_TO) {
                let Some(q) = &self.direct_reply else {
                    return Err(AmqpError::precondition_failed(
                        "fast reply consumer does not exist",
                    )
                    .on(60, 40));
                };
                props.reply_to = Some(ByteString::from(&**q));
                raw = props.to_bytes();
            }
        }
        let persistent = properties::delivery_mode(&raw) == Some(2);
        // priority (flag bit 11) and expiration (bit 8): decode only when present.
        let (mut priority, mut expiration_ms) = (None, None);
        if raw.len() >= 2 && raw[0] & 0x09 != 0 {
            let props = BasicProperties::decode(&raw).map_err(|e| {
                AmqpError::frame_error(format!("cannot decode properties: {e}")).on(60, 40)
            })?;
            priority = props.priority;
            if let Some(e) = props.expiration {
                expiration_ms = Some(parse_expiration(&e).map_err(|e| e.on(60, 40))?);
            }
        }
        self.allow(
            ctx,
            Perm::Write,
            Resource::Exchange,
            exchange_resource(&publish.exchange),
        )
        .map_err(|e| e.on(60, 40))?;
        // CC and BCC headers (sender-selected distribution): decoded only when the headers
        // hold either key's bytes, so other publishes pay one scan of their headers at most.
        let mut cc = Vec::new();
        // headers (flag bit 13) tested here first: the common publish pays one branch.
        if raw.len() >= 2
            && raw[0] & 0x20 != 0
            && (properties::may_have_header(&raw, "CC") || properties::may_have_header(&raw, "BCC"))
        {
            let mut props = BasicProperties::decode(&raw).map_err(|e| {
                AmqpError::frame_error(format!("cannot decode properties: {e}")).on(60, 40)
            })?;
            if let Some(h) = props.headers.as_mut() {
                cc = match header_routes(h) {
                    Ok(keys) => keys,
                    Err(e) => {
                        // RabbitMQ looks the exchange up first: a missing one is the 404.
                        ctx.vhost
                            .route(&publish.exchange, "", &Bytes::new(), &mut Vec::new())
                            .map_err(|e| e.on(60, 40))?;
                        return Err(e.on(60, 40));
                    }
                };
                let n = h.0.len();
                h.0.retain(|(k, _)| &**k != "BCC");
                if h.0.len() != n {
                    raw = props.to_bytes();
                }
            }
        }
        let msg = Message {
            exchange: publish.exchange,
            routing_key: publish.routing_key,
            properties: raw,
            body,
            persistent,
            priority,
            expiration_ms,
        };
        if let Some(ops) = &mut self.tx {
            ctx.vhost
                .route(&msg.exchange, "", &Bytes::new(), &mut Vec::new())?;
            ops.push(TxOp::Publish(msg, publish.mandatory, cc));
            return Ok(());
        }
        self.route(msg, &cc, publish.mandatory, ctx.vhost)
            .map_err(|e| e.on(60, 40))
    }

    fn route(
        &mut self,
        msg: Message,
        cc: &[ByteString],
        mandatory: bool,
        vhost: &Arc<VHost>,
    ) -> AmqpResult<()> {
        let mut targets = std::mem::take(&mut self.route_buf);
        targets.clear();
        bump(&self.shared.stats.publish, 1);
        let routed = vhost.route_keys(
            &msg.exchange,
            &msg.routing_key,
            cc,
            &msg.properties,
            &mut targets,
        );
        let delay = match routed {
            Ok(d) => d,
            Err(e) => {
                self.route_buf = targets;
                return Err(e);
            }
        };
        let seq = if self.confirm {
            self.next_publish_seq += 1;
            Some(self.next_publish_seq - 1)
        } else {
            None
        };
        // Held by a delayed exchange, unless mandatory and unroutable now: then returned below
        // like any other (the plugin returns every mandatory one; routing happens when due).
        if let Some(delay) = delay {
            if !(mandatory && unroutable_now(vhost, &msg, &mut targets)) {
                self.hold_delayed(msg, delay, seq, vhost, targets);
                return Ok(());
            }
        }
        if targets.is_empty() {
            let st = &self.shared.stats;
            bump(
                if mandatory {
                    &st.return_unroutable
                } else {
                    &st.drop_unroutable
                },
                1,
            );
        }
        if targets.is_empty() && mandatory {
            let frame_max = self.shared.outbox.frame_max.load(Ordering::Relaxed);
            let ret = Method::BasicReturn(BasicReturn {
                reply_code: reply::NO_ROUTE,
                reply_text: "NO_ROUTE".into(),
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            });
            let id = self.id();
            self.shared.outbox.push(|b| {
                frame::write_method(b, id, &ret);
                outbox::write_content(b, id, frame_max, &msg);
            });
        }
        if !targets.is_empty() {
            let msg = Arc::new(msg);
            // Durable queues that store it each owe the confirm a write; the last wait is ours,
            // released once every queue has answered.
            let stores = targets.iter().filter(|q| q.stores(&msg)).count();
            let handle = match seq {
                Some(seq) if stores > 0 => Some(self.confirms.pending(seq, stores + 1)),
                _ => None,
            };
            let mut accepted = true;
            for q in targets.drain(..) {
                let storing = q.stores(&msg);
                let r = q.publish(msg.clone(), if storing { handle.as_ref() } else { None });
                if q.pressured() && !self.pressured.iter().any(|x| x.ptr_eq(&q)) {
                    self.pressured.push(q.clone());
                }
                accepted &= r != Enqueued::Rejected;
                if storing && r != Enqueued::Accepted {
                    if let Some(h) = &handle {
                        h.done(r == Enqueued::Gone);
                    }
                }
            }
            match (&handle, seq) {
                (Some(h), _) => {
                    h.done(accepted);
                }
                (None, Some(seq)) => self.confirms.settled(seq, accepted),
                (None, None) => {}
            }
        } else if let Some(seq) = seq {
            self.confirms.settled(seq, true);
        }
        self.route_buf = targets;
        Ok(())
    }

    /// A publish to a delayed exchange with a positive `x-delay`: held by the exchange's store.
    /// Out of line: the common publish does not pay for it.
    #[cold]
    #[inline(never)]
    fn hold_delayed(
        &mut self,
        msg: Message,
        delay: u64,
        seq: Option<u64>,
        vhost: &Arc<VHost>,
        targets: Vec<QueueRef>,
    ) {
        self.route_buf = targets;
        let handle = seq.map(|s| self.confirms.pending(s, 1));
        let took = vhost
            .delay_store(&msg.exchange)
            .map(|store| store.hold(msg, delay, handle.as_ref()));
        if let Some(h) = handle {
            match took {
                Some(true) => {}
                // Held without a write to wait for.
                Some(false) => {
                    h.done(true);
                }
                // The store could not be opened: the publisher gets a nack.
                None => {
                    h.done(false);
                }
            }
        }
    }

    /// Sends the confirms that are ready, merging runs into `multiple` acks.
    pub fn flush_confirms(&mut self) {
        self.confirms.flush();
    }

    /// Releases everything the channel holds: unacked messages go back to their queues,
    /// consumers are removed (auto-delete queues may go).
    pub fn close(&mut self, vhost: &Arc<VHost>) {
        let mut taken = {
            let mut d = self.shared.deliveries.lock();
            if !d.closed {
                // Its counts stay in the vhost's totals once it is gone.
                vhost.retired.absorb(&self.shared.stats);
                vhost.churn.channel_closed.fetch_add(1, Ordering::Relaxed);
            }
            d.closed = true;
            d.unacked.drain(..).collect::<Vec<_>>()
        };
        // Acks, nacks and rejects of an uncommitted transaction are discarded, as in RabbitMQ:
        // those deliveries go back to their queues with the rest.
        for op in self.tx.take().into_iter().flatten() {
            if let TxOp::Settle(held, _) = op {
                taken.extend(held);
            }
        }
        for c in self.consumers.values() {
            c.cancelled.store(true, Ordering::Relaxed);
        }
        for (_, c) in self.consumers.drain() {
            remove_consumer(vhost, &c);
        }
        if let Some(q) = self.direct_reply.take() {
            vhost.drop_direct_reply_queue(&q);
        }
        finish(taken, Settle::Requeue);
        self.publish = PublishState::Idle;
        self.tx = None;
    }
}

/// The consumer timeout (docs/consumer-timeout.md), kept apart from the message path.
impl Channel {
    /// Whether the connection's timer must keep checking this channel: a manual-ack consumer,
    /// or deliveries awaiting ack.
    pub fn awaits_acks(&self) -> bool {
        self.consumers.values().any(|c| !c.no_ack)
            || !self.shared.deliveries.lock().unacked.is_empty()
    }

    /// Takes back deliveries unacked past their timeout, `now` being [`timeout::now_ms`]. With
    /// `cancel_notify` each timed-out consumer is cancelled (basic.cancel) and all of its unacked
    /// deliveries requeued; the channel stays open. Without it the channel must be closed: the
    /// error to close it with is returned (closing requeues everything). Timed-out basic.get
    /// deliveries are requeued either way. Returns the earliest deadline still ahead.
    pub fn expire_deliveries(
        &mut self,
        now: u64,
        cancel_notify: bool,
        conn: u64,
        vhost: &Arc<VHost>,
    ) -> AmqpResult<Option<u64>> {
        let global = self.default_consumer_timeout;
        let mut next: Option<u64> = None;
        // Timed-out consumers with their timeout; timed-out basic.get deliveries by tag.
        let mut expired: Vec<(Arc<Consumer>, u64, bool)> = Vec::new();
        let mut gets: Vec<u64> = Vec::new();
        let taken: Vec<Unacked> = {
            let mut d = self.shared.deliveries.lock();
            if d.unacked.is_empty() {
                return Ok(None);
            }
            // A consumer's timeout is resolved once per check, not per delivery.
            let mut timeouts: ahash::AHashMap<u64, Option<u64>> = ahash::AHashMap::new();
            for u in &d.unacked {
                let t = match &u.consumer {
                    Some(c) => *timeouts.entry(c.key).or_insert_with(|| {
                        timeout::effective(c.timeout_ms, c.queue.args().consumer_timeout_ms, global)
                    }),
                    None => timeout::effective(None, u.queue.args().consumer_timeout_ms, global),
                };
                let Some(t) = t else { continue };
                let deadline = u.stamp.saturating_add(t);
                if now < deadline {
                    next = Some(next.map_or(deadline, |n| n.min(deadline)));
                    continue;
                }
                match &u.consumer {
                    Some(c) if !expired.iter().any(|(x, ..)| x.key == c.key) => {
                        expired.push((c.clone(), t, false))
                    }
                    Some(_) => {}
                    None => gets.push(u.tag),
                }
            }
            if !cancel_notify {
                if let Some((c, t, _)) = expired.first() {
                    tracing::info!(conn, channel = self.id(), vhost = %vhost.name, queue = %c.queue.name(), consumer_tag = %c.tag, timeout_ms = t, "consumer timed out: closing the channel (the client lacks consumer_cancel_notify)");
                    return Err(AmqpError::precondition_failed(timeout::timed_out_text(
                        self.id(),
                        *t,
                    )));
                }
            }
            if expired.is_empty() && gets.is_empty() {
                return Ok(next);
            }
            // Marked under this lock: a delivery that raced past the mark is taken back at a
            // later check, without a second basic.cancel.
            for (c, _, newly) in expired.iter_mut() {
                *newly = !c.cancelled.swap(true, Ordering::Relaxed);
            }
            let all = std::mem::take(&mut d.unacked);
            let mut taken = Vec::new();
            for u in all {
                let gone = match &u.consumer {
                    Some(c) => expired.iter().any(|(x, ..)| x.key == c.key),
                    None => gets.binary_search(&u.tag).is_ok(),
                };
                if gone {
                    taken.push(u);
                } else {
                    d.unacked.push_back(u);
                }
            }
            for u in &taken {
                if u.consumer.is_some() {
                    d.global_unacked = d.global_unacked.saturating_sub(1);
                }
                d.reclaimed.insert(u.tag);
            }
            while d.reclaimed.len() > crate::limits::RECLAIMED_TAGS_MAX {
                d.reclaimed.pop_first();
            }
            taken
        };
        for (c, t, newly) in &expired {
            if self
                .consumers
                .get(&c.tag)
                .is_some_and(|x| Arc::ptr_eq(x, c))
            {
                self.consumers.remove(&c.tag);
            }
            // One the client had cancelled already is not cancelled again.
            if *newly {
                self.shared.cancelled(c);
                remove_consumer(vhost, c);
            }
            let requeued = taken
                .iter()
                .filter(|u| u.consumer.as_ref().is_some_and(|x| x.key == c.key))
                .count();
            tracing::info!(conn, channel = self.id(), vhost = %vhost.name, queue = %c.queue.name(), consumer_tag = %c.tag, timeout_ms = t, requeued, cancelled = *newly, "consumer timed out: deliveries requeued");
        }
        if !gets.is_empty() {
            tracing::info!(conn, channel = self.id(), vhost = %vhost.name, requeued = gets.len(), "basic.get deliveries timed out: requeued");
        }
        finish(taken, Settle::Requeue);
        if self.shared.capped() {
            self.kick_consumers();
        }
        Ok(next)
    }

    /// A publish to [`LEASE_EXCHANGE`]: moves the named deliveries' deadlines to the requested
    /// time from now (never earlier). Malformed requests and unknown tags are ignored; with
    /// confirms on it is confirmed like any publish.
    fn extend_lease(&mut self, routing_key: &str, body: &[u8]) {
        if self.confirm {
            self.next_publish_seq += 1;
            self.confirms.settled(self.next_publish_seq - 1, true);
        }
        let Some(lease) = timeout::parse_lease(routing_key, body) else {
            tracing::debug!(
                channel = self.id(),
                routing_key,
                "malformed lease extension ignored"
            );
            return;
        };
        let (now, global) = (timeout::now_ms(), self.default_consumer_timeout);
        let extend = |u: &mut Unacked| {
            let t = match &u.consumer {
                Some(c) => {
                    timeout::effective(c.timeout_ms, c.queue.args().consumer_timeout_ms, global)
                }
                None => timeout::effective(None, u.queue.args().consumer_timeout_ms, global),
            };
            if let Some(t) = t {
                u.stamp = timeout::extended_stamp(u.stamp, now, t, lease.extend_ms);
            }
        };
        let mut d = self.shared.deliveries.lock();
        match lease.target {
            LeaseTarget::All => d.unacked.iter_mut().for_each(extend),
            LeaseTarget::Tag(tag) => {
                if let Ok(i) = d.unacked.binary_search_by_key(&tag, |u| u.tag) {
                    extend(&mut d.unacked[i]);
                }
            }
        }
    }
}

fn remove_consumer(vhost: &Arc<VHost>, c: &Arc<Consumer>) {
    c.cancelled.store(true, Ordering::Relaxed);
    if c.queue.remove_consumer(c) {
        let _ = vhost.delete_queue(c.queue.name(), false, false, None);
    }
}

/// A local channel is the sink of its consumers' deliveries.
impl DeliverySink for ChannelShared {
    #[inline]
    fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        ChannelShared::offer(self, c, q, m)
    }

    fn wait_for_space(&self, q: &Arc<Queue>) {
        self.outbox.wait_for_space(q)
    }

    fn push(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> bool {
        if c.cancelled.load(Ordering::Relaxed) {
            return false;
        }
        let mut d = self.deliveries.lock();
        if d.closed {
            return false;
        }
        self.deliver_locked(&mut d, c, || q, m);
        true
    }

    fn hold_credit(&self, p: &Arc<crate::cluster::remote::Proxy>) -> bool {
        self.outbox.is_full() && self.outbox.wait_for_space_remote(p)
    }

    fn offer_stream(
        &self,
        c: &Arc<Consumer>,
        s: &Arc<crate::queue::stream::Stream>,
        m: &QueuedMessage,
    ) -> Offer {
        self.offer_from(c, || QueueRef::Stream(s.clone()), m)
    }

    fn wait_for_space_stream(&self, s: &Arc<crate::queue::stream::Stream>) -> bool {
        self.outbox.wait_for_space_stream(s)
    }

    fn cancelled(&self, c: &Consumer) {
        self.outbox.method(
            self.id,
            &Method::BasicCancel(BasicCancel {
                consumer_tag: c.tag.clone(),
                nowait: true,
            }),
        );
    }
}

/// The server-sent basic.cancel, for consumers of a deleted queue.
pub fn notify_cancelled(consumers: &[Arc<Consumer>]) {
    for c in consumers {
        if !c.cancelled.swap(true, Ordering::Relaxed) {
            c.sink.cancelled(c);
        }
    }
}

/// A server-generated name: prefix plus 22 URL-safe random characters, as RabbitMQ makes them.
pub fn gen_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    let mut s = String::with_capacity(prefix.len() + 22);
    s.push_str(prefix);
    for _ in 0..22 {
        s.push(ALPHABET[rng.gen_range(0..ALPHABET.len())] as char);
    }
    s
}

/// RabbitMQ strips CR and LF from exchange and queue names in declare, delete and bind methods
/// (`rabbit_channel:strip_cr_lf`); basic.publish, consume, get and queue.purge take names as given.
fn strip_cr_lf(name: &ByteString) -> ByteString {
    if !name.bytes().any(|b| b == b'\r' || b == b'\n') {
        return name.clone();
    }
    ByteString::from(name.replace(['\r', '\n'], ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_protocol::{FieldTable, FieldValue};

    fn setup(args: FieldTable) -> (Arc<VHost>, QueueRef, Channel) {
        let vhost = VHost::new("/");
        let q = vhost
            .declare_queue(&QueueSpec {
                name: "q",
                passive: false,
                durable: false,
                exclusive: false,
                auto_delete: false,
                arguments: &args,
                conn_id: 1,
                server_named: false,
                home: None,
                members: None,
            })
            .expect("declare");
        let mut ch = Channel::new(1, Outbox::new(131_072));
        ch.default_consumer_timeout = 0;
        (vhost, q, ch)
    }

    fn consume(
        ch: &mut Channel,
        q: &QueueRef,
        tag: &str,
        timeout_ms: Option<u64>,
    ) -> Arc<Consumer> {
        let c = Arc::new(Consumer {
            key: crate::queue::consumer_key(),
            tag: tag.into(),
            sink: ch.shared.clone(),
            queue: q.clone(),
            no_ack: false,
            exclusive: false,
            priority: 0,
            prefetch: 0,
            cancelled: AtomicBool::new(false),
            timeout_ms,
        });
        q.add_consumer(c.clone(), || {}).expect("consume");
        ch.consumers.insert(c.tag.clone(), c.clone());
        c
    }

    fn publish(q: &QueueRef, n: usize) {
        for i in 0..n {
            q.publish(
                Arc::new(Message {
                    exchange: "".into(),
                    routing_key: "q".into(),
                    properties: Bytes::from_static(&[0, 0]),
                    body: Bytes::from(i.to_string()),
                    persistent: false,
                    priority: None,
                    expiration_ms: None,
                }),
                None,
            );
        }
    }

    /// (tag, consumer tag, redelivered) of the channel's unacked deliveries.
    fn unacked(ch: &Channel) -> Vec<(u64, String, bool)> {
        let d = ch.shared.deliveries.lock();
        d.unacked
            .iter()
            .map(|u| {
                let c = u
                    .consumer
                    .as_ref()
                    .map_or(String::new(), |c| c.tag.to_string());
                (u.tag, c, u.msg.redelivered)
            })
            .collect()
    }

    #[test]
    fn a_timed_out_consumer_is_cancelled_and_all_its_deliveries_requeued() {
        let (vhost, q, mut ch) = setup(FieldTable::new());
        let quick = consume(&mut ch, &q, "quick", Some(1000));
        consume(&mut ch, &q, "patient", None);
        publish(&q, 4);
        let before = unacked(&ch);
        assert_eq!(before.len(), 4);
        let quick_tags: Vec<u64> = before
            .iter()
            .filter(|u| u.1 == "quick")
            .map(|u| u.0)
            .collect();
        assert_eq!(quick_tags.len(), 2);
        let now = timeout::now_ms();
        let next = ch
            .expire_deliveries(now + 500, true, 1, &vhost)
            .expect("open");
        assert!(
            next.is_some_and(|d| d > now + 500 && d <= now + 1000),
            "{next:?}"
        );
        assert_eq!(unacked(&ch).len(), 4, "nothing expired yet");
        // The patient consumer has no timeout at all (the broker's is off here).
        let next = ch
            .expire_deliveries(now + 2000, true, 1, &vhost)
            .expect("open");
        assert_eq!(next, None);
        assert!(quick.cancelled.load(Ordering::Relaxed));
        assert!(!ch.consumers.contains_key("quick") && ch.consumers.contains_key("patient"));
        assert_eq!(q.consumer_count(), 1);
        // Requeued, then redelivered to the other consumer, flagged.
        let after = unacked(&ch);
        assert_eq!(after.len(), 4);
        assert!(after.iter().all(|u| u.1 == "patient"));
        assert_eq!(after.iter().filter(|u| u.2).count(), 2);
        // Late settles of reclaimed tags are ignored; an unknown tag is still an error.
        assert!(ch
            .shared
            .take(quick_tags[0], false)
            .expect("ignored")
            .is_empty());
        assert!(
            ch.shared.take(quick_tags[0], false).is_err(),
            "forgotten once used"
        );
        assert!(ch.shared.take(99, false).is_err());
        assert!(
            ch.shared.take(quick_tags[1], true).is_ok(),
            "multiple up to a reclaimed tag"
        );
    }

    #[test]
    fn without_cancel_notify_the_channel_is_closed_with_rabbitmqs_text() {
        let mut args = FieldTable::new();
        args.insert("x-consumer-timeout", FieldValue::I32(1000));
        let (vhost, q, mut ch) = setup(args);
        let c = consume(&mut ch, &q, "c", None);
        publish(&q, 1);
        let now = timeout::now_ms();
        let e = ch
            .expire_deliveries(now + 2000, false, 1, &vhost)
            .expect_err("close");
        assert_eq!(e.code, 406);
        assert_eq!(
            e.text,
            format!("PRECONDITION_FAILED - {}", timeout::timed_out_text(1, 1000))
        );
        assert!(
            !c.cancelled.load(Ordering::Relaxed),
            "the close releases it"
        );
        assert_eq!(unacked(&ch).len(), 1);
    }

    #[test]
    fn a_lease_postpones_expiry_and_never_shortens_it() {
        let (vhost, q, mut ch) = setup(FieldTable::new());
        let c = consume(&mut ch, &q, "c", Some(1000));
        publish(&q, 2);
        let now = timeout::now_ms();
        ch.extend_lease("", b"5000");
        ch.extend_lease("1", b"100");
        ch.extend_lease("77", b"");
        let next = ch
            .expire_deliveries(now + 2000, true, 1, &vhost)
            .expect("open");
        assert!(next.is_some_and(|d| d >= now + 5000), "{next:?}");
        assert!(!c.cancelled.load(Ordering::Relaxed));
        ch.expire_deliveries(now + 60_000, true, 1, &vhost)
            .expect("open");
        assert!(c.cancelled.load(Ordering::Relaxed));
        assert_eq!(q.message_count(), 2);
    }

    #[test]
    fn a_timed_out_basic_get_is_requeued_and_the_channel_kept() {
        let mut args = FieldTable::new();
        args.insert("x-consumer-timeout", FieldValue::I32(1000));
        let (vhost, q, mut ch) = setup(args);
        publish(&q, 1);
        let shared = ch.shared.clone();
        let got = q
            .get(true, |m, left| shared.deliver_get(&q, m, left, false))
            .expect("get");
        assert!(got && q.message_count() == 0);
        let now = timeout::now_ms();
        ch.expire_deliveries(now + 2000, false, 1, &vhost)
            .expect("kept open");
        assert_eq!(q.message_count(), 1);
        assert!(ch
            .shared
            .take(1, false)
            .expect("late ack ignored")
            .is_empty());
    }
}
