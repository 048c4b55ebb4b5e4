//! The replicated queue on a real group of one member in a temporary directory: a recording
//! sink stands for a consumer's channel and a fake owner for the vhost. Publishes are
//! confirmed once applied, deliveries follow each consumer's credit, settlements and returns
//! go through the group, and a restart (the group reopened from its directory) gives back
//! what the queue held, what a gone consumer held marked redelivered.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable, FieldValue};

use super::ReplicatedQueue;
use crate::confirm::ConfirmHandle;
use crate::flow::SpaceWaiter;
use crate::message::Message;
use crate::queue::{
    Consumer, DeadRoute, DeliverySink, Offer, Queue, QueueArgs, QueueKind, QueueOptions,
    QueueOwner, QueueRef, QueuedMessage,
};

/// A consumer's channel: takes every delivery pushed to it.
#[derive(Default)]
struct Sink {
    got: Mutex<Vec<QueuedMessage>>,
    closed: AtomicBool,
}

impl DeliverySink for Sink {
    fn offer(&self, _c: &Arc<Consumer>, _q: &Arc<Queue>, _m: &QueuedMessage) -> Offer {
        Offer::NoCredit
    }
    fn wait_for_space(&self, _w: Arc<dyn SpaceWaiter>) -> bool {
        false
    }
    fn cancelled(&self, _c: &Consumer) {}
    fn push(&self, _c: &Arc<Consumer>, _q: QueueRef, m: &QueuedMessage) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        self.got.lock().push(m.clone());
        true
    }
}

impl Sink {
    fn bodies(&self) -> Vec<String> {
        self.got
            .lock()
            .iter()
            .map(|m| String::from_utf8_lossy(&m.msg.body).into_owned())
            .collect()
    }
}

/// The vhost: dead letters are recorded, and routed to `target` when there is one.
#[derive(Default)]
struct Owner {
    dead: Mutex<Vec<Bytes>>,
    target: Mutex<Option<QueueRef>>,
}

