//! A producer: its own connection; the writer publishes in batches from a pre-encoded frame
//! template, a reader task handles confirms, returns and closes from the broker.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use warren_protocol::frame::{
    write_body_frame_header, write_content_header, write_method, FRAME_END, FRAME_OVERHEAD,
};
use warren_protocol::method::BasicPublish;
use warren_protocol::properties::BasicProperties;
use warren_protocol::{FrameDecoder, FrameKind, Method};

use crate::body;
use crate::client::{close_method, decode_method, ClientError, Conn, CHANNEL};
use crate::stats::Stats;

/// Bytes encoded before each write; big enough that a write carries hundreds of small messages.
const BATCH_BYTES: usize = 128 * 1024;

#[derive(Debug, Clone)]
pub struct ProducerSpec {
    pub exchange: String,
    pub routing_key: String,
    pub mandatory: bool,
    pub persistent: bool,
    pub body_size: usize,
    /// msg/s; `None`: as fast as the socket takes them.
    pub rate: Option<f64>,
    /// With a rate: the messages due go out in a train this often.
    pub pacing: Duration,
    /// Max unconfirmed; `None`: no confirms.
    pub confirm: Option<u32>,
    /// Messages to send; 0: no limit.
    pub limit: u64,
    pub start_delay: Duration,
}

/// A whole publish (method, header and body frames) encoded once; each message copies it and
/// writes its sequence number and timestamp at `stamp_at`.
pub struct Template {
    pub bytes: Vec<u8>,
    pub stamp_at: usize,
}

impl Template {
    pub fn new(spec: &ProducerSpec, frame_max: u32) -> Template {
        let mut b = BytesMut::new();
        write_method(
            &mut b,
            CHANNEL,
            &Method::BasicPublish(BasicPublish {
                reserved_1: 0,
                exchange: spec.exchange.as_str().into(),
                routing_key: spec.routing_key.as_str().into(),
                mandatory: spec.mandatory,
                immediate: false,
            }),
        );
        // PerfTest's MINIMAL_BASIC / MINIMAL_PERSISTENT_BASIC: no properties, or delivery_mode 2.
        let props = BasicProperties {
            delivery_mode: spec.persistent.then_some(2),
            ..Default::default()
        };
        write_content_header(
            &mut b,
            CHANNEL,
            60,
            spec.body_size as u64,
            &props.to_bytes(),
        );
        let chunk = frame_max as usize - FRAME_OVERHEAD;
        let mut stamp_at = 0;
        let mut left = spec.body_size;
        let mut first = true;
        while left > 0 {
            let n = left.min(chunk);
            write_body_frame_header(&mut b, CHANNEL, n);
            if first {
                stamp_at = b.len();
                first = false;
            }
            b.resize(b.len() + n, 0);
            b.extend_from_slice(&[FRAME_END]);
            left -= n;
        }
        Template {
            bytes: b.to_vec(),
            stamp_at,
        }
    }

    #[inline]
    pub fn append(&self, out: &mut BytesMut, seq: u32, ts_ns: u64) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        body::stamp(&mut out[at + self.stamp_at..], seq, ts_ns);
    }
}

/// Wakes a paced producer every `every`, from a thread of its own. Tokio's timer ticks in whole
/// milliseconds, so a producer paced by it sends a millisecond's messages in one train, and at
/// high rates the train's last message waits behind hundreds of others in the broker. The
/// thread sleeps between ticks (no spinning) with a 1 µs timer slack, and stops when dropped.
struct Pacer {
    tick: Arc<Notify>,
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pacer {
    /// `None` if the thread cannot be started: the producer paces by the runtime's timer.
    fn start(every: Duration) -> Option<Pacer> {
        let tick = Arc::new(Notify::new());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, d) = (tick.clone(), done.clone());
        let thread = std::thread::Builder::new()
            .name("perf-pacer".into())
            .spawn(move || {
                // The default slack (50 µs) would stretch every sleep by about that much.
                let _ = nix::sys::prctl::set_timerslack(1_000);
                let mut at = std::time::Instant::now();
                while !d.load(Relaxed) {
                    at += every;
                    let now = std::time::Instant::now();
                    match at.checked_duration_since(now) {
                        Some(wait) => std::thread::sleep(wait),
                        // Fell behind (the machine stalled): tick from now on, no catch-up burst.
                        None => at = now,
                    }
                    // A tick the producer is not waiting for stays stored: it is not lost.
                    t.notify_one();
                }
            })
            .ok()?;
        Some(Pacer {
            tick,
            done,
            thread: Some(thread),
        })
    }
}

