//! A stream's tracking, beside its segments (`tracking.wrn` in the stream's directory): the
//! offsets consumers stored under a reference (the stream protocol's `store_offset`) and the
//! last publishing id of each named publisher (deduplication). Records in [`crate::record`]'s
//! framing (kind, the value as `seq`, the reference as data), appended with one write each; the
//! last record of a reference wins. When the file holds many more records than references, it
//! is rewritten with one record each ([`crate::snapshot::write_atomic`]). A torn or corrupt
//! tail is dropped at open.
//!
//! Not in the segments: a stream's offsets stay dense (a tracking record takes none) and
//! retention, which drops whole segments, never forgets a stored offset. Written without an
//! fsync, as RabbitMQ's stream writer writes its tracking: a process crash keeps it (the
//! kernel has it), a power loss may lose the last records.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};

use crate::record::{self, Scan};

pub const KIND_OFFSET: u8 = 7;
pub const KIND_PUBLISHER: u8 = 8;
pub const FILE_NAME: &str = "tracking.wrn";
/// Rewritten when it holds more than this many records beyond one per reference.
const COMPACT_SLACK: usize = 4096;

pub struct Tracking {
    path: PathBuf,
    file: File,
    offsets: HashMap<String, u64>,
    publishers: HashMap<String, u64>,
    records: usize,
}

impl Tracking {
    /// Opens (or creates) the tracking file of the stream in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Tracking> {
        let path = dir.join(FILE_NAME);
        let bytes = match std::fs::read(&path) {
            Ok(b) => Bytes::from(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Bytes::new(),
            Err(e) => return Err(e),
        };
        let mut t = Tracking {
            file: OpenOptions::new().create(true).append(true).open(&path)?,
            path,
            offsets: HashMap::new(),
            publishers: HashMap::new(),
            records: 0,
        };
        let mut at = 0;
        while at < bytes.len() {
            let Scan::Record(r, next) = record::scan(&bytes, at) else {
                break;
            };
            let reference = String::from_utf8_lossy(&r.data).into_owned();
            match r.kind {
                KIND_OFFSET => {
                    t.offsets.insert(reference, r.seq);
                }
                KIND_PUBLISHER => {
                    t.publishers.insert(reference, r.seq);
                }
                _ => {}
            }
            t.records += 1;
            at = next;
        }
        if at < bytes.len() {
            tracing::warn!(file = %t.path.display(), kept = at, size = bytes.len(), "stream tracking has a torn or corrupt tail: truncated");
            t.file.set_len(at as u64)?;
        }
        Ok(t)
    }

    pub fn offset(&self, reference: &str) -> Option<u64> {
        self.offsets.get(reference).copied()
    }

    pub fn publisher(&self, reference: &str) -> Option<u64> {
        self.publishers.get(reference).copied()
    }

    pub fn set_offset(&mut self, reference: &str, offset: u64) -> std::io::Result<()> {
        if self.offsets.get(reference) == Some(&offset) {
            return Ok(());
        }
        self.offsets.insert(reference.to_string(), offset);
        self.write(KIND_OFFSET, reference, offset)
    }

    /// Records `id` as the publisher's last, when it is beyond the one recorded.
    pub fn set_publisher(&mut self, reference: &str, id: u64) -> std::io::Result<()> {
        if self.publishers.get(reference).is_some_and(|&p| p >= id) {
            return Ok(());
        }
        self.publishers.insert(reference.to_string(), id);
        self.write(KIND_PUBLISHER, reference, id)
    }

    fn write(&mut self, kind: u8, reference: &str, value: u64) -> std::io::Result<()> {
        if self.records > self.offsets.len() + self.publishers.len() + COMPACT_SLACK {
            return self.compact();
        }
        let mut b = BytesMut::new();
        record::encode(&mut b, kind, value, reference.as_bytes());
        self.file.write_all(&b)?;
        self.records += 1;
        Ok(())
    }

    /// Rewrites the file with one record per reference.
    fn compact(&mut self) -> std::io::Result<()> {
        let mut b = BytesMut::new();
        for (r, v) in &self.offsets {
            record::encode(&mut b, KIND_OFFSET, *v, r.as_bytes());
        }
        for (r, v) in &self.publishers {
            record::encode(&mut b, KIND_PUBLISHER, *v, r.as_bytes());
        }
        crate::snapshot::write_atomic(&self.path, &b)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.records = self.offsets.len() + self.publishers.len();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "warren-tracking-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rand_suffix() -> u64 {
        use std::time::{SystemTime, UNIX_EPOCH};
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    #[test]
    fn kept_across_opens_and_compactions() {
        let d = dir();
        {
            let mut t = Tracking::open(&d).unwrap();
            t.set_offset("c1", 10).unwrap();
            t.set_offset("c1", 12).unwrap();
            t.set_publisher("p1", 5).unwrap();
            t.set_publisher("p1", 3).unwrap(); // never back
            for i in 0..(COMPACT_SLACK as u64 + 10) {
                t.set_offset("c2", i).unwrap();
            }
        }
        let size = std::fs::metadata(d.join(FILE_NAME)).unwrap().len();
        assert!(size < 4096 * 40, "compacted: {size} bytes");
        let t = Tracking::open(&d).unwrap();
        assert_eq!(t.offset("c1"), Some(12));
        assert_eq!(t.offset("c2"), Some(COMPACT_SLACK as u64 + 9));
        assert_eq!(t.publisher("p1"), Some(5));
        assert_eq!(t.offset("none"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_torn_tail_is_dropped() {
        let d = dir();
        {
            let mut t = Tracking::open(&d).unwrap();
            t.set_offset("c1", 7).unwrap();
        }
        let path = d.join(FILE_NAME);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0x57, 0x52, 0x4e]).unwrap();
        drop(f);
        let mut t = Tracking::open(&d).unwrap();
        assert_eq!(t.offset("c1"), Some(7));
        t.set_offset("c1", 8).unwrap();
        drop(t);
        assert_eq!(Tracking::open(&d).unwrap().offset("c1"), Some(8));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
