//! A replicated queue's state machine, after RabbitMQ's `rabbit_fifo`: the whole queue (its
//! messages, its consumers and their credit, the deliveries each holds, returns and delivery
//! counts, time) is one deterministic [`Machine`] that every member of the queue's Raft group
//! applies to the same entries in the same order. Only the leader acts on what an apply puts out
//! ([`Out`]): deliveries to its consumers' channels, dead letters, answers to publishers. A new
//! leader holds the same consumers and the same checked-out deliveries, so a failover cancels
//! no consumer, and a delivery the old leader made can still be settled through the new one.
//!
//! It is the classic queue's core ([`State`]) driven by a host that reads nothing outside the
//! machine and the entry:
//! - an offer is decided by the consumer's credit alone: a replicated queue has per-consumer
//!   prefetch only, as RabbitMQ's quorum queues (no channel-wide prefetch, no look at a
//!   connection's output);
//! - the time is the entry's timestamp, given to [`Machine::apply`];
//! - messages are references to the log entries that hold their bodies ([`MsgRef`]), so the
//!   machine never pages: the Raft log is the queue's log;
//! - retry back-off ([`Backoff`]) holds a returned message until a due time kept in the state,
//!   so a new leader holds it until the same time (no node-local retry store).
//!
//! Beside the core, the machine keeps what a classic queue's host keeps outside it: who holds
//! each delivery (checkouts, by consumer), the node each consumer's connection is on, and how
//! often each message went back to the queue.
//!
//! **Invariant:** [`Machine::apply`] is a function of the machine, the timestamp and the
//! command. Equal logs give equal machines and equal outputs on every member, and a machine
//! restored from a snapshot taken at any entry continues exactly as the one that took it
//! (`tests.rs` replays random logs both ways).
//!
//! `types.rs` holds the vocabulary (messages, commands, outputs, the back-off, the
//! configuration), re-exported here; this file holds the machine and its apply.

mod invariants;
mod paged;
mod types;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::collections::BTreeMap;

use paged::Paged;

pub use types::{Attach, Backoff, Cmd, Got, MachineConfig, MsgRef, Out, Resend, ReturnKind};

use crate::{
    Config, ConsumeRefused, Consumer, Effect, Entry, Host, Limits, Offer, PagedIn, Published,
    Reason, State,
};

/// The machine's version, carried by its snapshots. A later release that changes what an
/// entry does adds a version, and a group switches to it only once every member runs it, as
/// RabbitMQ's machine versions.
pub const MACHINE_VERSION: u32 = 1;

/// A publish's answer, put out before the deliveries it made.
fn answer_first(p: Published, out: &mut Vec<Out>) {
    let answer = match p {
        Published::Accepted { seq } => Out::Accepted { seq },
        Published::Rejected | Published::Gone => Out::Rejected,
    };
    out.insert(0, answer);
}

/// Returned messages held back by the retry back-off, by (due time, seq).
type Delayed = BTreeMap<(u64, u64), Entry<MsgRef>>;

/// A delivery not yet settled, and when it was made (the entry's timestamp).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Held {
    entry: Entry<MsgRef>,
    at: u64,
    /// Its number among the deliveries made to this consumer (or under this get key).
    delivery: u64,
}

/// Deliveries not yet settled, by consumer, then seq.
type Checkouts = BTreeMap<u64, BTreeMap<u64, Held>>;

/// A consumer as the machine keeps it beside the core.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Holder {
    node: String,
    no_ack: bool,
    /// Cancelled: gets no more deliveries, kept while it holds some.
    cancelled: bool,
    /// A delivery held longer than this (ms) times the consumer out.
    timeout_ms: Option<u64>,
    /// Deliveries made to it so far: the next one's number.
    next_delivery: u64,
    /// Its attach's terms, to take it on again after its node was unreachable.
    priority: i64,
    prefetch: u32,
    exclusive: bool,
    /// Its node is unreachable (`Cmd::Unreachable`): out of the core, holding nothing, until
    /// the node is back (`Cmd::Reachable`), as `rabbit_fifo`'s suspected consumers.
    suspected: bool,
}

