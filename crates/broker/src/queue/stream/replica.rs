//! A stream as a member of a replicated group (the group itself: `replicated/stream.rs`).
//!
//! The group's Raft log carries the messages; every member applies each committed entry to its
//! own log as one chunk ([`Stream::apply_entry`]), so members number the same messages with the
//! same offsets and write the same chunks and segments. The stream numbers nothing itself: a
//! publish goes to the group ([`StreamGroup::publish`]) and comes back as an applied entry.
//!
//! What a member has applied durably is kept in a checkpoint beside the segments (`applied`:
//! the last Raft index whose messages are fsynced, and the offset after them), written after
//! each group write's fsync. At boot the log is cut back to it ([`Stream::join_group`]) and the
//! group's entries after it are applied again; the group's snapshots are taken at it, so its
//! log is only dropped up to what this member's segments hold. A member whose copy is behind a
//! snapshot it is sent (a new member, or one down while the others dropped their logs) fetches
//! the missing offsets from another member's segments (`replicated/stream.rs`), as osiris'
//! replicas read the leader's.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use warren_store::checkpoint::Checkpoint;
use warren_store::stream::Entry;

use super::Stream;
use crate::confirm::ConfirmHandle;
use crate::queue::Enqueued;

/// A replicated stream's group, as the stream sees it.
pub trait StreamGroup: Send + Sync + 'static {
    /// Proposes a message (its stored form, its offset's 8 bytes at `patch`); `confirm`
    /// completes once the group has committed it (a majority has it on disk).
    fn publish(&self, data: Bytes, patch: usize, confirm: Option<Arc<ConfirmHandle>>) -> Enqueued;
    /// Proposes a tracking record (a stored consumer offset, or a publisher's last id).
    fn track(&self, record: Track);
    /// Its group id and members.
    fn group(&self) -> (u64, Vec<String>);
    /// The member that leads, as this node knows it.
    fn leader(&self) -> Option<String>;
    /// Too much proposed and not committed yet: publishers wait.
    fn pressured(&self) -> bool;
    /// The stream is deleted: the group stops, and removes the stream's files.
    fn delete(&self);
    /// Its members changed (`add_replica` / `delete_replica`).
    fn set_members(&self, members: Vec<String>);
}

/// A tracking record, replicated with the messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Track {
    Offset(String, u64),
    Publisher(String, u64),
}

/// What this member has applied of its group.
#[derive(Default)]
pub(super) struct Applied {
    /// Entries through this Raft index are in the log already (the checkpoint's at boot).
    skip_through: u64,
    /// Applied entries not yet durable: their index and the offset after their messages.
    marks: VecDeque<(u64, u64)>,
    /// The last (index, next offset) known durable.
    durable: (u64, u64),
    ckpt: Option<Checkpoint>,
    /// A group write failed: the checkpoint stays where it was until a restart, which cuts
    /// the log back to it and applies the rest again.
    frozen: bool,
    /// At boot the segments ended before the checkpoint's offset (a damaged tail cut off what
    /// was fsynced): the offsets `from..to` the entries through `index` wrote, to fetch from
    /// another member before anything is applied (`take_missing`).
    missing: Option<(u64, u64, u64)>,
}

/// The checkpoint's file, beside the segments.
const CHECKPOINT: &str = "applied";

