//! Reading a stream: each consumer's task takes committed messages from the tail cache, or
//! reads them from the segment files on the blocking pool, and offers them to its channel while
//! it has credit.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use warren_store::stream as log;

use crate::message::Message;
use crate::queue::{Offer, QueuedMessage};

use super::{Reader, Stream, READ_BYTES, READ_MSGS};

impl Stream {
    /// A consumer's task: reads from its cursor and offers to its channel while it has credit.
    pub(super) async fn serve(self: Arc<Self>, r: Arc<Reader>, mut next: u64) {
        let mut batch: VecDeque<QueuedMessage> = VecDeque::new();
        let mut hint = None;
        let mut failures = 0u32;
        loop {
            if r.consumer.cancelled.load(Ordering::Relaxed) || self.is_deleted() {
                return;
            }
            if batch.is_empty() {
                r.at_end.store(true, Ordering::SeqCst);
                let got = match self.fetch_cached(&mut next, &mut hint, &mut batch) {
                    Fetch::Got => Ok(true),
                    Fetch::End => Ok(false),
                    // On the blocking pool: a read from a cold disk must not stall the other
                    // tasks (connections, publishers) of this worker thread.
                    Fetch::File(plan, committed) => {
                        let s = self.clone();
                        let (n, h) = (next, hint);
                        let read = tokio::task::spawn_blocking(move || {
                            let (mut n, mut h, mut out) = (n, h, VecDeque::new());
                            let r = s.read_file(&plan, committed, &mut n, &mut h, &mut out);
                            (r, n, h, out)
                        });
                        match read.await {
                            Ok((r, n, h, out)) => {
                                (next, hint, batch) = (n, h, out);
                                r
                            }
                            Err(e) => Err(std::io::Error::other(e.to_string())),
                        }
                    }
                };
                match got {
                    Ok(true) => {
                        r.at_end.store(false, Ordering::SeqCst);
                        failures = 0;
                    }
                    Ok(false) => {
                        // Woken by the next group commit (or a cancel).
                        r.wake.notified().await;
                        r.at_end.store(false, Ordering::SeqCst);
                        continue;
                    }
                    Err(e) => {
                        r.at_end.store(false, Ordering::SeqCst);
                        failures += 1;
                        if failures == 1 {
                            tracing::error!(stream = %self.name, offset = next, error = %e, "cannot read the stream; retrying");
                        }
                        if failures >= 3 {
                            // A damaged segment: what cannot be read is skipped, not retried
                            // forever.
                            let after = self.inner.lock().log.segment_after(next);
                            if let Some(to) = after {
                                tracing::error!(stream = %self.name, from = next, to, "skipping the unreadable rest of a stream segment");
                                (next, hint, failures) = (to, None, 0);
                                continue;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
            let mut outbox_full = false;
            // One flush per batch straight to the socket, as a connection's read batch does,
            // rather than a writer wake-up per delivery. Nothing awaits until `end_batch`.
            crate::outbox::begin_batch();
            while let Some(m) = batch.front() {
                if r.credit.load(Ordering::Acquire) == 0 {
                    break;
                }
                match r.consumer.sink.offer_for(&r.consumer, m) {
                    Offer::Delivered => {
                        r.credit.fetch_sub(1, Ordering::AcqRel);
                        self.stats.deliver.fetch_add(1, Ordering::Relaxed);
                        batch.pop_front();
                    }
                    Offer::NoCredit => break,
                    Offer::OutboxFull => {
                        outbox_full = true;
                        break;
                    }
                }
            }
            crate::outbox::end_batch();
            if outbox_full {
                // The outbox wakes the stream's consumers once it drains (the timeout only
                // bounds a wake-up lost to a consumer that stopped).
                if r.consumer.sink.wait_for_space(self.clone()) {
                    let _ =
                        tokio::time::timeout(Duration::from_millis(100), r.wake.notified()).await;
                }
            } else if !batch.is_empty() {
                // Out of credit: an ack wakes it; the timeout covers a channel-wide limit
                // freed by another queue's ack.
                let _ = tokio::time::timeout(Duration::from_millis(100), r.wake.notified()).await;
            }
        }
    }

    /// Fills `out` from `*next` on from the tail cache, or says which file read comes next.
    fn fetch_cached(
        &self,
        next: &mut u64,
        hint: &mut Option<(u64, u64, u64)>,
        out: &mut VecDeque<QueuedMessage>,
    ) -> Fetch {
        let committed = self.committed.load(Ordering::SeqCst);
        let g = self.inner.lock();
        let first = g.log.first_offset();
        if *next < first {
            *next = first;
            *hint = None;
        }
        if *next >= committed {
            return Fetch::End;
        }
        if *next >= g.tail_first {
            let end = committed
                .min(g.tail_first + g.tail.len() as u64)
                .min(*next + READ_MSGS as u64);
            for o in *next..end {
                out.push_back(entry(o, g.tail[(o - g.tail_first) as usize].clone()));
            }
            *next = end;
            *hint = None;
            return if out.is_empty() {
                Fetch::End
            } else {
                Fetch::Got
            };
        }
        match g.log.plan(*next, *hint) {
            Some(plan) => Fetch::File(plan, committed),
            None => Fetch::End,
        }
    }

    /// Reads the entries `plan` points at (no lock held), up to `committed`. False: wait for
    /// the next commit.
    fn read_file(
        &self,
        plan: &log::ReadPlan,
        committed: u64,
        next: &mut u64,
        hint: &mut Option<(u64, u64, u64)>,
        out: &mut VecDeque<QueuedMessage>,
    ) -> std::io::Result<bool> {
        let (entries, end) = log::read(plan, READ_BYTES)?;
        let mut cut = false;
        for e in entries {
            if e.offset < *next {
                continue;
            }
            if e.offset >= committed {
                cut = true;
                break;
            }
            let Some((msg, _)) = crate::persist::decode_message(&e.data) else {
                tracing::warn!(stream = %self.name, offset = e.offset, "skipping a stored message that does not decode");
                *next = e.offset + 1;
                continue;
            };
            *next = e.offset + 1;
            out.push_back(entry(e.offset, Arc::new(msg)));
        }
        *hint = (!cut).then_some((*next, plan.segment, end));
        // Entries skipped below the cursor still moved it on; past `committed`, wait.
        Ok(!out.is_empty() || (!cut && end > plan.pos))
    }
}

/// What a reader's next step is.
enum Fetch {
    /// Messages were taken from the tail cache.
    Got,
    /// Nothing committed past the cursor yet.
    End,
    /// Read this file position (entries below this commit point only).
    File(log::ReadPlan, u64),
}

/// The first offset at or after `ms` in the entries `plan` starts at, reading forward.
pub(super) fn first_at_or_after(plan: &log::ReadPlan, ms: u64) -> Option<u64> {
    let mut plan = plan.clone();
    loop {
        let (entries, end) = log::read(&plan, READ_BYTES).ok()?;
        if let Some(e) = entries.iter().find(|e| e.ts_ms >= ms) {
            return Some(e.offset);
        }
        if entries.is_empty() || end >= plan.end {
            return None;
        }
        plan.pos = end;
    }
}

fn entry(offset: u64, msg: Arc<Message>) -> QueuedMessage {
    QueuedMessage {
        seq: offset,
        msg,
        redelivered: false,
        expires_at_ms: None,
        logged: false,
    }
}
