//! The classic queue host on its own: a fake sink stands for a consumer's connection, a fake
//! owner for the vhost, a confirm target records confirms, and a fake log in memory
//! ([`FakeLog`]) stands for the disk, with a persister whose group commits the test runs; one
//! test writes a real log in a temporary directory through a real persister.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable, FieldValue};

use super::*;
use crate::confirm::ConfirmTarget;
use crate::flow::SpaceWaiter;

/// A consumer's connection: takes deliveries while it has room, records them.
#[derive(Default)]
struct FakeSink {
    got: Mutex<Vec<QueuedMessage>>,
    full: AtomicBool,
    waiters: Mutex<Vec<Arc<dyn SpaceWaiter>>>,
    cancelled: AtomicUsize,
}

impl FakeSink {
    fn bodies(&self) -> Vec<Bytes> {
        self.got.lock().iter().map(|m| m.msg.body.clone()).collect()
    }
    /// The connection drained: whoever waited is woken.
    fn drain(&self) {
        self.full.store(false, Ordering::SeqCst);
        let waiters = std::mem::take(&mut *self.waiters.lock());
        for w in waiters {
            w.space();
        }
    }
}

impl DeliverySink for FakeSink {
    fn offer(&self, _c: &Arc<Consumer>, _q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        if self.full.load(Ordering::SeqCst) {
            return Offer::OutboxFull;
        }
        self.got.lock().push(m.clone());
        Offer::Delivered
    }
    fn wait_for_space(&self, w: Arc<dyn SpaceWaiter>) -> bool {
        self.waiters.lock().push(w);
        self.full.load(Ordering::SeqCst)
    }
    fn cancelled(&self, _c: &Consumer) {
        self.cancelled.fetch_add(1, Ordering::SeqCst);
    }
}

/// The vhost, as a queue sees it: dead letters are routed to one queue, or nowhere.
#[derive(Default)]
struct FakeOwner {
    dlq: Mutex<Option<QueueRef>>,
    routed: Mutex<Vec<(ByteString, Vec<ByteString>)>>,
    deleted: Mutex<Vec<String>>,
}

