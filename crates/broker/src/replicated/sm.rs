//! The group's state machine on one member ([`GroupSm`]): applies each committed entry's
//! operations to the [`Machine`] at the entry's timestamp, keeps the bodies it decoded, hands
//! the leader what it must act on, and takes and restores snapshots.
//!
//! Apply reads nothing but the machine and the entry; what it does outside (deliveries, dead
//! letters) happens only where the queue leads, after the machine's state is final for the
//! entry, so every member's machine is the same whoever acts.

use std::sync::{Arc, OnceLock, Weak};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_queue::replicated::{Cmd, Machine, MachineConfig, Out, Snapshot};

use super::bodies::Bodies;
use super::entry::{self, Op};
use super::legacy::{self, Legacy};
use super::net::Delivery;
use super::ReplicatedQueue;
use crate::message::Message;

/// A snapshot: `[SNAPSHOT_MAGIC][machine version u32][len u32][bincode machine snapshot][n u32]`,
/// then `n` bodies `[log place u64][len u32][stored message]`. Snapshots are taken at the
/// release cursor and carry no bodies (`n` is 0); earlier ones carried the bodies of the
/// messages in the queue, and are still read.
const SNAPSHOT_MAGIC: &[u8; 4] = b"WRQ1";
/// A candidate snapshot is kept (encoded, in memory) only for a machine of at most this many
/// messages; a longer queue keeps its log until it is shorter.
const CANDIDATE_MAX_MSGS: usize = 1_000_000;

/// What the leader does after an apply, the bodies already read.
pub enum Act {
    /// To the consumer's node.
    Deliver { node: String, d: Delivery },
    /// A dead letter; with its log place when the group keeps it until routed
    /// (at-least-once).
    DeadLetter(Arc<Message>, warren_queue::Reason, Option<u64>),
    /// A delivery whose body could not be read (the log lost it): dropped with an error.
    Lost { consumer: u64, seq: u64 },
    /// The machine timed out a consumer on `node`: its channel is told.
    TimedOut {
        node: String,
        consumer: u64,
        timeout_ms: u64,
    },
}

pub struct State {
    pub machine: Machine,
    pub bodies: Bodies,
    /// The index of the entry applied last.
    pub applied: u64,
    /// The machine at an applied index, encoded as a snapshot: it becomes the group's snapshot
    /// once every message it holds has left the queue (the release cursor passed it).
    pub candidate: Option<(u64, Vec<u8>)>,
    /// A group written by an earlier release: its messages not yet carried over to the
    /// machine (`legacy.rs`). No snapshot is taken until they are.
    pub legacy: Option<Legacy>,
}

pub struct GroupSm {
    pub state: Mutex<State>,
    /// What a fresh machine starts with (the declared arguments), on every member alike.
    pub(super) fresh: (MachineConfig, warren_queue::Limits),
    pub queue: OnceLock<Weak<ReplicatedQueue>>,
    pub log: OnceLock<warren_cluster::LogReader>,
    /// Deliveries carry `x-delivery-count` (a quorum queue's; a mirrored classic queue's do
    /// not, as in RabbitMQ 3.10).
    pub counted: bool,
    /// Publishes this member applied and the machine accepted, since the process started
    /// (Prometheus' `rabbitmq_queue_messages_published_total`); bumped under `state`'s lock.
    pub published: std::sync::atomic::AtomicU64,
}

impl GroupSm {
    pub fn new(config: MachineConfig, limits: warren_queue::Limits, counted: bool) -> GroupSm {
        GroupSm {
            state: Mutex::new(State {
                machine: Machine::new(config, limits, 0),
                bodies: Bodies::default(),
                applied: 0,
                candidate: None,
                legacy: None,
            }),
            fresh: (config, limits),
            queue: OnceLock::new(),
            log: OnceLock::new(),
            counted,
            published: Default::default(),
        }
    }

    /// Back to a fresh machine (this node left the group).
    pub fn reset(&self) {
        let (config, limits) = self.fresh;
        *self.state.lock() = State {
            machine: Machine::new(config, limits, 0),
            bodies: Bodies::default(),
            applied: 0,
            candidate: None,
            legacy: None,
        };
    }

