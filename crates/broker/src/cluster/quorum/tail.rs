//! Reading a leader's paged tail back from the group's log ([`LogTail`], at [`LogPos`]): a
//! replicated queue keeps no second copy of a long queue's messages.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::entry::decode;
use super::{LogPos, LogTail, Replicator};
use crate::message::Message;

impl LogPos {
    /// At message `id`.
    pub fn is(&self, id: u64) -> bool {
        self.next_id == id
    }
}

impl LogTail {
    pub(super) fn new(
        log: warren_cluster::LogReader,
        applied: Arc<AtomicU64>,
        repl: Arc<Replicator>,
        counts: bool,
    ) -> LogTail {
        LogTail {
            log,
            applied,
            repl,
            counts,
            at: None,
            runs: VecDeque::new(),
            seen: HashSet::new(),
            deadlines: VecDeque::new(),
            recovered_max: None,
        }
    }

    /// The queue pages out from the message at `at` on.
    pub fn start(&mut self, at: LogPos) {
        self.at = Some(at);
        self.runs.clear();
        self.deadlines.clear();
    }

    /// A new leader's whole queue, in the log from `from` on (see [`Queue::recover_tail`]).
    pub fn recover(&mut self, from: LogPos, runs: VecDeque<(u64, u64)>, seen: HashSet<u64>) {
        self.recovered_max = runs.back().map(|r| r.1);
        self.at = Some(from);
        self.runs = runs;
        self.seen = seen;
        self.deadlines.clear();
    }

    /// Message `id` joined the tail.
    pub fn push(&mut self, id: u64, expires_at_ms: Option<u64>) {
        match self.runs.back_mut() {
            Some(r) if r.1 + 1 == id => r.1 = id,
            _ => self.runs.push_back((id, id)),
        }
        if let Some(t) = expires_at_ms {
            self.deadlines.push_back((id, t));
        }
    }

    /// The whole tail left (purge, delete): settled in runs, without reading it back, if
    /// `settle` (not when the queue is retired: the messages stay in the group).
    pub fn forget(&mut self, settle: bool) {
        for (first, last) in self.runs.drain(..) {
            if settle {
                self.repl.settled_run(first, last);
            }
        }
        self.at = None;
        self.deadlines.clear();
        self.seen.clear();
    }

    fn holds(&self, id: u64) -> bool {
        let i = self.runs.partition_point(|r| r.1 < id);
        self.runs.get(i).is_some_and(|r| r.0 <= id)
    }

    /// Reads about `limits::PAGE_IN_BYTES` of the tail's messages back, in order; `ttl` is the
    /// queue's message TTL, for recovered messages.
    pub fn read(
        &mut self,
        remaining: usize,
        ttl: Option<u64>,
        now: &mut dyn FnMut() -> u64,
        out: &mut Vec<warren_queue::Entry<Arc<Message>>>,
    ) -> warren_queue::PagedIn {
        let mut read = warren_queue::PagedIn::default();
        let Some(mut at) = self.at else {
            return read;
        };
        let Some(last) = self.runs.back().map(|r| r.1) else {
            return read;
        };
        let applied = self.applied.load(Ordering::Acquire);
        let repl = self.repl.clone();
        let returns_so_far = repl.returns.lock();
        // Settled messages are skipped: read on until something is found (or the end).
        let mut done = false;
        while !done && read.records == 0 {
            let entries = match self.log.read(at.index, crate::limits::PAGE_IN_BYTES) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read a replicated queue's messages back from its log");
                    return read;
                }
            };
            done = entries.is_empty();
            'entries: for (index, cmd) in entries {
                if index >= applied {
                    done = true;
                    break;
                }
                if index != at.index {
                    tracing::error!(
                        index,
                        expected = at.index,
                        "a replicated queue's log skips an entry"
                    );
                    return read;
                }
                // As `GroupSm::apply` numbers them: an entry that does not decode has none.
                let msgs = cmd
                    .and_then(|c| decode(Bytes::from(c)))
                    .map(|d| d.msgs)
                    .unwrap_or_default();
                let n = msgs.len() as u64;
                for (i, data) in msgs.into_iter().enumerate() {
                    let id = at.first_id + i as u64;
                    if id < at.next_id {
                        continue;
                    }
                    if read.records == remaining || id > last {
                        done = true;
                        break 'entries;
                    }
                    at.next_id = id + 1;
                    if !self.holds(id) {
                        continue;
                    }
                    read.records += 1;
                    read.bytes += crate::persist::stored_body_len(&data);
                    let Some((msg, _)) = crate::persist::decode_message(&data) else {
                        tracing::warn!(id, "skipping a replicated message that does not decode");
                        continue;
                    };
                    let returns = returns_so_far.get(&id).copied().unwrap_or(0);
                    let msg = if self.counts {
                        crate::message::with_delivery_count(&msg, u64::from(returns))
                    } else {
                        msg
                    };
                    while self.deadlines.front().is_some_and(|d| d.0 < id) {
                        self.deadlines.pop_front();
                    }
                    let mut expires_at_ms =
                        self.deadlines.front().filter(|d| d.0 == id).map(|d| d.1);
                    if self.recovered_max.is_some_and(|m| id <= m) {
                        let t = match (ttl, warren_queue::Payload::expiration_ms(&msg)) {
                            (Some(x), Some(y)) => Some(x.min(y)),
                            (x, y) => x.or(y),
                        };
                        expires_at_ms = t.map(|t| now().saturating_add(t));
                    }
                    out.push(warren_queue::Entry {
                        seq: id,
                        msg: Arc::new(msg),
                        redelivered: self.seen.remove(&id) || returns > 0,
                        expires_at_ms,
                        logged: true,
                    });
                }
                // The whole entry is read: on to the next.
                at = LogPos {
                    index: index + 1,
                    first_id: at.first_id + n,
                    next_id: at.next_id.max(at.first_id + n),
                };
            }
        }
        while self.runs.front().is_some_and(|r| r.1 < at.next_id) {
            self.runs.pop_front();
        }
        if let Some(r) = self.runs.front_mut() {
            r.0 = r.0.max(at.next_id);
        }
        self.at = Some(at);
        read
    }
}
