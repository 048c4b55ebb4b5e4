//! Tests of replicated queues: HA policies, entries, snapshots, the replica.

use bytes::{BufMut, BytesMut};

use super::entry::{decode, encode};
use super::*;

#[test]
fn ha_policies_map_to_group_sizes_and_nodes() {
    let def = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    assert_eq!(
        ha_members(&def(serde_json::json!({"ha-mode": "all"}))),
        Some(Ha::Size(usize::MAX))
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "exactly", "ha-params": 2})
        )),
        Some(Ha::Size(3)),
        "two members could not survive the loss of one"
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "exactly", "ha-params": 5})
        )),
        Some(Ha::Size(5))
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "nodes", "ha-params": ["a@h", "b@h"]})
        )),
        Some(Ha::Nodes(vec!["a@h".into(), "b@h".into()]))
    );
    assert_eq!(
        ha_members(&def(serde_json::json!({"ha-mode": "exactly"}))),
        None
    );
    assert_eq!(ha_members(&def(serde_json::json!({"max-length": 3}))), None);
}

#[test]
fn entries_round_trip() {
    let m = Arc::new(Message {
        exchange: "x".into(),
        routing_key: "k".into(),
        properties: Bytes::from_static(&[0, 0]),
        body: Bytes::from_static(b"hello"),
        persistent: true,
        priority: None,
        expiration_ms: None,
    });
    let m_dead = m.clone();
    let batch = Batch {
        msgs: vec![(m.clone(), None), (m, None)],
        bytes: 10,
        settled: vec![3, 9],
        returned: vec![4],
        claimed: vec![7, 8],
        claim_new: 1,
        epoch: 42,
        settled_runs: vec![(100, 200)],
        dead: vec![(5, m_dead, vec![ByteString::from_static("cc-key")])],
    };
    let d = decode(Bytes::from(encode(&batch))).expect("decodes");
    assert_eq!(d.msgs.len(), 2);
    assert_eq!(d.settled, [3, 9]);
    assert_eq!(d.returned, [4]);
    assert_eq!(d.claimed, [7, 8]);
    assert_eq!(d.claim_new, 1);
    assert_eq!(d.epoch, 42);
    assert_eq!(d.settled_runs, [(100, 200)]);
    assert_eq!(d.dead.len(), 1);
    assert_eq!(d.dead[0].0, 5);
    assert_eq!(&*d.dead[0].2[0], "cc-key");
    let (back, _) = crate::persist::decode_message(&d.msgs[0]).expect("a stored message");
    assert_eq!(&back.body[..], b"hello");
    let whole = encode(&batch);
    assert!(
        decode(Bytes::copy_from_slice(&whole[..7])).is_none(),
        "a cut entry is refused"
    );
    // Entries of earlier versions end before the dead letters, or before the runs too.
    let no_dead = encode(&Batch {
        dead: Vec::new(),
        ..batch
    });
    let runs_only = decode(Bytes::copy_from_slice(&no_dead[..no_dead.len() - 4])).expect("decodes");
    assert_eq!(runs_only.settled_runs, [(100, 200)]);
    assert!(runs_only.dead.is_empty());
    let old = decode(Bytes::copy_from_slice(&no_dead[..no_dead.len() - 24])).expect("decodes");
    assert_eq!(old.epoch, 42);
    assert!(old.settled_runs.is_empty());
}

#[test]
fn a_snapshot_of_the_earlier_format_keeps_its_bodies() {
    use warren_cluster::StateMachine;
    let m = Message {
        exchange: "".into(),
        routing_key: "q".into(),
        properties: Bytes::from_static(&[0, 0]),
        body: Bytes::from_static(b"kept body"),
        persistent: true,
        priority: None,
        expiration_ms: None,
    };
    let stored = crate::persist::encode_message(&m, None);
    // `[next_id][n]([id][returns u32][delivered u8][len u32][stored])*n`
    let mut old = BytesMut::new();
    old.put_u64(12);
    old.put_u64(2);
    for (id, returns, delivered) in [(7u64, 2u32, 0u8), (9, 0, 1)] {
        old.put_u64(id);
        old.put_u32(returns);
        old.put_u8(delivered);
        old.put_u32(stored.len() as u32);
        old.put_slice(&stored);
    }
    let sm = GroupSm {
        queue: std::sync::OnceLock::new(),
        replica: Mutex::new(Replica::default()),
        applied: Arc::new(AtomicU64::new(0)),
    };
    sm.restore(Some(40), &old);
    {
        let r = sm.replica.lock();
        assert_eq!((r.next_id, r.live, r.live_bytes), (12, 2, 18));
        assert!(r.holds(7) && r.holds(9) && !r.holds(8));
        assert_eq!(r.legacy.len(), 2);
        assert_eq!(r.returns.get(&7), Some(&2));
        assert!(r.delivered.contains(&9));
        assert_eq!(r.start, Some((40, 12)));
    }
    // Its bodies are nowhere else: no snapshot replaces it while they are in the queue.
    assert!(matches!(
        sm.snapshot_point(),
        warren_cluster::SnapshotPoint::Unchanged
    ));
    sm.replica.lock().remove(7);
    sm.replica.lock().remove(9);
    assert!(sm.replica.lock().legacy.is_empty());
    // And a snapshot of the new format is the next id alone.
    sm.restore(Some(50), b"WQS2\0\0\0\0\0\0\0\x20");
    let r = sm.replica.lock();
    assert_eq!(
        (r.next_id, r.base, r.live, r.start),
        (32, 32, 0, Some((50, 32)))
    );
}

#[test]
fn replica_keeps_sizes_and_a_release_point() {
    let mut r = Replica::default();
    // Entries of 10 messages each, 100 bytes a body.
    for index in 1..=1000u64 {
        for _ in 0..10 {
            let id = r.next_id;
            r.next_id += 1;
            r.insert(id, 100);
        }
        r.applied(index, 1100);
    }
    assert_eq!((r.live, r.live_bytes), (10_000, 1_000_000));
    // Nothing settled: no snapshot can be taken past the first message.
    assert_eq!(r.release(), None);
    // The first 5,000 settled (a purge's run, as apply does it), one more out of order.
    for id in 0..5000 {
        r.remove(id);
    }
    r.remove(7000);
    assert!(!r.holds(7000) && r.holds(6999) && r.holds(5000) && !r.holds(4999));
    assert_eq!(r.oldest(), 5000);
    assert_eq!((r.live, r.live_bytes), (4999, 499_900));
    assert_eq!(r.sizes.len(), 5000, "the front is always in the queue");
    r.applied(1001, 10);
    let (index, next) = r.release().expect("a release point");
    assert!(next <= 5000 && index <= 500, "{index} {next}");
    assert!(
        index >= 256,
        "the newest checkpoint before the oldest message: {index}"
    );
    assert_eq!(r.checkpoints.len(), 3, "the older ones are dropped");
    assert_eq!(
        r.ids_from(6998).take(3).collect::<Vec<_>>(),
        [6998, 6999, 7001]
    );
    // All gone: the release point is the newest checkpoint (at most a checkpoint's worth of
    // log is kept behind an empty queue).
    for id in 5000..10_000 {
        r.remove(id);
    }
    assert_eq!((r.live, r.live_bytes, r.sizes.len()), (0, 0, 0));
    r.applied(1002, 10);
    assert_eq!(r.release(), Some((768, 7680)));
    assert_eq!(r.checkpoints.len(), 1);
    // A message after a gap of settled ones.
    r.insert(10_005, 7);
    assert_eq!((r.base, r.oldest()), (10_005, 10_005));
}