/// A replicated queue.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Machine {
    version: u32,
    core: State<u64, MsgRef>,
    delivery_limit: Option<u32>,
    retry: Option<Backoff>,
    /// Returns held back until their due time.
    delayed: Delayed,
    /// At-least-once dead-lettering (`x-dead-letter-strategy`): dead letters stay in the state
    /// until the leader has routed them and their targets have them ([`Cmd::DeadDone`]), so a
    /// new leader routes again what the old one had not finished.
    keep_dead: bool,
    kept: Kept,
    holders: BTreeMap<u64, Holder>,
    /// Deliveries not yet settled, by consumer, then seq.
    checkouts: Checkouts,
    /// The core's tail: ready messages past [`paged::PAGE_AT`] of a single-lane queue, compact.
    paged: Paged,
}

/// A machine at one entry, with its version.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Snapshot {
    pub version: u32,
    machine: Machine,
}

/// The host a machine's core runs against: answers from the machine and the entry only.
struct Apply<'a> {
    now: u64,
    holders: &'a mut BTreeMap<u64, Holder>,
    checkouts: &'a mut Checkouts,
    out: &'a mut Vec<Out>,
    /// At-least-once dead-lettering: dead letters are kept here until routed.
    kept: Option<&'a mut Kept>,
    paged: &'a mut Paged,
}

/// Dead letters kept until their targets have them (at-least-once), by log place.
type Kept = BTreeMap<u64, (MsgRef, Reason)>;

impl Host<u64, MsgRef> for Apply<'_> {
    fn offer(&mut self, consumer: &u64, entry: &Entry<MsgRef>) -> Offer {
        // The core offers only to consumers with credit; a cancelled one is not in its list.
        let Some(h) = self.holders.get_mut(consumer) else {
            return Offer::Refused;
        };
        let delivery = h.next_delivery;
        h.next_delivery += 1;
        self.out.push(Out::Deliver {
            consumer: *consumer,
            delivery,
            seq: entry.seq,
            msg: entry.msg.clone(),
            redelivered: entry.redelivered,
        });
        if !h.no_ack {
            let held = Held {
                entry: entry.clone(),
                at: self.now,
                delivery,
            };
            self.checkouts
                .entry(*consumer)
                .or_default()
                .insert(entry.seq, held);
        }
        Offer::Taken
    }
    fn page_in(&mut self, remaining: usize, out: &mut Vec<Entry<MsgRef>>) -> PagedIn {
        let (records, bytes) = self.paged.page_in(remaining, out);
        PagedIn { records, bytes }
    }
    fn can_page(&mut self) -> bool {
        true
    }
    fn now(&mut self) -> u64 {
        self.now
    }
    fn effect(&mut self, effect: Effect<'_, MsgRef>) {
        // The log is the group's Raft log: nothing to write or forget there. Paged messages
        // are kept compact in the state.
        match effect {
            Effect::DeadLetter(m, reason) => {
                if let Some(kept) = self.kept.as_deref_mut() {
                    kept.insert(m.index, (m.clone(), reason));
                }
                self.out.push(Out::DeadLetter(m, reason));
            }
            Effect::Append { entry, paged: true } => self.paged.push(entry),
            Effect::ForgetTail { .. } => self.paged.clear(),
            Effect::Append { paged: false, .. }
            | Effect::PageOut { .. }
            | Effect::Forget { .. } => {}
        }
    }
}

impl Machine {
    pub fn new(config: MachineConfig, limits: Limits, now: u64) -> Machine {
        Machine::build(config, limits, now, paged::PAGE_AT)
    }

    fn build(config: MachineConfig, limits: Limits, now: u64, page_at: usize) -> Machine {
        let core = Config {
            max_priority: config.max_priority,
            single_active_consumer: config.single_active_consumer,
            auto_delete: config.auto_delete,
            // Bodies are in the log; past PAGE_AT ready messages, the references are kept
            // compact (`paged.rs`). Deterministic: the count is the state's.
            page_out_msgs: page_at,
            page_out_bytes: u64::MAX,
        };
        Machine {
            version: MACHINE_VERSION,
            core: State::new(core, limits, now),
            delivery_limit: config.delivery_limit,
            retry: config.retry,
            delayed: BTreeMap::new(),
            keep_dead: config.keep_dead_letters,
            kept: BTreeMap::new(),
            holders: BTreeMap::new(),
            checkouts: BTreeMap::new(),
            paged: Paged::default(),
        }
    }

    /// A machine that pages past `page_at` ready messages (tests page after a few).
    #[cfg(test)]
    fn paging_at(config: MachineConfig, limits: Limits, page_at: usize) -> Machine {
        Machine::build(config, limits, 0, page_at)
    }

