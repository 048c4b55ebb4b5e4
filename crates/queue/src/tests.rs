//! The queue core against a naive model, and its invariants under random command sequences.
//! `Sim` is a host: consumers with prefetch, a log that pages in a few records at a time, a
//! virtual clock, and a record of every effect.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Msg {
    id: u32,
    size: u64,
    prio: Option<u8>,
    exp: Option<u64>,
}

impl Payload for Msg {
    fn body_len(&self) -> u64 {
        self.size
    }
    fn priority(&self) -> Option<u8> {
        self.prio
    }
    fn expiration_ms(&self) -> Option<u64> {
        self.exp
    }
}

#[derive(Debug, Default)]
struct SimConsumer {
    prefetch: usize,
    no_ack: bool,
    /// Refuses every offer (its connection's output is full).
    paused: bool,
    held: Vec<Entry<Msg>>,
}

#[derive(Debug, Default)]
struct Sim {
    now: u64,
    consumers: BTreeMap<u64, SimConsumer>,
    /// The log's tail: records of messages that live on disk only, in order.
    tail: VecDeque<Entry<Msg>>,
    paging: bool,
    can_page: bool,
    /// Seqs written to the log and not yet forgotten.
    logged: BTreeSet<u64>,
    dead: Vec<(u32, Reason)>,
    /// (consumer, id, redelivered, expires_at) for each delivery.
    delivered: Vec<(u64, u32, bool, Option<u64>)>,
    /// Ids that left the queue for good through the consumer side (no-ack deliveries).
    gone: BTreeSet<u32>,
    errors: Vec<String>,
}

impl Host<u64, Msg> for Sim {
    fn offer(&mut self, consumer: &u64, entry: &Entry<Msg>) -> Offer {
        let Some(c) = self.consumers.get_mut(consumer) else {
            self.errors
                .push(format!("offer to unknown consumer {consumer}"));
            return Offer::Refused;
        };
        if c.paused || (!c.no_ack && c.prefetch > 0 && c.held.len() >= c.prefetch) {
            return Offer::Refused;
        }
        self.delivered.push((
            *consumer,
            entry.msg.id,
            entry.redelivered,
            entry.expires_at_ms,
        ));
        if entry.expires_at_ms.is_some_and(|t| t < self.now) {
            self.errors.push(format!(
                "message {} delivered after its deadline",
                entry.msg.id
            ));
        }
        if c.no_ack {
            self.gone.insert(entry.msg.id);
        } else {
            c.held.push(entry.clone());
        }
        Offer::Taken
    }

    fn page_in(&mut self, remaining: usize, out: &mut Vec<Entry<Msg>>) -> PagedIn {
        // Three at a time, so reading back happens in the middle of everything.
        let mut r = PagedIn::default();
        while r.records < remaining.min(3) {
            let Some(e) = self.tail.pop_front() else {
                break;
            };
            r.records += 1;
            r.bytes += e.msg.size;
            out.push(e);
        }
        r
    }

    fn can_page(&mut self) -> bool {
        self.can_page
    }

    fn now(&mut self) -> u64 {
        self.now
    }

    fn effect(&mut self, effect: Effect<'_, Msg>) {
        match effect {
            Effect::PageOut { from_seq } => {
                if self.paging && !self.tail.is_empty() {
                    self.errors
                        .push(format!("page out again at {from_seq} with a tail"));
                }
                self.paging = true;
            }
            Effect::Append { entry, paged } => {
                if !self.logged.insert(entry.seq) {
                    self.errors
                        .push(format!("seq {} appended twice", entry.seq));
                }
                if paged {
                    let mut e = entry.clone();
                    e.logged = true;
                    self.tail.push_back(e);
                }
            }
            Effect::Forget { seq } => {
                if !self.logged.remove(&seq) {
                    self.errors
                        .push(format!("seq {seq} forgotten but not logged"));
                }
            }
            Effect::ForgetTail { last_seq } => {
                for e in self.tail.drain(..) {
                    if e.seq > last_seq {
                        self.errors
                            .push(format!("tail seq {} past {last_seq}", e.seq));
                    }
                    self.logged.remove(&e.seq);
                }
            }
            Effect::DeadLetter(m, r) => self.dead.push((m.id, r)),
        }
    }
}

