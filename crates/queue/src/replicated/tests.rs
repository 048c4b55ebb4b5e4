//! The replicated queue machine: deliveries by credit, what a cancel keeps and a consumer or
//! node going down returns, the delivery limit, time from the entries (TTL, consumer
//! timeouts), and determinism: random
//! logs applied on two members, and from a snapshot taken part way, give equal states and equal
//! outputs.

use proptest::prelude::*;

use super::{
    Attach, Backoff, Cmd, Machine, MachineConfig, MsgRef, Out, ReturnKind, MACHINE_VERSION,
};
use crate::{Limits, Reason};

pub(super) fn msg(index: u64) -> MsgRef {
    MsgRef {
        index,
        size: 10,
        priority: None,
        expiration_ms: None,
        delivery_count: 0,
    }
}

pub(super) fn attach(key: u64, node: &str, prefetch: u32) -> Cmd {
    Cmd::Attach(Attach {
        key,
        node: node.into(),
        priority: 0,
        prefetch,
        no_ack: false,
        exclusive: false,
        timeout_ms: None,
    })
}

/// (consumer, seq, redelivered, delivery count) of each delivery in `out`.
fn deliveries(out: &[Out]) -> Vec<(u64, u64, bool, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Out::Deliver {
                consumer,
                seq,
                msg,
                redelivered,
                ..
            } => Some((*consumer, *seq, *redelivered, msg.delivery_count)),
            _ => None,
        })
        .collect()
}

fn machine() -> Machine {
    Machine::new(MachineConfig::default(), Limits::default(), 0)
}

#[test]
fn deliveries_follow_credit_and_a_settle_gives_it_back() {
    let mut m = machine();
    assert_eq!(m.apply(1, attach(7, "a", 2)), [Out::Attached(Ok(()))]);
    let mut delivered = Vec::new();
    for i in 0..3 {
        let out = m.apply(2, Cmd::Enqueue(msg(100 + i)));
        assert_eq!(out[0], Out::Accepted { seq: i }, "the answer comes first");
        delivered.extend(deliveries(&out));
    }
    assert_eq!(delivered, [(7, 0, false, 0), (7, 1, false, 0)]);
    assert_eq!((m.ready_len(), m.held_by(7)), (1, vec![0, 1]));
    let out = m.apply(
        3,
        Cmd::Settle {
            consumer: 7,
            seqs: vec![0],
        },
    );
    assert_eq!(deliveries(&out), [(7, 2, false, 0)]);
    // A settle of what is not held (already settled) changes nothing.
    let before = m.fingerprint();
    assert!(m
        .apply(
            4,
            Cmd::Settle {
                consumer: 7,
                seqs: vec![0],
            }
        )
        .is_empty());
    assert_eq!(m.fingerprint(), before);
    m.check_invariants().unwrap();
}

#[test]
fn a_cancelled_consumer_keeps_what_it_holds_until_it_settles_it() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 0));
    m.apply(2, Cmd::Enqueue(msg(10)));
    let out = m.apply(3, Cmd::Cancel { consumer: 1 });
    assert_eq!(
        out,
        [Out::Detached {
            auto_delete_now: false
        }]
    );
    assert_eq!(
        m.held_by(1),
        [0],
        "still held: an ack may follow the cancel"
    );
    m.apply(4, Cmd::Enqueue(msg(11)));
    assert_eq!(m.ready_len(), 1, "no delivery to a cancelled consumer");
    m.apply(
        5,
        Cmd::Settle {
            consumer: 1,
            seqs: vec![0],
        },
    );
    assert_eq!(m.checked_out(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn a_consumer_down_returns_what_it_held_redelivered_to_the_others() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 1));
    m.apply(1, attach(2, "b", 1));
    m.apply(2, Cmd::Enqueue(msg(10)));
    m.apply(2, Cmd::Enqueue(msg(11)));
    assert_eq!((m.held_by(1), m.held_by(2)), (vec![0], vec![1]));
    m.apply(
        3,
        Cmd::Settle {
            consumer: 2,
            seqs: vec![1],
        },
    );
    let out = m.apply(4, Cmd::Down { consumer: 1 });
    assert_eq!(
        deliveries(&out),
        [(2, 0, true, 1)],
        "marked, counted, to the other"
    );
    assert_eq!(m.consumer_count(), 1);
    m.check_invariants().unwrap();
}