    fn queue(&self) -> Option<Arc<ReplicatedQueue>> {
        self.queue.get().and_then(Weak::upgrade)
    }
}

/// The body a delivery or dead letter needs, as the consumer sees it: quorum queue deliveries
/// carry `x-delivery-count`, as RabbitMQ 3.10's do (`counted`); a mirrored classic queue's
/// do not.
pub fn body(
    bodies: &mut Bodies,
    log: Option<&warren_cluster::LogReader>,
    seq: u64,
    r: &warren_queue::replicated::MsgRef,
    counted: bool,
) -> Option<Arc<Message>> {
    let m = bodies.get(seq, r, log)?;
    if !counted {
        return Some(m);
    }
    Some(Arc::new(crate::message::with_delivery_count(
        &m,
        u64::from(r.delivery_count),
    )))
}

/// What the machine keeps of message `m`, whose body is at log place `at`.
fn msg_ref(at: u64, m: &Message, delivery_count: u32) -> warren_queue::replicated::MsgRef {
    warren_queue::replicated::MsgRef {
        index: at,
        size: m.body.len() as u64,
        priority: m.priority,
        expiration_ms: m.expiration_ms,
        delivery_count,
    }
}

impl warren_cluster::StateMachine for GroupSm {
    fn apply(&self, index: u64, command: &bytes::Bytes) -> Vec<u8> {
        let q = self.queue();
        if command.first() == Some(&legacy::OP_ENQUEUE) {
            // An entry of the earlier form (a group an earlier release wrote): what it leaves in
            // the queue is carried over later. Nobody waits for its answer any more.
            let mut st = self.state.lock();
            match legacy::decode(command.clone()) {
                Some(d) => st
                    .legacy
                    .get_or_insert_with(Legacy::default)
                    .apply(index, d),
                None => {
                    let name = q.as_ref().map(|q| q.name.clone());
                    tracing::error!(queue = ?name, index, "an entry of the earlier format cannot be applied; skipped");
                }
            }
            st.applied = index;
            return Vec::new();
        }
        let e = match entry::decode(command.clone()) {
            Ok(e) => e,
            Err(why) => {
                let name = q.as_ref().map(|q| q.name.clone());
                tracing::error!(queue = ?name, index, error = %why, "a replicated queue entry cannot be applied; skipped");
                self.state.lock().applied = index;
                return entry::encode_reply(&[], &[]);
            }
        };
        let log = self.log.get();
        let keep_dead = self.fresh.0.keep_dead_letters;
        let mut replies = Vec::with_capacity(e.ops.len());
        let mut got = Vec::new();
        let mut acts = Vec::new();
        let mut st = self.state.lock();
        // Read under the machine's lock: `take_over` sets it under the same lock, so an entry
        // is either acted on or in the holds it sends again.
        let acting = q.as_ref().is_some_and(|q| q.leads());
        let State {
            machine,
            bodies,
            legacy,
            ..
        } = &mut *st;
        let mut slot = 0;
        for op in e.ops {
            let (outs, settled) = match op {
                Op::Import {
                    old,
                    redelivered,
                    count,
                    stored,
                } => {
                    // Imported once: an import of an id already carried finds it gone. Without
                    // the earlier state (a single node's carrying over, replayed from its log:
                    // the classic form it came from is not in the log) an import applies as it
                    // is: no import follows the one that emptied the earlier state (a leader
                    // proposes imports only from a state in which every earlier entry is
                    // applied, `legacy.rs`).
                    let carried = match legacy.as_mut() {
                        Some(l) => l.forget(old),
                        None => true,
                    };
                    let Some(data) = stored else {
                        replies.push(Vec::new());
                        continue;
                    };
                    let at = entry::msg_index(index, slot);
                    slot += 1;
                    let decoded = crate::persist::decode_message(&data);
                    let (true, Some((m, _))) = (carried, decoded) else {
                        replies.push(Vec::new());
                        continue;
                    };
                    let msg = msg_ref(at, &m, count);
                    let outs = machine.apply(e.ts, Cmd::Import { msg, redelivered });
                    if let (true, Some(Out::Accepted { seq })) = (acting, outs.first()) {
                        bodies.insert(*seq, Arc::new(m));
                    }
                    (outs, Vec::new())
                }
                Op::Publish(data) => {
                    let at = entry::msg_index(index, slot);
                    slot += 1;
                    let Some((m, _)) = crate::persist::decode_message(&data) else {
                        replies.push(vec![Out::Rejected]);
                        continue;
                    };
                    let outs = machine.apply(e.ts, Cmd::Enqueue(msg_ref(at, &m, 0)));
                    if let Some(Out::Accepted { .. }) = outs.first() {
                        crate::metrics::bump(&self.published, 1);
                    }
                    // Only the leader delivers: a follower reads bodies back from its log if
                    // it takes over.
                    if let (true, Some(Out::Accepted { seq })) = (acting, outs.first()) {
                        bodies.insert(*seq, Arc::new(m));
                    }
                    (outs, Vec::new())
                }
                Op::Cmd(c) => {
                    if matches!(c, Cmd::Attach(_) | Cmd::Get { .. }) {
                        if let Some(q) = q.as_ref() {
                            q.touch();
                        }
                    }
                    let settled = match &c {
                        Cmd::Settle { seqs, .. } | Cmd::Discard { seqs, .. } => seqs.clone(),
                        _ => Vec::new(),
                    };
                    let purge = matches!(c, Cmd::Purge);
                    let outs = machine.apply(e.ts, c);
                    if purge {
                        bodies.clear();
                    }
                    (outs, settled)
                }
            };
            let mut reply = Vec::new();
            for o in outs {
                if entry::answers(&o) {
                    // A get's proposer may be a node without the log: the body goes with it.
                    if let Out::Got(Some(g)) = &o {
                        if let Some(b) = bodies.stored_or_cached(g.seq, &g.msg, log) {
                            got.push((g.seq, b));
                        }
                    }
                    reply.push(o);
                    continue;
                }
                if !acting {
                    continue;
                }
                match o {
                    Out::Deliver {
                        consumer,
                        delivery,
                        seq,
                        msg,
                        redelivered,
                    } => {
                        let node = machine.consumer_node(consumer).unwrap_or_default();
                        acts.push(match body(bodies, log, seq, &msg, self.counted) {
                            Some(msg) => Act::Deliver {
                                node: node.to_string(),
                                d: Delivery {
                                    consumer,
                                    delivery,
                                    seq,
                                    redelivered,
                                    msg,
                                },
                            },
                            None => Act::Lost { consumer, seq },
                        })
                    }
                    Out::TimedOut {
                        consumer,
                        node,
                        timeout_ms,
                    } => acts.push(Act::TimedOut {
                        node,
                        consumer,
                        timeout_ms,
                    }),
                    Out::DeadLetter(r, reason) => {
                        // A dead letter has no seq any more: its body is read by place.
                        if let Some(m) = bodies
                            .stored(r.index, log)
                            .and_then(|b| crate::persist::decode_message(&b))
                        {
                            let kept = keep_dead.then_some(r.index);
                            acts.push(Act::DeadLetter(Arc::new(m.0), reason, kept));
                        }
                    }
                    _ => {}
                }
            }
            for seq in settled {
                bodies.remove(seq, None);
            }
            replies.push(reply);
        }
        st.applied = index;
        // Every earlier message carried over: the group is the machine's alone.
        if st.legacy.as_ref().is_some_and(Legacy::is_empty) {
            st.legacy = None;
            if let Some(q) = &q {
                tracing::info!(queue = %q.name, vhost = %q.vhost, index, "a replicated queue of the earlier form is carried over to the queue machine");
            }
        }
        drop(st);
        if let Some(q) = q.filter(|_| !acts.is_empty()) {
            q.act(acts);
        }
        entry::encode_reply(&replies, &got)
    }

