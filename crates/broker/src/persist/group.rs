//! Group commit. Durable queues buffer their log records in memory; the persister thread writes
//! every dirty owner's buffer and fsyncs the touched files, then confirms what that covered. The
//! group is formed by load, not by a timer: when idle a publish is written and synced at once;
//! while one fsync runs, the next publishes gather into the following group.
//!
//! One thread, measured against a pipeline of two (a second group written and synced while the
//! first one's fsync runs): the pipeline gained nothing on the 16-core machine (fsyncs of
//! 157 µs, groups waiting 86 µs for the one before) and lost about 20% of S2P under PerfTest on
//! the 2-core one, where each fsync costs about 150 µs of CPU
//! (docs/benchmarks/notes/2026-11-27-persistent-confirms-and-workers.md).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::Logged;
use crate::confirm::{complete_all, ConfirmHandle};

/// What one group wrote: its owners, the files to sync, and the confirms to complete.
#[derive(Default)]
struct Group {
    owners: Vec<Arc<dyn Logged>>,
    files: Vec<Arc<std::fs::File>>,
    written: Vec<Arc<ConfirmHandle>>,
    failed: Vec<Arc<ConfirmHandle>>,
}

/// Owners waiting for the next group, and since when the first of them has waited.
#[derive(Default)]
struct Dirty {
    owners: Vec<Arc<dyn Logged>>,
    since: Option<Instant>,
}

/// Where a group's time goes, summed over groups: from the first owner's `mark_dirty` to the
/// thread taking the group, its writes, its fsyncs, and completing it (the confirms' frames into
/// their connections' outboxes). Logged at shutdown: the confirm breakdown of
/// docs/benchmarks/notes/2026-11-27-persistent-confirms-and-workers.md.
#[derive(Default)]
pub struct GroupTimes {
    pub groups: AtomicU64,
    pub wait_nanos: AtomicU64,
    pub write_nanos: AtomicU64,
    pub sync_nanos: AtomicU64,
    pub finish_nanos: AtomicU64,
}

impl GroupTimes {
    /// Adds the time since `since` to `at`; returns now.
    fn add(at: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        at.fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
        now
    }

    /// Mean microseconds of each stage: (groups, wait, write, sync, finish).
    pub fn means_us(&self) -> (u64, u64, u64, u64, u64) {
        let n = self.groups.load(Ordering::Relaxed);
        let us = |a: &AtomicU64| a.load(Ordering::Relaxed) / n.max(1) / 1000;
        (
            n,
            us(&self.wait_nanos),
            us(&self.write_nanos),
            us(&self.sync_nanos),
            us(&self.finish_nanos),
        )
    }
}

pub struct Persister {
    dirty: Mutex<Dirty>,
    wake: Condvar,
    stop: AtomicBool,
    /// fsync calls made and bytes written, for benchmarks (logged at shutdown).
    pub fsyncs: AtomicU64,
    pub bytes: AtomicU64,
    pub times: GroupTimes,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Persister {
    fn new() -> Arc<Persister> {
        Arc::new(Persister {
            dirty: Mutex::new(Dirty::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            fsyncs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            times: GroupTimes::default(),
            thread: Mutex::new(None),
        })
    }

    pub fn start() -> Arc<Persister> {
        let p = Persister::new();
        let runner = p.clone();
        match std::thread::Builder::new()
            .name("warren-persister".into())
            .spawn(move || runner.run())
        {
            Ok(h) => *p.thread.lock() = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the persister thread"),
        }
        p
    }

    /// Queues `q` for the next group. Cheap when it is already queued.
    pub fn mark_dirty<L: Logged + 'static>(&self, q: &Arc<L>) {
        if q.join_batch() {
            let mut d = self.dirty.lock();
            if d.owners.is_empty() {
                d.since = Some(Instant::now());
            }
            d.owners.push(q.clone());
            drop(d);
            self.wake.notify_one();
        }
    }

    /// Writes what is still buffered, then stops the thread (clean shutdown).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        {
            let _g = self.dirty.lock();
            self.wake.notify_one();
        }
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
        let (groups, wait_us, write_us, sync_us, finish_us) = self.times.means_us();
        tracing::info!(
            fsyncs = self.fsyncs.load(Ordering::Relaxed),
            bytes_written = self.bytes.load(Ordering::Relaxed),
            groups,
            wait_us,
            write_us,
            sync_us,
            finish_us,
            "persister stopped"
        );
    }

    /// A persister without its thread, for tests that run each group commit themselves
    /// ([`Persister::commit_dirty`]).
    #[cfg(test)]
    pub(crate) fn manual() -> Arc<Persister> {
        Persister::new()
    }

    /// One group commit of what is dirty now, on the caller's thread, as the thread makes it.
    #[cfg(test)]
    pub(crate) fn commit_dirty(&self) {
        let batch = std::mem::take(&mut *self.dirty.lock());
        self.commit(batch);
    }

    fn run(self: Arc<Self>) {
        loop {
            let batch = {
                let mut d = self.dirty.lock();
                while d.owners.is_empty() && !self.stop.load(Ordering::Relaxed) {
                    self.wake.wait(&mut d);
                }
                std::mem::take(&mut *d)
            };
            if batch.owners.is_empty() {
                return;
            }
            self.commit(batch);
        }
    }

    fn commit(&self, batch: Dirty) {
        let t = &self.times;
        t.groups.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        if let Some(since) = batch.since {
            t.wait_nanos
                .fetch_add((start - since).as_nanos() as u64, Ordering::Relaxed);
        }
        let g = self.write(batch.owners);
        let at = GroupTimes::add(&t.write_nanos, start);
        let ok = sync_all(&g.files);
        self.fsyncs
            .fetch_add(g.files.len() as u64, Ordering::Relaxed);
        let at = GroupTimes::add(&t.sync_nanos, at);
        for q in &g.owners {
            q.synced(ok);
        }
        complete_all(
            g.written
                .into_iter()
                .map(|h| (h, ok))
                .chain(g.failed.into_iter().map(|h| (h, false))),
        );
        GroupTimes::add(&t.finish_nanos, at);
    }

    /// Writes each owner's buffer.
    fn write(&self, batch: Vec<Arc<dyn Logged>>) -> Group {
        let mut g = Group {
            owners: Vec::with_capacity(batch.len()),
            ..Group::default()
        };
        for q in batch {
            match q.write_log() {
                Ok((tokens, f)) => {
                    g.written.extend(tokens);
                    g.files.extend(f);
                }
                Err((e, tokens)) => {
                    tracing::error!(queue = %q.log_name(), error = %e, "cannot write queue log; publishes are nacked");
                    g.failed.extend(tokens);
                }
            }
            g.owners.push(q);
        }
        let mut seen = HashSet::new();
        g.files.retain(|f| seen.insert(Arc::as_ptr(f)));
        g
    }
}