type Q = State<u64, Msg>;

fn msg(id: u32, size: u64, prio: Option<u8>, exp: Option<u64>) -> Msg {
    Msg {
        id,
        size,
        prio,
        exp,
    }
}

fn consumer(key: u64, priority: i64) -> Consumer<u64> {
    Consumer {
        key,
        handle: key,
        priority,
        no_ack: false,
        exclusive: false,
    }
}

fn sim_with(keys: &[(u64, usize)]) -> Sim {
    let mut s = Sim::default();
    for &(k, prefetch) in keys {
        s.consumers.insert(
            k,
            SimConsumer {
                prefetch,
                ..Default::default()
            },
        );
    }
    s
}

#[test]
fn round_robin_within_a_priority_and_higher_priority_first() {
    let mut s = sim_with(&[(1, 0), (2, 0), (3, 0)]);
    let mut q = Q::new(Config::default(), Limits::default(), 0);
    q.add_consumer(consumer(1, 0), 0).unwrap();
    q.add_consumer(consumer(2, 0), 0).unwrap();
    for i in 0..4 {
        q.publish(msg(i, 1, None, None), false, &mut s);
    }
    let to: Vec<u64> = s.delivered.iter().map(|d| d.0).collect();
    assert_eq!(to, [1, 2, 1, 2]);
    q.add_consumer(consumer(3, 5), 0).unwrap();
    for i in 4..7 {
        q.publish(msg(i, 1, None, None), false, &mut s);
    }
    let to: Vec<u64> = s.delivered[4..].iter().map(|d| d.0).collect();
    assert_eq!(to, [3, 3, 3]);
}

#[test]
fn single_active_consumer_feeds_only_the_first_and_hands_over_on_cancel() {
    let mut s = sim_with(&[(1, 0), (2, 0)]);
    let config = Config {
        single_active_consumer: true,
        ..Config::default()
    };
    let mut q = Q::new(config, Limits::default(), 0);
    q.add_consumer(consumer(1, 0), 0).unwrap();
    q.add_consumer(consumer(2, 0), 0).unwrap();
    q.publish(msg(0, 1, None, None), false, &mut s);
    s.consumers.get_mut(&1).unwrap().paused = true;
    q.publish(msg(1, 1, None, None), false, &mut s);
    assert_eq!(s.delivered.len(), 1, "the inactive consumer got nothing");
    let (removed, _) = q.remove_consumer(1, &mut s);
    assert!(removed.is_some());
    assert_eq!(s.delivered.last().unwrap().0, 2);
    assert_eq!(s.delivered.last().unwrap().1, 1);
}

#[test]
fn ttl_zero_reaches_a_waiting_consumer_and_expires_otherwise() {
    let mut s = sim_with(&[(1, 1)]);
    let limits = Limits {
        message_ttl_ms: Some(0),
        ..Limits::default()
    };
    let mut q = Q::new(Config::default(), limits, 0);
    q.add_consumer(consumer(1, 0), 0).unwrap();
    q.publish(msg(0, 1, None, None), false, &mut s);
    q.publish(msg(1, 1, None, None), false, &mut s);
    assert_eq!(s.delivered.len(), 1);
    assert_eq!(s.dead, [(1, Reason::Expired)]);
    assert_eq!(q.ready_len(), 0);
}

#[test]
fn an_expired_message_behind_a_live_head_is_dropped_when_it_reaches_the_head() {
    let mut s = Sim::default();
    let mut q = Q::new(Config::default(), Limits::default(), 0);
    q.publish(msg(0, 1, None, Some(100)), false, &mut s);
    q.publish(msg(1, 1, None, Some(10)), false, &mut s);
    q.publish(msg(2, 1, None, None), false, &mut s);
    s.now = 50;
    q.expire(50, &mut s);
    assert_eq!(q.ready_len(), 3, "expiry looks at the head only");
    let (m, left) = q.get(false, &mut s).unwrap();
    assert_eq!(m.msg.id, 0);
    assert_eq!(
        left, 1,
        "the expired one behind is gone before get-ok's count"
    );
    assert_eq!(s.dead, [(1, Reason::Expired)]);
}

