//! The message body: PerfTest's layout, a 4-byte sequence number then an 8-byte send timestamp
//! (both big-endian), padded with zeros to the requested size. The timestamp is nanoseconds on
//! the system's monotonic clock (`CLOCK_MONOTONIC`, what Java's `System.nanoTime` reads), so
//! latency is exact between processes on one host, as with PerfTest: a drain run (S6b) measures
//! the age of a backlog another run published.

use std::sync::OnceLock;
use std::time::Instant;

use nix::time::{clock_gettime, ClockId};

/// Sequence number and timestamp; also the smallest body (PerfTest's default and minimum size).
pub const HEADER_BYTES: usize = 12;

/// `CLOCK_MONOTONIC` at the first call, and the `Instant` taken with it: later readings are
/// `Instant` elapsed time (vDSO-cheap, and never an error) added to that base.
fn epoch() -> (Instant, u64) {
    static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let base = clock_gettime(ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
            .unwrap_or(0);
        (Instant::now(), base)
    })
}

/// Nanoseconds on the system's monotonic clock; comparable across processes on this host.
pub fn now_ns() -> u64 {
    let (at, base) = epoch();
    base + at.elapsed().as_nanos() as u64
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
