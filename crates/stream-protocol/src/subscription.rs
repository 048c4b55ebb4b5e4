//! A subscription: a consumer of the stream through the broker API (`Stream::add_consumer`,
//! whose reader task hands committed messages to this [`DeliverySink`]), and a task that sends
//! what has come as chunks, one `Deliver` frame each, while the client has chunk credit.
//!
//! The stream reader's own credit (the consumer's prefetch, [`PREFETCH`] messages) bounds what
//! waits here: a message sent in a chunk is settled back to the stream, which gives that
//! credit back. So a client without chunk credit stops the reader, and nothing piles up.
//!
//! Filtering (RabbitMQ 3.13's): a subscription with `filter.N` values gets only the messages
//! whose filter value (the publish's, kept as the `x-stream-filter-value` header) is one of
//! them, and those without one when `match-unfiltered` is true. RabbitMQ skips whole chunks by
//! a Bloom filter and leaves the rest to the client's own filter; here each message is checked,
//! and a chunk holds a run of consecutive matching offsets, so every chunk's offsets stay
//! right and the client's filter finds nothing more to drop.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Notify;
use warren_broker::flow::SpaceWaiter;
use warren_broker::queue::stream::{StartAt, Stream};
use warren_broker::queue::{Consumer, DeliverySink, Offer, Queue, QueueRef, QueuedMessage};
use warren_protocol::properties::BasicProperties;

use crate::frame::{OffsetSpec, DELIVER, METADATA_UPDATE};
use crate::out::Out;

/// Messages the stream's reader may hand over before some are sent and settled.
const PREFETCH: u16 = 4096;
/// Most messages in one chunk.
const CHUNK_MSGS: usize = 1024;

pub struct Subscription {
    id: u8,
    stream: Arc<Stream>,
    consumer: Arc<Consumer>,
    sink: Arc<Sink>,
    task: tokio::task::JoinHandle<()>,
}

/// What a filtered subscription takes: messages with one of `values` as their filter value,
/// and those without one if `unfiltered`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub values: Vec<String>,
    pub unfiltered: bool,
}

impl Filter {
    /// From a subscribe's properties (`filter.0`, `filter.1`, ..., `match-unfiltered`); `None`
    /// when it names no filter value.
    pub fn from_properties(properties: &[(String, String)]) -> Option<Filter> {
        let values: Vec<String> = properties
            .iter()
            .filter(|(k, _)| k.starts_with("filter."))
            .map(|(_, v)| v.clone())
            .collect();
        let unfiltered = properties
            .iter()
            .any(|(k, v)| k == "match-unfiltered" && v == "true");
        (!values.is_empty()).then_some(Filter { values, unfiltered })
    }

    fn takes(&self, m: &QueuedMessage) -> bool {
        match filter_value(&m.msg.properties) {
            Some(v) => self.values.iter().any(|f| *f == v),
            None => self.unfiltered,
        }
    }
}

/// The header a message's filter value is kept in (RabbitMQ 3.13's name for AMQP 0-9-1
/// publishers).
pub const FILTER_HEADER: &str = "x-stream-filter-value";

fn filter_value(properties: &bytes::Bytes) -> Option<String> {
    let p = BasicProperties::decode(properties).ok()?;
    let v = p.headers?.get(FILTER_HEADER)?.as_str()?.to_string();
    Some(v)
}

struct Sink {
    pending: Mutex<Vec<QueuedMessage>>,
    filter: Option<Filter>,
    wake: Notify,
    /// Chunks the client will take.
    credit: AtomicU32,
    stopped: AtomicBool,
    out: Arc<Out>,
    id: u8,
    stream: String,
}

impl DeliverySink for Sink {
    fn offer(&self, _c: &Arc<Consumer>, _q: &Arc<Queue>, _m: &QueuedMessage) -> Offer {
        Offer::NoCredit
    }

    fn offer_for(&self, _c: &Arc<Consumer>, m: &QueuedMessage) -> Offer {
        if self.stopped.load(Ordering::Relaxed) {
            return Offer::NoCredit;
        }
        self.pending.lock().push(m.clone());
        self.wake.notify_one();
        Offer::Delivered
    }

    fn wait_for_space(&self, _w: Arc<dyn SpaceWaiter>) -> bool {
        false
    }

    /// The stream was deleted: RabbitMQ tells the client with a metadata update.
    fn cancelled(&self, _c: &Consumer) {
        self.stopped.store(true, Ordering::Relaxed);
        self.wake.notify_one();
        let stream = self.stream.clone();
        self.out.send(|w| {
            w.begin(METADATA_UPDATE, 1)
                .u16(crate::frame::code::STREAM_NOT_AVAILABLE)
                .string(&stream)
                .end()
        });
    }
}