#[test]
fn a_node_down_returns_only_its_consumers_deliveries() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 1));
    m.apply(1, attach(2, "b", 1));
    m.apply(1, attach(3, "a", 1));
    for i in 0..3 {
        m.apply(2, Cmd::Enqueue(msg(i)));
    }
    let out = m.apply(3, Cmd::NodeDown { node: "a".into() });
    // Both of node a's consumers left; their two messages went back, to the consumer on b
    // once it has credit.
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, Out::Detached { .. }))
            .count(),
        2
    );
    assert_eq!(m.consumer_count(), 1);
    assert_eq!((m.ready_len(), m.held_by(2).len()), (2, 1));
    m.check_invariants().unwrap();
}

#[test]
fn an_unreachable_nodes_consumers_give_back_what_they_hold_and_receive_again_when_it_is_back() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 2));
    m.apply(1, attach(2, "b", 1));
    for i in 0..3 {
        m.apply(2, Cmd::Enqueue(msg(i)));
    }
    assert_eq!((m.held_by(1), m.held_by(2)), (vec![0, 2], vec![1]));
    let out = m.apply(3, Cmd::Unreachable { node: "a".into() });
    assert!(
        !out.iter().any(|o| matches!(o, Out::Detached { .. })),
        "not a detach: it is still attached"
    );
    assert_eq!((m.ready_len(), m.held_by(1)), (2, vec![]));
    assert_eq!(m.consumer_nodes().get("a"), Some(&(false, true)));
    // b settles: the returned messages go to b only, redelivered.
    let out = m.apply(
        4,
        Cmd::Settle {
            consumer: 2,
            seqs: vec![1],
        },
    );
    assert_eq!(deliveries(&out), [(2, 0, true, 1)]);
    // A second `Unreachable` changes nothing.
    assert!(m.apply(5, Cmd::Unreachable { node: "a".into() }).is_empty());
    // Back: consumer 1 receives again, within its prefetch, numbered after its earlier ones.
    let out = m.apply(6, Cmd::Reachable { node: "a".into() });
    assert_eq!(deliveries(&out), [(1, 2, true, 1)]);
    assert!(
        matches!(
            out.iter().find(|o| matches!(o, Out::Deliver { .. })),
            Some(Out::Deliver { delivery: 2, .. })
        ),
        "{out:?}"
    );
    assert_eq!(m.consumer_nodes().get("a"), Some(&(true, false)));
    assert_eq!(m.consumer_count(), 2);
    m.check_invariants().unwrap();
}

#[test]
fn a_message_returned_past_the_delivery_limit_is_dead_lettered() {
    let config = MachineConfig {
        delivery_limit: Some(1),
        ..Default::default()
    };
    let mut m = Machine::new(config, Limits::default(), 0);
    m.apply(1, attach(1, "a", 1));
    m.apply(2, Cmd::Enqueue(msg(10)));
    let out = m.apply(
        3,
        Cmd::Return {
            consumer: 1,
            seqs: vec![0],
            kind: ReturnKind::Rejected,
        },
    );
    assert_eq!(
        deliveries(&out),
        [(1, 0, true, 1)],
        "one return is within the limit"
    );
    let out = m.apply(
        4,
        Cmd::Return {
            consumer: 1,
            seqs: vec![0],
            kind: ReturnKind::Rejected,
        },
    );
    assert!(matches!(
        &out[..],
        [Out::DeadLetter(d, Reason::DeliveryLimit)] if d.index == 10 && d.delivery_count == 2
    ));
    assert_eq!((m.ready_len(), m.checked_out()), (0, 0));
    m.check_invariants().unwrap();
}