    /// Applies one entry's command at the entry's timestamp `now`; what it puts out, in order.
    pub fn apply(&mut self, now: u64, cmd: Cmd) -> Vec<Out> {
        let mut out = Vec::new();
        let Machine {
            core,
            holders,
            checkouts,
            delivery_limit,
            retry,
            delayed,
            keep_dead,
            kept,
            paged,
            ..
        } = self;
        // The core's host over the machine's side, made for each step that needs it.
        macro_rules! host {
            () => {
                Apply {
                    now,
                    holders: &mut *holders,
                    checkouts: &mut *checkouts,
                    out: &mut out,
                    kept: if *keep_dead { Some(&mut *kept) } else { None },
                    paged: &mut *paged,
                }
            };
        }
        match cmd {
            Cmd::Enqueue(m) => answer_first(core.publish(m, false, &mut host!()), &mut out),
            Cmd::Import { msg, redelivered } => {
                answer_first(core.import(msg, redelivered, &mut host!()), &mut out)
            }
            Cmd::Attach(a) => {
                let c = Consumer {
                    key: a.key,
                    handle: a.key,
                    priority: a.priority,
                    no_ack: a.no_ack,
                    exclusive: a.exclusive,
                    prefetch: a.prefetch,
                    outstanding: 0,
                };
                // A key still known (attached, or cancelled and holding deliveries) is taken.
                let r = if holders.contains_key(&a.key) {
                    Err(ConsumeRefused::Exclusive)
                } else {
                    core.add_consumer(c, now)
                };
                out.push(Out::Attached(r));
                if r.is_ok() {
                    let holder = Holder {
                        node: a.node,
                        no_ack: a.no_ack,
                        cancelled: false,
                        timeout_ms: a.timeout_ms,
                        next_delivery: 0,
                        priority: a.priority,
                        prefetch: a.prefetch,
                        exclusive: a.exclusive,
                        suspected: false,
                    };
                    holders.insert(a.key, holder);
                    core.dispatch(&mut host!());
                }
            }
            Cmd::Settle { consumer, seqs } => {
                let done = take(checkouts, consumer, &seqs);
                core.settle(done, true, &mut host!());
                forget_if_done(holders, checkouts, consumer);
            }
            Cmd::Discard { consumer, seqs } => {
                let done = take(checkouts, consumer, &seqs);
                core.discard(done, true, &mut host!());
                forget_if_done(holders, checkouts, consumer);
            }
            Cmd::Return {
                consumer,
                seqs,
                kind,
            } => {
                let back = take(checkouts, consumer, &seqs);
                let hold = retry
                    .filter(|r| r.applies(kind))
                    .map(|r| (r, &mut *delayed));
                return_all(core, *delivery_limit, hold, back, &mut host!());
                forget_if_done(holders, checkouts, consumer);
            }
            Cmd::Cancel { consumer } => {
                if let Some(h) = holders.get_mut(&consumer).filter(|h| !h.cancelled) {
                    h.cancelled = true;
                    let (_, auto_delete_now) = core.remove_consumer(consumer, &mut host!());
                    out.push(Out::Detached { auto_delete_now });
                    forget_if_done(holders, checkouts, consumer);
                }
            }
            Cmd::Get { key, node, ack } => {
                // A key names one consumer or one channel's gets, never both: a get under an
                // attached consumer's key takes nothing.
                let got = if holders.get(&key).is_some_and(|h| !h.cancelled) {
                    None
                } else {
                    core.get(ack, &mut host!())
                };
                let answer = got.map(|(entry, remaining)| {
                    let got = Got {
                        seq: entry.seq,
                        msg: entry.msg.clone(),
                        redelivered: entry.redelivered,
                        remaining,
                    };
                    if ack {
                        // Held as a cancelled consumer's delivery: settled, returned, or back
                        // when the channel or its node goes down.
                        let h = holders.entry(key).or_insert(Holder {
                            node,
                            no_ack: false,
                            cancelled: true,
                            timeout_ms: None,
                            next_delivery: 0,
                            priority: 0,
                            prefetch: 0,
                            exclusive: false,
                            suspected: false,
                        });
                        let delivery = h.next_delivery;
                        h.next_delivery += 1;
                        let held = Held {
                            entry,
                            at: now,
                            delivery,
                        };
                        checkouts
                            .entry(key)
                            .or_default()
                            .insert(held.entry.seq, held);
                    }
                    got
                });
                out.push(Out::Got(answer));
            }
            Cmd::Down { consumer } => {
                down(core, *delivery_limit, consumer, &mut host!());
            }
            Cmd::NodeDown { node } => {
                let gone = on_node(holders, &node, |_| true);
                for consumer in gone {
                    down(core, *delivery_limit, consumer, &mut host!());
                }
            }
            Cmd::Unreachable { node } => {
                let on = on_node(holders, &node, |h| !h.suspected);
                for consumer in on {
                    suspect(core, *delivery_limit, consumer, &mut host!());
                }
            }
            Cmd::Reachable { node } => {
                let back = on_node(holders, &node, |h| h.suspected);
                for key in back {
                    let Some(h) = holders.get_mut(&key) else {
                        continue;
                    };
                    h.suspected = false;
                    let c = Consumer {
                        key,
                        handle: key,
                        priority: h.priority,
                        no_ack: h.no_ack,
                        exclusive: h.exclusive,
                        prefetch: h.prefetch,
                        outstanding: 0,
                    };
                    // An exclusive consumer that another took the place of meanwhile is gone.
                    if core.add_consumer(c, now).is_err() {
                        holders.remove(&key);
                    }
                }
                core.dispatch(&mut host!());
            }
            Cmd::Purge => {
                let n = core.purge(&mut host!());
                out.push(Out::Purged(n));
            }
            Cmd::SetLimits(l) => core.set_limits(l),
            Cmd::SetRetry(r) => *retry = r,
            Cmd::DeadDone { places } => {
                for p in places {
                    kept.remove(&p);
                }
            }
            Cmd::Tick => {
                // Held-back returns that are due go back to the queue's tail, redelivered.
                while let Some(entry) = delayed.first_entry().filter(|e| e.key().0 <= now) {
                    let e = entry.remove();
                    // Never refused: it was in the queue already (a full queue stays over).
                    core.requeue_at_tail(e.msg, &mut host!());
                }
                core.expire(now, &mut host!());
                let late: Vec<(u64, String, u64)> = checkouts
                    .iter()
                    .filter_map(|(c, held)| {
                        let h = holders.get(c)?;
                        let t = h.timeout_ms?;
                        let late = held.values().any(|d| d.at.saturating_add(t) <= now);
                        late.then(|| (*c, h.node.clone(), t))
                    })
                    .collect();
                for (consumer, node, timeout_ms) in late {
                    out.push(Out::TimedOut {
                        consumer,
                        node,
                        timeout_ms,
                    });
                    down(core, *delivery_limit, consumer, &mut host!());
                }
            }
            Cmd::Lease {
                consumer,
                seqs,
                extend_ms,
            } => {
                let t = holders.get(&consumer).and_then(|h| h.timeout_ms);
                if let (Some(t), Some(held)) = (t, checkouts.get_mut(&consumer)) {
                    // Delivered `at`, it times out at `at + t`: moved so that it does at
                    // `now + extend`, never earlier.
                    let wanted = now.saturating_add(extend_ms.unwrap_or(t)).saturating_sub(t);
                    for s in &seqs {
                        if let Some(h) = held.get_mut(s) {
                            h.at = h.at.max(wanted);
                        }
                    }
                }
            }
        }
        out
    }

