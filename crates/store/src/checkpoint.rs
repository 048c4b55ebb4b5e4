//! A pair of numbers rewritten often and cheaply, never torn: two 32-byte slots written in
//! turn (`[version u8][pad 3][sequence u32][a u64][b u64][crc u32][pad 4]`), read back as
//! the valid slot with the higher sequence. A write is one `pwrite`, without an fsync: after a
//! crash the file holds the last value written or an earlier one, never a mix, which is what
//! a replicated stream's member needs of "applied through Raft index `a`, offsets below `b`"
//! (an earlier value only makes it apply again entries it truncates first).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

const SLOT: usize = 32;
/// The slot format.
pub const VERSION: u8 = 1;

pub struct Checkpoint {
    file: File,
    seq: u32,
}

fn encode(seq: u32, a: u64, b: u64) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[0] = VERSION;
    s[4..8].copy_from_slice(&seq.to_be_bytes());
    s[8..16].copy_from_slice(&a.to_be_bytes());
    s[16..24].copy_from_slice(&b.to_be_bytes());
    let crc = crc32fast::hash(&s[..24]);
    s[24..28].copy_from_slice(&crc.to_be_bytes());
    s
}

/// A slot's sequence and values, if it is whole; an error if it is of a newer version.
fn decode(s: &[u8]) -> std::io::Result<Option<(u32, u64, u64)>> {
    let word = |r: std::ops::Range<usize>| s[r].iter().fold(0u64, |n, b| n << 8 | *b as u64);
    if s.len() < SLOT || crc32fast::hash(&s[..24]) != word(24..28) as u32 {
        return Ok(None);
    }
    if s[0] > VERSION {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "checkpoint of version {}, newer than this build reads ({VERSION})",
                s[0]
            ),
        ));
    }
    Ok(Some((word(4..8) as u32, word(8..16), word(16..24))))
}

impl Checkpoint {
    /// Opens (creating) the checkpoint at `path`; returns it and the last value written.
    pub fn open(path: &Path) -> std::io::Result<(Checkpoint, Option<(u64, u64)>)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut b = vec![0u8; 2 * SLOT];
        let n = file.read_at(&mut b, 0)?;
        b.truncate(n);
        let slots = [
            decode(b.get(..SLOT).unwrap_or_default())?,
            decode(b.get(SLOT..).unwrap_or_default())?,
        ];
        let last = slots.into_iter().flatten().max_by_key(|(seq, _, _)| *seq);
        let seq = last.map_or(0, |(s, _, _)| s);
        Ok((Checkpoint { file, seq }, last.map(|(_, a, b)| (a, b))))
    }

    /// Writes `(a, b)` over the older slot.
    pub fn write(&mut self, a: u64, b: u64) -> std::io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let at = (self.seq as u64 % 2) * SLOT as u64;
        self.file.write_all_at(&encode(self.seq, a, b), at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_whole_value_is_read_back() {
        let d = std::env::temp_dir().join(format!("warren-ckpt-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&d);
        let p = d.join("applied");
        let _ = std::fs::remove_file(&p);
        let (mut c, last) = Checkpoint::open(&p).expect("opens");
        assert_eq!(last, None);
        c.write(1, 10).expect("writes");
        c.write(2, 20).expect("writes");
        c.write(3, 30).expect("writes");
        drop(c);
        let (mut c, last) = Checkpoint::open(&p).expect("reopens");
        assert_eq!(last, Some((3, 30)));
        c.write(4, 40).expect("writes");
        // The newest slot torn: the one before it is read.
        let f = OpenOptions::new().write(true).open(&p).expect("opens");
        let newest = (c.seq as u64 % 2) * SLOT as u64;
        f.write_all_at(&[0xFF; 5], newest + 10).expect("tears");
        assert_eq!(Checkpoint::open(&p).expect("reopens").1, Some((3, 30)));
        // A newer version is refused, not read as something else.
        let mut s = encode(9, 5, 50);
        s[0] = VERSION + 1;
        let crc = crc32fast::hash(&s[..24]);
        s[24..28].copy_from_slice(&crc.to_be_bytes());
        f.write_all_at(&s, 0).expect("writes");
        assert!(Checkpoint::open(&p).is_err());
    }
}
