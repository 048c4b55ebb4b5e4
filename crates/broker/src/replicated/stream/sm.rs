//! A replicated stream's state machine on a member (its stream: entries applied as chunks,
//! snapshots at what its segments hold durably), and catching a copy up from another
//! member's segments when a snapshot is past it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Buf, Bytes};
use parking_lot::Mutex;

use super::wire::{decode_entry, decode_fetched};
use super::{ReplicatedStream, FETCH_BYTES, MACHINE_VERSION};
use crate::queue::stream::Stream;

/// The group's state machine on this member: its stream.
pub(super) struct StreamSm {
    pub(super) stream: Weak<Stream>,
    pub(super) group: Weak<ReplicatedStream>,
    /// The index of the last snapshot point handed out.
    pub(super) snapshot_at: Mutex<u64>,
}

/// `[version][index u64][next u64][first u64]`.
fn encode_point(index: u64, next: u64, first: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(25);
    b.push(MACHINE_VERSION);
    b.extend_from_slice(&index.to_be_bytes());
    b.extend_from_slice(&next.to_be_bytes());
    b.extend_from_slice(&first.to_be_bytes());
    b
}

impl warren_cluster::StateMachine for StreamSm {
    fn apply(&self, index: u64, command: &Bytes) -> Vec<u8> {
        let Some(s) = self.stream.upgrade() else {
            return Vec::new();
        };
        match decode_entry(command) {
            Ok((ts, msgs, tracks)) => s.apply_entry(index, ts, msgs.into_iter(), &tracks),
            Err(e) => {
                tracing::error!(stream = %s.name, vhost = %s.vhost, index, error = %e, "a stream entry cannot be applied: this member stops applying (run the newer build)");
                s.stop_applying();
            }
        }
        Vec::new()
    }

    fn snapshot(&self) -> Vec<u8> {
        let (index, next, first) = self
            .stream
            .upgrade()
            .map_or((0, 0, 0), |s| s.durable_point());
        encode_point(index, next, first)
    }

    fn snapshot_point(&self) -> warren_cluster::SnapshotPoint {
        let Some(s) = self.stream.upgrade() else {
            return warren_cluster::SnapshotPoint::Unchanged;
        };
        let (index, next, first) = s.durable_point();
        let mut at = self.snapshot_at.lock();
        if index <= *at {
            return warren_cluster::SnapshotPoint::Unchanged;
        }
        *at = index;
        warren_cluster::SnapshotPoint::At(index, encode_point(index, next, first))
    }

    fn restore(&self, index: Option<u64>, snapshot: &[u8]) {
        let (Some(s), Some(_)) = (self.stream.upgrade(), index) else {
            return;
        };
        let mut b = snapshot;
        if b.remaining() < 25 {
            return;
        }
        let v = b.get_u8();
        if v > MACHINE_VERSION {
            tracing::error!(stream = %s.name, vhost = %s.vhost, version = v, "a stream snapshot of a newer version: this member stops applying (run the newer build)");
            s.stop_applying();
            return;
        }
        let (at, next, first) = (b.get_u64(), b.get_u64(), b.get_u64());
        *self.snapshot_at.lock() = at;
        let from = match s.behind(at, next, first) {
            Ok(None) => return,
            Ok(Some(from)) => from,
            Err(e) => {
                tracing::error!(stream = %s.name, error = %e, "cannot prepare the stream member's copy for a snapshot");
                s.stop_applying();
                return;
            }
        };
        let Some(g) = self.group.upgrade() else {
            return;
        };
        tracing::info!(stream = %s.name, vhost = %s.vhost, from, to = next, "stream member: fetching what it lacks from another member");
        // `restore` is synchronous, on the group's state machine task: the fetch blocks it
        // (and only it), which needs the multi-threaded runtime the broker runs on.
        let handle = tokio::runtime::Handle::current();
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            tracing::error!(stream = %s.name, "cannot fetch a stream copy on a single-threaded runtime: this member stops applying");
            s.stop_applying();
            return;
        }
        tokio::task::block_in_place(|| handle.block_on(g.catch_up(&s, from, next)));
        s.caught_up(at, next);
    }
}

impl ReplicatedStream {
    /// Fetches offsets `from..to` from the other members' segments into `s`, trying each in
    /// turn (the leader first) until it has them all; retries while none can give them.
    pub(super) async fn catch_up(&self, s: &Arc<Stream>, mut from: u64, to: u64) {
        let mut wait = Duration::from_millis(100);
        while from < to && !*self.stop.borrow() {
            let mut others: Vec<String> = self
                .members()
                .into_iter()
                .filter(|m| *m != self.me)
                .collect();
            if let Some(l) = self.leader.get() {
                others.sort_by_key(|m| *m != l);
            }
            let mut progressed = false;
            for m in others {
                match self.net.fetch(&m, self.group, from, FETCH_BYTES, 0).await {
                    Ok(body) => match decode_fetched(body) {
                        Some((entries, chunks)) if !entries.is_empty() => {
                            from = s.append_fetched(&entries, &chunks, to);
                            progressed = true;
                            break;
                        }
                        _ => {}
                    },
                    Err(e) => {
                        tracing::debug!(stream = %self.name, member = %m, error = %e, "cannot fetch from this member")
                    }
                }
            }
            if !progressed {
                // At boot the links come up meanwhile: said aloud only once it lasts.
                if wait >= Duration::from_secs(1) {
                    tracing::warn!(stream = %self.name, vhost = %self.vhost, from, to, "no member could give the stream's missing offsets yet: retrying");
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}