#[test]
fn time_is_the_entries_not_a_clock() {
    let limits = Limits {
        message_ttl_ms: Some(100),
        ..Default::default()
    };
    let mut m = Machine::new(MachineConfig::default(), limits, 0);
    m.apply(1_000, Cmd::Enqueue(msg(1)));
    assert!(m.apply(1_099, Cmd::Tick).is_empty(), "not due at 1099");
    let out = m.apply(1_100, Cmd::Tick);
    assert!(matches!(&out[..], [Out::DeadLetter(d, Reason::Expired)] if d.index == 1));
    assert_eq!(
        m.release_cursor(),
        None,
        "nothing referenced: the log may go"
    );
}

#[test]
fn a_delivery_held_past_the_consumer_timeout_times_the_consumer_out() {
    let mut m = timing_out(0);
    m.apply(0, attach(2, "b", 0));
    m.apply(10, Cmd::Enqueue(msg(1)));
    m.apply(50, Cmd::Enqueue(msg(2)));
    assert_eq!((m.held_by(1), m.held_by(2)), (vec![0], vec![1]));
    assert!(m.apply(109, Cmd::Tick).is_empty(), "held 99 ms: not yet");
    let out = m.apply(110, Cmd::Tick);
    assert_eq!(
        out[0],
        Out::TimedOut {
            consumer: 1,
            node: "a".into(),
            timeout_ms: 100
        }
    );
    assert_eq!(
        deliveries(&out),
        [(2, 0, true, 1)],
        "what it held goes back, to the other consumer"
    );
    assert_eq!(m.consumer_count(), 1);
    m.check_invariants().unwrap();
}

/// A machine with consumer 1 on node a, timing out after 100 ms, holding `n` messages
/// delivered at 0.
fn timing_out(n: u64) -> Machine {
    let mut m = machine();
    m.apply(
        0,
        Cmd::Attach(Attach {
            key: 1,
            node: "a".into(),
            priority: 0,
            prefetch: 0,
            no_ack: false,
            exclusive: false,
            timeout_ms: Some(100),
        }),
    );
    for i in 0..n {
        m.apply(0, Cmd::Enqueue(msg(i + 1)));
    }
    m
}

fn lease(seq: u64, extend_ms: u64) -> Cmd {
    Cmd::Lease {
        consumer: 1,
        seqs: vec![seq],
        extend_ms: Some(extend_ms),
    }
}

#[test]
fn a_lease_moves_a_held_deliverys_timeout_later_never_sooner() {
    let mut m = timing_out(2);
    // At 80, seq 0 is to time out 300 from now; seq 1 is not named. A shorter lease later does
    // not bring it back.
    m.apply(80, lease(0, 300));
    m.apply(90, lease(0, 10));
    assert_eq!(m.next_due(), Some(100), "seq 1 still times out at 100");
    let out = m.apply(100, Cmd::Tick);
    assert!(
        matches!(out.first(), Some(Out::TimedOut { consumer: 1, .. })),
        "seq 1 was not extended: {out:?}"
    );
    // With only seq 0 held and extended, the consumer keeps it until 380.
    let mut m = timing_out(1);
    m.apply(80, lease(0, 300));
    assert!(m.apply(379, Cmd::Tick).is_empty());
    assert!(matches!(
        m.apply(380, Cmd::Tick).first(),
        Some(Out::TimedOut { consumer: 1, .. })
    ));
}

#[test]
fn a_get_holds_its_message_until_settled_and_its_node_going_down_returns_it() {
    let mut m = machine();
    m.apply(1, Cmd::Enqueue(msg(1)));
    m.apply(1, Cmd::Enqueue(msg(2)));
    let get = |key| Cmd::Get {
        key,
        node: "b".into(),
        ack: true,
    };
    let out = m.apply(2, get(9));
    assert!(matches!(&out[..], [Out::Got(Some(g))] if g.seq == 0 && g.remaining == 1));
    assert_eq!(m.held_by(9), [0]);
    let out = m.apply(
        3,
        Cmd::Get {
            key: 8,
            node: "a".into(),
            ack: false,
        },
    );
    assert!(matches!(&out[..], [Out::Got(Some(g))] if g.seq == 1 && g.remaining == 0));
    assert_eq!(m.held_by(8), Vec::<u64>::new(), "no-ack: gone");
    assert_eq!(m.apply(4, get(9)), [Out::Got(None)]);
    m.apply(5, Cmd::NodeDown { node: "b".into() });
    assert_eq!(
        (m.ready_len(), m.checked_out()),
        (1, 0),
        "back in the queue"
    );
    m.check_invariants().unwrap();
}

