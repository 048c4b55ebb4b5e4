//! The machine's compact form of a long backlog. Past [`PAGE_AT`] ready messages, a
//! single-lane queue's core pages new messages out to its tail (as a classic queue pages to its
//! log); the machine's host keeps that tail here, in the state, instead of as one
//! `Entry<MsgRef>` (72 bytes) per message:
//! - runs of messages whose seqs and log places are both consecutive (the publishes of one log
//!   entry), 24 bytes a run;
//! - each message's body size, 4 bytes;
//! - in full, only the few messages that are not plain (a priority, an expiration, a deadline,
//!   a delivery count, a redelivered flag, a body over 4 GiB).
//!
//! The core reads it back in order ([`Paged::page_in`]) once its memory holds no ready
//! message. It is part of the state: every member pages at the same message, snapshots carry
//! it, and a restored machine reads back the same entries.

use std::collections::{BTreeMap, VecDeque};

use super::types::MsgRef;
use crate::Entry;

/// Ready messages a single-lane machine keeps in full before it pages the rest out.
pub(super) const PAGE_AT: usize = 4096;

/// Messages read back at once.
const PAGE_IN: usize = 1024;

/// A run of paged messages: seqs `seq..seq + count` at places `place..place + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Run {
    seq: u64,
    place: u64,
    count: u32,
}

/// The core's tail, compact.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) struct Paged {
    runs: VecDeque<Run>,
    /// One per message, in order (a message kept in full has a 0 here).
    sizes: VecDeque<u32>,
    /// Messages that are not plain, in full, by seq.
    full: BTreeMap<u64, Entry<MsgRef>>,
}

impl Paged {
    /// Appends a message the core paged out (its seq is above every one here).
    pub(super) fn push(&mut self, e: &Entry<MsgRef>) {
        let m = &e.msg;
        let plain = !e.redelivered
            && e.expires_at_ms.is_none()
            && m.priority.is_none()
            && m.expiration_ms.is_none()
            && m.delivery_count == 0;
        let size = u32::try_from(m.size).ok().filter(|_| plain);
        if size.is_none() {
            self.full.insert(e.seq, e.clone());
        }
        self.sizes.push_back(size.unwrap_or(0));
        match self.runs.back_mut() {
            Some(r)
                if r.seq + u64::from(r.count) == e.seq
                    && r.place + u64::from(r.count) == m.index
                    && r.count < u32::MAX =>
            {
                r.count += 1;
            }
            _ => self.runs.push_back(Run {
                seq: e.seq,
                place: m.index,
                count: 1,
            }),
        }
    }

    /// Reads back up to `remaining` messages (and at most [`PAGE_IN`]) into `out`, in order;
    /// how many, and their body bytes.
    pub(super) fn page_in(
        &mut self,
        remaining: usize,
        out: &mut Vec<Entry<MsgRef>>,
    ) -> (usize, u64) {
        let (mut n, mut bytes) = (0, 0);
        while n < remaining.min(PAGE_IN) {
            let Some(e) = self.pop() else { break };
            bytes += e.msg.size;
            out.push(e);
            n += 1;
        }
        (n, bytes)
    }

    fn pop(&mut self) -> Option<Entry<MsgRef>> {
        let run = self.runs.front_mut()?;
        let (seq, place) = (run.seq, run.place);
        run.seq += 1;
        run.place += 1;
        run.count -= 1;
        if run.count == 0 {
            self.runs.pop_front();
        }
        let size = self.sizes.pop_front().unwrap_or(0);
        Some(
            self.full
                .remove(&seq)
                .unwrap_or_else(|| plain(seq, place, size)),
        )
    }

