//! One queue: ready messages in order, its consumers, and dispatch. Each queue has its own mutex
//! and no lock is shared between queues, so N busy queues run on N cores. Work happens in the
//! task that causes it: a publisher's connection task enqueues and dispatches; an ack on the
//! consumer's connection settles and dispatches again; a writer that drained its outbox
//! dispatches the queues that were waiting for it.
//!
//! Lock order: queue -> channel deliveries -> outbox. Never take a queue lock while holding a
//! channel's deliveries lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable, FieldValue};

use crate::channel::{ChannelShared, Offer};
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;

/// A message in a queue, with its position so requeued messages go back where they were.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub seq: u64,
    pub msg: Arc<Message>,
    pub redelivered: bool,
}

/// A consumer: lives in its queue's consumer list and in its channel's consumer map.
pub struct Consumer {
    pub tag: ByteString,
    pub channel: Arc<ChannelShared>,
    pub queue: Arc<Queue>,
    pub no_ack: bool,
    pub exclusive: bool,
    /// Per-consumer prefetch (basic.qos global=false at consume time); 0 = unlimited.
    pub prefetch: u16,
    /// Unacked deliveries to this consumer; changed only under the channel's deliveries lock.
    pub unacked: AtomicU32,
    /// Set when the broker cancelled it (queue deleted) or the client did.
    pub cancelled: AtomicBool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueOptions {
    pub durable: bool,
    pub exclusive_owner: Option<u64>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    pub limits: QueueLimits,
}

/// What happens to a publish into a full queue (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    #[default]
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

/// Length limits from `x-max-length` and `x-max-length-bytes` (ready messages only, as RabbitMQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueLimits {
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
}

impl QueueLimits {
    /// Parses and validates the limit arguments; `what` names the queue in errors.
    pub fn parse(args: &FieldTable, what: &str) -> AmqpResult<QueueLimits> {
        let invalid = |key: &str, why: String| AmqpError::precondition_failed(format!("invalid arg '{key}' for {what}: \"{why}\""));
        let non_neg = |key: &str| -> AmqpResult<Option<u64>> {
            match args.get(key) {
                None => Ok(None),
                Some(v) => match v.as_i64() {
                    Some(n) if n >= 0 => Ok(Some(n as u64)),
                    Some(n) => Err(invalid(key, format!("negative value {n}"))),
                    None => Err(invalid(key, format!("expected integer, got {}", type_name(v)))),
                },
            }
        };
        let overflow = match args.get("x-overflow") {
            None => Overflow::DropHead,
            Some(v) => match v.as_str() {
                Some("drop-head") => Overflow::DropHead,
                Some("reject-publish") => Overflow::RejectPublish,
                Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
                Some(other) => return Err(invalid("x-overflow", format!("{other} is not a valid overflow behaviour"))),
                None => return Err(invalid("x-overflow", format!("expected longstr, got {}", type_name(v)))),
            },
        };
        Ok(QueueLimits { max_length: non_neg("x-max-length")?, max_length_bytes: non_neg("x-max-length-bytes")?, overflow })
    }
}

/// RabbitMQ's name for a field value's type, as it appears in error texts.
pub fn type_name(v: &FieldValue) -> &'static str {
    match v {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) | FieldValue::U64(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(..) => "decimal",
        FieldValue::LongStr(_) => "longstr",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
        FieldValue::Bytes(_) => "binary",
    }
}

/// A field value as RabbitMQ prints it in error texts.
pub fn display_value(v: &FieldValue) -> String {
    if let Some(n) = v.as_i64() {
        return n.to_string();
    }
    match v {
        FieldValue::Bool(b) => b.to_string(),
        FieldValue::F32(f) => f.to_string(),
        FieldValue::F64(f) => f.to_string(),
        FieldValue::LongStr(b) | FieldValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// The outcome of offering a published message to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Accepted,
    /// The queue is full and its overflow mode refuses publishes: the publisher gets a nack.
    Rejected,
    /// The queue was deleted between routing and enqueue.
    Gone,
}

pub struct Queue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<QueuedMessage>,
    /// Body bytes of `ready`, for x-max-length-bytes.
    ready_bytes: u64,
    next_seq: u64,
    consumers: Vec<Arc<Consumer>>,
    /// Round-robin position in `consumers`.
    next_consumer: usize,
    /// Delivered to an ack-mode consumer or basic.get, not yet settled.
    unacked: usize,
    deleted: bool,
    /// An auto-delete queue goes away when its last consumer leaves, not before its first.
    had_consumer: bool,
}

pub struct RemovedConsumer {
    /// The queue is auto-delete and this was its last consumer.
    pub auto_delete_now: bool,
}

