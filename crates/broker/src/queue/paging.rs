//! Paging and the queue's own log: where the tail of a long queue is read back from (`Pager`),
//! the scratch log a non-durable queue makes to page out to, and the persister's side (joining
//! its batch, writing the buffered records).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_queue::PagedIn;

use super::{holds, Io, Queue, QueueLogOf, QueuedMessage};
use crate::confirm::ConfirmHandle;
use crate::limits;
use crate::persist::MessageLog;

impl Io {
    /// Reads about `limits::PAGE_IN_BYTES` of paged-out messages, in order.
    pub(super) fn page_in(&mut self, remaining: usize, out: &mut Vec<QueuedMessage>) -> PagedIn {
        let (Some(p), Some(log)) = (&mut self.pager, &self.log) else {
            return PagedIn::default();
        };
        let (recovered, max) = (&p.recovered, p.recovered_max);
        let got = match log.read(&mut p.cursor, limits::PAGE_IN_BYTES, &|s| {
            holds(recovered, max, s)
        }) {
            Ok(got) => got,
            Err(e) => {
                tracing::error!(error = %e, "cannot read paged-out messages back");
                Vec::new()
            }
        };
        if got.is_empty() {
            tracing::error!(
                messages = remaining,
                "paged-out messages could not be read back and are dropped"
            );
        }
        let mut read = PagedIn::default();
        for (seq, data) in got {
            // More records than the tail counts would be a bookkeeping bug: never overrun.
            if read.records == remaining {
                tracing::error!(
                    seq,
                    "a paged-out record beyond the queue's count is ignored"
                );
                break;
            }
            p.recovered.forget_below(seq);
            read.records += 1;
            read.bytes += crate::persist::stored_body_len(&data);
            let Some((msg, expires_at_ms)) = crate::persist::decode_message(&data) else {
                tracing::warn!(seq, "skipping a stored message that does not decode");
                continue;
            };
            out.push(QueuedMessage {
                seq,
                msg: Arc::new(msg),
                // Recovered at boot: it may have been delivered before the restart, so say so.
                redelivered: p.recovered_max.is_some_and(|m| seq <= m),
                expires_at_ms,
                logged: true,
            });
        }
        read
    }
}

impl Queue {
    /// Makes sure a log exists to page out to (a non-durable queue makes a scratch one once).
    pub(super) fn ensure_log(&self, io: &mut Io) -> bool {
        if io.log.is_some() {
            return true;
        }
        let Some(open) = self.scratch.as_ref().filter(|_| !io.scratch_failed) else {
            return false;
        };
        match open() {
            Ok(log) => {
                io.log = Some(log);
                true
            }
            Err(e) => {
                io.scratch_failed = true;
                tracing::warn!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot page out: the queue keeps its backlog in memory");
                false
            }
        }
    }
}

impl Queue {
    /// Joins the persister's next batch; false if already in it.
    pub fn mark_dirty(&self) -> bool {
        !self.in_batch.swap(true, Ordering::AcqRel)
    }

    /// Called by the persister: writes the buffered records (the caller fsyncs the files).
    pub fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        self.in_batch.store(false, Ordering::Release);
        let mut st = self.state.lock();
        let io = &mut st.io;
        io.log_dirty = false;
        let persister = self.persister.as_ref();
        // Matched once here, so that the store's log is written as directly as before the
        // interface (each call through the enum's match cost the write 36 instructions).
        match io.log.as_mut() {
            Some(QueueLogOf::Store(l)) => crate::persist::write_counted(Some(l), persister),
            Some(QueueLogOf::Other(l)) => crate::persist::write_counted(Some(&mut **l), persister),
            None => Ok((Vec::new(), Vec::new())),
        }
    }
}

/// The persister writes a classic queue's log.
impl crate::persist::Logged for Queue {
    fn join_batch(&self) -> bool {
        self.mark_dirty()
    }
    fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        Queue::write_log(self)
    }
    fn log_name(&self) -> &str {
        &self.name
    }
}
