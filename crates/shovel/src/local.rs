//! A shovel's ends on this broker, through the broker API (no socket): the source is a
//! consumer of the queue (`QueueRef::add_consumer`, with a [`DeliverySink`] that hands each
//! delivery to the shovel's task), settled through `QueueRef::settle`/`requeue`; the
//! destination publishes through `VHost::publish` with a [`ConfirmTarget`] that tells the
//! task when each publish is stored, and waits out a pressured queue as a publishing
//! connection would (`QueueRef::stall`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytestring::ByteString;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use warren_broker::confirm::ConfirmTarget;
use warren_broker::error::AmqpError;
use warren_broker::flow::SpaceWaiter;
use warren_broker::queue::{Consumer, DeliverySink, Offer, Queue, QueueRef, QueuedMessage};
use warren_broker::server::Broker;
use warren_broker::vhost::{gen_name, QueueSpec, VHost};
use warren_protocol::FieldTable;

use crate::delivery::Delivery;
use crate::params::Source;

/// An AMQP error as RabbitMQ's shovel status shows a channel's close.
pub fn amqp_text(e: AmqpError) -> String {
    format!("{} - {}", warren_protocol::reply::name(e.code), e.text)
}

fn table(args: &Map<String, Value>) -> Result<FieldTable, String> {
    warren_broker::json::json_to_table(&Value::Object(args.clone()))
}

fn vhost(broker: &Broker, name: &str) -> Result<Arc<VHost>, String> {
    broker
        .vhost(name)
        .ok_or_else(|| format!("vhost '{name}' does not exist"))
}

/// RabbitMQ's `ensure_queue`: the queue if it exists, else declared durable with `args`.
pub fn ensure_queue(
    v: &Arc<VHost>,
    name: &str,
    args: &Map<String, Value>,
    conn_id: u64,
) -> Result<(), String> {
    if v.queue(name).is_some() {
        return Ok(());
    }
    let arguments = table(args)?;
    v.declare_queue(&QueueSpec {
        name,
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        arguments: &arguments,
        conn_id,
        server_named: false,
        home: None,
        members: None,
    })
    .map(|_| ())
    .map_err(amqp_text)
}

enum Event {
    Delivery(QueueRef, QueuedMessage),
    /// The broker cancelled the consumer (its queue was deleted).
    Cancelled,
}

/// Hands the queue's deliveries to the shovel's task. The queue counts the consumer's credit
/// (its prefetch), so what waits in the channel is bounded by it.
struct Sink {
    tx: mpsc::UnboundedSender<Event>,
}

impl Sink {
    fn take(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> Offer {
        if c.cancelled.load(Ordering::Relaxed) {
            return Offer::NoCredit;
        }
        match self.tx.send(Event::Delivery(q, m.clone())) {
            Ok(()) => Offer::Delivered,
            Err(_) => Offer::NoCredit,
        }
    }
}

impl DeliverySink for Sink {
    fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        self.take(c, QueueRef::Local(q.clone()), m)
    }

    fn offer_for(&self, c: &Arc<Consumer>, m: &QueuedMessage) -> Offer {
        self.take(c, c.queue.clone(), m)
    }

    /// Nothing to drain: the shovel's channel is unbounded (the credit bounds it).
    fn wait_for_space(&self, _w: Arc<dyn SpaceWaiter>) -> bool {
        false
    }

    fn cancelled(&self, _c: &Consumer) {
        let _ = self.tx.send(Event::Cancelled);
    }

    fn push(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> bool {
        matches!(self.take(c, q, m), Offer::Delivered)
    }
}

/// A local queue the shovel consumes.
pub struct LocalSource {
    vhost: Arc<VHost>,
    queue: QueueRef,
    consumer: Arc<Consumer>,
    rx: mpsc::UnboundedReceiver<Event>,
    /// Deliveries not settled yet, by the shovel's tag.
    held: HashMap<u64, (QueueRef, QueuedMessage)>,
    next_tag: u64,
    /// The exclusive queue it declared for `src-exchange`, deleted when it stops.
    own_queue: Option<String>,
    conn_id: u64,
    /// Messages in the queue when it started consuming (`src-delete-after: queue-length`).
    pub initial_len: u64,
}

impl LocalSource {
    pub fn open(
        broker: &Broker,
        vhost_name: &str,
        source: &Source,
        prefetch: u16,
        consumer_args: &Map<String, Value>,
    ) -> Result<LocalSource, String> {
        let v = vhost(broker, vhost_name)?;
        let conn_id = broker.next_connection_id();
        let (name, own_queue) = match source {
            Source::Queue { name, args } => {
                ensure_queue(&v, name, args, conn_id)?;
                (name.clone(), None)
            }
            Source::Exchange { name, key } => {
                let q = gen_name("amq.gen-");
                let none = FieldTable::new();
                v.declare_queue(&QueueSpec {
                    name: &q,
                    passive: false,
                    durable: false,
                    exclusive: true,
                    auto_delete: false,
                    arguments: &none,
                    conn_id,
                    server_named: true,
                    home: None,
                    members: None,
                })
                .map_err(amqp_text)?;
                if let Err(e) = v.bind_queue(&q, name, key, &none, true, Some(conn_id)) {
                    let _ = v.delete_queue(&q, false, false, Some(conn_id));
                    return Err(amqp_text(e));
                }
                (q.clone(), Some(q))
            }
        };
        let queue = v
            .queue_for(&name, conn_id)
            .and_then(QueueRef::resolved)
            .map_err(amqp_text)?;
        let priority = consumer_args
            .get("x-priority")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel();
        let consumer = Arc::new(Consumer {
            key: warren_broker::queue::consumer_key(),
            tag: ByteString::from(gen_name("amq.ctag-")),
            sink: Arc::new(Sink { tx }),
            queue: queue.clone(),
            // Settled by the shovel even with `no-ack` (at once), so the queue's credit
            // bounds what it holds.
            no_ack: false,
            exclusive: false,
            priority,
            prefetch,
            cancelled: AtomicBool::new(false),
            timeout_ms: None,
        });
        let initial_len = queue.message_count() as u64;
        queue
            .add_consumer(consumer.clone(), || {})
            .map_err(amqp_text)?;
        Ok(LocalSource {
            vhost: v,
            queue,
            consumer,
            rx,
            held: HashMap::new(),
            next_tag: 1,
            own_queue,
            conn_id,
            initial_len,
        })
    }

