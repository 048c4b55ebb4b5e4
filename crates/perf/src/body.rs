//! The message body: PerfTest's layout, a 4-byte sequence number then an 8-byte send timestamp
//! (both big-endian), padded with zeros to the requested size. The timestamp is nanoseconds on
//! this process's monotonic clock, so latency is exact when producer and consumer share the
//! process (as in PerfTest, which does the same with `System.nanoTime`).

use std::sync::OnceLock;
use std::time::Instant;

/// Sequence number and timestamp; also the smallest body (PerfTest's default and minimum size).
pub const HEADER_BYTES: usize = 12;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the process's first call; monotonic.
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// Writes the sequence number and timestamp into the first [`HEADER_BYTES`] of `body`.
pub fn stamp(body: &mut [u8], seq: u32, ts_ns: u64) {
    body[..4].copy_from_slice(&seq.to_be_bytes());
    body[4..12].copy_from_slice(&ts_ns.to_be_bytes());
}

/// The send timestamp of a body, if it is long enough to hold one.
pub fn timestamp(body: &[u8]) -> Option<u64> {
    let b: [u8; 8] = body.get(4..12)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_and_read_back() {
        let mut b = vec![0u8; 16];
        stamp(&mut b, 7, 123_456_789);
        assert_eq!(&b[..4], &[0, 0, 0, 7]);
        assert_eq!(timestamp(&b), Some(123_456_789));
        assert_eq!(timestamp(&b[..11]), None);
        let (a, c) = (now_ns(), now_ns());
        assert!(c >= a);
    }
}
