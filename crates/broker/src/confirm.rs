//! Publisher confirms. A channel in confirm mode numbers its publishes; each is confirmed once
//! every durable queue it reached has it on disk (or already let it go: consumed and acked,
//! expired, purged, deleted). Transient publishes are confirmed at once. [`Confirms::flush`]
//! merges what is ready into `multiple=true` acks where no earlier publish is still pending.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use warren_protocol::frame;
use warren_protocol::method::{BasicAck, BasicNack};
use warren_protocol::Method;

use crate::metrics::ChannelStats;
use crate::outbox::Outbox;

#[derive(Default)]
struct State {
    /// Publishes waiting for a durable write.
    outstanding: BTreeSet<u64>,
    acks: Vec<u64>,
    nacks: Vec<u64>,
    /// The channel is closed: nothing more is sent (a publish confirmed later, by the
    /// persister or by another node, would reach the client after channel.close-ok, or a new
    /// channel with the same number).
    closed: bool,
}

/// A channel's confirm bookkeeping, shared with the persister thread.
pub struct Confirms {
    channel: u16,
    outbox: Arc<Outbox>,
    /// Its channel's counts (`confirm`).
    stats: Arc<ChannelStats>,
    state: Mutex<State>,
}

impl Confirms {
    pub fn new(channel: u16, outbox: Arc<Outbox>, stats: Arc<ChannelStats>) -> Arc<Confirms> {
        Arc::new(Confirms {
            channel,
            outbox,
            stats,
            state: Mutex::new(State::default()),
        })
    }

    /// The channel closes (before its close-ok is written): what is not sent yet never is.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.outstanding.clear();
        st.acks.clear();
        st.nacks.clear();
    }

    /// Publishes not yet confirmed to the client: waiting for a durable write, or settled but
    /// not yet sent (RabbitMQ's `messages_unconfirmed`). Read by Prometheus, not per message.
    pub fn unconfirmed(&self) -> usize {
        let st = self.state.lock();
        st.outstanding.len() + st.acks.len() + st.nacks.len()
    }

    /// A publish whose outcome is already known.
    pub fn settled(&self, seq: u64, ok: bool) {
        let mut st = self.state.lock();
        if ok {
            st.acks.push(seq)
        } else {
            st.nacks.push(seq)
        }
    }

    /// A publish that waits for `waits` durable writes; returns the handle each write completes.
    pub fn pending(self: &Arc<Self>, seq: u64, waits: usize) -> Arc<ConfirmHandle> {
        self.state.lock().outstanding.insert(seq);
        Arc::new(ConfirmHandle {
            target: Target::Channel(self.clone()),
            seq,
            remaining: AtomicUsize::new(waits),
            failed: AtomicUsize::new(0),
        })
    }

    fn finish(&self, seq: u64, ok: bool) {
        let mut st = self.state.lock();
        st.outstanding.remove(&seq);
        if ok {
            st.acks.push(seq)
        } else {
            st.nacks.push(seq)
        }
    }

    /// Sends what is ready: nacks one by one, then acks below the oldest outstanding publish as
    /// one `multiple` ack, and any later ones singly.
    pub fn flush(&self) {
        let mut st = self.state.lock();
        if st.closed {
            st.acks.clear();
            st.nacks.clear();
            return;
        }
        if st.acks.is_empty() && st.nacks.is_empty() {
            return;
        }
        let low = st.outstanding.first().copied().unwrap_or(u64::MAX);
        let mut acks = std::mem::take(&mut st.acks);
        let nacks = std::mem::take(&mut st.nacks);
        acks.sort_unstable();
        let split = acks.partition_point(|&t| t < low);
        // Flushed from the channel's task and from the persister thread: added atomically.
        self.stats
            .confirm
            .fetch_add(acks.len() as u64, Ordering::Relaxed);
        let id = self.channel;
        self.outbox.push(|b| {
            for &tag in &nacks {
                frame::write_method(
                    b,
                    id,
                    &Method::BasicNack(BasicNack {
                        delivery_tag: tag,
                        multiple: false,
                        requeue: false,
                    }),
                );
            }
            if split > 0 {
                frame::write_method(
                    b,
                    id,
                    &Method::BasicAck(BasicAck {
                        delivery_tag: acks[split - 1],
                        multiple: split > 1,
                    }),
                );
            }
            for &tag in &acks[split..] {
                frame::write_method(
                    b,
                    id,
                    &Method::BasicAck(BasicAck {
                        delivery_tag: tag,
                        multiple: false,
                    }),
                );
            }
        });
    }
}

/// Completes `handles` (one durable write each) and flushes every channel that became ready.
pub fn complete_all(handles: impl IntoIterator<Item = (Arc<ConfirmHandle>, bool)>) {
    let mut ready: Vec<Arc<Confirms>> = Vec::new();
    for (h, ok) in handles {
        if let Some(c) = h.done(ok) {
            if !ready.iter().any(|x| Arc::ptr_eq(x, &c)) {
                ready.push(c);
            }
        }
    }
    for c in ready {
        c.flush();
    }
}

/// What [`ConfirmHandle::then`] runs.
type OnDone = Box<dyn FnOnce(bool) + Send>;

