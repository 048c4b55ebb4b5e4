//! The osiris chunk a `Deliver` carries (osiris's `osiris_log` header, version 0): 48 bytes of
//! header, then each message as a simple entry (a 0 bit and a 31-bit size, then the bytes).
//! Clients check the data's CRC-32 and skip the messages before the offset they asked for.

use bytes::{BufMut, BytesMut};

/// Magic 5, format version 0.
const MAGIC_VERSION: u8 = 0x50;
pub const HEADER_BYTES: usize = 48;

/// Writes a user chunk of `entries` (their AMQP 1.0 bytes) that starts at offset `first`,
/// stamped `timestamp_ms`, into `out`.
pub fn write<'a>(
    out: &mut BytesMut,
    first: u64,
    timestamp_ms: i64,
    entries: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) {
    let n = entries.len();
    let data_len: usize = entries.clone().map(|e| 4 + e.len()).sum();
    let header_at = out.len();
    out.reserve(HEADER_BYTES + data_len);
    out.put_u8(MAGIC_VERSION);
    out.put_u8(0); // chunk type: user
    out.put_u16(n as u16);
    out.put_u32(n as u32);
    out.put_i64(timestamp_ms);
    out.put_u64(0); // epoch
    out.put_u64(first);
    out.put_u32(0); // the CRC, patched below
    out.put_u32(data_len as u32);
    out.put_u32(0); // trailer
    out.put_u32(0); // reserved
    let data_at = out.len();
    for e in entries {
        out.put_u32(e.len() as u32 & 0x7fff_ffff);
        out.put_slice(e);
    }
    let crc = crc32fast::hash(&out[data_at..]);
    out[header_at + 32..header_at + 36].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_as_osiris_writes_it() {
        let mut b = BytesMut::new();
        let msgs: [&[u8]; 2] = [b"ab", b"c"];
        write(&mut b, 10, 1_000, msgs.iter().copied());
        assert_eq!(b.len(), HEADER_BYTES + 4 + 2 + 4 + 1);
        assert_eq!(b[0], 0x50);
        assert_eq!(&b[2..4], &2u16.to_be_bytes());
        assert_eq!(&b[24..32], &10u64.to_be_bytes());
        assert_eq!(&b[36..40], &11u32.to_be_bytes());
        let crc = crc32fast::hash(&b[HEADER_BYTES..]);
        assert_eq!(&b[32..36], &crc.to_be_bytes());
        assert_eq!(
            &b[HEADER_BYTES..HEADER_BYTES + 6],
            &[0, 0, 0, 2, b'a', b'b']
        );
    }
}
