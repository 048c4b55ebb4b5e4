//! A channel: publish assembly (method, header, body frames), consumers, the unacked map,
//! prefetch, publisher confirms and transactions.
//!
//! [`Channel`] is owned by its connection task. [`ChannelShared`] is the part queues touch when
//! they deliver from other tasks: the delivery-tag counter, the unacked list and prefetch counts,
//! under one small mutex, so that tags reach the socket in order.
//!
//! The methods are handled by class, one file each, as `impl Channel` blocks: `exchange.rs`,
//! `queue.rs`, `basic.rs` (consume, cancel, get, ack/nack/reject, recover, qos), `publish.rs`
//! (assembling basic.publish's method, header and body frames), `confirm_tx.rs`; `deliveries.rs`
//! is the unacked map's side (basic.get-ok, settling, close, the `DeliverySink` queues call)
//! and `expiry.rs` the consumer timeout. This file keeps the types, `Channel::dispatch` and
//! the per-message hot paths: [`Channel::publish`], [`Channel::route`] and
//! [`ChannelShared::offer`] stay here because bench/callgrind.sh counts instructions by those
//! symbol names, and a method in an `impl` block of a child module is named
//! `channel::child::<impl Channel>::f` instead.

mod basic;
mod confirm_tx;
mod deliveries;
mod exchange;
mod expiry;
mod names;
mod publish;
mod queue;

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
use crate::consumer_timeout::{self as timeout, LEASE_EXCHANGE};
use crate::error::{AmqpError, AmqpResult};
use crate::message::{header_routes, Message};
use crate::metrics::{bump, delivered, ChannelStats, PublishStats};
use crate::outbox::{self, Outbox};
use crate::queue::{ConfirmTo, Consumer, FannedOut, Offer, Queue, QueueRef, QueuedMessage};
use crate::vhost::publish::{priority_and_expiration, Published};
use crate::vhost::{VHost, DIRECT_REPLY_TO};

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
    /// Consumers (by key) their queue timed out, with the timeout: handled at the next
    /// consumer timeout check (`expiry.rs`).
    timed_out_by_queue: Vec<(u64, u64)>,
}

pub struct ChannelShared {
    pub id: u16,
    pub outbox: Arc<Outbox>,
    deliveries: Mutex<Deliveries>,
    /// What `list_channels` shows of the channel's modes; only the channel's task writes it.
    pub modes: ChannelModes,
    /// Message counts (management API, Prometheus).
    pub stats: Arc<ChannelStats>,
    /// What Prometheus' global counters count beyond `stats`.
    pub publish_stats: PublishStats,
    /// The channel's publisher confirms: Prometheus reads how many are outstanding.
    pub confirms: Arc<Confirms>,
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
        let stats: Arc<ChannelStats> = Arc::default();
        Arc::new(ChannelShared {
            id,
            confirms: Confirms::new(id, outbox.clone(), stats.clone()),
            outbox,
            deliveries: Mutex::new(Deliveries {
                next_tag: 1,
                ..Default::default()
            }),
            modes: ChannelModes::default(),
            stats,
            publish_stats: PublishStats::default(),
        })
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
            confirms: shared.confirms.clone(),
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

    pub fn handle_method(&mut self, m: Method, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let (class_id, method_id) = (m.class_id(), m.method_id());
        self.dispatch(m, ctx).map_err(|e| e.on(class_id, method_id))
    }