#[test]
fn requeue_restores_position_and_drop_head_applies_after_it() {
    let mut s = sim_with(&[(1, 0)]);
    let limits = Limits {
        max_length: Some(2),
        ..Limits::default()
    };
    let mut q = Q::new(Config::default(), limits, 0);
    q.add_consumer(consumer(1, 0), 0).unwrap();
    q.publish(msg(0, 1, None, None), false, &mut s);
    s.consumers.get_mut(&1).unwrap().paused = true;
    q.publish(msg(1, 1, None, None), false, &mut s);
    q.publish(msg(2, 1, None, None), false, &mut s);
    let held = std::mem::take(&mut s.consumers.get_mut(&1).unwrap().held);
    q.requeue(held, &mut s);
    // 0 went back to the head, which made three: the head (0, redelivered) is dropped.
    assert_eq!(s.dead, [(0, Reason::MaxLen)]);
    let (m, _) = q.get(false, &mut s).unwrap();
    assert_eq!((m.msg.id, m.redelivered), (1, false));
}

#[test]
fn reject_publish_dlx_dead_letters_the_refused_message() {
    let mut s = Sim::default();
    let limits = Limits {
        max_length: Some(1),
        overflow: Overflow::RejectPublishDlx,
        ..Limits::default()
    };
    let mut q = Q::new(Config::default(), limits, 0);
    assert!(matches!(
        q.publish(msg(0, 1, None, None), false, &mut s),
        Published::Accepted { .. }
    ));
    assert_eq!(
        q.publish(msg(1, 1, None, None), false, &mut s),
        Published::Rejected
    );
    assert_eq!(s.dead, [(1, Reason::MaxLen)]);
}