/// Who else than a channel may wait for a publish to be stored: implemented where such a
/// waiter lives (a node link for a publish forwarded from another node, in `cluster/remote.rs`;
/// a delay store for a due message's log record, in `delayed.rs`), so that this file names
/// none of them.
pub trait ConfirmTarget: Send + Sync {
    /// Publish `seq` is done: stored by every queue it went to (`ok`), or refused by one.
    fn confirmed(self: Arc<Self>, seq: u64, ok: bool);
}

/// Who is told when a confirmed publish is done.
enum Target {
    /// The common case, kept apart so that it costs no virtual call.
    Channel(Arc<Confirms>),
    Other(Arc<dyn ConfirmTarget>),
    /// Something to do once a write is durable (a retried message leaves its queue).
    Then(Mutex<Option<OnDone>>),
}

/// One confirmed publish waiting on durable queues.
pub struct ConfirmHandle {
    target: Target,
    seq: u64,
    remaining: AtomicUsize,
    failed: AtomicUsize,
}

impl ConfirmHandle {
    /// One queue is done with it; `ok` false means it could not be stored (the publisher gets a
    /// nack). Returns the tracker to flush when this was the last queue.
    pub fn done(&self, ok: bool) -> Option<Arc<Confirms>> {
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ok = self.failed.load(Ordering::Relaxed) == 0;
            match &self.target {
                Target::Channel(c) => {
                    c.finish(self.seq, ok);
                    return Some(c.clone());
                }
                Target::Other(t) => t.clone().confirmed(self.seq, ok),
                Target::Then(f) => {
                    if let Some(f) = f.lock().take() {
                        f(ok)
                    }
                }
            }
        }
        None
    }

    /// A publish known to `target` as `seq`, waiting on `waits` durable queues.
    pub fn for_target(
        target: Arc<dyn ConfirmTarget>,
        seq: u64,
        waits: usize,
    ) -> Arc<ConfirmHandle> {
        Arc::new(ConfirmHandle {
            target: Target::Other(target),
            seq,
            remaining: AtomicUsize::new(waits),
            failed: AtomicUsize::new(0),
        })
    }
}

impl ConfirmHandle {
    /// Runs `f` once one durable write is done (`true`) or failed.
    pub fn then(f: impl FnOnce(bool) + Send + 'static) -> Arc<ConfirmHandle> {
        Self::then_n(1, f)
    }

    /// Runs `f` once `waits` durable writes are done (`true` if none failed).
    pub fn then_n(waits: usize, f: impl FnOnce(bool) + Send + 'static) -> Arc<ConfirmHandle> {
        Arc::new(ConfirmHandle {
            target: Target::Then(Mutex::new(Some(Box::new(f)))),
            seq: 0,
            remaining: AtomicUsize::new(waits),
            failed: AtomicUsize::new(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use warren_protocol::{FrameDecoder, Method};

    fn drain(o: &Arc<Outbox>) -> Vec<Method> {
        let mut buf = BytesMut::new();
        o.take_for_test(&mut buf);
        let dec = FrameDecoder::new(0);
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut buf).expect("frames") {
            out.push(Method::decode(&f.payload).expect("method"));
        }
        out
    }

    #[test]
    fn multiple_only_below_the_oldest_outstanding() {
        let o = Outbox::new(0);
        let c = Confirms::new(1, o.clone(), Default::default());
        c.settled(1, true);
        let h2 = c.pending(2, 1);
        c.settled(3, true);
        c.settled(4, true);
        c.flush();
        assert_eq!(
            drain(&o),
            vec![
                Method::BasicAck(BasicAck {
                    delivery_tag: 1,
                    multiple: false
                }),
                Method::BasicAck(BasicAck {
                    delivery_tag: 3,
                    multiple: false
                }),
                Method::BasicAck(BasicAck {
                    delivery_tag: 4,
                    multiple: false
                }),
            ]
        );
        assert!(h2.done(true).is_some());
        c.settled(5, true);
        c.flush();
        assert_eq!(
            drain(&o),
            vec![Method::BasicAck(BasicAck {
                delivery_tag: 5,
                multiple: true
            })]
        );
        let h6 = c.pending(6, 2);
        assert!(h6.done(true).is_none());
        assert!(h6.done(false).is_some());
        c.flush();
        assert_eq!(
            drain(&o),
            vec![Method::BasicNack(BasicNack {
                delivery_tag: 6,
                multiple: false,
                requeue: false
            })]
        );
    }

    #[test]
    fn unconfirmed_counts_publishes_until_their_confirm_is_sent() {
        let o = Outbox::new(0);
        let c = Confirms::new(1, o.clone(), Default::default());
        assert_eq!(c.unconfirmed(), 0);
        let h1 = c.pending(1, 1);
        c.settled(2, true);
        assert_eq!(
            c.unconfirmed(),
            2,
            "one waits for a write, one for the flush"
        );
        c.flush();
        assert_eq!(c.unconfirmed(), 1, "the durable one still waits");
        assert!(h1.done(true).is_some());
        assert_eq!(c.unconfirmed(), 1, "written, not yet sent");
        c.flush();
        assert_eq!(c.unconfirmed(), 0);
        let _h3 = c.pending(3, 1);
        c.close();
        assert_eq!(c.unconfirmed(), 0, "a closed channel confirms nothing more");
        drain(&o);
    }
}
