//! Group commit across a node's Raft groups: one thread makes the appends of every group
//! durable together, and tells each group's openraft when its own are.
//!
//! Each group keeps its own segment files; written through the page cache, an append still
//! has to reach the disk before openraft is told. One fdatasync per group per append, run
//! on the async workers, is what a node with 100 quorum queues at a low rate each spent its
//! time on (38% of its CPU, and workers blocked in the kernel while connections waited: the
//! sizing study, docs/benchmarks.md). Here an append is written and handed to this thread
//! ([`submit`]); the thread takes everything handed to it since its last round and makes it
//! durable at once: one `syncfs` for the files of one filesystem (one device flush for all of
//! them; on other systems, or for a single file, fdatasync each), then completes the appends in
//! the order they came. While it syncs, the next round gathers: the busier the node, the more
//! appends one flush covers. RabbitMQ's Ra gets the same from one write-ahead log per node.
//! openraft 0.9's core awaits each append's flush before its next command (asynchronously:
//! the worker is free meanwhile), so a group has one append in flight and its writes stay in
//! order; the groups' appends are what a round gathers.
//!
//! `syncfs` also writes back whatever else on that filesystem is dirty; on a disk the data
//! directory shares with other busy writers that is their data too. That is the price of one
//! flush instead of one per group, and why the setting is per group (`MetaConfig::group_commit`):
//! a simulation keeps each append's fdatasync in line, in its own order.

use std::fs::File;
use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// An append waiting to be durable: the files it wrote and what to do once they are.
pub(super) struct Job {
    pub files: Vec<Arc<File>>,
    pub done: Box<dyn FnOnce(io::Result<()>) + Send>,
}

/// At most this many appends in one round, so that a flood still completes in steps.
const ROUND: usize = 4096;

static SYNCER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// Hands `job` to the node's sync thread (started on first use). If the thread is gone, the
/// job is synced here.
pub(super) fn submit(job: Job) {
    let tx = SYNCER.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("warren-log-sync".into())
            .spawn(move || run(rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the Raft log sync thread; syncing in line");
        }
        Mutex::new(tx)
    });
    let sent = match tx.lock() {
        Ok(tx) => tx.send(job),
        Err(p) => p.into_inner().send(job),
    };
    if let Err(mpsc::SendError(job)) = sent {
        let r = sync_each(&job.files);
        (job.done)(r);
    }
}

fn run(rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut round = vec![first];
        while round.len() < ROUND {
            match rx.try_recv() {
                Ok(j) => round.push(j),
                Err(_) => break,
            }
        }
        let files: Vec<&Arc<File>> = round.iter().flat_map(|j| j.files.iter()).collect();
        let result = sync_together(&files);
        for job in round {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            (job.done)(r);
        }
    }
}

/// Makes `files` durable: per filesystem, one `syncfs` where it holds more than one of them
/// (Linux), else an fdatasync of each.
fn sync_together(files: &[&Arc<File>]) -> io::Result<()> {
    let mut distinct: Vec<&Arc<File>> = Vec::new();
    for f in files {
        if !distinct.iter().any(|d| Arc::ptr_eq(d, f)) {
            distinct.push(f);
        }
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let mut by_dev: Vec<(u64, Vec<&Arc<File>>)> = Vec::new();
        for f in distinct {
            let dev = f.metadata()?.dev();
            match by_dev.iter_mut().find(|(d, _)| *d == dev) {
                Some((_, fs)) => fs.push(f),
                None => by_dev.push((dev, vec![f])),
            }
        }
        for (_, fs) in by_dev {
            match fs.as_slice() {
                [one] => one.sync_data()?,
                [first, ..] => nix::unistd::syncfs(first.as_ref()).map_err(io::Error::from)?,
                [] => {}
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        for f in distinct {
            f.sync_data()?;
        }
        Ok(())
    }
}

/// fdatasync of each file.
pub(super) fn sync_each(files: &[Arc<File>]) -> io::Result<()> {
    files.iter().try_for_each(|f| f.sync_data())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn every_job_completes_once_in_the_order_it_came() {
        let dir = std::env::temp_dir().join(format!("warren-log-sync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let files: Vec<Arc<File>> = (0..5)
            .map(|i| Arc::new(File::create(dir.join(format!("{i}"))).expect("create")))
            .collect();
        let (tx, rx) = mpsc::channel();
        for n in 0..200usize {
            let f = files[n % files.len()].clone();
            (&*f).write_all(b"x").expect("write");
            let tx = tx.clone();
            submit(Job {
                files: vec![f],
                done: Box::new(move |r| {
                    let _ = tx.send((n, r.is_ok()));
                }),
            });
        }
        let got: Vec<(usize, bool)> = (0..200)
            .map(|_| {
                rx.recv_timeout(std::time::Duration::from_secs(20))
                    .expect("completed")
            })
            .collect();
        assert_eq!(got, (0..200).map(|n| (n, true)).collect::<Vec<_>>());
        assert!(rx.try_recv().is_err(), "no job completes twice");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
