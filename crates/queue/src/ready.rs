//! The ready messages: one lane per priority level in memory, each in seq order, and behind
//! level 0 the tail that lives in the log only (single-lane queues). Recovering a log, reading
//! the tail back, taking the head and clearing all. Invariant: `ready_len` and `ready_bytes`
//! count memory and tail together, and the tail is `None` rather than empty.

use crate::host::forget;
use crate::{Consumer, Effect, Entry, Host, Payload, State, Tail};

impl<C, M: Payload> State<C, M> {
    /// Takes over what a log recovered at boot: `count` messages of `bytes`, to be read back in
    /// order from the host's log; seqs continue from `next_seq`. A priority queue reads them all
    /// now, into their levels.
    pub fn recover(&mut self, next_seq: u64, count: usize, bytes: u64, host: &mut impl Host<C, M>) {
        self.next_seq = self.next_seq.max(next_seq);
        if count == 0 {
            return;
        }
        self.ready_len += count;
        self.ready_bytes += bytes;
        self.tail = Some(Tail { count, bytes });
        // Recovered messages may carry deadlines.
        self.may_expire = true;
        if self.ready.len() > 1 {
            while self.tail.is_some() {
                self.page_in(host);
            }
            let lane = std::mem::take(&mut self.ready[0]);
            for e in lane {
                let level = self.level(&e.msg);
                self.ready[level].push_back(e);
            }
        }
    }

    /// Removes every ready message; returns how many.
    pub fn purge(&mut self, host: &mut impl Host<C, M>) -> u32 {
        let n = self.ready_len as u32;
        self.clear_ready(host);
        n
    }

    /// Deletes the queue: returns its ready count and its consumers (to be told of the cancel).
    /// Unacked messages stay with their channels; settling them later is harmless.
    pub fn delete(&mut self, host: &mut impl Host<C, M>) -> (u32, Vec<Consumer<C>>) {
        self.deleted = true;
        let n = self.ready_len as u32;
        self.clear_ready(host);
        (n, std::mem::take(&mut self.consumers))
    }

    /// Reads paged-out messages back once memory holds none.
    pub(crate) fn fill(&mut self, host: &mut impl Host<C, M>) {
        if self.tail.is_some() && self.ready[0].is_empty() {
            self.page_in(host);
        }
    }

    /// Reads the next paged-out messages into level 0, in order.
    fn page_in(&mut self, host: &mut impl Host<C, M>) {
        let Some(mut tail) = self.tail else { return };
        let mut got = std::mem::take(&mut self.scratch);
        let read = host.page_in(tail.count, &mut got);
        // Never trust a host to read more than the tail holds.
        let records = read.records.min(tail.count);
        let mut kept_bytes = 0;
        let mut kept = 0;
        for e in got.drain(..).take(records) {
            kept_bytes += e.msg.body_len();
            kept += 1;
            self.ready[0].push_back(e);
        }
        // Records that did not decode leave the counts; so does the whole tail if none could be
        // read.
        let (records, bytes) = if records == 0 {
            (tail.count, tail.bytes)
        } else {
            (records, read.bytes.max(kept_bytes))
        };
        let lost = records - kept;
        self.ready_len -= lost;
        self.ready_bytes = self.ready_bytes.saturating_sub(bytes - kept_bytes);
        tail.count -= records;
        tail.bytes = tail.bytes.saturating_sub(bytes);
        self.tail = (tail.count > 0).then_some(tail);
        self.scratch = got;
    }

    pub(crate) fn pop_ready(&mut self, host: &mut impl Host<C, M>) -> Option<Entry<M>> {
        self.fill(host);
        let m = self.ready.iter_mut().rev().find_map(|l| l.pop_front())?;
        self.ready_bytes -= m.msg.body_len();
        self.ready_len -= 1;
        Some(m)
    }

    fn clear_ready(&mut self, host: &mut impl Host<C, M>) {
        for lane in &mut self.ready {
            for m in lane.drain(..) {
                forget(&m, host);
            }
        }
        if self.tail.take().is_some() {
            // What is on disk only goes with one record, without reading it back.
            host.effect(Effect::ForgetTail {
                last_seq: self.next_seq.saturating_sub(1),
            });
        }
        self.ready_len = 0;
        self.ready_bytes = 0;
    }
}