impl QueueOwner for FakeOwner {
    fn route_dead_letter(
        &self,
        m: &Message,
        extra_keys: &[ByteString],
        out: &mut Vec<QueueRef>,
    ) -> DeadRoute {
        self.routed
            .lock()
            .push((m.routing_key.clone(), extra_keys.to_vec()));
        match &*self.dlq.lock() {
            Some(q) => {
                out.push(q.clone());
                DeadRoute::Routed
            }
            None => DeadRoute::NoExchange,
        }
    }
    fn hold_dead_letter(
        self: Arc<Self>,
        _m: &Message,
        _delay_ms: u64,
        _confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Option<bool> {
        None
    }
    fn delete_unused_queue(&self, name: &str) {
        self.deleted.lock().push(name.to_string());
    }
}

/// Records the confirms it is told of.
#[derive(Default)]
struct Confirmed(Mutex<Vec<(u64, bool)>>);

impl ConfirmTarget for Confirmed {
    fn confirmed(self: Arc<Self>, seq: u64, ok: bool) {
        self.0.lock().push((seq, ok));
    }
}

fn msg(body: &'static str, persistent: bool) -> Arc<Message> {
    msg_of(Bytes::from_static(body.as_bytes()), persistent)
}

fn msg_of(body: Bytes, persistent: bool) -> Arc<Message> {
    Arc::new(Message {
        exchange: ByteString::from(""),
        routing_key: ByteString::from("q"),
        properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
        body,
        persistent,
        priority: None,
        expiration_ms: None,
        forwarded: crate::message::Forwarded::NONE,
    })
}

fn options(args: FieldTable, durable: bool) -> QueueOptions {
    QueueOptions {
        durable,
        exclusive_owner: None,
        auto_delete: false,
        args: QueueArgs::parse(&args, "queue 'q' in vhost '/'").expect("valid arguments"),
        arguments: args,
    }
}

fn queue(name: &str, args: FieldTable, owner: &Arc<FakeOwner>) -> Arc<Queue> {
    Queue::new(
        name.into(),
        "/".into(),
        options(args, false),
        Arc::downgrade(owner),
    )
}

fn consumer(q: &Arc<Queue>, sink: &Arc<FakeSink>, prefetch: u16, no_ack: bool) -> Arc<Consumer> {
    let c = Arc::new(Consumer {
        key: consumer_key(),
        tag: ByteString::from("ctag"),
        sink: sink.clone(),
        queue: QueueRef::Local(q.clone()),
        no_ack,
        exclusive: false,
        priority: 0,
        prefetch,
        cancelled: AtomicBool::new(false),
        timeout_ms: None,
    });
    q.add_consumer(c.clone(), || {}).expect("consumes");
    c
}

#[test]
fn a_publish_goes_to_the_sink_and_prefetch_holds_the_rest_until_an_ack() {
    let owner = Arc::new(FakeOwner::default());
    let q = queue("q", FieldTable::default(), &owner);
    let sink = Arc::new(FakeSink::default());
    let c = consumer(&q, &sink, 2, false);
    for b in ["a", "b", "c"] {
        assert_eq!(q.publish(msg(b, false), None), Enqueued::Accepted);
    }
    assert_eq!(sink.bodies(), ["a", "b"]);
    assert_eq!((q.message_count(), q.unacked_count()), (1, 2));
    let first = sink.got.lock()[0].clone();
    q.settle([(Some(c.key), first)], true);
    assert_eq!(sink.bodies(), ["a", "b", "c"]);
    assert_eq!((q.message_count(), q.unacked_count()), (0, 2));
}

#[test]
fn a_full_connection_holds_deliveries_until_it_drains() {
    let owner = Arc::new(FakeOwner::default());
    let q = queue("q", FieldTable::default(), &owner);
    let sink = Arc::new(FakeSink::default());
    sink.full.store(true, Ordering::SeqCst);
    consumer(&q, &sink, 0, true);
    q.publish(msg("a", false), None);
    assert!(sink.bodies().is_empty());
    assert_eq!(q.message_count(), 1);
    assert_eq!(sink.waiters.lock().len(), 1, "the queue waits for space");
    sink.drain();
    assert_eq!(sink.bodies(), ["a"]);
    assert_eq!(q.message_count(), 0);
}

#[test]
fn a_requeued_message_comes_back_first_and_marked_redelivered() {
    let owner = Arc::new(FakeOwner::default());
    let q = queue("q", FieldTable::default(), &owner);
    let sink = Arc::new(FakeSink::default());
    let c = consumer(&q, &sink, 1, false);
    q.publish(msg("a", false), None);
    q.publish(msg("b", false), None);
    let first = sink.got.lock()[0].clone();
    assert!(!first.redelivered);
    q.requeue([(Some(c.key), first)]);
    let got = sink.got.lock().clone();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[1].msg.body.clone(), got[1].redelivered),
        (Bytes::from_static(b"a"), true)
    );
}

#[test]
fn a_rejected_message_is_dead_lettered_through_the_owner() {
    let owner = Arc::new(FakeOwner::default());
    let dlq = queue("dlq", FieldTable::default(), &owner);
    *owner.dlq.lock() = Some(QueueRef::Local(dlq.clone()));
    let mut args = FieldTable::default();
    args.insert("x-dead-letter-exchange", FieldValue::LongStr("dlx".into()));
    args.insert(
        "x-dead-letter-routing-key",
        FieldValue::LongStr("dead".into()),
    );
    let q = queue("q", args, &owner);
    let sink = Arc::new(FakeSink::default());
    let c = consumer(&q, &sink, 0, false);
    q.publish(msg("a", false), None);
    let first = sink.got.lock()[0].clone();
    q.discard([(Some(c.key), first)], true);
    assert_eq!(owner.routed.lock()[0].0, ByteString::from("dead"));
    assert_eq!(dlq.message_count(), 1);
    assert_eq!((q.message_count(), q.unacked_count()), (0, 0));
}