impl Queue {
    pub fn new(name: Arc<str>, vhost: Arc<str>, options: QueueOptions) -> Arc<Queue> {
        Arc::new(Queue { name, vhost, options, state: Mutex::new(State::default()) })
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    /// Enqueues and dispatches, applying the length limits.
    pub fn publish(self: &Arc<Self>, msg: Arc<Message>) -> Enqueued {
        let mut st = self.state.lock();
        if st.deleted {
            return Enqueued::Gone;
        }
        let limits = &self.options.limits;
        let size = msg.body.len() as u64;
        if limits.overflow != Overflow::DropHead && st.is_full(limits, size) {
            return Enqueued::Rejected;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.ready_bytes += size;
        st.ready.push_back(QueuedMessage { seq, msg, redelivered: false });
        self.dispatch_locked(&mut st);
        if limits.overflow == Overflow::DropHead {
            while st.is_full(limits, 0) {
                st.pop_ready();
            }
        }
        Enqueued::Accepted
    }

    pub fn dispatch(self: &Arc<Self>) {
        let mut st = self.state.lock();
        self.dispatch_locked(&mut st);
    }

    fn dispatch_locked(self: &Arc<Self>, st: &mut State) {
        'messages: while !st.ready.is_empty() && !st.consumers.is_empty() {
            let n = st.consumers.len();
            for i in 0..n {
                let idx = (st.next_consumer + i) % n;
                let c = &st.consumers[idx];
                let Some(front) = st.ready.front() else { break 'messages };
                match c.channel.offer(c, self, front) {
                    Offer::Delivered => {
                        let acked_mode = !c.no_ack;
                        st.pop_ready();
                        if acked_mode {
                            st.unacked += 1;
                        }
                        st.next_consumer = (idx + 1) % n;
                        continue 'messages;
                    }
                    Offer::OutboxFull => c.channel.outbox.wait_for_space(self),
                    Offer::NoCredit => {}
                }
            }
            break;
        }
    }

    /// basic.get: takes the head message. `ack_mode` counts it as unacked.
    pub fn get(&self, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> bool {
        let mut st = self.state.lock();
        let Some(m) = st.pop_ready() else { return false };
        if ack_mode {
            st.unacked += 1;
        }
        let remaining = st.ready.len() as u32;
        take(&m, remaining);
        true
    }

    /// Settles `n` unacked messages (acked, or rejected without requeue) and dispatches.
    pub fn settle(self: &Arc<Self>, n: usize) {
        let mut st = self.state.lock();
        st.unacked = st.unacked.saturating_sub(n);
        self.dispatch_locked(&mut st);
    }

    /// Puts unacked messages back at their original positions, marked redelivered.
    pub fn requeue(self: &Arc<Self>, msgs: impl IntoIterator<Item = QueuedMessage>) {
        let mut st = self.state.lock();
        if st.deleted {
            return;
        }
        for mut m in msgs {
            st.unacked = st.unacked.saturating_sub(1);
            m.redelivered = true;
            st.ready_bytes += m.msg.body.len() as u64;
            let pos = st.ready.partition_point(|r| r.seq < m.seq);
            st.ready.insert(pos, m);
        }
        self.dispatch_locked(&mut st);
    }

    /// Adds a consumer; `on_added` runs under the queue lock (it sends consume-ok), so no
    /// delivery can overtake the consume-ok.
    pub fn add_consumer(self: &Arc<Self>, c: Arc<Consumer>, on_added: impl FnOnce()) -> AmqpResult<()> {
        let mut st = self.state.lock();
        if st.deleted {
            return Err(AmqpError::not_found(format!("no {}", self.describe())));
        }
        if st.consumers.iter().any(|x| x.exclusive) || (c.exclusive && !st.consumers.is_empty()) {
            return Err(AmqpError::access_refused(format!("{} in exclusive use", self.describe())));
        }
        st.consumers.push(c);
        st.had_consumer = true;
        on_added();
        self.dispatch_locked(&mut st);
        Ok(())
    }

    pub fn remove_consumer(&self, c: &Arc<Consumer>) -> RemovedConsumer {
        let mut st = self.state.lock();
        st.consumers.retain(|x| !Arc::ptr_eq(x, c));
        if st.next_consumer >= st.consumers.len() {
            st.next_consumer = 0;
        }
        RemovedConsumer { auto_delete_now: self.options.auto_delete && st.had_consumer && st.consumers.is_empty() && !st.deleted }
    }

    pub fn message_count(&self) -> u32 {
        self.state.lock().ready.len() as u32
    }

    pub fn consumer_count(&self) -> u32 {
        self.state.lock().consumers.len() as u32
    }

    pub fn purge(&self) -> u32 {
        let mut st = self.state.lock();
        let n = st.ready.len() as u32;
        st.ready.clear();
        st.ready_bytes = 0;
        n
    }

    /// Marks the queue deleted; returns its ready count and consumers (to be told of the cancel).
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        let mut st = self.state.lock();
        st.deleted = true;
        let n = st.ready.len() as u32;
        st.ready.clear();
        (n, std::mem::take(&mut st.consumers))
    }

    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }
}

impl State {
    fn pop_ready(&mut self) -> Option<QueuedMessage> {
        let m = self.ready.pop_front()?;
        self.ready_bytes -= m.msg.body.len() as u64;
        Some(m)
    }

    /// Over a limit once a message of `incoming` bytes is added (0: already over).
    fn is_full(&self, l: &QueueLimits, incoming: u64) -> bool {
        let extra = (incoming > 0) as u64;
        l.max_length.is_some_and(|m| self.ready.len() as u64 + extra > m) || l.max_length_bytes.is_some_and(|m| self.ready_bytes + incoming > m)
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({})", self.name)
    }
}

/// Checks if a consumer may take another delivery under its own prefetch.
pub fn consumer_has_credit(c: &Consumer) -> bool {
    c.no_ack || c.prefetch == 0 || c.unacked.load(Ordering::Relaxed) < c.prefetch as u32
}