#[test]
fn next_due_is_the_earliest_deadline_or_timeout() {
    let limits = Limits {
        message_ttl_ms: Some(500),
        ..Default::default()
    };
    let mut m = Machine::new(MachineConfig::default(), limits, 0);
    assert_eq!(m.next_due(), None);
    m.apply(100, Cmd::Enqueue(msg(1)));
    assert_eq!(m.next_due(), Some(600));
    m.apply(
        200,
        Cmd::Attach(Attach {
            key: 1,
            node: "a".into(),
            priority: 0,
            prefetch: 0,
            no_ack: false,
            exclusive: false,
            timeout_ms: Some(50),
        }),
    );
    assert_eq!(
        m.next_due(),
        Some(250),
        "the delivery's timeout, at 200 + 50"
    );
}

#[test]
fn a_rejected_delivery_is_held_back_until_due_then_back_at_the_tail() {
    let config = MachineConfig {
        retry: Some(Backoff {
            on_reject: true,
            on_nack: false,
            min_ms: 1_000,
            max_ms: None,
            multiplier: None,
        }),
        ..Default::default()
    };
    let mut m = Machine::new(config, Limits::default(), 0);
    m.apply(0, attach(1, "a", 1));
    m.apply(0, Cmd::Enqueue(msg(1)));
    m.apply(0, Cmd::Enqueue(msg(2)));
    let out = m.apply(
        100,
        Cmd::Return {
            consumer: 1,
            seqs: vec![0],
            kind: ReturnKind::Rejected,
        },
    );
    // Its credit came back: the next message goes out while the first waits.
    assert_eq!(deliveries(&out), [(1, 1, false, 0)]);
    assert_eq!((m.delayed_len(), m.ready_len()), (1, 0));
    assert_eq!(m.next_due(), Some(1_100), "attempt 1 waits min x 1");
    assert!(m.apply(1_099, Cmd::Tick).is_empty());
    m.apply(
        1_100,
        Cmd::Settle {
            consumer: 1,
            seqs: vec![1],
        },
    );
    let out = m.apply(1_100, Cmd::Tick);
    assert_eq!(
        deliveries(&out),
        [(1, 2, true, 1)],
        "back at the tail (a new seq), redelivered, counted"
    );
    // A nack is not a failed delivery under `failed`-only retry: back at once.
    let out = m.apply(
        1_200,
        Cmd::Return {
            consumer: 1,
            seqs: vec![2],
            kind: ReturnKind::Nacked,
        },
    );
    assert_eq!(deliveries(&out), [(1, 2, true, 2)]);
    m.check_invariants().unwrap();
}

/// A held-back return that comes due while the queue is full under reject-publish comes back
/// all the same, as a requeue does: it was in the queue, so refusing it would lose it.
#[test]
fn a_due_return_comes_back_to_a_full_reject_publish_queue() {
    let config = MachineConfig {
        retry: Some(Backoff {
            on_reject: true,
            on_nack: true,
            min_ms: 10,
            max_ms: None,
            multiplier: None,
        }),
        ..Default::default()
    };
    let limits = Limits {
        max_length: Some(1),
        overflow: crate::Overflow::RejectPublish,
        ..Default::default()
    };
    let mut m = Machine::new(config, limits, 0);
    m.apply(0, attach(1, "a", 1));
    m.apply(0, Cmd::Enqueue(msg(1)));
    m.apply(
        1,
        Cmd::Return {
            consumer: 1,
            seqs: vec![0],
            kind: ReturnKind::Rejected,
        },
    );
    m.apply(2, Cmd::Cancel { consumer: 1 });
    assert_eq!(
        m.apply(3, Cmd::Enqueue(msg(2)))[0],
        Out::Accepted { seq: 1 }
    );
    assert_eq!(m.apply(3, Cmd::Enqueue(msg(3))), [Out::Rejected], "full");
    m.apply(20, Cmd::Tick);
    assert_eq!(
        (m.ready_len(), m.delayed_len()),
        (2, 0),
        "back, over the limit"
    );
    m.check_invariants().unwrap();
}