    /// The next delivery; an error once the queue cancelled the consumer.
    pub async fn next(&mut self) -> Result<Delivery, String> {
        match self.rx.recv().await {
            Some(Event::Delivery(q, m)) => {
                let tag = self.next_tag;
                self.next_tag += 1;
                let d = Delivery {
                    tag,
                    exchange: m.msg.exchange.clone(),
                    routing_key: m.msg.routing_key.clone(),
                    properties: m.msg.properties.clone(),
                    body: m.msg.body.clone(),
                };
                self.held.insert(tag, (q, m));
                Ok(d)
            }
            Some(Event::Cancelled) | None => Err(format!(
                "consumer cancelled by the broker: {}",
                self.queue.describe()
            )),
        }
    }

    pub fn ack(&mut self, tag: u64) {
        if let Some((q, m)) = self.held.remove(&tag) {
            q.settle(std::iter::once((Some(self.consumer.key), m)), true);
        }
    }

    /// Back to its queue (a destination refused it).
    pub fn requeue(&mut self, tag: u64) {
        if let Some((q, m)) = self.held.remove(&tag) {
            q.requeue(std::iter::once((Some(self.consumer.key), m)));
        }
    }
}

/// Stops consuming (when the shovel stops, fails, or its task is aborted): what it holds goes
/// back to the queue, and a queue it declared for an exchange is deleted.
impl Drop for LocalSource {
    fn drop(&mut self) {
        self.consumer.cancelled.store(true, Ordering::Relaxed);
        self.queue.remove_consumer(&self.consumer);
        self.rx.close();
        while let Ok(e) = self.rx.try_recv() {
            if let Event::Delivery(q, m) = e {
                let tag = self.next_tag;
                self.next_tag += 1;
                self.held.insert(tag, (q, m));
            }
        }
        let mut held: Vec<_> = self.held.drain().collect();
        held.sort_by_key(|(tag, _)| *tag);
        for (_, (q, m)) in held {
            q.requeue(std::iter::once((Some(self.consumer.key), m)));
        }
        if let Some(q) = self.own_queue.take() {
            let _ = self
                .vhost
                .delete_queue(&q, false, false, Some(self.conn_id));
        }
    }
}

/// Tells the shovel's task that a publish is stored (or refused).
struct Confirmed {
    tx: mpsc::UnboundedSender<(u64, bool)>,
}

impl ConfirmTarget for Confirmed {
    fn confirmed(self: Arc<Self>, seq: u64, ok: bool) {
        let _ = self.tx.send((seq, ok));
    }
}

/// A local vhost the shovel publishes to.
pub struct LocalDest {
    vhost: Arc<VHost>,
    target: Arc<dyn ConfirmTarget>,
    confirms: mpsc::UnboundedReceiver<(u64, bool)>,
    targets: Vec<QueueRef>,
    pressured: Vec<QueueRef>,
}

/// How long a publish waits for a pressured queue before it goes on (as a connection that
/// also consumes: `limits::PUBLISH_STALL_MS`).
const STALL: Duration = Duration::from_millis(200);

impl LocalDest {
    pub fn open(
        broker: &Broker,
        vhost_name: &str,
        dest_queue: Option<(&str, &Map<String, Value>)>,
    ) -> Result<LocalDest, String> {
        let v = vhost(broker, vhost_name)?;
        if let Some((name, args)) = dest_queue {
            ensure_queue(&v, name, args, broker.next_connection_id())?;
        }
        let (tx, confirms) = mpsc::unbounded_channel();
        Ok(LocalDest {
            vhost: v,
            target: Arc::new(Confirmed { tx }),
            confirms,
            targets: Vec::new(),
            pressured: Vec::new(),
        })
    }

    /// Publishes; `Some(ok)` when it is settled at once (no queue stores it to disk, or it
    /// is unroutable, which RabbitMQ confirms), else its confirm comes from
    /// [`LocalDest::confirmed`] with `seq`.
    pub async fn publish(
        &mut self,
        seq: u64,
        exchange: ByteString,
        routing_key: ByteString,
        properties: Bytes,
        body: Bytes,
    ) -> Result<Option<bool>, String> {
        let msg = warren_broker::vhost::publish::message(exchange, routing_key, properties, body)
            .map_err(amqp_text)?;
        let r = self
            .vhost
            .publish_confirmed(
                msg,
                &self.target,
                seq,
                &mut self.targets,
                &mut self.pressured,
            )
            .map_err(amqp_text)?;
        for q in std::mem::take(&mut self.pressured) {
            q.stall(STALL).await;
        }
        Ok(r)
    }

    /// The next confirm of a publish that waited for a write: (seq, stored).
    pub async fn confirmed(&mut self) -> (u64, bool) {
        match self.confirms.recv().await {
            Some(c) => c,
            // The sender lives in `self.target`: never closed while `self` is.
            None => std::future::pending().await,
        }
    }
}
