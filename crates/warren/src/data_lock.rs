//! One server per data directory: `warren server` holds an exclusive `flock` on
//! `<data_dir>/.lock` for its whole life and refuses to start when another process holds it
//! (RabbitMQ likewise refuses a second node on the same database). Two servers on one directory
//! would each recover the files, then overwrite and truncate each other's logs: a confirmed
//! message would be lost.
//!
//! `flock` locks belong to the open file, so the kernel drops the lock when its holder exits in
//! any way, `kill -9` included: there is never a stale lock to clear. The file also records the
//! holder's pid, for the error the next server prints.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = ".lock";

/// Held for the server's life; dropping it (or exiting) releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: Flock<File>,
}

/// Why a data directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("data directory {} is in use by another warren server ({}); stop it or choose another --data-dir", dir.display(), holder(*pid))]
    Held { dir: PathBuf, pid: Option<u32> },
    #[error("cannot lock data directory {}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
}

fn holder(pid: Option<u32>) -> String {
    match pid {
        Some(p) => format!("pid {p}"),
        None => "pid unknown".to_string(),
    }
}

/// Takes `dir` (created if missing) for this process, before anything else in it is read or
/// written.
pub fn acquire(dir: &Path) -> Result<DataDirLock, LockError> {
    let io = |source| LockError::Io {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    // Not truncated on open: the holder's pid must survive a refused server's open.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))
        .map_err(io)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut f) => {
            f.set_len(0).map_err(io)?;
            f.rewind().map_err(io)?;
            writeln!(f, "{}", std::process::id()).map_err(io)?;
            Ok(DataDirLock { _file: f })
        }
        Err((mut f, Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let pid = f
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            Err(LockError::Held {
                dir: dir.to_path_buf(),
                pid,
            })
        }
        Err((_, e)) => Err(io(std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("warren-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = acquire(&dir).expect("first");
        let recorded = std::fs::read_to_string(dir.join(LOCK_FILE)).expect("lock file");
        assert_eq!(recorded.trim(), std::process::id().to_string());
        // flock conflicts between open files, even within one process.
        match acquire(&dir) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("second acquire: {other:?}"),
        }
        let msg = acquire(&dir).expect_err("held").to_string();
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(first);
        let again = acquire(&dir).expect("free once dropped");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