#[test]
fn a_no_ack_delivery_of_a_logged_message_cancels_its_write() {
    let mut s = Sim::default();
    s.consumers.insert(
        1,
        SimConsumer {
            no_ack: true,
            ..Default::default()
        },
    );
    let mut q = Q::new(Config::default(), Limits::default(), 0);
    let mut c = consumer(1, 0);
    c.no_ack = true;
    q.add_consumer(c, 0).unwrap();
    q.publish(msg(0, 1, None, None), true, &mut s);
    assert!(s.logged.is_empty(), "appended, then forgotten at once");
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[test]
fn a_paged_tail_is_read_back_in_order_and_purged_with_one_record() {
    let mut s = Sim {
        can_page: true,
        ..Sim::default()
    };
    let config = Config {
        page_out_msgs: 2,
        ..Config::default()
    };
    let mut q = Q::new(config, Limits::default(), 0);
    for i in 0..10 {
        q.publish(msg(i, 1, None, None), false, &mut s);
    }
    assert_eq!(q.paged_len(), 8);
    assert_eq!(s.tail.len(), 8);
    let ids: Vec<u32> = (0..5)
        .map(|_| q.get(false, &mut s).unwrap().0.msg.id)
        .collect();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert_eq!(q.purge(&mut s), 5);
    assert!(s.tail.is_empty() && s.logged.is_empty());
    q.check_invariants().unwrap();
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[test]
fn a_recovered_priority_queue_reads_everything_into_its_levels() {
    let mut s = Sim::default();
    for (seq, p) in [(0u64, 0u8), (1, 3), (2, 1)] {
        s.tail.push_back(Entry {
            seq,
            msg: msg(seq as u32, 2, Some(p), None),
            redelivered: true,
            expires_at_ms: None,
            logged: true,
        });
        s.logged.insert(seq);
    }
    let config = Config {
        max_priority: Some(5),
        ..Config::default()
    };
    let mut q = Q::new(config, Limits::default(), 0);
    q.recover(3, 3, 6, &mut s);
    q.check_invariants().unwrap();
    let ids: Vec<u32> = (0..3)
        .map(|_| q.get(false, &mut s).unwrap().0.msg.id)
        .collect();
    assert_eq!(ids, [1, 2, 0]);
}

#[test]
fn an_unreadable_tail_is_dropped_from_the_counts() {
    let mut s = Sim {
        can_page: true,
        ..Sim::default()
    };
    let config = Config {
        page_out_msgs: 1,
        ..Config::default()
    };
    let mut q = Q::new(config, Limits::default(), 0);
    for i in 0..4 {
        q.publish(msg(i, 3, None, None), false, &mut s);
    }
    s.tail.clear();
    assert_eq!(q.get(false, &mut s).unwrap().0.msg.id, 0);
    assert!(q.get(false, &mut s).is_none());
    assert_eq!((q.ready_len(), q.ready_bytes()), (0, 0));
    q.check_invariants().unwrap();
}

// ---- the naive model ----

/// A queue as a list: the head is the lowest seq of the highest level present.
#[derive(Debug, Default)]
struct Model {
    next_seq: u64,
    max_priority: Option<u8>,
    limits: Limits,
    ready: Vec<(u64, Msg, bool, Option<u64>)>,
    dead: Vec<(u32, Reason)>,
    /// Once a message had a deadline, every publish checks deadlines (the core's `may_expire`).
    deadlines: bool,
}

impl Model {
    fn level(&self, m: &Msg) -> u8 {
        self.max_priority
            .map_or(0, |max| m.prio.unwrap_or(0).min(max))
    }
    fn head_of(&self, level: Option<u8>) -> Option<usize> {
        let top = match level {
            Some(l) => l,
            None => self.ready.iter().map(|r| self.level(&r.1)).max()?,
        };
        self.ready
            .iter()
            .enumerate()
            .filter(|(_, r)| self.level(&r.1) == top)
            .min_by_key(|(_, r)| r.0)
            .map(|(i, _)| i)
    }
    fn len_bytes(&self) -> (u64, u64) {
        (
            self.ready.len() as u64,
            self.ready.iter().map(|r| r.1.size).sum(),
        )
    }
    fn full(&self, adding: Option<u64>) -> bool {
        let (n, b) = self.len_bytes();
        let (extra, bytes) = adding.map_or((0, 0), |b| (1, b));
        self.limits.max_length.is_some_and(|m| n + extra > m)
            || self.limits.max_length_bytes.is_some_and(|m| b + bytes > m)
    }
    fn expire(&mut self, now: u64) {
        let levels: BTreeSet<u8> = self.ready.iter().map(|r| self.level(&r.1)).collect();
        for l in levels {
            while let Some(i) = self.head_of(Some(l)) {
                if self.ready[i].3.is_none_or(|t| t > now) {
                    break;
                }
                let r = self.ready.remove(i);
                self.dead.push((r.1.id, Reason::Expired));
            }
        }
    }
    fn drop_head(&mut self) {
        if self.limits.overflow != Overflow::DropHead {
            return;
        }
        while self.full(None) {
            let Some(i) = self.head_of(None) else { break };
            let r = self.ready.remove(i);
            self.dead.push((r.1.id, Reason::MaxLen));
        }
    }
    fn publish(&mut self, m: Msg, now: u64) -> bool {
        if self.limits.overflow != Overflow::DropHead && self.full(Some(m.size)) {
            if self.limits.overflow == Overflow::RejectPublishDlx {
                self.dead.push((m.id, Reason::MaxLen));
            }
            return false;
        }
        let ttl = match (self.limits.message_ttl_ms, m.exp) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        let exp = ttl.map(|t| now + t);
        let was_empty = self.ready.is_empty();
        self.ready.push((self.next_seq, m, false, exp));
        self.next_seq += 1;
        self.deadlines |= exp.is_some();
        if exp.is_some() || (!was_empty && self.deadlines) {
            self.expire(now);
        }
        self.drop_head();
        true
    }
    fn get(&mut self, now: u64) -> Option<(u64, Msg, bool, Option<u64>, u32)> {
        self.expire(now);
        let i = self.head_of(None)?;
        let r = self.ready.remove(i);
        self.expire(now);
        Some((r.0, r.1, r.2, r.3, self.ready.len() as u32))
    }
    fn requeue(&mut self, back: Vec<(u64, Msg, bool, Option<u64>)>, now: u64) {
        for (seq, m, _, exp) in back {
            self.ready.push((seq, m, true, exp));
        }
        self.drop_head();
        self.expire(now);
    }
}

#[derive(Debug, Clone)]
enum ModelOp {
    Publish {
        size: u64,
        prio: Option<u8>,
        exp: Option<u64>,
    },
    Get {
        ack: bool,
    },
    AckAll,
    RejectAll,
    RequeueAll,
    Advance(u64),
    Expire,
    Purge,
    SetLimits(Limits),
}

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (
        proptest::option::of(0u64..6),
        proptest::option::of(0u64..40),
        prop_oneof![
            Just(Overflow::DropHead),
            Just(Overflow::RejectPublish),
            Just(Overflow::RejectPublishDlx)
        ],
        proptest::option::of(0u64..20),
    )
        .prop_map(
            |(max_length, max_length_bytes, overflow, message_ttl_ms)| Limits {
                max_length,
                max_length_bytes,
                overflow,
                message_ttl_ms,
            },
        )
}

fn model_op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        6 => (0u64..10, proptest::option::of(0u8..5), proptest::option::of(0u64..20))
            .prop_map(|(size, prio, exp)| ModelOp::Publish { size, prio, exp }),
        4 => any::<bool>().prop_map(|ack| ModelOp::Get { ack }),
        1 => Just(ModelOp::AckAll),
        1 => Just(ModelOp::RejectAll),
        1 => Just(ModelOp::RequeueAll),
        2 => (0u64..8).prop_map(ModelOp::Advance),
        1 => Just(ModelOp::Expire),
        1 => Just(ModelOp::Purge),
        1 => limits_strategy().prop_map(ModelOp::SetLimits),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// With no consumers, the core and the naive model agree on every answer, every dead letter
    /// and every count, whether or not the queue pages out and whatever its priorities.
    #[test]
    fn agrees_with_the_model(
        ops in proptest::collection::vec(model_op(), 0..80),
        limits in limits_strategy(),
        max_priority in proptest::option::of(0u8..3),
        page_out_msgs in 1usize..6,
        logged in any::<bool>(),
    ) {
        let mut s = Sim { can_page: true, ..Sim::default() };
        let config = Config { max_priority, page_out_msgs, ..Config::default() };
        let mut q = Q::new(config, limits, 0);
        let mut m = Model { max_priority, limits, ..Model::default() };
        let mut held: Vec<Entry<Msg>> = Vec::new();
        let mut mheld: Vec<(u64, Msg, bool, Option<u64>)> = Vec::new();
        let mut id = 0;
        for op in ops {
            match op {
                ModelOp::Publish { size, prio, exp } => {
                    let x = msg(id, size, prio, exp);
                    id += 1;
                    let got = q.publish(x.clone(), logged, &mut s);
                    let want = m.publish(x, s.now);
                    prop_assert_eq!(matches!(got, Published::Accepted { .. }), want);
                }
                ModelOp::Get { ack } => {
                    let got = q.get(ack, &mut s);
                    let want = m.get(s.now);
                    prop_assert_eq!(
                        got.as_ref().map(|(e, n)| (e.seq, e.msg.id, e.redelivered, *n)),
                        want.as_ref().map(|w| (w.0, w.1.id, w.2, w.4))
                    );
                    if let (Some((e, _)), Some(w)) = (got, want) {
                        if ack {
                            held.push(e);
                            mheld.push((w.0, w.1, w.2, w.3));
                        }
                    }
                }
                ModelOp::AckAll => {
                    q.settle(held.drain(..), true, &mut s);
                    mheld.clear();
                    m.expire(s.now);
                }
                ModelOp::RejectAll => {
                    q.discard(held.drain(..), true, &mut s);
                    for r in mheld.drain(..) {
                        m.dead.push((r.1.id, Reason::Rejected));
                    }
                    m.expire(s.now);
                }
                ModelOp::RequeueAll => {
                    q.requeue(held.drain(..), &mut s);
                    m.requeue(std::mem::take(&mut mheld), s.now);
                }
                ModelOp::Advance(ms) => s.now += ms,
                ModelOp::Expire => {
                    q.expire(s.now, &mut s);
                    m.expire(s.now);
                }
                ModelOp::Purge => {
                    let n = q.purge(&mut s);
                    prop_assert_eq!(n as usize, m.ready.len());
                    m.ready.clear();
                }
                ModelOp::SetLimits(l) => {
                    q.set_limits(l);
                    m.limits = l;
                }
            }
            prop_assert_eq!(&s.dead, &m.dead);
            let (n, b) = m.len_bytes();
            prop_assert_eq!((q.ready_len() as u64, q.ready_bytes()), (n, b));
            prop_assert_eq!(q.unacked(), held.len());
            q.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert!(s.errors.is_empty(), "{:?}", s.errors);
        }
    }
}

