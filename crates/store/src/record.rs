//! A record: `magic u32 | len u32 | crc32 u32 | payload[len]`, big-endian. The checksum covers
//! the payload. The magic lets recovery find the next record after a corrupt one.
//!
//! Payload: `kind u8 | seq u64 | data`. Kind 1 = enqueue (data is the message), 2 = ack,
//! 3 = ack of every seq from `seq` to the u64 in `data` (a purge), 4 = volatile enqueue: a
//! transient message paged out of memory, read back at run time and ignored by recovery.

use bytes::{BufMut, Bytes, BytesMut};

pub const MAGIC: u32 = 0x5752_4e31; // "WRN1"
pub const HEADER_BYTES: usize = 12;
pub const KIND_ENQUEUE: u8 = 1;
pub const KIND_ACK: u8 = 2;
pub const KIND_ACK_RANGE: u8 = 3;
pub const KIND_VOLATILE: u8 = 4;
/// No record is larger than this (a 128 MiB message plus its envelope); a larger length is corrupt.
pub const MAX_PAYLOAD_BYTES: u32 = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: u8,
    pub seq: u64,
    pub data: Bytes,
}

pub fn encode(buf: &mut BytesMut, kind: u8, seq: u64, data: &[u8]) {
    buf.reserve(HEADER_BYTES + 1 + 8 + data.len());
    encode_with(buf, kind, seq, |b| b.put_slice(data));
}

/// As [`encode`], the data written by `write` straight into `buf` rather than copied from a
/// buffer of its own (a replicated queue's log entries carry message bodies).
pub fn encode_with(buf: &mut BytesMut, kind: u8, seq: u64, write: impl FnOnce(&mut BytesMut)) {
    let start = buf.len();
    buf.put_u32(MAGIC);
    buf.put_u32(0);
    buf.put_u32(0);
    buf.put_u8(kind);
    buf.put_u64(seq);
    write(buf);
    let len = (buf.len() - start - HEADER_BYTES) as u32;
    let crc = crc32fast::hash(&buf[start + HEADER_BYTES..]);
    buf[start + 4..start + 8].copy_from_slice(&len.to_be_bytes());
    buf[start + 8..start + 12].copy_from_slice(&crc.to_be_bytes());
}

/// What the scanner found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// A valid record and the offset just past it.
    Record(Record, usize),
    /// Not enough bytes for the record the header announces: a torn tail if at the end.
    Truncated,
    /// Bad magic, impossible length or checksum mismatch.
    Corrupt,
}

/// Reads the record at `at` in `file`.
pub fn scan(file: &Bytes, at: usize) -> Scan {
    let rest = &file[at..];
    if rest.len() < HEADER_BYTES {
        return Scan::Truncated;
    }
    let word = |i: usize| u32::from_be_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
    if word(0) != MAGIC {
        return Scan::Corrupt;
    }
    let len = word(4);
    if !(9..=MAX_PAYLOAD_BYTES).contains(&len) {
        return Scan::Corrupt;
    }
    let end = HEADER_BYTES + len as usize;
    if rest.len() < end {
        return Scan::Truncated;
    }
    let payload = &rest[HEADER_BYTES..end];
    if crc32fast::hash(payload) != word(8) {
        return Scan::Corrupt;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&payload[1..9]);
    let start = at + HEADER_BYTES;
    Scan::Record(
        Record {
            kind: payload[0],
            seq: u64::from_be_bytes(seq),
            data: file.slice(start + 9..start + len as usize),
        },
        at + end,
    )
}

/// The offset of the next plausible record header after a corrupt one, if any.
pub fn resync(file: &Bytes, from: usize) -> Option<usize> {
    let magic = MAGIC.to_be_bytes();
    (from + 1..file.len().saturating_sub(3))
        .find(|&i| file[i..i + 4] == magic && matches!(scan(file, i), Scan::Record(..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_in_pieces_scans_back_whole() {
        for data in [&b""[..], b"hello", &[7u8; 5000]] {
            let mut b = BytesMut::from(&b"xy"[..]);
            encode_with(&mut b, KIND_ENQUEUE, 9, |w| {
                let (x, y) = data.split_at(data.len() / 2);
                w.put_slice(x);
                w.put_slice(y);
            });
            let file = b.freeze();
            let Scan::Record(r, next) = scan(&file, 2) else {
                panic!("no record");
            };
            assert_eq!((r.kind, r.seq, &r.data[..]), (KIND_ENQUEUE, 9, data));
            assert_eq!(next, file.len());
        }
    }

    #[test]
    fn round_trip_and_damage() {
        let mut b = BytesMut::new();
        encode(&mut b, KIND_ENQUEUE, 7, b"hello");
        encode(&mut b, KIND_ACK, 7, b"");
        let whole = b.freeze();
        let Scan::Record(r, next) = scan(&whole, 0) else {
            panic!("first record")
        };
        assert_eq!(
            (r.kind, r.seq, &r.data[..]),
            (KIND_ENQUEUE, 7, &b"hello"[..])
        );
        assert!(matches!(
            scan(&whole, next),
            Scan::Record(Record { kind: KIND_ACK, .. }, _)
        ));
        assert_eq!(scan(&whole.slice(..next - 1), 0), Scan::Truncated);
        let mut flipped = whole.to_vec();
        flipped[HEADER_BYTES + 3] ^= 1;
        let flipped = Bytes::from(flipped);
        assert_eq!(scan(&flipped, 0), Scan::Corrupt);
        assert_eq!(resync(&flipped, 0), Some(next));
    }
}