    /// Every message here, in order, in full.
    pub(super) fn iter(&self) -> impl Iterator<Item = Entry<MsgRef>> + '_ {
        let mut sizes = self.sizes.iter();
        self.runs
            .iter()
            .flat_map(|r| (0..u64::from(r.count)).map(move |i| (r.seq + i, r.place + i)))
            .map(move |(seq, place)| {
                let size = sizes.next().copied().unwrap_or(0);
                self.full
                    .get(&seq)
                    .cloned()
                    .unwrap_or_else(|| plain(seq, place, size))
            })
    }

    /// The lowest log place a message here refers to.
    pub(super) fn first_place(&self) -> Option<u64> {
        // Places grow with seqs except for returns paged at the tail: look at every run.
        self.runs.iter().map(|r| r.place).min()
    }

    pub(super) fn len(&self) -> usize {
        self.sizes.len()
    }

    pub(super) fn clear(&mut self) {
        *self = Paged::default();
    }
}

/// A plain message as it was enqueued: only its place and size.
fn plain(seq: u64, place: u64, size: u32) -> Entry<MsgRef> {
    Entry {
        seq,
        msg: MsgRef {
            index: place,
            size: u64::from(size),
            priority: None,
            expiration_ms: None,
            delivery_count: 0,
        },
        redelivered: false,
        expires_at_ms: None,
        logged: false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{arb_cmd, attach, msg, through_bytes};
    use super::super::{Cmd, Machine, MachineConfig};
    use crate::Limits;

    proptest! {
        /// Paging changes nothing anyone sees: a machine that pages its backlog after 3 ready
        /// messages puts out exactly what one that never pages does, keeps its invariants (a seq
        /// in one place, the core's count), and one restored from its snapshot (paged messages
        /// included) continues the same.
        #[test]
        fn a_paged_backlog_puts_out_what_one_in_full_does(
            cmds in prop::collection::vec(arb_cmd(), 1..200),
            cut in any::<prop::sample::Index>(),
        ) {
            let cut = cut.index(cmds.len());
            let config = MachineConfig {
                delivery_limit: Some(3),
                keep_dead_letters: true,
                ..Default::default()
            };
            let mut paging = Machine::paging_at(config, Limits::default(), 3);
            let mut full = Machine::paging_at(config, Limits::default(), usize::MAX);
            let mut restored: Option<Machine> = None;
            for (i, cmd) in cmds.into_iter().enumerate() {
                let now = 10 * i as u64;
                if i == cut {
                    restored = Some(Machine::restore(through_bytes(paging.snapshot())).unwrap());
                }
                let out = paging.apply(now, cmd.clone());
                prop_assert_eq!(&out, &full.apply(now, cmd.clone()));
                prop_assert_eq!(paging.release_cursor(), full.release_cursor());
                prop_assert_eq!(paging.ready_len(), full.ready_len());
                let mut refs: Vec<_> = paging.refs().collect();
                let mut want: Vec<_> = full.refs().collect();
                refs.sort_by_key(|(s, m)| (*s, m.index));
                want.sort_by_key(|(s, m)| (*s, m.index));
                prop_assert_eq!(refs, want);
                paging.check_invariants().map_err(TestCaseError::fail)?;
                if let Some(r) = restored.as_mut() {
                    prop_assert_eq!(&r.apply(now, cmd.clone()), &out);
                    prop_assert_eq!(r.fingerprint(), paging.fingerprint());
                }
            }
        }
    }

    #[test]
    fn a_long_backlog_is_kept_compact_and_read_back_in_order() {
        let mut m = Machine::paging_at(MachineConfig::default(), Limits::default(), 4);
        // Three entries of 10 publishes each: places index<<12 | slot, as the broker numbers them.
        for entry in 1..=3u64 {
            for slot in 0..10 {
                m.apply(0, Cmd::Enqueue(msg(entry << 12 | slot)));
            }
        }
        assert_eq!(m.ready_len(), 30);
        assert_eq!(m.paged.len(), 26, "past 4 in full, the rest is paged");
        assert_eq!(m.release_cursor(), Some(1 << 12));
        m.apply(1, attach(1, "a", 0));
        let got: Vec<u64> = m.held_by(1);
        assert_eq!(got, (0..30).collect::<Vec<_>>(), "every message, in order");
        assert_eq!(m.paged.len(), 0);
        m.check_invariants().unwrap();
    }
}