// ---- invariants with consumers ----

#[derive(Debug, Clone)]
enum Op {
    Publish {
        size: u64,
        prio: Option<u8>,
        exp: Option<u64>,
        logged: bool,
    },
    Get {
        ack: bool,
    },
    Consume {
        key: u64,
        priority: i64,
        prefetch: usize,
        no_ack: bool,
        exclusive: bool,
    },
    Cancel {
        key: u64,
    },
    /// A consumer settles what it holds: ack, reject or requeue, with or without dispatch.
    Settle {
        key: u64,
        how: u8,
        dispatch: bool,
    },
    Pause {
        key: u64,
        paused: bool,
    },
    Dispatch,
    Advance(u64),
    Expire,
    Purge,
    SetLimits(Limits),
    Delete,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..10, proptest::option::of(0u8..4), proptest::option::of(0u64..20), any::<bool>())
            .prop_map(|(size, prio, exp, logged)| Op::Publish { size, prio, exp, logged }),
        2 => any::<bool>().prop_map(|ack| Op::Get { ack }),
        3 => (0u64..4, -1i64..2, 0usize..3, any::<bool>(), proptest::bool::weighted(0.1))
            .prop_map(|(key, priority, prefetch, no_ack, exclusive)| Op::Consume { key, priority, prefetch, no_ack, exclusive }),
        1 => (0u64..4).prop_map(|key| Op::Cancel { key }),
        4 => (0u64..5, 0u8..3, proptest::bool::weighted(0.9))
            .prop_map(|(key, how, dispatch)| Op::Settle { key, how, dispatch }),
        2 => (0u64..4, any::<bool>()).prop_map(|(key, paused)| Op::Pause { key, paused }),
        1 => Just(Op::Dispatch),
        2 => (0u64..8).prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => Just(Op::Purge),
        1 => limits_strategy().prop_map(Op::SetLimits),
        1 => Just(Op::Delete),
    ]
}