    /// Decodes which method arrived and hands it to its handler, one per method, in the file
    /// of its class; each handler replies itself.
    fn dispatch(&mut self, m: Method, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        match m {
            Method::BasicPublish(p) => self.basic_publish(p),
            Method::BasicAck(a) => self.settle(a.delivery_tag, a.multiple, false, true, None),
            Method::BasicNack(n) => self.basic_nack(n, ctx),
            Method::BasicReject(r) => self.basic_reject(r, ctx),
            Method::BasicQos(q) => self.basic_qos(q),
            Method::BasicConsume(c) => self.consume(c, ctx),
            Method::BasicCancel(c) => self.basic_cancel(c, ctx),
            Method::BasicGet(g) => self.basic_get(g, ctx),
            Method::BasicRecover(r) => self.basic_recover(r),
            Method::BasicRecoverAsync(r) => self.recover(r.requeue),
            Method::ExchangeDeclare(x) => self.exchange_declare(x, ctx),
            Method::ExchangeDelete(x) => self.exchange_delete(x, ctx),
            Method::ExchangeBind(b) => self.exchange_bind(b, ctx),
            Method::ExchangeUnbind(b) => self.exchange_unbind(b, ctx),
            Method::QueueDeclare(d) => self.queue_declare(d, ctx),
            Method::QueueBind(b) => self.queue_bind(b, ctx),
            Method::QueueUnbind(b) => self.queue_unbind(b, ctx),
            Method::QueuePurge(p) => self.queue_purge(p, ctx),
            Method::QueueDelete(d) => self.queue_delete(d, ctx),
            Method::ConfirmSelect(c) => self.confirm_select(c),
            Method::TxSelect(_) => self.tx_select(),
            Method::TxCommit(_) => self.tx_commit(ctx),
            Method::TxRollback(_) => self.tx_rollback(),
            Method::ChannelFlow(f) => self.channel_flow(f),
            Method::ChannelFlowOk(_) => Ok(()),
            other => Err(unexpected_method(&other)),
        }
    }

    /// channel.flow: a client may ask for deliveries to go on (active=true); pausing them is
    /// not implemented.
    fn channel_flow(&mut self, f: ChannelFlow) -> AmqpResult<()> {
        if !f.active {
            return Err(AmqpError::not_implemented("active=false"));
        }
        self.reply(ChannelFlowOk { active: true });
        Ok(())
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
        let (priority, expiration_ms) = priority_and_expiration(&raw).map_err(|e| e.on(60, 40))?;
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
            forwarded: crate::message::Forwarded::NONE,
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
        bump(&self.shared.stats.publish, 1);
        let seq = self.confirm.then_some(self.next_publish_seq);
        let confirm = seq.map(|seq| ConfirmTo::Channel(&self.confirms, seq));
        let pressured = &mut self.pressured;
        let published = vhost.publish(msg, cc, mandatory, confirm, &mut targets, |q| {
            if q.pressured() && !pressured.iter().any(|x| x.ptr_eq(q)) {
                pressured.push(q.clone());
            }
        });
        self.route_buf = targets;
        let published = published?;
        if seq.is_some() {
            self.next_publish_seq += 1;
            bump(&self.shared.publish_stats.received_confirm, 1);
        }
        if !matches!(published, Published::Unroutable(_)) {
            bump(&self.shared.publish_stats.routed, 1);
        }
        match published {
            // A delayed exchange's store holds it (the plugin returns a mandatory one only
            // when nothing would take it now: then it is unroutable below).
            Published::Held | Published::Routed(FannedOut::Pending) => {}
            Published::Routed(FannedOut::Settled { accepted }) => {
                if let Some(seq) = seq {
                    self.confirms.settled(seq, accepted);
                }
            }
            Published::Unroutable(msg) => self.unroutable(msg, mandatory, seq),
        }
        Ok(())
    }

    /// A message no queue takes: counted, returned if mandatory, and confirmed (as RabbitMQ
    /// confirms an unroutable message).
    fn unroutable(&mut self, msg: Message, mandatory: bool, seq: Option<u64>) {
        let st = &self.shared.stats;
        bump(
            if mandatory {
                &st.return_unroutable
            } else {
                &st.drop_unroutable
            },
            1,
        );
        if mandatory {
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
        if let Some(seq) = seq {
            self.confirms.settled(seq, true);
        }
    }
}

/// Removes `c` from its queue. A queue that runs elsewhere (on another node, or led by one)
/// has stopped delivering to it when this returns; deliveries it made before that may arrive
/// meanwhile, and its kind decides (a no-ack one still reaches the client, before the
/// cancel-ok: the consumer is marked cancelled only after).
fn remove_consumer(vhost: &Arc<VHost>, c: &Arc<Consumer>) {
    let elsewhere = matches!(c.queue, QueueRef::Other(_));
    if !elsewhere {
        c.cancelled.store(true, Ordering::Relaxed);
    }
    let auto_delete = c.queue.remove_consumer(c);
    c.cancelled.store(true, Ordering::Relaxed);
    if auto_delete {
        let _ = vhost.delete_queue(c.queue.name(), false, false, None);
    }
}

/// The 503 for a method a channel does not take.
fn unexpected_method(m: &Method) -> AmqpError {
    AmqpError::command_invalid(format!("unexpected method {} on a channel", m.name()))
}
