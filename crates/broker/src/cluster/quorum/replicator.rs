//! The leader's side of replication ([`Replicator`]): gathers what its queue did (publishes,
//! settlements, returns, claims, kept dead letters) into batches to propose, and holds its
//! publishers back while too much waits for the group.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use warren_protocol::ByteString;

use super::{Batch, DeadKept, Replicator, BATCH_BYTES, BATCH_MSGS, PRESSURE_BYTES, PRESSURE_MSGS};
use crate::confirm::ConfirmHandle;
use crate::message::Message;

impl Replicator {
    /// Message `id` was dead-lettered as `msg` (at-least-once): kept, and replicated as kept,
    /// until [`Replicator::dead_done`].
    pub fn dead_lettering(&self, id: u64, msg: Arc<Message>, cc: Vec<ByteString>) {
        self.pending.lock().dead.push((id, msg.clone(), cc.clone()));
        self.dead.lock().insert(
            id,
            DeadKept {
                msg,
                cc,
                sent: false,
            },
        );
        self.wake.notify_one();
    }

    /// The kept dead letters not on their way, now marked as on their way.
    pub fn dead_to_send(&self) -> Vec<(u64, Arc<Message>, Vec<ByteString>)> {
        let mut d = self.dead.lock();
        d.iter_mut()
            .filter(|(_, k)| !k.sent)
            .map(|(id, k)| {
                k.sent = true;
                (*id, k.msg.clone(), k.cc.clone())
            })
            .collect()
    }

    pub(super) fn has_dead_to_send(&self) -> bool {
        self.dead.lock().values().any(|k| !k.sent)
    }

    /// Could not be routed: tried again later.
    pub fn dead_unsent(&self, id: u64) {
        if let Some(k) = self.dead.lock().get_mut(&id) {
            k.sent = false;
        }
    }

    /// Every target has dead letter `id` (`ok`): its message is settled. Otherwise it is sent
    /// again later.
    pub fn dead_done(&self, id: u64, ok: bool) {
        if ok {
            if self.dead.lock().remove(&id).is_some() {
                self.settled(id);
            }
        } else {
            self.dead_unsent(id);
        }
    }

    /// A publish to replicate; its confirm (if any) is completed once it is committed.
    pub fn submit(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) {
        let size = msg.body.len() + msg.properties.len() + 64;
        let mut p = self.pending.lock();
        p.bytes += size;
        p.msgs.push((msg, confirm.cloned()));
        drop(p);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.in_flight_bytes.fetch_add(size, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A message (by its replica id) left the leader's queue for good.
    pub fn settled(&self, id: u64) {
        self.returns.lock().remove(&id);
        self.pending.lock().settled.push(id);
        self.wake.notify_one();
    }

    /// Every message from `first` to `last` that is still in the queue left it.
    pub fn settled_run(&self, first: u64, last: u64) {
        self.returns
            .lock()
            .retain(|id, _| *id < first || *id > last);
        self.pending.lock().settled_runs.push((first, last));
        self.wake.notify_one();
    }

    /// An offer of `id` (and probably of the ones after it) waits for its claim.
    pub fn want_claims(&self, id: u64) {
        let mut w = self.claims_from.lock();
        *w = Some(w.map_or(id, |x| x.min(id)));
        drop(w);
        self.wake.notify_one();
    }

    /// `id` went out already (basic.get): record its claim in the next entry.
    pub fn claim_now(&self, id: u64) {
        if self.claiming.lock().insert(id) {
            self.pending.lock().claimed.push(id);
            self.wake.notify_one();
        }
    }

    /// A message went back to the leader's queue (requeued): its count of returns so far.
    pub fn returned(&self, id: u64) -> u32 {
        let n = {
            let mut r = self.returns.lock();
            let n = r.entry(id).or_insert(0);
            *n += 1;
            *n
        };
        self.pending.lock().returned.push(id);
        self.wake.notify_one();
        n
    }

    /// Publishes wait for replication beyond what the log keeps up with.
    pub fn pressured(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= PRESSURE_MSGS
            || self.in_flight_bytes.load(Ordering::Relaxed) >= PRESSURE_BYTES
    }

    pub async fn stall(&self, max: Duration) {
        crate::flow::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    pub(super) fn take(&self) -> Option<Batch> {
        let mut p = self.pending.lock();
        if p.msgs.is_empty()
            && p.settled.is_empty()
            && p.settled_runs.is_empty()
            && p.dead.is_empty()
            && p.returned.is_empty()
            && p.claimed.is_empty()
            && self.claims_from.lock().is_none()
        {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        if p.msgs.len() <= BATCH_MSGS && p.bytes <= BATCH_BYTES {
            let mut b = std::mem::take(&mut *p);
            b.epoch = epoch;
            return Some(b);
        }
        let mut n = 0;
        let mut bytes = 0;
        for (m, _) in &p.msgs {
            let b = m.body.len() + m.properties.len() + 64;
            if n > 0 && (n == BATCH_MSGS || bytes + b > BATCH_BYTES) {
                break;
            }
            n += 1;
            bytes += b;
        }
        let rest = p.msgs.split_off(n);
        let msgs = std::mem::replace(&mut p.msgs, rest);
        p.bytes -= bytes;
        Some(Batch {
            msgs,
            bytes,
            settled: std::mem::take(&mut p.settled),
            settled_runs: std::mem::take(&mut p.settled_runs),
            dead: std::mem::take(&mut p.dead),
            returned: std::mem::take(&mut p.returned),
            claimed: std::mem::take(&mut p.claimed),
            claim_new: 0,
            epoch,
        })
    }

    pub(super) fn done(&self, n: usize, bytes: usize) {
        let was = self.pressured();
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
        self.in_flight_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if was && !self.pressured() {
            self.relieved.notify_waiters();
        }
    }
}