/// Most files synced at once by one group: each queue has its own log, and one `fdatasync`
/// after another made a group over 10 queues take 10 flush latencies (S3, S6). Concurrent
/// flushes overlap on this kind of disk: 10 files synced in parallel took 3.6-12 ms against
/// 24-38 ms in turn.
const PARALLEL_SYNCS: usize = 16;

/// fdatasyncs every file, concurrently when there are several; false if any failed.
fn sync_all(files: &[Arc<std::fs::File>]) -> bool {
    let sync = |f: &Arc<std::fs::File>| match f.sync_data() {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "fsync failed; publishes are nacked");
            false
        }
    };
    if files.len() <= 1 {
        return files.iter().all(sync);
    }
    let sync_chunk = |chunk: &[Arc<std::fs::File>]| chunk.iter().map(sync).fold(true, |a, b| a & b);
    std::thread::scope(|s| {
        let mut ok = true;
        let mut handles = Vec::new();
        for chunk in files.chunks(files.len().div_ceil(PARALLEL_SYNCS)) {
            // Out of threads: sync this chunk here rather than fail the group.
            match std::thread::Builder::new().spawn_scoped(s, move || sync_chunk(chunk)) {
                Ok(h) => handles.push(h),
                Err(_) => ok &= sync_chunk(chunk),
            }
        }
        handles
            .into_iter()
            .fold(ok, |a, h| a & h.join().unwrap_or(false))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// An owner with nothing buffered but one file to sync.
    struct OneFile {
        queued: AtomicBool,
        file: Arc<std::fs::File>,
        synced: AtomicBool,
    }

    impl Logged for OneFile {
        fn join_batch(&self) -> bool {
            !self.queued.swap(true, Ordering::AcqRel)
        }
        fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
            self.queued.store(false, Ordering::Release);
            Ok((Vec::new(), vec![self.file.clone()]))
        }
        fn synced(&self, ok: bool) {
            self.synced.store(ok, Ordering::Relaxed);
        }
        fn log_name(&self) -> &str {
            "one-file"
        }
    }

    #[test]
    fn a_group_counts_its_wait_and_syncs_each_file_once() {
        let path = std::env::temp_dir().join(format!("warren-group-{}", std::process::id()));
        let file = Arc::new(std::fs::File::create(&path).expect("temp file"));
        let owner = |file: &Arc<std::fs::File>| {
            Arc::new(OneFile {
                queued: AtomicBool::new(false),
                file: file.clone(),
                synced: AtomicBool::new(false),
            })
        };
        let (a, b) = (owner(&file), owner(&file));
        let p = Persister::manual();
        p.mark_dirty(&a);
        p.mark_dirty(&a); // already queued: joins once
        p.mark_dirty(&b);
        std::thread::sleep(std::time::Duration::from_millis(5));
        p.commit_dirty();
        let (groups, wait_us, ..) = p.times.means_us();
        assert_eq!(groups, 1);
        assert!(wait_us >= 5_000, "waited {wait_us} µs");
        // Two owners of one file: one fsync.
        assert_eq!(p.fsyncs.load(Ordering::Relaxed), 1);
        assert!(a.synced.load(Ordering::Relaxed) && b.synced.load(Ordering::Relaxed));
        // Nothing dirty: a commit syncs nothing.
        p.commit_dirty();
        assert_eq!(p.fsyncs.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_file(path);
    }
}