/// Where each accepted message is: exactly one of ready, held by a consumer or a get, or gone.
fn check_conservation(
    q: &Q,
    s: &Sim,
    gets: &[Entry<Msg>],
    accepted: &BTreeSet<u32>,
    finished: &BTreeSet<u32>,
) -> Result<(), String> {
    let mut seen = BTreeMap::<u32, &str>::new();
    let mut place = |id: u32, at: &'static str| match seen.insert(id, at) {
        Some(prev) => Err(format!("message {id} both {prev} and {at}")),
        None => Ok(()),
    };
    for e in q.ready.iter().flatten() {
        place(e.msg.id, "ready")?;
    }
    for e in &s.tail {
        place(e.msg.id, "paged")?;
    }
    for c in s.consumers.values() {
        for e in &c.held {
            place(e.msg.id, "held")?;
        }
    }
    for e in gets {
        place(e.msg.id, "got")?;
    }
    for id in finished {
        place(*id, "finished")?;
    }
    let all: BTreeSet<u32> = seen.keys().copied().collect();
    if &all != accepted {
        let missing: Vec<_> = accepted.difference(&all).collect();
        let extra: Vec<_> = all.difference(accepted).collect();
        return Err(format!("lost {missing:?}, invented {extra:?}"));
    }
    Ok(())
}