impl Stream {
    /// Makes this stream a member of `group`: its log is cut back to what the checkpoint says
    /// the group applied durably (everything, for a new member), which is then where entries
    /// are applied from. Returns that Raft index.
    pub fn join_group(&self, group: Arc<dyn StreamGroup>) -> std::io::Result<u64> {
        let (ckpt, last) = Checkpoint::open(&self.dir.join(CHECKPOINT))?;
        let (index, offset) = last.unwrap_or((0, 0));
        let mut g = self.inner.lock();
        let offset = offset.max(g.log.first_offset());
        let mut missing = None;
        if g.log.next_offset() > offset {
            tracing::info!(stream = %self.name, vhost = %self.vhost, from = offset, to = g.log.next_offset(), "stream member: cutting back to what its group applied durably");
            g.log.truncate_to(offset)?;
        } else if g.log.next_offset() < offset {
            // Its segments lost the end of what they held durably (a damaged tail was cut at
            // open): applying on from here would number the next messages with offsets that
            // others gave to the lost ones. The lost offsets are fetched first.
            tracing::warn!(stream = %self.name, vhost = %self.vhost, from = g.log.next_offset(), to = offset, "stream member: its segments lost offsets they held durably; they are fetched from another member");
            missing = Some((index, g.log.next_offset(), offset));
        }
        let next = g.log.next_offset();
        g.empty_tail(next);
        g.in_flight = next;
        drop(g);
        self.committed.store(next, Ordering::SeqCst);
        *self.applied.lock() = Applied {
            skip_through: index,
            marks: VecDeque::new(),
            durable: (index, next),
            ckpt: Some(ckpt),
            frozen: false,
            missing,
        };
        let _ = self.group.set(group);
        Ok(index)
    }

    /// What the copy lost of what it held durably at boot (see `Applied::missing`): the Raft
    /// index those offsets go with, and the offsets; taken once.
    pub fn take_missing(&self) -> Option<(u64, u64, u64)> {
        self.applied.lock().missing.take()
    }

    /// Makes this stream the read copy of a node that is no member of `group`: it is fed from
    /// the members' segments ([`Stream::append_fetched`]) and its publishes go to the group.
    pub fn follow_group(&self, group: Arc<dyn StreamGroup>) {
        let _ = self.group.set(group);
    }

    /// This node left the group: its copy stays, as a read copy (fed from the members'), and
    /// its checkpoint goes (a member again starts over from what the group sends it).
    pub fn leave_group(&self) {
        *self.applied.lock() = Applied::default();
        let _ = std::fs::remove_file(self.dir.join(CHECKPOINT));
    }

    /// The read copy is empty and the members' copies start at `first` (retention dropped what
    /// was before): it starts there too.
    pub fn start_at(&self, first: u64) -> std::io::Result<()> {
        let g = self.inner.lock();
        if g.log.next_offset() >= first || g.log.next_offset() != g.log.first_offset() {
            return Ok(());
        }
        self.restart_at(g, first)
    }

    /// Drops the whole copy and starts it again, empty, at `first`.
    fn restart_at(
        &self,
        mut g: parking_lot::MutexGuard<'_, super::Inner>,
        first: u64,
    ) -> std::io::Result<()> {
        g.log.reset(first)?;
        g.empty_tail(first);
        g.in_flight = first;
        drop(g);
        self.first.store(first, Ordering::Relaxed);
        self.committed.store(first, Ordering::SeqCst);
        Ok(())
    }

    /// The offset after the last one this copy holds (written or not).
    pub fn next_offset(&self) -> u64 {
        self.inner.lock().log.next_offset()
    }

    /// Waits up to `max` for committed offsets to reach past `from`.
    pub async fn wait_committed_past(&self, from: u64, max: std::time::Duration) {
        let grown = self.grown.notified();
        tokio::pin!(grown);
        grown.as_mut().enable();
        if self.committed() <= from && !self.is_deleted() {
            let _ = tokio::time::timeout(max, grown).await;
        }
    }

    /// The group this stream is a member of, if it is replicated.
    pub fn replicated(&self) -> Option<&Arc<dyn StreamGroup>> {
        self.group.get()
    }

