//! A simulated host and a checker of the queue's invariants, shared by the property tests and
//! the fuzz target (feature `testing`). `Sim` has consumers with prefetch, a log that pages in a
//! few records at a time, a virtual clock, and a record of every effect; [`run_ops`] drives a
//! queue with it and checks, after every command, that each message is in exactly one place,
//! that dispatch is work-conserving, and that deadlines, limits and counts hold.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::*;

#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub id: u32,
    pub size: u64,
    pub prio: Option<u8>,
    pub exp: Option<u64>,
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
pub struct SimConsumer {
    pub prefetch: usize,
    pub no_ack: bool,
    /// Refuses every offer (its connection's output is full).
    pub paused: bool,
    pub held: Vec<Entry<Msg>>,
}

#[derive(Debug, Default)]
pub struct Sim {
    pub now: u64,
    pub consumers: BTreeMap<u64, SimConsumer>,
    /// The log's tail: records of messages that live on disk only, in order.
    pub tail: VecDeque<Entry<Msg>>,
    pub paging: bool,
    pub can_page: bool,
    /// Seqs written to the log and not yet forgotten.
    pub logged: BTreeSet<u64>,
    pub dead: Vec<(u32, Reason)>,
    /// (consumer, id, redelivered, expires_at) for each delivery.
    pub delivered: Vec<(u64, u32, bool, Option<u64>)>,
    /// Ids that left the queue for good through the consumer side (no-ack deliveries).
    pub gone: BTreeSet<u32>,
    pub errors: Vec<String>,
}

impl Host<u64, Msg> for Sim {
    fn offer(&mut self, consumer: &u64, entry: &Entry<Msg>) -> Offer {
        let Some(c) = self.consumers.get_mut(consumer) else {
            self.errors
                .push(format!("offer to unknown consumer {consumer}"));
            return Offer::Refused;
        };
        if !c.no_ack && c.prefetch > 0 && c.held.len() >= c.prefetch {
            self.errors.push(format!(
                "consumer {consumer} offered a message beyond its prefetch"
            ));
            return Offer::Refused;
        }
        if c.paused {
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

pub type Q = State<u64, Msg>;

pub fn msg(id: u32, size: u64, prio: Option<u8>, exp: Option<u64>) -> Msg {
    Msg {
        id,
        size,
        prio,
        exp,
    }
}

/// An ack-mode consumer with no prefetch limit.
pub fn consumer(key: u64, priority: i64) -> Consumer<u64> {
    Consumer {
        key,
        handle: key,
        priority,
        no_ack: false,
        exclusive: false,
        prefetch: 0,
        outstanding: 0,
    }
}

pub fn sim_with(keys: &[(u64, usize)]) -> Sim {
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

#[derive(Debug, Clone)]
pub enum Op {
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

/// The ids of the ready messages, in memory and paged out.
fn ready_ids(q: &Q, s: &Sim) -> Vec<u32> {
    let paged = s.tail.iter().map(|e| e.msg.id);
    q.ready
        .iter()
        .flatten()
        .map(|e| e.msg.id)
        .chain(paged)
        .collect()
}

/// Runs `ops` against a fresh queue, checking every invariant after each.
pub fn run_ops(ops: Vec<Op>, config: Config, limits: Limits) -> Result<(), String> {
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
                        prefetch: prefetch as u32,
                        outstanding: 0,
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
                    q.requeue(c.held.into_iter().map(|e| (Some(key), e)), &mut s);
                } else {
                    dispatched = false;
                }
            }
            Op::Settle { key, how, dispatch } => {
                // Key 4 settles what basic.get took (no consumer's credit).
                let (from, held) = if key == 4 {
                    (None, std::mem::take(&mut gets))
                } else {
                    let held = s
                        .consumers
                        .get_mut(&key)
                        .map(|c| std::mem::take(&mut c.held))
                        .unwrap_or_default();
                    (Some(key), held)
                };
                let ids: Vec<u32> = held.iter().map(|e| e.msg.id).collect();
                let held = held.into_iter().map(|e| (from, e));
                match how {
                    0 => {
                        finished.extend(ids);
                        q.settle(held, dispatch, &mut s);
                    }
                    1 => {
                        finished.extend(ids);
                        q.discard(held, dispatch, &mut s);
                    }
                    _ => {
                        if q.is_deleted() {
                            finished.extend(ids);
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
                let before = ready_ids(&q, &s);
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
                let before = ready_ids(&q, &s);
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

/// Reads a command sequence, a config and limits from fuzzer bytes: every input is valid.
pub fn ops_from_bytes(data: &[u8]) -> (Vec<Op>, Config, Limits) {
    let mut b = data.iter().copied();
    let mut next = move || b.next();
    let opt = |v: u8, m: u64| (v & 0x80 != 0).then_some((v & 0x7f) as u64 % m);
    let head: Vec<u8> = (0..5).map(|_| next().unwrap_or(0)).collect();
    let config = Config {
        max_priority: opt(head[0], 4).map(|p| p as u8),
        single_active_consumer: head[1] & 1 != 0,
        page_out_msgs: 1 + (head[1] >> 1) as usize % 8,
        ..Config::default()
    };
    let limits = Limits {
        max_length: opt(head[2], 8),
        max_length_bytes: opt(head[3], 64),
        overflow: match head[4] % 3 {
            0 => Overflow::DropHead,
            1 => Overflow::RejectPublish,
            _ => Overflow::RejectPublishDlx,
        },
        message_ttl_ms: opt(head[4], 30),
    };
    let mut ops = Vec::new();
    while let Some(tag) = next() {
        let a = next().unwrap_or(0);
        let op = match tag % 13 {
            0..=2 => Op::Publish {
                size: (a % 16) as u64,
                prio: opt(next().unwrap_or(0), 6).map(|p| p as u8),
                exp: opt(next().unwrap_or(0), 30),
                logged: a & 0x10 != 0,
            },
            3 => Op::Get { ack: a & 1 != 0 },
            4 => Op::Consume {
                key: (a % 4) as u64,
                priority: (a >> 2) as i64 % 3 - 1,
                prefetch: (a >> 4) as usize % 3,
                no_ack: a & 0x40 != 0,
                exclusive: a & 0x80 != 0 && a & 3 == 0,
            },
            5 => Op::Cancel {
                key: (a % 4) as u64,
            },
            6 | 7 => Op::Settle {
                key: (a % 5) as u64,
                how: (a >> 3) % 3,
                dispatch: a & 0x80 == 0,
            },
            8 => Op::Pause {
                key: (a % 4) as u64,
                paused: a & 0x10 != 0,
            },
            9 => Op::Advance((a % 16) as u64),
            10 => match a % 4 {
                0 => Op::Expire,
                1 => Op::Purge,
                2 => Op::Dispatch,
                _ => Op::Delete,
            },
            11 => Op::SetLimits(Limits {
                max_length: opt(a, 8),
                max_length_bytes: opt(next().unwrap_or(0), 64),
                overflow: limits.overflow,
                message_ttl_ms: opt(next().unwrap_or(0), 30),
            }),
            _ => Op::Dispatch,
        };
        ops.push(op);
    }
    (ops, config, limits)
}