    /// The machine as it is now, for a snapshot at the entry just applied.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: self.version,
            machine: self.clone(),
        }
    }

    /// A machine from a snapshot; refused when it is of a version this release does not know.
    pub fn restore(s: Snapshot) -> Result<Machine, String> {
        if s.version > MACHINE_VERSION {
            return Err(format!(
                "a snapshot of queue machine version {} is newer than this release's {}",
                s.version, MACHINE_VERSION
            ));
        }
        Ok(s.machine)
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The earliest time a [`Cmd::Tick`] has something to do (a ready message's deadline, a
    /// held delivery's consumer timeout, a held-back return's due time); `None`: none pending.
    /// The leader proposes a tick then.
    pub fn next_due(&self) -> Option<u64> {
        let deadlines = self
            .core
            .ready
            .iter()
            .filter_map(|l| l.front().and_then(|e| e.expires_at_ms));
        let timeouts = self.checkouts.iter().filter_map(|(c, held)| {
            let t = self.holders.get(c).and_then(|h| h.timeout_ms)?;
            held.values().map(|h| h.at.saturating_add(t)).min()
        });
        let retries = self.delayed.keys().next().map(|k| k.0);
        deadlines.chain(timeouts).chain(retries).min()
    }

    /// The lowest log index a message still in the queue (ready or held) refers to: the log
    /// may be truncated below it once a snapshot covers it (`rabbit_fifo`'s release cursor).
    /// `None`: the queue references no entry.
    pub fn release_cursor(&self) -> Option<u64> {
        let in_full = self.in_full().map(|(_, m)| m.index);
        in_full.chain(self.paged.first_place()).min()
    }

    /// Every message still in the queue (ready, held, or held back by the retry back-off), by
    /// seq, in no particular order: what a snapshot must be able to read the bodies of.
    pub fn refs(&self) -> impl Iterator<Item = (u64, MsgRef)> + '_ {
        let in_full = self.in_full().map(|(s, m)| (s, m.clone()));
        in_full.chain(self.paged.iter().map(|e| (e.seq, e.msg)))
    }

    /// [`Machine::refs`] but the paged ones.
    fn in_full(&self) -> impl Iterator<Item = (u64, &MsgRef)> {
        let ready = self.core.ready.iter().flat_map(|l| l.iter());
        let held = self
            .checkouts
            .values()
            .flat_map(|m| m.values().map(|h| &h.entry));
        ready
            .chain(held)
            .chain(self.delayed.values())
            .map(|e| (e.seq, &e.msg))
            // A kept dead letter has no seq any more: named by its place.
            .chain(self.kept.values().map(|(m, _)| (m.index, m)))
    }

    /// The dead letters kept until routed (at-least-once), by log place.
    pub fn kept_dead(&self) -> impl Iterator<Item = (&MsgRef, Reason)> {
        self.kept.values().map(|(m, r)| (m, *r))
    }

    /// The node a consumer (or a get key) is on.
    pub fn consumer_node(&self, consumer: u64) -> Option<&str> {
        self.holders.get(&consumer).map(|h| h.node.as_str())
    }

    /// The consumers that may receive, with their nodes (those whose node is unreachable
    /// included).
    pub fn attached(&self) -> impl Iterator<Item = (u64, &str)> {
        self.holders
            .iter()
            .filter(|(_, h)| !h.cancelled)
            .map(|(k, h)| (*k, h.node.as_str()))
    }

    /// The nodes of consumers (and gets holding deliveries), each with whether it has some
    /// that are not suspected and some that are (out of the core since it was unreachable).
    pub fn consumer_nodes(&self) -> std::collections::BTreeMap<&str, (bool, bool)> {
        let mut nodes = std::collections::BTreeMap::new();
        for h in self.holders.values() {
            let (active, suspected) = nodes.entry(h.node.as_str()).or_insert((false, false));
            *active |= !h.suspected;
            *suspected |= h.suspected;
        }
        nodes
    }

    pub fn ready_len(&self) -> usize {
        self.core.ready_len()
    }

    /// Every message the machine references: ready, held, held back, kept dead letters.
    pub fn len(&self) -> usize {
        self.ready_len() + self.checked_out() + self.delayed.len() + self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Returns held back by the retry back-off (not counted as ready, as RabbitMQ 4.3).
    pub fn delayed_len(&self) -> usize {
        self.delayed.len()
    }

    /// Deliveries not yet settled.
    pub fn checked_out(&self) -> usize {
        self.checkouts.values().map(BTreeMap::len).sum()
    }

    /// What `consumer` holds that was delivered after its delivery number `after` (all it holds
    /// with `None`), in delivery order: what a new leader sends again when the consumer's node
    /// saw a gap. Reads only: resending changes nothing in the state.
    pub fn held_since(&self, consumer: u64, after: Option<u64>) -> Vec<Resend> {
        let mut v: Vec<Resend> = self
            .checkouts
            .get(&consumer)
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|h| after.is_none_or(|a| h.delivery > a))
            .map(|h| Resend {
                delivery: h.delivery,
                seq: h.entry.seq,
                msg: h.entry.msg.clone(),
                redelivered: h.entry.redelivered,
            })
            .collect();
        v.sort_by_key(|r| r.delivery);
        v
    }

    /// The seqs `consumer` holds, in order.
    pub fn held_by(&self, consumer: u64) -> Vec<u64> {
        self.checkouts
            .get(&consumer)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default()
    }

    /// A consumer of priority `min_priority` or more waits for messages ([`State::starving`]).
    pub fn starving(&self, min_priority: i64) -> bool {
        self.core.starving(min_priority)
    }

    /// Consumers that may receive (not cancelled, not down).
    pub fn consumer_count(&self) -> usize {
        self.core.consumers().len()
    }

    /// A text of the whole state, equal on two members exactly when their states are equal.
    pub fn fingerprint(&self) -> String {
        format!("{self:?}")
    }
}

