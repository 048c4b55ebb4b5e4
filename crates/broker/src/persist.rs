//! Group commit. Durable queues buffer their log records in memory; the persister thread writes
//! every dirty queue's buffer and fsyncs the touched files, then confirms what that covered. The
//! group is formed by load, not by a timer: when idle a publish is written and synced at once;
//! while one fsync runs, the next publishes gather into the following group. A persistent message
//! consumed and acked while still buffered is never written.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};
use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;

use crate::confirm::complete_all;
use crate::message::Message;
use crate::queue::Queue;

pub struct Persister {
    dirty: Mutex<Vec<Arc<Queue>>>,
    wake: Condvar,
    stop: AtomicBool,
    /// fsync calls made and bytes written, for benchmarks (logged at shutdown).
    pub fsyncs: AtomicU64,
    pub bytes: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Persister {
    pub fn start() -> Arc<Persister> {
        let p = Arc::new(Persister {
            dirty: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            fsyncs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        let runner = p.clone();
        match std::thread::Builder::new()
            .name("warren-persister".into())
            .spawn(move || runner.run())
        {
            Ok(h) => *p.thread.lock() = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the persister thread"),
        }
        p
    }

    /// Queues `q` for the next group. Cheap when it is already queued.
    pub fn mark_dirty(&self, q: &Arc<Queue>) {
        if q.mark_dirty() {
            self.dirty.lock().push(q.clone());
            self.wake.notify_one();
        }
    }

    /// Writes what is still buffered, then stops the thread (clean shutdown).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        {
            let _g = self.dirty.lock();
            self.wake.notify_one();
        }
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
        tracing::info!(
            fsyncs = self.fsyncs.load(Ordering::Relaxed),
            bytes_written = self.bytes.load(Ordering::Relaxed),
            "persister stopped"
        );
    }

    fn run(self: Arc<Self>) {
        loop {
            let batch = {
                let mut d = self.dirty.lock();
                while d.is_empty() && !self.stop.load(Ordering::Relaxed) {
                    self.wake.wait(&mut d);
                }
                std::mem::take(&mut *d)
            };
            if batch.is_empty() {
                return;
            }
            self.commit(batch);
        }
    }

    fn commit(&self, batch: Vec<Arc<Queue>>) {
        let mut written = Vec::new();
        let mut failed = Vec::new();
        let mut files = Vec::new();
        for q in batch {
            match q.write_log() {
                Ok((tokens, f)) => {
                    written.extend(tokens);
                    files.extend(f);
                }
                Err((e, tokens)) => {
                    tracing::error!(queue = %q.name, error = %e, "cannot write queue log; publishes are nacked");
                    failed.extend(tokens);
                }
            }
        }
        let mut seen = HashSet::new();
        let mut synced = true;
        for f in files {
            if seen.insert(Arc::as_ptr(&f)) {
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = f.sync_data() {
                    tracing::error!(error = %e, "fsync failed; publishes are nacked");
                    synced = false;
                }
            }
        }
        complete_all(
            written
                .into_iter()
                .map(|h| (h, synced))
                .chain(failed.into_iter().map(|h| (h, false))),
        );
    }
}

/// A message as stored in a queue log: exchange, routing key, raw properties, body.
pub fn encode_message(m: &Message) -> Bytes {
    let mut b = BytesMut::with_capacity(
        2 + m.exchange.len() + m.routing_key.len() + 4 + m.properties.len() + m.body.len(),
    );
    b.put_u8(m.exchange.len() as u8);
    b.put_slice(m.exchange.as_bytes());
    b.put_u8(m.routing_key.len() as u8);
    b.put_slice(m.routing_key.as_bytes());
    b.put_u32(m.properties.len() as u32);
    b.put_slice(&m.properties);
    b.put_slice(&m.body);
    b.freeze()
}

pub fn decode_message(data: &Bytes) -> Option<Message> {
    let mut at = 0usize;
    let short = |at: &mut usize| -> Option<ByteString> {
        let n = *data.get(*at)? as usize;
        let s = ByteString::try_from(
            data.get(*at + 1..*at + 1 + n)
                .map(|_| data.slice(*at + 1..*at + 1 + n))?,
        )
        .ok()?;
        *at += 1 + n;
        Some(s)
    };
    let exchange = short(&mut at)?;
    let routing_key = short(&mut at)?;
    let n = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    let properties = data.get(at..at + n).map(|_| data.slice(at..at + n))?;
    let body = data.slice(at + n..);
    let props = BasicProperties::decode(&properties).ok()?;
    let expiration_ms = props.expiration.and_then(|e| e.parse().ok());
    Some(Message {
        exchange,
        routing_key,
        properties,
        body,
        persistent: true,
        priority: props.priority,
        expiration_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trip() {
        let props = BasicProperties {
            delivery_mode: Some(2),
            priority: Some(3),
            ..Default::default()
        };
        let m = Message {
            exchange: "x".into(),
            routing_key: "rk".into(),
            properties: props.to_bytes(),
            body: Bytes::from_static(b"body"),
            persistent: true,
            priority: Some(3),
            expiration_ms: None,
        };
        let d = decode_message(&encode_message(&m)).expect("decodes");
        assert_eq!(
            (&*d.exchange, &*d.routing_key, &d.body[..], d.priority),
            ("x", "rk", &b"body"[..], Some(3))
        );
        assert!(decode_message(&Bytes::from_static(&[5, b'a'])).is_none());
    }
}