    /// Applies the committed entry `index`: its messages (each stored form with its offset
    /// placeholder at `patch`) are numbered from the log's next offset and buffered as one
    /// chunk, stamped `ts_ms` (the leader's clock, so every member stores the same); then its
    /// tracking records. (Tracking is written at once, without waiting for the chunk's fsync:
    /// after a crash a member may hold a stored offset past its segments, as osiris may.)
    pub fn apply_entry<'a>(
        self: &Arc<Self>,
        index: u64,
        ts_ms: u64,
        msgs: impl Iterator<Item = (&'a [u8], usize)>,
        tracks: &[Track],
    ) {
        let mut a = self.applied.lock();
        if index <= a.skip_through {
            return;
        }
        let mut g = self.inner.lock();
        if g.deleted {
            return;
        }
        g.log.start_chunk();
        let mut n = 0u64;
        for (stored, patch) in msgs {
            let Some(at) = patch.checked_add(8).filter(|end| *end <= stored.len()) else {
                tracing::error!(stream = %self.name, index, "a replicated entry's message is malformed: skipped");
                continue;
            };
            let offset = g.log.next_offset();
            let mut data = BytesMut::from(stored);
            data[patch..at].copy_from_slice(&offset.to_be_bytes());
            let data = data.freeze();
            let Some((m, _)) = crate::persist::decode_message(&data) else {
                tracing::error!(stream = %self.name, index, "a replicated entry's message does not decode: skipped");
                continue;
            };
            g.log.append(ts_ms, data, None);
            self.cache(&mut g, Arc::new(m));
            n += 1;
        }
        let next = g.log.next_offset();
        drop(g);
        a.marks.push_back((index, next));
        a.skip_through = index;
        drop(a);
        for t in tracks {
            match t {
                Track::Offset(r, o) => self.store_offset_here(r, *o),
                Track::Publisher(r, id) => self.record_publisher_here(r, *id),
            }
        }
        self.stats.publish.fetch_add(n, Ordering::Relaxed);
        self.persister.mark_dirty(self);
    }

    /// This member cannot apply its group's entries (one of a newer version, or its copy
    /// cannot be brought up to a snapshot): it applies nothing more, and keeps what it has.
    pub fn stop_applying(&self) {
        let mut a = self.applied.lock();
        a.skip_through = u64::MAX;
        a.frozen = true;
    }

    /// Publishers held back by the group may go on.
    pub fn relieve(&self) {
        self.relieved.notify_waiters();
    }

    /// Offsets below `to` are fsynced: the checkpoint moves to the last entry they cover.
    pub(super) fn durable_upto(&self, to: u64) {
        let mut a = self.applied.lock();
        if a.frozen || a.ckpt.is_none() {
            return;
        }
        let mut last = None;
        while a.marks.front().is_some_and(|m| m.1 <= to) {
            last = a.marks.pop_front();
        }
        let Some((index, next)) = last else { return };
        a.durable = (index, next);
        if let Some(c) = a.ckpt.as_mut() {
            if let Err(e) = c.write(index, next) {
                tracing::warn!(stream = %self.name, error = %e, "cannot write the stream member's checkpoint");
            }
        }
    }

    /// A group write failed: see `Applied::frozen`.
    pub(super) fn freeze_checkpoint(&self) {
        let mut a = self.applied.lock();
        if a.ckpt.is_some() && !a.frozen {
            tracing::error!(stream = %self.name, vhost = %self.vhost, "a write of the stream member failed: its checkpoint stays where it was until a restart");
            a.frozen = true;
        }
    }

    /// The last (Raft index, next offset) this member holds durably, and its first offset:
    /// where the group's snapshot is taken.
    pub fn durable_point(&self) -> (u64, u64, u64) {
        let (index, next) = self.applied.lock().durable;
        (index, next, self.first_offset())
    }

    /// The group installs a snapshot taken at `index` (offsets below `next`, from `first`):
    /// the offsets this member lacks, `Some(from)`, to fetch from another member; `None` when
    /// it holds them already. A copy that ends before `first` starts again, empty, at `first`.
    pub fn behind(&self, index: u64, next: u64, first: u64) -> std::io::Result<Option<u64>> {
        let a = self.applied.lock();
        if index <= a.skip_through {
            return Ok(None);
        }
        drop(a);
        let g = self.inner.lock();
        let mine = g.log.next_offset();
        if mine >= next {
            return Ok(None);
        }
        if mine < first {
            self.restart_at(g, first)?;
            return Ok(Some(first));
        }
        Ok(Some(mine))
    }