    // Never called: `snapshot_point` always names a point.
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    /// A snapshot at the release cursor, as RabbitMQ's quorum queues take theirs: the machine
    /// as it was at an earlier index, once every message it held then has left the queue, so
    /// that the log before that index (and the bodies in it) is no longer needed, while the
    /// bodies of the messages still in the queue stay in the log after it. Meanwhile the
    /// machine now is kept as the next candidate.
    fn snapshot_point(&self) -> warren_cluster::SnapshotPoint {
        let mut st = self.state.lock();
        let State {
            machine,
            bodies,
            applied,
            candidate,
            legacy,
        } = &mut *st;
        // The earlier form's messages are in the log until carried over.
        if legacy.is_some() {
            return warren_cluster::SnapshotPoint::Unchanged;
        }
        // The first entry a message still in the queue is in (`None`: it holds none).
        let cursor = machine
            .release_cursor()
            .map(|place| entry::split_index(place).0);
        let point = match cursor {
            // Nothing in the queue: the machine now is a snapshot at once.
            None => {
                *candidate = None;
                encode_snapshot(machine).map(|b| (*applied, b))
            }
            Some(first) => {
                let passed = candidate.as_ref().is_some_and(|(at, _)| first > *at);
                let point = if passed { candidate.take() } else { None };
                if candidate.is_none() && machine.len() <= CANDIDATE_MAX_MSGS {
                    *candidate = encode_snapshot(machine).map(|b| (*applied, b));
                }
                point
            }
        };
        let Some((at, data)) = point else {
            return warren_cluster::SnapshotPoint::Unchanged;
        };
        // Bodies an earlier snapshot carried belong to messages before the point: gone.
        bodies.repin(std::collections::HashMap::new());
        warren_cluster::SnapshotPoint::At(at, data)
    }