impl Subscription {
    /// Subscribes at `offset`; `on_added` (the subscribe response) is sent before any chunk.
    pub fn start(
        stream: Arc<Stream>,
        id: u8,
        offset: OffsetSpec,
        credit: u16,
        filter: Option<Filter>,
        out: Arc<Out>,
        frame_max: u32,
        on_added: impl FnOnce(),
    ) -> Result<Arc<Subscription>, String> {
        let sink = Arc::new(Sink {
            pending: Mutex::new(Vec::new()),
            filter,
            wake: Notify::new(),
            credit: AtomicU32::new(credit as u32),
            stopped: AtomicBool::new(false),
            out,
            id,
            stream: stream.name.to_string(),
        });
        let consumer = Arc::new(Consumer {
            key: warren_broker::queue::consumer_key(),
            tag: format!("stream-subscription-{id}").into(),
            sink: sink.clone(),
            queue: QueueRef::Stream(stream.clone()),
            no_ack: false,
            exclusive: false,
            priority: 0,
            prefetch: PREFETCH,
            cancelled: AtomicBool::new(false),
            timeout_ms: None,
        });
        let start = match offset {
            OffsetSpec::First => StartAt::First,
            OffsetSpec::Last => StartAt::Last,
            OffsetSpec::Next => StartAt::Next,
            OffsetSpec::Offset(n) => StartAt::Offset(n),
            OffsetSpec::Timestamp(ms) => StartAt::Time(ms.max(0) as u64),
        };
        // The task first, so the reader's first messages find it; it waits for credit anyway.
        let task = tokio::spawn(pump(sink.clone(), stream.clone(), consumer.key, frame_max));
        if let Err(e) = stream.add_consumer(consumer.clone(), start, on_added) {
            task.abort();
            return Err(e.text.to_string());
        }
        Ok(Arc::new(Subscription {
            id,
            stream,
            consumer,
            sink,
            task,
        }))
    }

    pub fn add_credit(&self, n: u16) {
        self.sink.credit.fetch_add(n as u32, Ordering::AcqRel);
        self.sink.wake.notify_one();
    }

    pub fn stop(&self) {
        self.sink.stopped.store(true, Ordering::Relaxed);
        self.consumer.cancelled.store(true, Ordering::Relaxed);
        self.stream.remove_consumer(&self.consumer);
        self.task.abort();
        tracing::debug!(subscription = self.id, stream = %self.stream.name, "stream subscription stopped");
    }
}

/// Sends what the reader handed over as chunks while the client has credit, settling each
/// sent message back to the stream (which gives the reader its credit back).
async fn pump(sink: Arc<Sink>, stream: Arc<Stream>, key: u64, frame_max: u32) {
    // Room for the Deliver frame's own fields and a chunk header.
    let budget = (frame_max as usize).saturating_sub(128).max(4096);
    let mut encoded: Vec<Vec<u8>> = Vec::new();
    loop {
        let have = !sink.pending.lock().is_empty();
        if sink.stopped.load(Ordering::Relaxed) {
            return;
        }
        if !have || sink.credit.load(Ordering::Acquire) == 0 {
            sink.wake.notified().await;
            continue;
        }
        // One chunk: up to CHUNK_MSGS messages within the frame budget (at least one); with a
        // filter, the messages it does not take before them are passed over, and the chunk is
        // a run of consecutive offsets it takes.
        let (skipped, taken): (Vec<QueuedMessage>, Vec<QueuedMessage>) = {
            let mut p = sink.pending.lock();
            let skip = match &sink.filter {
                Some(f) => p.iter().take_while(|m| !f.takes(m)).count(),
                None => 0,
            };
            let mut bytes = 0;
            let mut n = 0;
            for (i, m) in p.iter().enumerate().skip(skip).take(CHUNK_MSGS) {
                bytes += m.msg.body.len() + m.msg.properties.len() + 64;
                if n > 0 && bytes > budget {
                    break;
                }
                if let Some(f) = &sink.filter {
                    if n > 0 && (!f.takes(m) || m.seq != p[i - 1].seq + 1) {
                        break;
                    }
                }
                n += 1;
            }
            let skipped = p.drain(..skip).collect();
            (skipped, p.drain(..n).collect())
        };
        if !skipped.is_empty() {
            stream.settle(skipped.into_iter().map(|m| (Some(key), m)));
        }
        if taken.is_empty() {
            continue;
        }
        encoded.clear();
        for m in &taken {
            let props = BasicProperties::decode(&m.msg.properties).unwrap_or_default();
            encoded.push(crate::amqp10::from_amqp091(&props, &m.msg.body));
        }
        let first = taken[0].seq;
        let now = warren_broker::clock::unix_ms() as i64;
        let mut chunk = BytesMut::new();
        crate::chunk::write(&mut chunk, first, now, encoded.iter().map(Vec::as_slice));
        sink.credit.fetch_sub(1, Ordering::AcqRel);
        sink.out.send(|w| {
            w.begin(DELIVER, 1).u8(sink.id);
            w.buf.extend_from_slice(&chunk);
            w.end();
        });
        stream.settle(taken.into_iter().map(|m| (Some(key), m)));
    }
}