    /// Appends entries fetched from another member's segments (offsets from the log's next
    /// on, below `to`: what comes after is applied from the group's log), each chunk as it
    /// was; returns the next offset.
    pub fn append_fetched(
        self: &Arc<Self>,
        entries: &[Entry],
        chunk_starts: &[u64],
        to: u64,
    ) -> u64 {
        let mut g = self.inner.lock();
        for e in entries {
            if e.offset != g.log.next_offset() || e.offset >= to {
                continue;
            }
            if chunk_starts.contains(&e.offset) {
                g.log.start_chunk();
            }
            g.log.append(e.ts_ms, e.data.clone(), None);
        }
        let next = g.log.next_offset();
        // Not cached (readers read them from the files): the cache starts after them.
        g.empty_tail(next);
        drop(g);
        self.persister.mark_dirty(self);
        next
    }

    /// The fetched copy reaches the snapshot at `index` (offsets below `next`): entries after it
    /// are applied from here on.
    pub fn caught_up(&self, index: u64, next: u64) {
        let mut a = self.applied.lock();
        a.skip_through = a.skip_through.max(index);
        a.marks.push_back((index, next));
    }

    /// Reads committed entries from `from` on, up to about `max_bytes`, for a member that
    /// fetches them; with the first offsets of the chunks among them.
    pub fn read_for_member(
        &self,
        from: u64,
        max_bytes: u64,
    ) -> std::io::Result<(Vec<Entry>, Vec<u64>)> {
        let committed = self.committed();
        let plan = self.inner.lock().log.plan(from, None);
        let Some(plan) = plan else {
            return Ok((Vec::new(), Vec::new()));
        };
        let (entries, chunks) = warren_store::stream::read_with_chunks(&plan, max_bytes)?;
        let entries: Vec<Entry> = entries
            .into_iter()
            .filter(|e| e.offset >= from && e.offset < committed)
            .collect();
        let chunks = chunks
            .into_iter()
            .filter(|c| entries.iter().any(|e| e.offset == *c))
            .collect();
        Ok((entries, chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::persist::Persister;
    use crate::queue::{QueueArgs, QueueOptions};

    /// A group that takes nothing: the tests apply entries themselves.
    struct NoGroup;

    impl StreamGroup for NoGroup {
        fn publish(&self, _: Bytes, _: usize, _: Option<Arc<ConfirmHandle>>) -> Enqueued {
            Enqueued::Gone
        }
        fn track(&self, _: Track) {}
        fn group(&self) -> (u64, Vec<String>) {
            (1, vec!["me".into()])
        }
        fn leader(&self) -> Option<String> {
            None
        }
        fn pressured(&self) -> bool {
            false
        }
        fn delete(&self) {}
        fn set_members(&self, _: Vec<String>) {}
    }

    fn open(dir: &std::path::Path, p: &Arc<Persister>) -> Arc<Stream> {
        let mut arguments = warren_protocol::FieldTable::new();
        arguments.insert("x-queue-type", warren_protocol::FieldValue::str("stream"));
        let opts = QueueOptions {
            durable: true,
            exclusive_owner: None,
            auto_delete: false,
            arguments,
            args: QueueArgs::default(),
        };
        let s =
            Stream::open("s".into(), "/".into(), opts, 1, dir.into(), p.clone()).expect("opens");
        s.join_group(Arc::new(NoGroup)).expect("joins");
        s
    }

    /// The stored form of a message with body `b`, and where its offset goes.
    fn stored(b: &str) -> (Bytes, usize) {
        let m = Message {
            exchange: "".into(),
            routing_key: "s".into(),
            properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
            body: Bytes::from(b.to_string()),
            persistent: true,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let (data, _, patch) = super::super::write::encode_with_offset(&m);
        (data.freeze(), patch)
    }

    fn apply(s: &Arc<Stream>, index: u64, bodies: &[&str]) {
        let msgs: Vec<(Bytes, usize)> = bodies.iter().map(|b| stored(b)).collect();
        s.apply_entry(
            index,
            1000 + index,
            msgs.iter().map(|(d, p)| (&d[..], *p)),
            &[],
        );
    }

    fn bodies(s: &Stream) -> Vec<(u64, String)> {
        let (entries, _) = s.read_for_member(0, 1 << 20).expect("reads");
        entries
            .iter()
            .map(|e| {
                let (m, _) = crate::persist::decode_message(&e.data).expect("decodes");
                (e.offset, String::from_utf8_lossy(&m.body).into_owned())
            })
            .collect()
    }

    #[test]
    fn entries_apply_once_as_chunks_and_the_checkpoint_cuts_back_at_boot() {
        let dir = std::env::temp_dir().join(format!("warren-replica-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = Persister::manual();
        let s = open(&dir, &p);
        apply(&s, 3, &["a", "b"]);
        apply(&s, 5, &["c"]);
        // Again (a replay after a restart): nothing twice.
        apply(&s, 5, &["c"]);
        p.commit_dirty();
        assert_eq!(s.durable_point(), (5, 3, 0));
        assert_eq!(
            bodies(&s),
            vec![(0, "a".into()), (1, "b".into()), (2, "c".into())]
        );
        // Applied but never fsynced: not in the checkpoint; the next boot cuts it off, and the
        // entry applied again lands at the same offset.
        apply(&s, 7, &["d"]);
        {
            let mut g = s.inner.lock();
            let _ = g.log.write_pending();
        }
        drop(s);
        let s = open(&dir, &p);
        assert_eq!(s.next_offset(), 3, "cut back to the checkpoint");
        apply(&s, 5, &["c"]);
        apply(&s, 7, &["d"]);
        p.commit_dirty();
        assert_eq!(s.durable_point(), (7, 4, 0));
        assert_eq!(bodies(&s).last(), Some(&(3, "d".to_string())));
        // A copy fetched from another member, up to a snapshot's point.
        let other_dir = dir.join("other");
        let o = open(&other_dir, &p);
        assert_eq!(o.behind(7, 4, 0).expect("checks"), Some(0));
        let (entries, chunks) = s.read_for_member(0, 1 << 20).expect("reads");
        assert_eq!(chunks, vec![0, 2, 3], "one chunk per applied entry");
        assert_eq!(o.append_fetched(&entries, &chunks, 4), 4);
        o.caught_up(7, 4);
        p.commit_dirty();
        assert_eq!(bodies(&o), bodies(&s));
        assert_eq!(o.durable_point(), (7, 4, 0));
        // What the snapshot covers is not applied again.
        apply(&o, 7, &["d"]);
        assert_eq!(o.next_offset(), 4);
        // A damaged tail cut at open takes offset 3, which the checkpoint says is durable: the
        // copy says what it lacks (to fetch) rather than number the next message 3 again.
        drop(o);
        let seg = other_dir.join("0000000000000000.seg");
        let len = std::fs::metadata(&seg).expect("segment").len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .expect("opens");
        f.set_len(len - 3).expect("cuts");
        drop(f);
        let o = open(&other_dir, &p);
        assert_eq!(o.next_offset(), 3);
        assert_eq!(o.take_missing(), Some((7, 3, 4)));
        assert_eq!(o.take_missing(), None, "taken once");
        let (entries, chunks) = s.read_for_member(3, 1 << 20).expect("reads");
        assert_eq!(o.append_fetched(&entries, &chunks, 4), 4);
        o.caught_up(7, 4);
        p.commit_dirty();
        assert_eq!(bodies(&o), bodies(&s));
        apply(&o, 8, &["e"]);
        p.commit_dirty();
        assert_eq!(bodies(&o).last(), Some(&(4, "e".to_string())));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