/// Takes `seqs` out of what `consumer` holds; seqs it does not hold (settled already, or never
/// its) are ignored, so a duplicate settle is harmless.
fn take(
    checkouts: &mut Checkouts,
    consumer: u64,
    seqs: &[u64],
) -> Vec<(Option<u64>, Entry<MsgRef>)> {
    let Some(held) = checkouts.get_mut(&consumer) else {
        return Vec::new();
    };
    let out = seqs
        .iter()
        .filter_map(|s| held.remove(s))
        .map(|h| (Some(consumer), h.entry))
        .collect();
    if held.is_empty() {
        checkouts.remove(&consumer);
    }
    out
}

/// The consumers (and get keys) on `node` that `which` picks.
fn on_node(
    holders: &BTreeMap<u64, Holder>,
    node: &str,
    which: impl Fn(&Holder) -> bool,
) -> Vec<u64> {
    holders
        .iter()
        .filter(|(_, h)| h.node == node && which(h))
        .map(|(k, _)| *k)
        .collect()
}

/// A cancelled consumer is forgotten once it holds nothing.
fn forget_if_done(holders: &mut BTreeMap<u64, Holder>, checkouts: &Checkouts, consumer: u64) {
    if holders.get(&consumer).is_some_and(|h| h.cancelled) && !checkouts.contains_key(&consumer) {
        holders.remove(&consumer);
    }
}

