//! A subscription: a consumer of the stream through the broker API (`Stream::add_consumer`,
//! whose reader task hands committed messages to this [`DeliverySink`]), and a task that sends
//! what has come as chunks, one `Deliver` frame each, while the client has chunk credit.
//!
//! The stream reader's own credit (the consumer's prefetch, [`PREFETCH`] messages) bounds what
//! waits here: a message sent in a chunk is settled back to the stream, which gives that
//! credit back. So a client without chunk credit stops the reader, and nothing piles up.

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

struct Sink {
    pending: Mutex<Vec<QueuedMessage>>,
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
        out: Arc<Out>,
        frame_max: u32,
        on_added: impl FnOnce(),
    ) -> Result<Arc<Subscription>, String> {
        let sink = Arc::new(Sink {
            pending: Mutex::new(Vec::new()),
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
        // One chunk: up to CHUNK_MSGS messages within the frame budget (at least one).
        let taken: Vec<QueuedMessage> = {
            let mut p = sink.pending.lock();
            let mut bytes = 0;
            let mut n = 0;
            for m in p.iter().take(CHUNK_MSGS) {
                bytes += m.msg.body.len() + m.msg.properties.len() + 64;
                if n > 0 && bytes > budget {
                    break;
                }
                n += 1;
            }
            p.drain(..n).collect()
        };
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
