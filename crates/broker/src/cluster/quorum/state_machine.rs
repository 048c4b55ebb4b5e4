//! The group's state machine on one member ([`GroupSm`]): applies each committed entry to the
//! replica (and, on the leader, to its queue), takes and restores snapshots.

use std::sync::atomic::Ordering;
use std::sync::Weak;

use bytes::{Buf, Bytes};

use super::entry::decode;
use super::{GroupSm, LogPos, Replica, SNAPSHOT_MAGIC};

impl warren_cluster::StateMachine for GroupSm {
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8> {
        // Entries up to this one may be read back (a leader's tail reaches into it as it goes).
        self.applied.store(index + 1, Ordering::Release);
        let Some(d) = decode(Bytes::copy_from_slice(command)) else {
            tracing::error!(index, "undecodable queue entry skipped");
            return Vec::new();
        };
        let q = self.queue.get().and_then(Weak::upgrade);
        let mut r = self.replica.lock();
        // Under the replica's lock, so a leg being built sees each message exactly once.
        let leg = q.as_ref().and_then(|q| q.local_leg());
        let mut refused: Vec<u32> = Vec::new();
        let first_id = r.next_id;
        // Claims first: a claimed new message may go out as soon as it is enqueued.
        let claim_new = (d.claim_new as usize).min(d.msgs.len()) as u64;
        let new_claims = first_id..first_id + claim_new;
        for id in d.claimed.iter().copied().chain(new_claims.clone()) {
            if id >= first_id || r.holds(id) {
                r.delivered.insert(id);
            }
        }
        // An earlier leader's entry, applied after this node took over: what it claimed or
        // returned may have been delivered already.
        let foreign = q
            .as_ref()
            .is_some_and(|q| d.epoch != q.repl.epoch.load(Ordering::Relaxed));
        if let Some(leg) = &leg {
            if foreign && (!d.claimed.is_empty() || !d.returned.is_empty()) {
                leg.mark_redelivered(d.claimed.iter().chain(&d.returned).copied());
            }
            if !d.claimed.is_empty() || claim_new > 0 {
                super::leg::claimed(leg, d.claimed.iter().copied().chain(new_claims.clone()));
            }
        }
        for (i, data) in d.msgs.into_iter().enumerate() {
            let id = r.next_id;
            r.next_id += 1;
            let size = crate::persist::stored_body_len(&data);
            if let (Some(leg), Some(q)) = (&leg, &q) {
                if let Some((msg, _)) = crate::persist::decode_message(&data) {
                    let seen = foreign && new_claims.contains(&id);
                    let at = LogPos {
                        index,
                        first_id,
                        next_id: id,
                    };
                    if super::leg::apply_committed(leg, id, Some(at), q.delivery_form(msg, 0), seen)
                    {
                        r.insert(id, size);
                    } else {
                        refused.push(i as u32);
                    }
                    continue;
                }
            }
            r.insert(id, size);
        }
        // Kept before the settlements: a dead letter taken at once is settled in the same entry.
        for (id, data, cc) in d.dead {
            if r.holds(id) {
                r.dead.insert(id, (data, cc));
            }
        }
        for id in d.settled {
            r.remove(id);
        }
        for (first, last) in d.settled_runs {
            let last = last.min(r.next_id.saturating_sub(1));
            for id in first.max(r.base)..=last {
                r.remove(id);
            }
        }
        for id in d.returned {
            if r.holds(id) {
                *r.returns.entry(id).or_insert(0) += 1;
            }
        }
        r.applied(index, command.len());
        drop(r);
        if let Some(q) = &q {
            let mut c = q.repl.claiming.lock();
            for id in &d.claimed {
                c.remove(id);
            }
        }
        // The other members hold the refused ones: settled in the next entry.
        if let Some(q) = &q {
            for i in &refused {
                q.repl.settled(first_id + u64::from(*i));
            }
        }
        // The positions in the entry of publishes the leader's queue refused (x-overflow
        // reject-publish): they never entered it, and their publishers get a nack.
        let mut out = Vec::with_capacity(refused.len() * 4);
        for i in refused {
            out.extend_from_slice(&i.to_be_bytes());
        }
        out
    }

    // Never called: `snapshot_point` always names a point.
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    /// As Ra does for a quorum queue, at the release cursor: the newest checkpoint below the
    /// oldest message still in the queue. Every message enqueued up to it has been settled, so
    /// the state there is the next id alone, and the entries after it (which hold every body
    /// still needed) are applied again from the log.
    fn snapshot_point(&self) -> warren_cluster::SnapshotPoint {
        let r = self.replica.lock();
        // A snapshot of the earlier format holds bodies nothing else has: kept until they go.
        if !r.legacy.is_empty() {
            return warren_cluster::SnapshotPoint::Unchanged;
        }
        match r.release() {
            Some((index, next_id)) => {
                let mut b = SNAPSHOT_MAGIC.to_vec();
                b.extend_from_slice(&next_id.to_be_bytes());
                warren_cluster::SnapshotPoint::At(index, b)
            }
            None => warren_cluster::SnapshotPoint::Unchanged,
        }
    }

    fn restore(&self, index: Option<u64>, snapshot: &[u8]) {
        let mut r = Replica::default();
        if let Some(point) = snapshot.strip_prefix(SNAPSHOT_MAGIC) {
            // `[next id u64]`: every message before it was settled.
            if let Ok(next) = <[u8; 8]>::try_from(point) {
                r.next_id = u64::from_be_bytes(next);
                r.base = r.next_id;
            }
        } else {
            restore_legacy(&mut r, snapshot);
        }
        // The log is read again from the entry after the snapshot's.
        if let Some(index) = index {
            r.start = Some((index, r.next_id));
        }
        *self.replica.lock() = r;
        // A leader's queue no longer matches: build it again from the new state.
        if let Some(q) = self.queue.get().and_then(Weak::upgrade) {
            q.retire_leg();
        }
    }
}

/// A snapshot of the earlier format: every message's body, returns and claim.
fn restore_legacy(r: &mut Replica, snapshot: &[u8]) {
    let mut b = Bytes::copy_from_slice(snapshot);
    if b.remaining() < 16 {
        return;
    }
    let next_id = b.get_u64();
    let n = b.get_u64();
    for _ in 0..n {
        if b.remaining() < 17 {
            break;
        }
        let id = b.get_u64();
        let returns = b.get_u32();
        let delivered = b.get_u8() == 1;
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            break;
        }
        let data = b.split_to(len);
        r.insert(id, crate::persist::stored_body_len(&data));
        r.legacy.insert(id, data);
        if delivered {
            r.delivered.insert(id);
        }
        if returns > 0 {
            r.returns.insert(id, returns);
        }
    }
    r.next_id = next_id;
    if r.live == 0 {
        r.base = next_id;
    }
}