#[test]
fn a_dead_letter_without_an_exchange_is_dropped() {
    let owner = Arc::new(FakeOwner::default());
    let mut args = FieldTable::default();
    args.insert("x-dead-letter-exchange", FieldValue::LongStr("gone".into()));
    args.insert("x-max-length", FieldValue::I32(1));
    let q = queue("q", args, &owner);
    q.publish(msg("a", false), None);
    q.publish(msg("b", false), None);
    assert_eq!(
        owner.routed.lock().len(),
        1,
        "the head overflowed and was offered"
    );
    assert_eq!(q.message_count(), 1);
}

#[test]
fn deleting_a_queue_hands_back_its_consumers() {
    let owner = Arc::new(FakeOwner::default());
    let q = queue("q", FieldTable::default(), &owner);
    let sink = Arc::new(FakeSink::default());
    sink.full.store(true, Ordering::SeqCst);
    let c = consumer(&q, &sink, 0, true);
    q.publish(msg("a", false), None);
    let (ready, consumers) = q.mark_deleted();
    assert_eq!(ready, 1);
    assert_eq!(consumers.len(), 1);
    assert_eq!(consumers[0].key, c.key);
    assert_eq!(q.publish(msg("b", false), None), Enqueued::Gone);
}

/// The fan-out's confirm rule: one confirm for all the queues, a refusal nacks it, a queue
/// without storage confirms at once.
#[test]
fn a_fan_out_confirms_once_and_a_refusal_nacks() {
    let owner = Arc::new(FakeOwner::default());
    let mut full = FieldTable::default();
    full.insert("x-max-length", FieldValue::I32(0));
    full.insert("x-overflow", FieldValue::LongStr("reject-publish".into()));
    let open = QueueRef::Local(queue("open", FieldTable::default(), &owner));
    let refusing = QueueRef::Local(queue("full", full, &owner));
    let to: Arc<dyn ConfirmTarget> = Arc::new(Confirmed::default());
    let m = msg("a", true);
    let out = fan_out(
        &m,
        std::slice::from_ref(&open),
        Some(ConfirmTo::Target(&to, 1)),
        |_| {},
    );
    assert_eq!(
        out,
        FannedOut::Settled { accepted: true },
        "a transient queue stores nothing"
    );
    let out = fan_out(
        &m,
        &[open.clone(), refusing],
        Some(ConfirmTo::Target(&to, 2)),
        |_| {},
    );
    assert_eq!(out, FannedOut::Settled { accepted: false });
    let mut seen = 0;
    fan_out(&m, &[open.clone(), open], None, |_| seen += 1);
    assert_eq!(seen, 2);
}

