//! The queue core against a naive model, and its invariants under random command sequences
//! (the simulated host and the checker are in `testing`).

use std::collections::BTreeSet;

use proptest::prelude::*;

use crate::testing::*;
use crate::*;

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
fn credit_is_spent_by_deliveries_and_given_back_by_settles_naming_the_consumer() {
    let mut s = sim_with(&[(1, 2)]);
    let mut q = Q::new(Config::default(), Limits::default(), 0);
    let mut c = consumer(1, 0);
    c.prefetch = 2;
    q.add_consumer(c, 0).unwrap();
    for i in 0..5 {
        q.publish(msg(i, 1, None, None), false, &mut s);
    }
    assert_eq!(s.delivered.len(), 2, "two of credit");
    assert_eq!(q.consumers()[0].outstanding, 2);
    // A settle that names no consumer (a basic.get's) gives no credit.
    let (got, _) = q.get(true, &mut s).unwrap();
    q.settle([(None, got)], true, &mut s);
    assert_eq!(s.delivered.len(), 2);
    let first = s.consumers.get_mut(&1).unwrap().held.remove(0);
    q.settle([(Some(1), first)], true, &mut s);
    assert_eq!(s.delivered.len(), 3, "one settled, one more delivered");
    let back = s.consumers.get_mut(&1).unwrap().held.remove(0);
    q.requeue([(Some(1), back)], &mut s);
    assert_eq!(s.delivered.len(), 4, "a requeue gives credit back too");
    assert_eq!(s.delivered[3].1, 1, "the requeued message first");
    assert!(s.delivered[3].2, "marked redelivered");
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[test]
fn starving_while_nothing_is_ready_and_a_consumer_of_the_priority_has_credit() {
    let mut s = sim_with(&[(1, 1), (2, 0)]);
    let mut q = Q::new(Config::default(), Limits::default(), 0);
    assert!(!q.starving(0), "no consumer");
    // A federation link's consumer (priority -1) does not count for priority 0.
    q.add_consumer(consumer(2, -1), 0).unwrap();
    assert!(!q.starving(0));
    assert!(q.starving(-1));
    q.remove_consumer(2, &mut s);
    let mut c = consumer(1, 0);
    c.prefetch = 1;
    q.add_consumer(c, 0).unwrap();
    assert!(q.starving(0), "empty, with credit");
    q.publish(msg(0, 1, None, None), false, &mut s);
    assert!(!q.starving(0), "its one credit spent");
    q.publish(msg(1, 1, None, None), false, &mut s);
    let held = s.consumers.get_mut(&1).unwrap().held.remove(0);
    q.settle([(Some(1), held)], true, &mut s);
    assert_eq!(s.delivered.len(), 2, "the second delivered on the settle");
    assert!(!q.starving(0), "its credit spent again");
    let held = s.consumers.get_mut(&1).unwrap().held.remove(0);
    q.settle([(Some(1), held)], true, &mut s);
    assert!(q.starving(0));
    assert!(!q.starving(1), "no consumer of priority 1");
    assert!(s.errors.is_empty(), "{:?}", s.errors);
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
    let mut c = consumer(1, 0);
    c.prefetch = 1;
    q.add_consumer(c, 0).unwrap();
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
    q.requeue(held.into_iter().map(|e| (Some(1), e)), &mut s);
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
                    q.settle(held.drain(..).map(|e| (None, e)), true, &mut s);
                    mheld.clear();
                    m.expire(s.now);
                }
                ModelOp::RejectAll => {
                    q.discard(held.drain(..).map(|e| (None, e)), true, &mut s);
                    for r in mheld.drain(..) {
                        m.dead.push((r.1.id, Reason::Rejected));
                    }
                    m.expire(s.now);
                }
                ModelOp::RequeueAll => {
                    q.requeue(held.drain(..).map(|e| (None, e)), &mut s);
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The fuzz target's decoding, on random bytes: never panics, and the run keeps every
    /// invariant.
    #[test]
    fn fuzz_bytes_keep_invariants(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let (ops, config, limits) = ops_from_bytes(&data);
        run_ops(ops, config, limits).map_err(TestCaseError::fail)?;
    }
}

/// Every input that ever broke the fuzz target, kept under `tests/crashers/queue_commands/`.
#[test]
fn fuzz_crashers_stay_fixed() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crashers/queue_commands");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let (ops, config, limits) = ops_from_bytes(&std::fs::read(&path).unwrap());
        if let Err(e) = run_ops(ops, config, limits) {
            panic!("{}: {e}", path.display());
        }
    }
}