    fn restore(&self, index: Option<u64>, snapshot: &[u8]) {
        let (config, limits) = self.fresh;
        let mut st = State {
            machine: Machine::new(config, limits, 0),
            bodies: Bodies::default(),
            applied: index.unwrap_or(0),
            candidate: None,
            // A new group carrying a single node's earlier queue over keeps what it carries.
            legacy: if snapshot.is_empty() {
                self.state.lock().legacy.take()
            } else {
                None
            },
        };
        // A snapshot of the earlier form (a group an earlier release wrote).
        if !snapshot.is_empty() && !snapshot.starts_with(SNAPSHOT_MAGIC) {
            st.legacy = Legacy::restore(snapshot);
            if st.legacy.is_some() {
                *self.state.lock() = st;
                return;
            }
        }
        match decode_snapshot(snapshot, &mut st) {
            Ok(()) => {}
            Err(why) => {
                let name = self.queue().map(|q| q.name.clone());
                tracing::error!(queue = ?name, error = %why, "a replicated queue snapshot cannot be restored");
            }
        }
        *self.state.lock() = st;
    }
}

/// The machine as a snapshot (no bodies: they are in the log after it).
fn encode_snapshot(machine: &Machine) -> Option<Vec<u8>> {
    let m = bincode::serialize(&machine.snapshot()).ok()?;
    let mut b = BytesMut::with_capacity(m.len() + 16);
    b.put_slice(SNAPSHOT_MAGIC);
    b.put_u32(machine.version());
    b.put_u32(m.len() as u32);
    b.put_slice(&m);
    b.put_u32(0);
    Some(b.to_vec())
}

fn decode_snapshot(snapshot: &[u8], st: &mut State) -> Result<(), String> {
    if snapshot.is_empty() {
        return Ok(());
    }
    let mut b = Bytes::copy_from_slice(snapshot);
    if b.remaining() < 12 || &b[..4] != SNAPSHOT_MAGIC {
        return Err("not a replicated queue snapshot".into());
    }
    b.advance(4);
    // Refused before decoding: a newer machine's encoding may differ.
    let version = b.get_u32();
    if version > warren_queue::replicated::MACHINE_VERSION {
        return Err(format!(
            "a snapshot of queue machine version {version} is newer than this release's {}",
            warren_queue::replicated::MACHINE_VERSION
        ));
    }
    let len = b.get_u32() as usize;
    if b.remaining() < len + 4 {
        return Err("a cut snapshot".into());
    }
    let s: Snapshot = bincode::deserialize(&b.split_to(len))
        .map_err(|e| format!("an undecodable machine: {e}"))?;
    st.machine = Machine::restore(s)?;
    let n = b.get_u32();
    for _ in 0..n {
        if b.remaining() < 12 {
            return Err("a cut snapshot".into());
        }
        let at = b.get_u64();
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            return Err("a cut snapshot".into());
        }
        st.bodies.pin(at, b.split_to(len));
    }
    Ok(())
}