/// Returned deliveries go back, one more delivery counted; past the delivery limit they
/// are dead-lettered instead.
fn return_all(
    core: &mut State<u64, MsgRef>,
    limit: Option<u32>,
    hold: Option<(Backoff, &mut Delayed)>,
    back: Vec<(Option<u64>, Entry<MsgRef>)>,
    host: &mut Apply<'_>,
) {
    let (mut requeue, mut dead) = (Vec::new(), Vec::new());
    for (c, mut e) in back {
        e.msg.delivery_count += 1;
        if limit.is_some_and(|l| e.msg.delivery_count > l) {
            dead.push((c, e));
        } else {
            requeue.push((c, e));
        }
    }
    if !dead.is_empty() {
        core.dead_letter(dead, Reason::DeliveryLimit, host);
    }
    if requeue.is_empty() {
        return;
    }
    match hold {
        // Settled here (its consumer's credit comes back), held until due.
        Some((backoff, delayed)) => {
            let now = host.now;
            for (_, e) in &requeue {
                let due = now.saturating_add(backoff.delay_ms(u64::from(e.msg.delivery_count)));
                delayed.insert((due, e.seq), e.clone());
            }
            core.settle(requeue, true, host);
        }
        None => core.requeue(requeue, host),
    }
}

/// Everything `consumer` holds, taken out of its checkouts.
fn take_all(checkouts: &mut Checkouts, consumer: u64) -> Vec<(Option<u64>, Entry<MsgRef>)> {
    checkouts
        .remove(&consumer)
        .unwrap_or_default()
        .into_values()
        .map(|h| (Some(consumer), h.entry))
        .collect()
}

/// A consumer whose node is unreachable: out of the core (no deliveries) and what it held back
/// in the queue, but still attached, to be taken on again when its node is back. A cancelled
/// one (or a get key) is removed, as its node going down would.
fn suspect(core: &mut State<u64, MsgRef>, limit: Option<u32>, consumer: u64, host: &mut Apply<'_>) {
    match host.holders.get_mut(&consumer) {
        Some(h) if !h.cancelled => h.suspected = true,
        Some(_) => return down(core, limit, consumer, host),
        None => return,
    }
    let held = take_all(host.checkouts, consumer);
    core.remove_consumer(consumer, host);
    return_all(core, limit, None, held, host);
}

/// A consumer whose channel, connection or node is gone: removed, and what it held goes
/// back to the queue.
fn down(core: &mut State<u64, MsgRef>, limit: Option<u32>, consumer: u64, host: &mut Apply<'_>) {
    let Some(h) = host.holders.remove(&consumer) else {
        return;
    };
    let held = take_all(host.checkouts, consumer);
    if !h.cancelled {
        let (_, auto_delete_now) = core.remove_consumer(consumer, host);
        host.out.push(Out::Detached { auto_delete_now });
    }
    return_all(core, limit, None, held, host);
}
