//! The bodies of a replicated queue's messages, which stay in the group's log: the machine holds
//! only references ([`MsgRef`]: the log place of each body). The leader keeps the messages it
//! decoded as it applied them, up to [`CACHE_BYTES`], and reads the others back from the log,
//! an entry at a time (a backlog is read back in order, so the entry read last serves the next
//! messages too). A snapshot carries the bodies the queue still needs, since the log before it
//! may be purged; they are kept here until their messages leave.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use warren_queue::replicated::MsgRef;

use super::entry::{self, Op};
use crate::message::Message;

/// Decoded messages kept in memory, by seq. Past this, the oldest go first (a backlog's head,
/// read back from the log when its turn comes; and messages that left the queue by expiry or
/// a limit, which nothing settles).
const CACHE_BYTES: usize = 16 << 20;

#[derive(Default)]
pub struct Bodies {
    cache: BTreeMap<u64, Arc<Message>>,
    bytes: usize,
    /// Stored messages a snapshot brought, by log place: the log may no longer have them.
    pinned: HashMap<u64, Bytes>,
    /// The publishes of the entry read back last: `(index, stored messages)`.
    last: Option<(u64, Vec<Bytes>)>,
}

fn cost(m: &Message) -> usize {
    m.body.len() + m.properties.len() + 128
}

impl Bodies {
    /// Message `seq` was enqueued (decoded from the entry being applied).
    pub fn insert(&mut self, seq: u64, m: Arc<Message>) {
        self.bytes += cost(&m);
        if let Some(old) = self.cache.insert(seq, m) {
            self.bytes -= cost(&old);
        }
        while self.bytes > CACHE_BYTES {
            let Some((_, old)) = self.cache.pop_first() else {
                break;
            };
            self.bytes -= cost(&old);
        }
    }

    /// Message `seq` (at `r.index` in the log) left the queue for good.
    pub fn remove(&mut self, seq: u64, r: Option<&MsgRef>) {
        if let Some(old) = self.cache.remove(&seq) {
            self.bytes -= cost(&old);
        }
        if let Some(r) = r {
            self.pinned.remove(&r.index);
        }
    }

    /// Every message left (purge, delete).
    pub fn clear(&mut self) {
        self.cache.clear();
        self.bytes = 0;
        self.last = None;
    }

    /// The bodies the snapshot just taken holds, by log place, in place of the earlier ones.
    pub fn repin(&mut self, pinned: HashMap<u64, Bytes>) {
        self.pinned = pinned;
    }

    /// A snapshot's bodies, by log place.
    pub fn pin(&mut self, at: u64, stored: Bytes) {
        self.pinned.insert(at, stored);
    }

    /// The message `seq` refers to at `r`: from memory, a snapshot, or the log.
    pub fn get(
        &mut self,
        seq: u64,
        r: &MsgRef,
        log: Option<&warren_cluster::LogReader>,
    ) -> Option<Arc<Message>> {
        if let Some(m) = self.cache.get(&seq) {
            return Some(m.clone());
        }
        self.stored(r.index, log)
            .and_then(|b| crate::persist::decode_message(&b))
            .map(|(m, _)| Arc::new(m))
    }

    /// The stored form of message `seq` at `r`: re-encoded from memory, else from a snapshot
    /// or the log.
    pub fn stored_or_cached(
        &mut self,
        seq: u64,
        r: &MsgRef,
        log: Option<&warren_cluster::LogReader>,
    ) -> Option<Bytes> {
        if let Some(m) = self.cache.get(&seq) {
            let mut b = bytes::BytesMut::new();
            crate::persist::encode_message_into(&mut b, m, None);
            return Some(b.freeze());
        }
        self.stored(r.index, log)
    }

    /// The stored form of the message at log place `at`.
    pub fn stored(&mut self, at: u64, log: Option<&warren_cluster::LogReader>) -> Option<Bytes> {
        if let Some(b) = self.pinned.get(&at) {
            return Some(b.clone());
        }
        let (index, slot) = entry::split_index(at);
        if self.last.as_ref().is_none_or(|(i, _)| *i != index) {
            let read = log?.read(index, 1).ok()?;
            let (i, data) = read.into_iter().next()?;
            if i != index {
                return None;
            }
            let e = entry::decode(Bytes::from(data?)).ok()?;
            let publishes = e
                .ops
                .into_iter()
                .filter_map(|op| match op {
                    Op::Publish(b) => Some(b),
                    Op::Import { stored, .. } => stored,
                    Op::Cmd(_) => None,
                })
                .collect();
            self.last = Some((index, publishes));
        }
        self.last.as_ref()?.1.get(slot).cloned()
    }
}
