//! The broker's clocks: the monotonic one that message deadlines (TTL, `x-expires`) are kept on,
//! and Unix time (stored deadlines, stream timestamps, delayed messages' due times). The coarse
//! clock that stamps every delivery for consumer timeouts is `consumer_timeout::now_ms`.

/// Milliseconds on a monotonic clock shared by the process (TTL deadlines).
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Unix time in seconds (`x-death` times).
pub fn unix_s() -> u64 {
    unix_ms() / 1000
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