/// Runs `ops` against a fresh queue, checking every invariant after each.
fn run_ops(ops: Vec<Op>, config: Config, limits: Limits) -> Result<(), String> {
    let mut s = Sim {
        can_page: true,
        ..Sim::default()
    };
    let mut q = Q::new(config, limits, 0);
    let mut gets: Vec<Entry<Msg>> = Vec::new();
    let mut accepted = BTreeSet::new();
    let mut finished = BTreeSet::new();
    let mut owed_dispatch = false;
    let mut id = 0u32;
    for op in ops {
        let dead_before = s.dead.len();
        let delivered_before = s.delivered.len();
        let mut dispatched = true;
        let mut just_published = None;
        match op {
            Op::Publish {
                size,
                prio,
                exp,
                logged,
            } => {
                let x = msg(id, size, prio, exp);
                just_published = Some(id);
                id += 1;
                match q.publish(x, logged, &mut s) {
                    Published::Accepted { .. } => {
                        accepted.insert(id - 1);
                        let l = q.limits;
                        // Within the limits after an accepted publish, whatever the mode.
                        if l.max_length.is_some_and(|m| q.ready_len() as u64 > m)
                            || l.max_length_bytes.is_some_and(|m| q.ready_bytes() > m)
                        {
                            return Err("over a length limit after a publish".into());
                        }
                    }
                    // Refused and dead-lettered: it still exists, at the dead-letter exchange.
                    // A refused publish does not dispatch.
                    Published::Rejected => {
                        dispatched = false;
                        if s.dead[dead_before..].iter().any(|d| d.0 == id - 1) {
                            accepted.insert(id - 1);
                        }
                    }
                    Published::Gone => dispatched = false,
                }
            }
            Op::Get { ack } => {
                dispatched = false;
                if let Some((e, _)) = q.get(ack, &mut s) {
                    if e.expires_at_ms.is_some_and(|t| t <= s.now) {
                        return Err(format!("got message {} past its deadline", e.msg.id));
                    }
                    if ack {
                        gets.push(e);
                    } else {
                        finished.insert(e.msg.id);
                    }
                }
            }
            Op::Consume {
                key,
                priority,
                prefetch,
                no_ack,
                exclusive,
            } => {
                if let std::collections::btree_map::Entry::Vacant(v) = s.consumers.entry(key) {
                    v.insert(SimConsumer {
                        prefetch,
                        no_ack,
                        ..Default::default()
                    });
                    let c = Consumer {
                        key,
                        handle: key,
                        priority,
                        no_ack,
                        exclusive,
                    };
                    if q.add_consumer(c, s.now).is_ok() {
                        q.dispatch(&mut s);
                    } else {
                        s.consumers.remove(&key);
                        dispatched = false;
                    }
                } else {
                    dispatched = false;
                }
            }
            Op::Cancel { key } => {
                if s.consumers.contains_key(&key) {
                    let (removed, _) = q.remove_consumer(key, &mut s);
                    let c = s.consumers.remove(&key).unwrap_or_default();
                    if removed.is_none() && !q.is_deleted() {
                        return Err(format!("consumer {key} was not in the queue"));
                    }
                    // Its unacked deliveries go back, as a channel close does (nowhere, once
                    // the queue is deleted).
                    if q.is_deleted() {
                        finished.extend(c.held.iter().map(|e| e.msg.id));
                    }
                    q.requeue(c.held, &mut s);
                } else {
                    dispatched = false;
                }
            }
            Op::Settle { key, how, dispatch } => {
                let held = if key == 4 {
                    std::mem::take(&mut gets)
                } else {
                    s.consumers
                        .get_mut(&key)
                        .map(|c| std::mem::take(&mut c.held))
                        .unwrap_or_default()
                };
                match how {
                    0 => {
                        finished.extend(held.iter().map(|e| e.msg.id));
                        q.settle(held, dispatch, &mut s);
                    }
                    1 => {
                        finished.extend(held.iter().map(|e| e.msg.id));
                        q.discard(held, dispatch, &mut s);
                    }
                    _ => {
                        if q.is_deleted() {
                            finished.extend(held.iter().map(|e| e.msg.id));
                        }
                        q.requeue(held, &mut s)
                    }
                }
                dispatched = dispatch || how == 2;
                if !dispatched {
                    owed_dispatch = true;
                }
            }
            Op::Pause { key, paused } => {
                if let Some(c) = s.consumers.get_mut(&key) {
                    c.paused = paused;
                    owed_dispatch |= !paused;
                }
                dispatched = false;
            }
            Op::Dispatch => q.dispatch(&mut s),
            Op::Advance(ms) => {
                s.now += ms;
                dispatched = false;
            }
            Op::Expire => {
                q.expire(s.now, &mut s);
                dispatched = false;
            }
            Op::Purge => {
                let before: Vec<u32> = q
                    .ready
                    .iter()
                    .flatten()
                    .map(|e| e.msg.id)
                    .chain(s.tail.iter().map(|e| e.msg.id))
                    .collect();
                let n = q.purge(&mut s);
                if n as usize != before.len() {
                    return Err(format!("purge said {n}, held {}", before.len()));
                }
                finished.extend(before);
                dispatched = false;
            }
            Op::SetLimits(l) => {
                q.set_limits(l);
                dispatched = false;
            }
            Op::Delete => {
                let before: Vec<u32> = q
                    .ready
                    .iter()
                    .flatten()
                    .map(|e| e.msg.id)
                    .chain(s.tail.iter().map(|e| e.msg.id))
                    .collect();
                q.delete(&mut s);
                finished.extend(before);
            }
        }
        for (i, (_, mid, _, exp)) in s.delivered[delivered_before..].iter().enumerate() {
            // A deadline equal to now is delivered only as a message that found the queue empty.
            if exp.is_some_and(|t| t == s.now) && (just_published != Some(*mid) || i > 0) {
                return Err(format!("message {mid} delivered at its deadline"));
            }
        }
        finished.extend(s.dead[dead_before..].iter().map(|d| d.0));
        finished.extend(std::mem::take(&mut s.gone));
        if dispatched {
            owed_dispatch = false;
        }
        // Work-conserving: after a dispatch, nothing ready may be left for a consumer that can
        // take it.
        if !owed_dispatch && q.ready_len() > 0 && !q.is_deleted() {
            let n = if q.config.single_active_consumer {
                q.consumers.len().min(1)
            } else {
                q.consumers.len()
            };
            for c in &q.consumers[..n] {
                let sc = &s.consumers[&c.key];
                if !sc.paused && (sc.no_ack || sc.prefetch == 0 || sc.held.len() < sc.prefetch) {
                    // Unless everything left is expired and waiting behind the head.
                    return Err(format!("consumer {} could take a ready message", c.key));
                }
            }
        }
        if q.unacked() != gets.len() + s.consumers.values().map(|c| c.held.len()).sum::<usize>()
            && !q.is_deleted()
        {
            return Err("unacked count differs from what is held".into());
        }
        if let Some(m) = s.delivered[delivered_before..].iter().find(|d| {
            q.config.single_active_consumer
                && Some(d.0) != q.consumers.first().map(|c| c.key)
                && !q.consumers.is_empty()
        }) {
            return Err(format!(
                "single active consumer: {} delivered to {}",
                m.1, m.0
            ));
        }
        q.check_invariants()?;
        check_conservation(&q, &s, &gets, &accepted, &finished)?;
        if let Some(e) = s.errors.first() {
            return Err(e.clone());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Random commands with consumers: every message accounted for exactly once, dispatch
    /// work-conserving, deadlines and limits kept, bookkeeping true.
    #[test]
    fn invariants_hold(
        ops in proptest::collection::vec(op(), 0..100),
        limits in limits_strategy(),
        max_priority in proptest::option::of(0u8..3),
        sac in proptest::bool::weighted(0.2),
        page_out_msgs in 1usize..8,
    ) {
        let config = Config { max_priority, single_active_consumer: sac, page_out_msgs, ..Config::default() };
        run_ops(ops, config, limits).map_err(TestCaseError::fail)?;
    }
}