impl Drop for Pacer {
    /// Stops the thread and waits for it (at most one tick).
    fn drop(&mut self) {
        self.done.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Unconfirmed publishes (sequence number, send time), oldest first.
struct Pending {
    queue: Mutex<VecDeque<(u64, u64)>>,
    /// Wakes the writer when confirms free room in the window.
    room: Notify,
}

pub async fn run(
    conn: Conn,
    spec: ProducerSpec,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ClientError> {
    let template = Template::new(&spec, conn.frame_max);
    let Conn {
        stream,
        rbuf,
        frame_max,
        ..
    } = conn;
    let (rd, mut wr) = stream.into_split();
    let pending = Arc::new(Pending {
        queue: Mutex::new(VecDeque::new()),
        room: Notify::new(),
    });
    let reader = tokio::spawn(read_loop(
        rd,
        rbuf,
        frame_max,
        pending.clone(),
        stats.clone(),
    ));

    if !spec.start_delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(spec.start_delay) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
    let per_batch = (BATCH_BYTES / template.bytes.len()).max(1) as u64;
    let mut wbuf = BytesMut::with_capacity(BATCH_BYTES + template.bytes.len());
    let pacer = match spec.rate {
        Some(_) if spec.pacing < Duration::from_millis(1) => Pacer::start(spec.pacing),
        _ => None,
    };
    let start = Instant::now();
    let mut sent: u64 = 0;
    let mut clean = true;
    while !*stop.borrow() && !reader.is_finished() {
        let mut n = per_batch;
        if spec.limit > 0 {
            n = n.min(spec.limit - sent);
            if n == 0 {
                break;
            }
        }
        if let Some(r) = spec.rate {
            // Message k is due at k/r seconds.
            let due = (start.elapsed().as_secs_f64() * r) as u64 + 1;
            if due <= sent {
                let next = start + Duration::from_secs_f64(sent as f64 / r);
                match &pacer {
                    // The next train is due at the pacer's next tick.
                    Some(p) => tokio::select! {
                        _ = p.tick.notified() => {}
                        _ = stop.wait_for(|s| *s) => {}
                    },
                    None => tokio::select! {
                        _ = tokio::time::sleep_until(next) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    },
                }
                continue;
            }
            n = n.min(due - sent);
        }
        if let Some(window) = spec.confirm {
            let room = (window as u64).saturating_sub(pending.queue.lock().len() as u64);
            if room == 0 {
                tokio::select! {
                    _ = pending.room.notified() => {}
                    _ = stop.wait_for(|s| *s) => {}
                    // The reader may have ended (broker closed); the loop condition checks it.
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            n = n.min(room);
        }
        let ts = body::now_ns();
        wbuf.clear();
        for i in 0..n {
            template.append(&mut wbuf, (sent + i + 1) as u32, ts);
        }
        if spec.confirm.is_some() {
            let mut q = pending.queue.lock();
            q.extend((sent + 1..=sent + n).map(|seq| (seq, ts)));
        }
        tokio::select! {
            r = wr.write_all(&wbuf) => r?,
            _ = stop.wait_for(|s| *s) => { clean = false; break; }
        }
        sent += n;
        stats.counters.sent.fetch_add(n, Relaxed);
    }
    // A bounded run waits for its last confirms, unless told to stop.
    if spec.confirm.is_some() && clean {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pending.queue.lock().is_empty() && !*stop.borrow() && !reader.is_finished() {
            tokio::select! {
                _ = pending.room.notified() => {}
                _ = stop.wait_for(|s| *s) => {}
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
    if clean && !reader.is_finished() {
        wbuf.clear();
        write_method(&mut wbuf, 0, &close_method());
        let _ = wr.write_all(&wbuf).await;
    }
    let result = match tokio::time::timeout(Duration::from_secs(2), reader).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(ClientError::Protocol(format!(
            "producer reader failed: {e}"
        ))),
        Err(_) => Ok(()),
    };
    // Once we asked to close, an error from a broker that drops the socket is not the run's.
    if *stop.borrow() {
        return Ok(());
    }
    result
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    mut rbuf: BytesMut,
    frame_max: u32,
    pending: Arc<Pending>,
    stats: Arc<Stats>,
) -> Result<(), ClientError> {
    let decoder = FrameDecoder::new(frame_max);
    let mut confirm_ns = Vec::new();
    loop {
        while let Some(f) = decoder.decode(&mut rbuf)? {
            if f.kind != FrameKind::Method {
                continue; // returned message content, heartbeats
            }
            match decode_method(&f.payload)? {
                Method::BasicAck(a) => settle(
                    &pending,
                    &stats,
                    a.delivery_tag,
                    a.multiple,
                    true,
                    &mut confirm_ns,
                ),
                Method::BasicNack(n) => settle(
                    &pending,
                    &stats,
                    n.delivery_tag,
                    n.multiple,
                    false,
                    &mut confirm_ns,
                ),
                Method::BasicReturn(_) => {
                    stats.counters.returned.fetch_add(1, Relaxed);
                }
                Method::ConnectionCloseOk(_) => return Ok(()),
                Method::ConnectionClose(c) => {
                    return Err(ClientError::Closed {
                        what: "connection",
                        code: c.reply_code,
                        text: c.reply_text.to_string(),
                    })
                }
                Method::ChannelClose(c) => {
                    return Err(ClientError::Closed {
                        what: "channel",
                        code: c.reply_code,
                        text: c.reply_text.to_string(),
                    })
                }
                Method::ConnectionBlocked(b) => {
                    tracing::info!(reason = %b.reason, "producer connection blocked by the broker")
                }
                Method::ConnectionUnblocked(_) => {
                    tracing::info!("producer connection unblocked")
                }
                _ => {}
            }
        }
        stats.record_confirms(&confirm_ns);
        confirm_ns.clear();
        if rd.read_buf(&mut rbuf).await? == 0 {
            return Err(ClientError::Protocol("the broker closed the socket".into()));
        }
    }
}

fn settle(
    pending: &Pending,
    stats: &Stats,
    tag: u64,
    multiple: bool,
    ack: bool,
    latencies: &mut Vec<u64>,
) {
    let now = body::now_ns();
    let mut n = 0u64;
    {
        let mut q = pending.queue.lock();
        if multiple {
            while let Some(&(seq, ts)) = q.front() {
                if seq > tag {
                    break;
                }
                q.pop_front();
                latencies.push(now.saturating_sub(ts));
                n += 1;
            }
        } else if let Ok(i) = q.binary_search_by_key(&tag, |e| e.0) {
            if let Some((_, ts)) = q.remove(i) {
                latencies.push(now.saturating_sub(ts));
                n = 1;
            }
        }
    }
    let c = if ack {
        &stats.counters.confirmed
    } else {
        &stats.counters.nacked
    };
    c.fetch_add(n, Relaxed);
    pending.room.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_protocol::properties::ContentHeader;

    fn spec(size: usize, persistent: bool) -> ProducerSpec {
        ProducerSpec {
            exchange: "direct".into(),
            routing_key: "rk".into(),
            mandatory: true,
            persistent,
            body_size: size,
            rate: None,
            pacing: Duration::from_millis(1),
            confirm: None,
            limit: 0,
            start_delay: Duration::ZERO,
        }
    }

    /// The template decodes with the generic codec into publish, header and body frames.
    #[test]
    fn template_is_a_valid_publish() {
        for (size, frames) in [(12usize, 3usize), (4088, 3), (4089, 4), (10_000, 5)] {
            let t = Template::new(&spec(size, true), 4096);
            let mut out = BytesMut::new();
            t.append(&mut out, 9, 777);
            let dec = FrameDecoder::new(4096);
            let mut got = Vec::new();
            while let Some(f) = dec.decode(&mut out).expect("valid frames") {
                got.push(f);
            }
            assert!(out.is_empty());
            assert_eq!(got.len(), frames, "size {size}");
            match Method::decode(&got[0].payload).expect("method") {
                Method::BasicPublish(p) => {
                    assert_eq!(
                        (&*p.exchange, &*p.routing_key, p.mandatory),
                        ("direct", "rk", true)
                    )
                }
                m => panic!("{m:?}"),
            }
            let h = ContentHeader::decode(&got[1].payload).expect("header");
            assert_eq!(h.body_size, size as u64);
            assert_eq!(
                warren_protocol::properties::delivery_mode(&h.raw_properties),
                Some(2)
            );
            let body: Vec<u8> = got[2..].iter().flat_map(|f| f.payload.to_vec()).collect();
            assert_eq!(body.len(), size);
            assert_eq!(&body[..4], &9u32.to_be_bytes());
            assert_eq!(body::timestamp(&body), Some(777));
        }
        let t = Template::new(&spec(12, false), 4096);
        let mut out = BytesMut::new();
        t.append(&mut out, 1, 1);
        let dec = FrameDecoder::new(4096);
        dec.decode(&mut out).expect("ok");
        let h = dec.decode(&mut out).expect("ok").expect("header");
        let h = ContentHeader::decode(&h.payload).expect("header");
        assert_eq!(
            &h.raw_properties[..],
            &[0, 0],
            "no properties unless persistent"
        );
    }

    #[test]
    fn settle_multiple_and_single() {
        let p = Pending {
            queue: Mutex::new((1..=5).map(|s| (s, 0)).collect()),
            room: Notify::new(),
        };
        let stats = Stats::default();
        let mut lat = Vec::new();
        settle(&p, &stats, 3, false, false, &mut lat);
        settle(&p, &stats, 2, true, true, &mut lat);
        settle(&p, &stats, 2, true, true, &mut lat); // already settled: nothing
        assert_eq!(stats.counters.confirmed.load(Relaxed), 2);
        assert_eq!(stats.counters.nacked.load(Relaxed), 1);
        assert_eq!(
            p.queue.lock().iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![4, 5]
        );
        settle(&p, &stats, 5, true, true, &mut lat);
        assert!(p.queue.lock().is_empty());
        assert_eq!(lat.len(), 5);
    }

    /// The pacer's thread wakes a waiting producer again and again, and ends once dropped.
    #[tokio::test]
    async fn a_pacer_ticks_until_dropped() {
        let p = Pacer::start(Duration::from_micros(100)).expect("thread");
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(10), p.tick.notified())
                .await
                .expect("a tick");
        }
        // Dropping joins the thread: it returns only if the thread ended.
        let dropped = tokio::task::spawn_blocking(move || drop(p));
        tokio::time::timeout(Duration::from_secs(10), dropped)
            .await
            .expect("the thread ended")
            .expect("joined");
    }
}