impl QueueOwner for Owner {
    fn route_dead_letter(
        &self,
        m: &Message,
        _extra_keys: &[ByteString],
        out: &mut Vec<QueueRef>,
    ) -> DeadRoute {
        self.dead.lock().push(m.body.clone());
        out.extend(self.target.lock().clone());
        DeadRoute::Routed
    }
    fn hold_dead_letter(
        self: Arc<Self>,
        _m: &Message,
        _delay_ms: u64,
        _confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Option<bool> {
        None
    }
    fn delete_unused_queue(&self, _name: &str) {}
}

fn dir(test: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("warren-rq-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn open(d: &std::path::Path, args: FieldTable, owner: &Arc<Owner>) -> Arc<ReplicatedQueue> {
    let mut args = args;
    args.insert(
        "x-queue-type",
        FieldValue::LongStr(Bytes::from_static(b"quorum")),
    );
    let options = QueueOptions {
        durable: true,
        exclusive_owner: None,
        auto_delete: false,
        args: QueueArgs::parse(&args, "queue 'q' in vhost '/'").expect("valid arguments"),
        arguments: args,
    };
    let owner: Weak<dyn QueueOwner> = Arc::downgrade(owner) as _;
    ReplicatedQueue::open(
        "q".into(),
        "/".into(),
        options,
        Some(1),
        d.join("group"),
        owner,
        super::Placement::alone(1, "warren@test".into()),
    )
}

fn msg(body: &str) -> Arc<Message> {
    Arc::new(Message {
        exchange: ByteString::from(""),
        routing_key: ByteString::from("q"),
        properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
        body: Bytes::copy_from_slice(body.as_bytes()),
        persistent: true,
        priority: None,
        expiration_ms: None,
        forwarded: crate::message::Forwarded::NONE,
    })
}

/// Publishes `bodies` and waits until every one is confirmed; returns how many were acked.
async fn publish_confirmed(q: &Arc<ReplicatedQueue>, bodies: &[&str]) -> usize {
    let acked = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    for b in bodies {
        let (a, d) = (acked.clone(), done.clone());
        let h = ConfirmHandle::then(move |ok| {
            if ok {
                a.fetch_add(1, Ordering::SeqCst);
            }
            d.fetch_add(1, Ordering::SeqCst);
        });
        q.publish(msg(b), Some(&h));
    }
    wait(|| done.load(Ordering::SeqCst) == bodies.len()).await;
    acked.load(Ordering::SeqCst)
}

async fn wait(mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out");
}

fn consumer(q: &Arc<ReplicatedQueue>, sink: &Arc<Sink>, key: u64, prefetch: u16) -> Arc<Consumer> {
    let c = Arc::new(Consumer {
        key,
        tag: ByteString::from("ctag"),
        sink: sink.clone(),
        queue: QueueRef::Other(q.clone()),
        no_ack: false,
        exclusive: false,
        priority: 0,
        prefetch,
        cancelled: AtomicBool::new(false),
        timeout_ms: None,
    });
    let added = AtomicBool::new(false);
    q.clone()
        .add_consumer(c.clone(), &mut || added.store(true, Ordering::SeqCst))
        .expect("consumes");
    assert!(added.load(Ordering::SeqCst));
    c
}

fn settle(
    q: &ReplicatedQueue,
    c: &Consumer,
    m: &QueuedMessage,
) -> impl Iterator<Item = crate::queue::Settled> {
    let _ = q;
    std::iter::once((Some(c.key), m.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_are_confirmed_and_delivered_within_each_consumers_credit() {
    let d = dir("credit");
    let owner = Arc::new(Owner::default());
    let q = open(&d, FieldTable::default(), &owner);
    assert_eq!(publish_confirmed(&q, &["a", "b", "c"]).await, 3);
    assert_eq!(q.message_count(), 3);
    let sink = Arc::new(Sink::default());
    let c = consumer(&q, &sink, 2, 2);
    wait(|| sink.got.lock().len() == 2).await;
    assert_eq!(sink.bodies(), ["a", "b"]);
    assert_eq!(q.unacked_count(), 2);
    let first = sink.got.lock()[0].clone();
    assert!(!first.redelivered);
    q.settle(&mut settle(&q, &c, &first));
    wait(|| sink.got.lock().len() == 3).await;
    assert_eq!(sink.bodies(), ["a", "b", "c"]);
    wait(|| q.unacked_count() == 2 && q.message_count() == 0).await;
    // A requeued delivery comes back redelivered, its x-delivery-count one more.
    let second = sink.got.lock()[1].clone();
    q.requeue(&mut settle(&q, &c, &second));
    // Credit: one held back for c, which holds "c" and now gets "b" again.
    wait(|| sink.got.lock().len() == 4).await;
    let again = sink.got.lock()[3].clone();
    assert_eq!(&again.msg.body[..], b"b");
    assert!(again.redelivered);
    let props = warren_protocol::properties::BasicProperties::decode(&again.msg.properties)
        .expect("properties");
    let count = props
        .headers
        .and_then(|h| h.get("x-delivery-count").cloned());
    assert_eq!(count.and_then(|v| v.as_i64()), Some(1));
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_get_takes_in_order_and_purge_empties() {
    let d = dir("get");
    let owner = Arc::new(Owner::default());
    let q = open(&d, FieldTable::default(), &owner);
    assert_eq!(publish_confirmed(&q, &["1", "2", "3"]).await, 3);
    let mut got = Vec::new();
    let took = q
        .clone()
        .get(false, &mut |m, left| got.push((m.msg.body.clone(), left)))
        .expect("get");
    assert!(took);
    assert_eq!(got, [(Bytes::from_static(b"1"), 2)]);
    assert_eq!(q.purge(), 2);
    let empty = q
        .clone()
        .get(false, &mut |_, _| panic!("nothing to get"))
        .expect("get");
    assert!(!empty);
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_queue_and_returns_what_a_gone_consumer_held() {
    let d = dir("restart");
    let owner = Arc::new(Owner::default());
    let q = open(&d, FieldTable::default(), &owner);
    assert_eq!(publish_confirmed(&q, &["1", "2", "3", "4", "5"]).await, 5);
    let sink = Arc::new(Sink::default());
    let c = consumer(&q, &sink, 3, 2);
    wait(|| sink.got.lock().len() == 2).await;
    let first = sink.got.lock()[0].clone();
    q.settle(&mut settle(&q, &c, &first));
    wait(|| q.message_count() == 2 && q.unacked_count() == 2).await;
    q.close().await;
    drop(q);
    // The node restarts: its consumer is gone, and what it held is back, redelivered.
    let q = open(&d, FieldTable::default(), &owner);
    wait(|| q.message_count() == 4 && q.unacked_count() == 0).await;

    let sink = Arc::new(Sink::default());
    let _c = consumer(&q, &sink, 4, 0);
    wait(|| sink.got.lock().len() == 4).await;
    let got: Vec<(String, bool)> = sink
        .got
        .lock()
        .iter()
        .map(|m| {
            (
                String::from_utf8_lossy(&m.msg.body).into_owned(),
                m.redelivered,
            )
        })
        .collect();
    // "2" and "3" were held (the ack of "1" made room for "3"): back, redelivered; "4" and
    // "5" were never delivered.
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("2".into(), true),
            ("3".into(), true),
            ("4".into(), false),
            ("5".into(), false)
        ],
        "{got:?}"
    );
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_delivery_limit_a_message_is_dead_lettered() {
    let d = dir("limit");
    let owner = Arc::new(Owner::default());
    let mut args = FieldTable::default();
    args.insert("x-delivery-limit", FieldValue::I32(1));
    args.insert(
        "x-dead-letter-exchange",
        FieldValue::LongStr(Bytes::from_static(b"dlx")),
    );
    let q = open(&d, args, &owner);
    assert_eq!(publish_confirmed(&q, &["m"]).await, 1);
    let sink = Arc::new(Sink::default());
    let c = consumer(&q, &sink, 5, 1);
    for n in 1..=2 {
        wait(|| sink.got.lock().len() == n).await;
        let m = sink.got.lock()[n - 1].clone();
        q.requeue(&mut settle(&q, &c, &m));
    }
    wait(|| owner.dead.lock().len() == 1).await;
    assert_eq!(&owner.dead.lock()[0][..], b"m");
    wait(|| q.message_count() == 0 && q.unacked_count() == 0).await;
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_more_entries_than_a_snapshot_takes_a_restart_still_has_the_backlog() {
    let d = dir("snapshot");
    let owner = Arc::new(Owner::default());
    let q = open(&d, FieldTable::default(), &owner);
    // Enough entries for a snapshot (every 1024), each a publish and a get with ack settled.
    churn(&q, 600).await;
    assert_eq!(publish_confirmed(&q, &["kept-1", "kept-2"]).await, 2);
    wait(|| q.message_count() == 2 && q.unacked_count() == 0).await;
    // The queue was empty at times, so a snapshot was taken and the log before it may go.
    wait(|| d.join("group").join("snapshot.bin").exists()).await;
    q.close().await;
    drop(q);
    assert_eq!(reopened_bodies(&d, &owner, 2).await, ["kept-1", "kept-2"]);
}

/// The queue in `d` opened again: the bodies of its `n` messages, taken by gets; then removed.
async fn reopened_bodies(d: &std::path::Path, owner: &Arc<Owner>, n: u32) -> Vec<Bytes> {
    let q = open(d, FieldTable::default(), owner);
    wait(|| q.message_count() == n).await;
    let mut got = Vec::new();
    while q
        .clone()
        .get(false, &mut |m, _| got.push(m.msg.body.clone()))
        .expect("get")
    {}
    q.close().await;
    let _ = std::fs::remove_dir_all(d);
    got
}

/// `n` publishes, each taken by a get with ack and settled: about two entries each (a settle
/// goes into the next entry, with the next publish).
async fn churn(q: &Arc<ReplicatedQueue>, n: usize) {
    for i in 0..n {
        let body = format!("c{i}");
        assert_eq!(publish_confirmed(q, &[&body]).await, 1);
        let mut got = None;
        q.clone()
            .get(true, &mut |m, _| {
                if m.msg.body.starts_with(b"c") {
                    got = Some(m.clone())
                }
            })
            .expect("get");
        if let Some(m) = got {
            q.settle(&mut std::iter::once((None, m)));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_at_the_release_cursor_keeps_the_bodies_of_a_queue_never_empty() {
    let d = dir("cursor");
    let owner = Arc::new(Owner::default());
    let q = open(&d, FieldTable::default(), &owner);
    // "head" stays while the first snapshot point (1,024 entries) passes (the machine there
    // holds it) ...
    assert_eq!(publish_confirmed(&q, &["head"]).await, 1);
    // (gets take the oldest: "head" is taken and kept aside until it is settled below)
    let mut head = None;
    q.clone()
        .get(true, &mut |m, _| head = Some(m.clone()))
        .expect("get");
    let head = head.expect("head");
    churn(&q, 700).await;
    q.settle(&mut std::iter::once((None, head)));
    // ... then leaves; "tail-1" and "tail-2" come after that point and stay: the next
    // snapshot is the machine at the first point, and the tails' bodies stay in the log.
    assert_eq!(publish_confirmed(&q, &["tail-1", "tail-2"]).await, 2);
    let mut tails = Vec::new();
    for _ in 0..2 {
        q.clone()
            .get(true, &mut |m, _| tails.push(m.clone()))
            .expect("get");
    }
    churn(&q, 1200).await;
    wait(|| d.join("group").join("snapshot.bin").exists()).await;
    // Returned (a closed channel's), the tails are ready again.
    q.requeue(&mut tails.into_iter().map(|m| (None, m)));
    wait(|| q.message_count() == 2 && q.unacked_count() == 0).await;
    q.close().await;
    drop(q);
    assert_eq!(reopened_bodies(&d, &owner, 2).await, ["tail-1", "tail-2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_dead_letters_stay_in_the_group_until_a_target_has_them() {
    let d = dir("dead-kept");
    let owner = Arc::new(Owner::default());
    let mut args = FieldTable::default();
    args.insert("x-delivery-limit", FieldValue::I32(0));
    args.insert(
        "x-dead-letter-exchange",
        FieldValue::LongStr(Bytes::from_static(b"dlx")),
    );
    args.insert(
        "x-dead-letter-strategy",
        FieldValue::LongStr(Bytes::from_static(b"at-least-once")),
    );
    args.insert(
        "x-overflow",
        FieldValue::LongStr(Bytes::from_static(b"reject-publish")),
    );
    let q = open(&d, args.clone(), &owner);
    assert_eq!(publish_confirmed(&q, &["m"]).await, 1);
    let sink = Arc::new(Sink::default());
    let c = consumer(&q, &sink, 6, 1);
    wait(|| sink.got.lock().len() == 1).await;
    let m = sink.got.lock()[0].clone();
    q.requeue(&mut settle(&q, &c, &m));
    // Unroutable: tried, and kept (tried again each second).
    wait(|| owner.dead.lock().len() >= 2).await;
    assert_eq!(q.sm.state.lock().machine.kept_dead().count(), 1);
    // Kept through a restart.
    q.close().await;
    drop(q);
    let q = open(&d, args, &owner);
    wait(|| owner.dead.lock().len() >= 3).await;
    assert_eq!(q.sm.state.lock().machine.kept_dead().count(), 1);
    // A target appears: it gets the dead letter, and the group forgets it.
    let dlq = Queue::new(
        "dlq".into(),
        "/".into(),
        QueueOptions {
            durable: false,
            exclusive_owner: None,
            auto_delete: false,
            args: QueueArgs::default(),
            arguments: FieldTable::default(),
        },
        Weak::<Owner>::new(),
    );
    *owner.target.lock() = Some(QueueRef::Local(dlq.clone()));
    wait(|| dlq.message_count() == 1).await;
    wait(|| q.sm.state.lock().machine.kept_dead().count() == 0).await;
    assert_eq!(dlq.message_count(), 1);
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Item 4's replay: the group's whole log, applied on a fresh member, gives the same machine
/// as the live one (apply reads nothing but the machine and the entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_groups_log_on_a_fresh_member_gives_the_same_machine() {
    let d = dir("replay");
    let owner = Arc::new(Owner::default());
    let mut args = FieldTable::default();
    args.insert("x-delivery-limit", FieldValue::I32(2));
    args.insert("x-message-ttl", FieldValue::I32(60_000));
    args.insert(
        "x-dead-letter-exchange",
        FieldValue::LongStr(Bytes::from_static(b"dlx")),
    );
    let q = open(&d, args, &owner);
    let bodies: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    assert_eq!(publish_confirmed(&q, &refs).await, 40);
    let sink = Arc::new(Sink::default());
    let c = consumer(&q, &sink, 7, 5);
    // Ack some, requeue some (three times over the limit for one), get one, purge the rest.
    let mut handled = 0;
    while handled < 20 {
        wait(|| sink.got.lock().len() > handled).await;
        let m = sink.got.lock()[handled].clone();
        if handled % 3 == 0 {
            q.requeue(&mut settle(&q, &c, &m));
        } else {
            q.settle(&mut settle(&q, &c, &m));
        }
        handled += 1;
    }
    q.detach(&c);
    let mut got = None;
    q.clone()
        .get(true, &mut |m, _| got = Some(m.clone()))
        .expect("get");
    assert!(got.is_some());
    q.purge();
    let (live, applied, config) = {
        let st = q.sm.state.lock();
        (st.machine.fingerprint(), st.applied, q.sm.fresh)
    };
    assert!(applied >= 5, "entries applied: {applied}");
    let log = q.sm.log.get().expect("the group's log").clone();
    let fresh = super::sm::GroupSm::new(config.0, config.1, true);
    let mut at = 1;
    while at <= applied {
        let read = log.read(at, 1 << 20).expect("the log reads back");
        assert!(!read.is_empty(), "entry {at} is in the log");
        for (index, cmd) in read {
            if index > applied {
                break;
            }
            if let Some(cmd) = cmd {
                warren_cluster::StateMachine::apply(&fresh, index, &cmd);
            }
            at = index + 1;
        }
    }
    assert_eq!(fresh.state.lock().machine.fingerprint(), live);
    q.close().await;
    let _ = std::fs::remove_dir_all(&d);
}