#[test]
fn backoff_is_linear_or_exponential_and_capped() {
    let linear = Backoff {
        on_reject: true,
        on_nack: true,
        min_ms: 1_000,
        max_ms: Some(2_500),
        multiplier: None,
    };
    let d: Vec<u64> = (1..=4).map(|n| linear.delay_ms(n)).collect();
    assert_eq!(d, [1_000, 2_000, 2_500, 2_500]);
    let exp = Backoff {
        multiplier: Some(3),
        max_ms: None,
        ..linear
    };
    let d: Vec<u64> = (1..=3).map(|n| exp.delay_ms(n)).collect();
    assert_eq!(d, [1_000, 3_000, 9_000]);
    assert_eq!(
        exp.delay_ms(100),
        u64::from(u32::MAX),
        "never past 2^32-1 ms"
    );
}

#[test]
fn deliveries_are_numbered_per_consumer_and_what_it_holds_can_be_sent_again() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 0));
    let mut numbers = Vec::new();
    for i in 0..4 {
        for o in m.apply(2, Cmd::Enqueue(msg(i))) {
            if let Out::Deliver { delivery, seq, .. } = o {
                numbers.push((delivery, seq));
            }
        }
    }
    assert_eq!(numbers, [(0, 0), (1, 1), (2, 2), (3, 3)]);
    m.apply(
        3,
        Cmd::Settle {
            consumer: 1,
            seqs: vec![0],
        },
    );
    // The consumer's node last saw delivery 1: the new leader sends 2 and 3 again.
    let before = m.fingerprint();
    let again: Vec<(u64, u64)> = m
        .held_since(1, Some(1))
        .iter()
        .map(|r| (r.delivery, r.seq))
        .collect();
    assert_eq!(again, [(2, 2), (3, 3)]);
    assert_eq!(m.held_since(1, None).len(), 3);
    assert_eq!(m.fingerprint(), before, "sending again changes nothing");
}

#[test]
fn the_release_cursor_is_the_oldest_entry_still_referenced() {
    let mut m = machine();
    m.apply(1, attach(1, "a", 1));
    for i in [5, 6, 7] {
        m.apply(2, Cmd::Enqueue(msg(i)));
    }
    assert_eq!(m.release_cursor(), Some(5), "held by the consumer");
    m.apply(
        3,
        Cmd::Settle {
            consumer: 1,
            seqs: vec![0],
        },
    );
    assert_eq!(m.release_cursor(), Some(6));
}

#[test]
fn a_snapshot_carries_the_version_and_a_newer_one_is_refused() {
    let m = machine();
    let mut s = m.snapshot();
    assert_eq!(s.version, MACHINE_VERSION);
    assert!(Machine::restore(s.clone()).is_ok());
    s.version = MACHINE_VERSION + 1;
    let e = Machine::restore(s).unwrap_err();
    assert!(e.contains("newer than this release"), "{e}");
}

#[test]
fn at_least_once_dead_letters_stay_until_done() {
    let config = MachineConfig {
        delivery_limit: Some(0),
        keep_dead_letters: true,
        ..Default::default()
    };
    let mut m = Machine::new(config, Limits::default(), 0);
    m.apply(1, attach(1, "a", 1));
    m.apply(2, Cmd::Enqueue(msg(10)));
    let out = m.apply(
        3,
        Cmd::Return {
            consumer: 1,
            seqs: vec![0],
            kind: ReturnKind::Rejected,
        },
    );
    assert!(out
        .iter()
        .any(|o| matches!(o, Out::DeadLetter(r, Reason::DeliveryLimit) if r.index == 10)));
    // Kept: its body must stay (the release cursor says so) until its targets have it.
    assert_eq!(m.kept_dead().count(), 1);
    assert_eq!(m.release_cursor(), Some(10));
    assert_eq!(m.ready_len(), 0);
    m.apply(4, Cmd::DeadDone { places: vec![10] });
    assert_eq!(m.kept_dead().count(), 0);
    assert_eq!(m.release_cursor(), None);
}

