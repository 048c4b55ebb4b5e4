//! Consumer (delivery acknowledgement) timeout: the pure parts. Which timeout applies to a
//! delivery, the clock deliveries are stamped with, and the lease-extension request. The check
//! itself is `Channel::expire_deliveries`, run by the connection's timer (see
//! docs/consumer-timeout.md).

/// The reserved exchange name a consumer publishes to, on its own channel, to extend its lease
/// on unacked deliveries. It names no exchange: the channel intercepts it before routing.
pub const LEASE_EXCHANGE: &str = "amq.warren.lease";

/// Milliseconds of the coarse monotonic clock (a few ms resolution, no syscall): every manual-ack
/// delivery is stamped with it, so it must cost next to nothing.
#[inline]
pub fn now_ms() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    match clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE) {
        Ok(t) => t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000,
        // Never on Linux; a stamp of 0 makes a delivery look old, never young.
        Err(_) => 0,
    }
}

/// The timeout in force for a delivery: the consumer's `x-consumer-timeout`, else the queue's
/// (its argument and its policy's, merged in `policy::effective`), else the broker's
/// `consumer_timeout`. 0 at the consumer or queue level means "not set there"; a global 0
/// disables the timeout. `None`: the delivery never times out.
#[inline]
pub fn effective(consumer: Option<u64>, queue: Option<u64>, global: u64) -> Option<u64> {
    consumer
        .filter(|&t| t > 0)
        .or(queue.filter(|&t| t > 0))
        .or((global > 0).then_some(global))
}

/// RabbitMQ's text for the channel close sent to a client without `consumer_cancel_notify`.
pub fn timed_out_text(channel: u16, timeout_ms: u64) -> String {
    format!(
        "delivery acknowledgement on channel {channel} timed out. Timeout value used: \
         {timeout_ms} ms. This timeout value can be configured, see consumers doc guide to \
         learn more"
    )
}

/// Which deliveries a lease request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseTarget {
    /// Routing key empty or `*`: every unacked delivery on the channel.
    All,
    Tag(u64),
}

/// A parsed publish to [`LEASE_EXCHANGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub target: LeaseTarget,
    /// The new lease from now, in ms; `None`: the delivery's own timeout.
    pub extend_ms: Option<u64>,
}

/// Parses a lease request: routing key = delivery tag in decimal (or empty / `*`), body =
/// optional extension in ms as ASCII digits. `None` for a malformed request, which is ignored.
pub fn parse_lease(routing_key: &str, body: &[u8]) -> Option<Lease> {
    let target = match routing_key {
        "" | "*" => LeaseTarget::All,
        k => LeaseTarget::Tag(parse_digits(k.as_bytes())?),
    };
    let body = body.trim_ascii();
    let extend_ms = if body.is_empty() {
        None
    } else {
        Some(parse_digits(body)?)
    };
    Some(Lease { target, extend_ms })
}

fn parse_digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The stamp that makes a delivery with timeout `timeout_ms` expire `extend_ms` from `now`
/// (deadline = stamp + timeout), never earlier than it already would: a lease only grows.
#[inline]
pub fn extended_stamp(stamp: u64, now: u64, timeout_ms: u64, extend_ms: Option<u64>) -> u64 {
    let wanted = now
        .saturating_add(extend_ms.unwrap_or(timeout_ms))
        .saturating_sub(timeout_ms);
    stamp.max(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_source_wins_and_zero_means_unset() {
        assert_eq!(effective(Some(500), Some(900), 1_800_000), Some(500));
        assert_eq!(effective(None, Some(900), 1_800_000), Some(900));
        assert_eq!(effective(Some(0), Some(900), 1_800_000), Some(900));
        assert_eq!(effective(Some(0), Some(0), 1_800_000), Some(1_800_000));
        assert_eq!(effective(None, None, 0), None, "global 0 disables");
        assert_eq!(effective(Some(700), None, 0), Some(700));
    }

    #[test]
    fn the_close_text_is_rabbitmqs() {
        assert_eq!(
            timed_out_text(1, 1800000),
            "delivery acknowledgement on channel 1 timed out. Timeout value used: 1800000 ms. \
             This timeout value can be configured, see consumers doc guide to learn more"
        );
    }

    #[test]
    fn lease_requests_parse_or_are_ignored() {
        let l = |k: &str, b: &[u8]| parse_lease(k, b);
        assert_eq!(
            l("42", b""),
            Some(Lease {
                target: LeaseTarget::Tag(42),
                extend_ms: None
            })
        );
        assert_eq!(
            l("", b" 5000\n"),
            Some(Lease {
                target: LeaseTarget::All,
                extend_ms: Some(5000)
            })
        );
        assert_eq!(l("*", b"").map(|x| x.target), Some(LeaseTarget::All));
        assert_eq!(l("x1", b""), None);
        assert_eq!(l("-1", b""), None);
        assert_eq!(l("1", b"soon"), None);
        assert_eq!(l("1", b"-5"), None);
        assert_eq!(l("99999999999999999999", b""), None, "overflow");
    }

    #[test]
    fn a_lease_only_grows() {
        // Delivered at 1000 with a 500 ms timeout: deadline 1500.
        assert_eq!(extended_stamp(1000, 1200, 500, None), 1200, "deadline 1700");
        assert_eq!(
            extended_stamp(1000, 1200, 500, Some(2000)),
            2700,
            "deadline 3200"
        );
        assert_eq!(
            extended_stamp(1000, 1200, 500, Some(100)),
            1000,
            "never shortened"
        );
        // Early in the clock's life the subtraction saturates; the lease cannot shrink either.
        assert_eq!(extended_stamp(0, 10, 1_800_000, Some(5)), 0);
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = now_ms();
        assert!(b >= a + 20, "{a} -> {b}");
    }
}