/// A durable queue's persistent message is written to its log by the persister, and the
/// publish's confirm waits for that write.
#[test]
fn a_persistent_message_is_confirmed_after_its_write_and_recovered_from_the_log() {
    let dir = std::env::temp_dir().join(format!("warren-queue-test-{}", rand::random::<u64>()));
    let persister = crate::persist::Persister::start();
    let owner = Arc::new(FakeOwner::default());
    let open = |persister: &Arc<crate::persist::Persister>| {
        let (log, rec) = Log::open(&dir, crate::persist::stored_body_len).expect("log opens");
        Queue::with_log(
            "q".into(),
            "/".into(),
            options(FieldTable::default(), true),
            Arc::downgrade(&owner) as Weak<FakeOwner>,
            Some(Backing {
                persister: persister.clone(),
                durable: Some((1, QueueLogOf::Store(log), rec)),
                scratch: None,
            }),
        )
    };
    let q = open(&persister);
    let confirmed = Arc::new(Confirmed::default());
    let to: Arc<dyn ConfirmTarget> = confirmed.clone();
    let out = fan_out(
        &msg("kept", true),
        &[QueueRef::Local(q.clone())],
        Some(ConfirmTo::Target(&to, 7)),
        |_| {},
    );
    assert_eq!(out, FannedOut::Pending, "the confirm waits for the write");
    // A bound only so that a lost confirm fails instead of hanging: not a timing check.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while confirmed.0.lock().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "confirmed after the write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(*confirmed.0.lock(), [(7, true)]);
    drop(q);
    let again = open(&persister);
    assert_eq!(again.message_count(), 1, "recovered from its log");
    let sink = Arc::new(FakeSink::default());
    consumer(&again, &sink, 0, true);
    assert_eq!(sink.bodies(), ["kept"]);
    drop(again);
    persister.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A queue's log in memory ([`MessageLog`]): what is buffered, what was written, what was
/// acked and read, and a switch that fails the next writes as a full disk would.
#[derive(Default)]
struct LogState {
    buffered: Vec<(u64, Bytes, Option<Arc<ConfirmHandle>>, bool)>,
    /// seq → (data, volatile)
    written: std::collections::BTreeMap<u64, (Bytes, bool)>,
    acked: Vec<u64>,
    reads: usize,
    fail_writes: bool,
    destroyed: bool,
    bytes: u64,
}

#[derive(Clone, Default)]
struct FakeLog(Arc<Mutex<LogState>>);

impl FakeLog {
    fn buffered(&self) -> Vec<u64> {
        self.0.lock().buffered.iter().map(|b| b.0).collect()
    }
    fn written(&self) -> Vec<u64> {
        self.0.lock().written.keys().copied().collect()
    }
}

impl MessageLog for FakeLog {
    fn enqueue(&mut self, seq: u64, data: Bytes, c: Option<Arc<ConfirmHandle>>, volatile: bool) {
        self.0.lock().buffered.push((seq, data, c, volatile));
    }
    fn ack(&mut self, seq: u64) -> Option<Arc<ConfirmHandle>> {
        let mut st = self.0.lock();
        st.acked.push(seq);
        if let Some(i) = st.buffered.iter().position(|b| b.0 == seq) {
            return st.buffered.remove(i).2;
        }
        st.written.remove(&seq);
        None
    }
    fn ack_range(
        &mut self,
        from: u64,
        to: u64,
        live: &dyn Fn(u64) -> bool,
    ) -> Vec<Arc<ConfirmHandle>> {
        (from..=to)
            .filter(|s| live(*s))
            .filter_map(|s| self.ack(s))
            .collect()
    }
    fn cursor_at_start(&self, first_seq: u64) -> warren_store::Cursor {
        warren_store::Cursor::from_seq(first_seq)
    }
    fn cursor_at_end(&self, next_seq: u64) -> warren_store::Cursor {
        warren_store::Cursor::from_seq(next_seq)
    }
    fn read(
        &self,
        cursor: &mut warren_store::Cursor,
        max_bytes: usize,
        keep: &dyn Fn(u64) -> bool,
    ) -> std::io::Result<Vec<(u64, Bytes)>> {
        let mut st = self.0.lock();
        st.reads += 1;
        let from = cursor.next_seq;
        let buffered = st.buffered.iter().map(|b| (b.0, b.1.clone()));
        let mut all: Vec<(u64, Bytes)> = st
            .written
            .range(from..)
            .map(|(s, (d, _))| (*s, d.clone()))
            .chain(buffered.filter(|b| b.0 >= from))
            .filter(|(s, _)| keep(*s))
            .collect();
        all.sort_by_key(|r| r.0);
        let (mut out, mut got) = (Vec::new(), 0);
        for (seq, data) in all {
            if got >= max_bytes {
                break;
            }
            got += data.len();
            cursor.next_seq = seq + 1;
            out.push((seq, data));
        }
        Ok(out)
    }
    fn write_pending(&mut self) -> warren_store::Written<Arc<ConfirmHandle>> {
        let mut st = self.0.lock();
        let pending = std::mem::take(&mut st.buffered);
        let tokens = pending.iter().filter_map(|b| b.2.clone()).collect();
        if st.fail_writes {
            let e = std::io::Error::other("no space left on device (fake)");
            return Err((e, tokens));
        }
        for (seq, data, _, volatile) in pending {
            st.bytes += data.len() as u64;
            st.written.insert(seq, (data, volatile));
        }
        Ok((tokens, Vec::new()))
    }
    fn bytes_written(&self) -> u64 {
        self.0.lock().bytes
    }
    fn destroy(self: Box<Self>) -> Vec<Arc<ConfirmHandle>> {
        let mut st = self.0.lock();
        st.destroyed = true;
        st.buffered.drain(..).filter_map(|b| b.2).collect()
    }
}

/// A durable queue over `log`, with a persister whose group commits the test runs.
fn logged_queue(
    log: &FakeLog,
    owner: &Arc<FakeOwner>,
) -> (Arc<Queue>, Arc<crate::persist::Persister>) {
    let persister = crate::persist::Persister::manual();
    let q = Queue::with_log(
        "q".into(),
        "/".into(),
        options(FieldTable::default(), true),
        Arc::downgrade(owner) as Weak<FakeOwner>,
        Some(Backing {
            persister: persister.clone(),
            durable: Some((
                1,
                QueueLogOf::Other(Box::new(log.clone())),
                Default::default(),
            )),
            scratch: None,
        }),
    );
    (q, persister)
}

/// Publishes `m` to `q` with confirm `seq` to `to`.
fn publish_confirmed(q: &Arc<Queue>, m: Arc<Message>, to: &Arc<Confirmed>, seq: u64) -> FannedOut {
    let to: Arc<dyn ConfirmTarget> = to.clone();
    fan_out(
        &m,
        &[QueueRef::Local(q.clone())],
        Some(ConfirmTo::Target(&to, seq)),
        |_| {},
    )
}

#[test]
fn only_a_persistent_message_is_logged_confirmed_after_its_write_and_its_ack_logged() {
    let (log, owner) = (FakeLog::default(), Arc::new(FakeOwner::default()));
    let (q, persister) = logged_queue(&log, &owner);
    let confirmed = Arc::new(Confirmed::default());
    let out = publish_confirmed(&q, msg("p", true), &confirmed, 1);
    assert_eq!(
        out,
        FannedOut::Pending,
        "a persistent message waits for its write"
    );
    let out = publish_confirmed(&q, msg("t", false), &confirmed, 2);
    assert_eq!(
        out,
        FannedOut::Settled { accepted: true },
        "a transient one does not"
    );
    assert_eq!(log.buffered(), [0], "only the persistent message is logged");
    assert!(
        confirmed.0.lock().is_empty(),
        "nothing confirmed before the write"
    );
    persister.commit_dirty();
    assert_eq!((log.written(), log.buffered()), (vec![0], vec![]));
    assert_eq!(*confirmed.0.lock(), [(1, true)]);
    let sink = Arc::new(FakeSink::default());
    let c = consumer(&q, &sink, 0, false);
    assert_eq!(sink.bodies(), ["p", "t"]);
    let got = sink.got.lock().clone();
    q.settle(got.into_iter().map(|m| (Some(c.key), m)), false);
    assert_eq!(
        log.0.lock().acked,
        [0],
        "only the logged message's ack is logged"
    );
    assert!(log.written().is_empty());
}

#[test]
fn a_write_that_fails_nacks_the_publish() {
    let (log, owner) = (FakeLog::default(), Arc::new(FakeOwner::default()));
    let (q, persister) = logged_queue(&log, &owner);
    log.0.lock().fail_writes = true;
    let confirmed = Arc::new(Confirmed::default());
    assert_eq!(
        publish_confirmed(&q, msg("p", true), &confirmed, 5),
        FannedOut::Pending
    );
    persister.commit_dirty();
    assert_eq!(*confirmed.0.lock(), [(5, false)], "never confirmed, nacked");
    // The disk came back: the next publish is written and confirmed.
    log.0.lock().fail_writes = false;
    publish_confirmed(&q, msg("p2", true), &confirmed, 6);
    persister.commit_dirty();
    assert_eq!(*confirmed.0.lock(), [(5, false), (6, true)]);
}

#[test]
fn a_message_acked_before_its_write_is_never_written() {
    let (log, owner) = (FakeLog::default(), Arc::new(FakeOwner::default()));
    let (q, persister) = logged_queue(&log, &owner);
    let sink = Arc::new(FakeSink::default());
    let c = consumer(&q, &sink, 0, false);
    let confirmed = Arc::new(Confirmed::default());
    publish_confirmed(&q, msg("p", true), &confirmed, 1);
    let m = sink.got.lock()[0].clone();
    q.settle([(Some(c.key), m)], false);
    assert_eq!(
        *confirmed.0.lock(),
        [(1, true)],
        "it left the queue: nothing to wait for"
    );
    persister.commit_dirty();
    assert!(log.written().is_empty() && log.buffered().is_empty());
}

#[test]
fn deleting_a_durable_queue_destroys_its_log() {
    let (log, owner) = (FakeLog::default(), Arc::new(FakeOwner::default()));
    let (q, _persister) = logged_queue(&log, &owner);
    let confirmed = Arc::new(Confirmed::default());
    publish_confirmed(&q, msg("p", true), &confirmed, 1);
    let (ready, _) = q.mark_deleted();
    assert_eq!(ready, 1);
    assert!(log.0.lock().destroyed);
    assert_eq!(
        *confirmed.0.lock(),
        [(1, true)],
        "a buffered confirm is answered"
    );
}

/// A non-durable queue past `limits::PAGE_OUT_MSGS` pages its tail out to a scratch log, made
/// once, and reads it back in order.
#[test]
fn a_long_transient_queue_pages_out_to_its_scratch_log_and_back_in_order() {
    let log = FakeLog::default();
    let opened = Arc::new(AtomicUsize::new(0));
    let (l, n) = (log.clone(), opened.clone());
    let owner = Arc::new(FakeOwner::default());
    let persister = crate::persist::Persister::manual();
    let q = Queue::with_log(
        "q".into(),
        "/".into(),
        options(FieldTable::default(), false),
        Arc::downgrade(&owner) as Weak<FakeOwner>,
        Some(Backing {
            persister: persister.clone(),
            durable: None,
            scratch: Some(Box::new(move || {
                n.fetch_add(1, Ordering::SeqCst);
                Ok(QueueLogOf::Other(Box::new(l.clone())))
            })),
        }),
    );
    let total = limits::PAGE_OUT_MSGS + 1000;
    let bodies: Vec<Bytes> = (0..total).map(|i| Bytes::from(i.to_string())).collect();
    for b in &bodies {
        assert_eq!(
            q.publish(msg_of(b.clone(), false), None),
            Enqueued::Accepted
        );
    }
    persister.commit_dirty();
    assert_eq!(opened.load(Ordering::SeqCst), 1, "one scratch log");
    let paged = log.written();
    assert!(!paged.is_empty(), "the tail is paged out");
    assert!(log.0.lock().written.values().all(|(_, volatile)| *volatile));
    assert_eq!(q.message_count() as usize, total);
    let sink = Arc::new(FakeSink::default());
    consumer(&q, &sink, 0, true);
    assert_eq!(sink.bodies(), bodies, "every message, in order");
    assert!(log.0.lock().reads > 0, "the tail was read back");
}