/// A random command over a few consumers and nodes; seqs name recent messages.
pub(super) fn arb_cmd() -> impl Strategy<Value = Cmd> {
    // Consumers attach as 0-5, gets hold under 3-5: some keys collide, which the machine
    // must survive.
    let key = 0u64..6;
    let node = prop_oneof![Just("a".to_string()), Just("b".to_string())];
    let seqs = prop::collection::vec(0u64..24, 0..4);
    prop_oneof![
        6 => (0u64..1000, prop::option::of(0u8..3), prop::option::of(1u64..50)).prop_map(
            |(index, priority, exp)| Cmd::Enqueue(MsgRef {
                index,
                size: 1 + index % 7,
                priority,
                expiration_ms: exp,
                delivery_count: 0,
            })
        ),
        2 => (key.clone(), node.clone(), 0u32..3, any::<bool>(), -1i64..2, prop::option::of(5u64..60)).prop_map(
            |(key, node, prefetch, no_ack, priority, timeout_ms)| Cmd::Attach(Attach {
                key,
                node,
                priority,
                prefetch,
                no_ack,
                exclusive: false,
                timeout_ms,
            })
        ),
        3 => (key.clone(), seqs.clone()).prop_map(|(consumer, seqs)| Cmd::Settle { consumer, seqs }),
        2 => (key.clone(), seqs.clone(), prop_oneof![
            Just(ReturnKind::Rejected),
            Just(ReturnKind::Nacked),
            Just(ReturnKind::Released)
        ])
            .prop_map(|(consumer, seqs, kind)| Cmd::Return { consumer, seqs, kind }),
        1 => prop::option::of((any::<bool>(), 1u64..30)).prop_map(|r| Cmd::SetRetry(r.map(
            |(on_nack, min_ms)| Backoff {
                on_reject: true,
                on_nack,
                min_ms,
                max_ms: Some(60),
                multiplier: None,
            }
        ))),
        1 => (key.clone(), seqs).prop_map(|(consumer, seqs)| Cmd::Discard { consumer, seqs }),
        1 => key.clone().prop_map(|consumer| Cmd::Cancel { consumer }),
        1 => key.prop_map(|consumer| Cmd::Down { consumer }),
        1 => node.clone().prop_map(|node| Cmd::NodeDown { node }),
        1 => node.clone().prop_map(|node| Cmd::Unreachable { node }),
        1 => node.clone().prop_map(|node| Cmd::Reachable { node }),
        1 => (3u64..6, node, any::<bool>()).prop_map(|(key, node, ack)| Cmd::Get { key, node, ack }),
        1 => Just(Cmd::Purge),
        1 => (prop::option::of(0u64..6)).prop_map(|max_length| Cmd::SetLimits(Limits {
            max_length,
            ..Default::default()
        })),
        2 => Just(Cmd::Tick),
        1 => (0u64..6, prop::collection::vec(0u64..24, 0..3), prop::option::of(1u64..80))
            .prop_map(|(consumer, seqs, extend_ms)| Cmd::Lease { consumer, seqs, extend_ms }),
        1 => prop::collection::vec(0u64..1000, 0..3).prop_map(|places| Cmd::DeadDone { places }),
    ]
}

/// A snapshot as a member receives it: encoded (bincode, as the broker's Raft snapshots) and
/// decoded. Without the `serde` feature, as it is.
#[cfg(feature = "serde")]
pub(super) fn through_bytes(s: crate::replicated::Snapshot) -> crate::replicated::Snapshot {
    bincode::deserialize(&bincode::serialize(&s).unwrap()).unwrap()
}

#[cfg(not(feature = "serde"))]
pub(super) fn through_bytes(s: crate::replicated::Snapshot) -> crate::replicated::Snapshot {
    s
}

fn new_machine() -> Machine {
    let config = MachineConfig {
        max_priority: Some(2),
        delivery_limit: Some(3),
        retry: Some(Backoff {
            on_reject: true,
            on_nack: false,
            min_ms: 15,
            max_ms: Some(40),
            multiplier: Some(2),
        }),
        keep_dead_letters: true,
        ..Default::default()
    };
    let limits = Limits {
        message_ttl_ms: Some(40),
        ..Default::default()
    };
    Machine::new(config, limits, 0)
}

proptest! {
    /// Two members applying one log agree at every index, and a member restored from a
    /// snapshot at any index (encoded and decoded) continues exactly as the one that took it. No seq is ever held by
    /// two consumers or both held and ready, and a message delivered again is flagged.
    #[test]
    fn members_agree_and_a_snapshot_continues_the_same(
        cmds in prop::collection::vec(arb_cmd(), 1..120),
        cut in any::<prop::sample::Index>(),
    ) {
        let cut = cut.index(cmds.len());
        let (mut a, mut b) = (new_machine(), new_machine());
        let mut restored: Option<Machine> = None;
        let mut delivered = std::collections::BTreeSet::new();
        let mut numbered = std::collections::BTreeMap::<u64, u64>::new();
        for (i, cmd) in cmds.into_iter().enumerate() {
            let now = 10 * i as u64;
            if i == cut {
                restored = Some(Machine::restore(through_bytes(a.snapshot())).unwrap());
            }
            let out_a = a.apply(now, cmd.clone());
            let out_b = b.apply(now, cmd.clone());
            prop_assert_eq!(&out_a, &out_b);
            prop_assert_eq!(a.fingerprint(), b.fingerprint());
            if let Some(r) = restored.as_mut() {
                prop_assert_eq!(&r.apply(now, cmd.clone()), &out_a);
                prop_assert_eq!(r.fingerprint(), a.fingerprint());
            }
            a.check_invariants().map_err(TestCaseError::fail)?;
            // A key attached anew is a new consumer: its numbering starts again.
            if let (Cmd::Attach(at), Some(Out::Attached(Ok(())))) = (&cmd, out_a.first()) {
                numbered.insert(at.key, 0);
            }
            for o in &out_a {
                if let Out::Deliver { consumer, delivery, .. } = o {
                    let next = numbered.entry(*consumer).or_insert(0);
                    prop_assert_eq!(*delivery, *next, "consumer {}'s deliveries are numbered in order", consumer);
                    *next += 1;
                }
            }
            for (_, seq, redelivered, _) in deliveries(&out_a) {
                if !delivered.insert(seq) {
                    prop_assert!(redelivered, "seq {} delivered again unflagged", seq);
                }
            }
        }
    }
}

#[test]
fn an_imported_message_keeps_its_count_and_flag_and_is_never_refused() {
    let limits = Limits {
        max_length: Some(1),
        overflow: crate::Overflow::RejectPublish,
        ..Default::default()
    };
    let mut m = Machine::new(MachineConfig::default(), limits, 0);
    let mut counted = msg(1);
    counted.delivery_count = 2;
    for (r, redelivered) in [(counted, true), (msg(2), false)] {
        assert!(matches!(
            m.apply(
                0,
                Cmd::Import {
                    msg: r,
                    redelivered
                }
            )[0],
            Out::Accepted { .. }
        ));
    }
    assert_eq!(m.ready_len(), 2, "an import is over the limit, not refused");
    assert_eq!(
        m.apply(0, Cmd::Enqueue(msg(3))),
        [Out::Rejected],
        "a publish is"
    );
    let out = m.apply(1, attach(1, "a", 5));
    assert_eq!(deliveries(&out), [(1, 0, true, 2), (1, 1, false, 0)]);
    m.check_invariants().unwrap();
}
