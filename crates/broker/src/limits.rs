//! Every limit and default, with RabbitMQ's value where RabbitMQ has one.

/// Channels per connection offered in connection.tune (RabbitMQ: 2047).
pub const CHANNEL_MAX: u16 = 2047;
/// Largest frame offered in connection.tune (RabbitMQ: 131072).
pub const FRAME_MAX: u32 = 131_072;
/// Heartbeat interval offered in connection.tune, seconds (RabbitMQ: 60).
pub const HEARTBEAT_S: u16 = 60;
/// A client that has not finished the handshake by then is dropped (RabbitMQ: 10 s).
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// A socket write with no progress for this long closes the connection (RabbitMQ's
/// `tcp_listen_options.send_timeout`: 15 s).
pub const SEND_TIMEOUT_MS: u64 = 15_000;
/// Wait before answering a failed login. RabbitMQ answers at once but closes slowly enough
/// that guessing is rate-limited per connection; 1 s keeps a guesser to one try a second.
pub const AUTH_FAILURE_DELAY_MS: u64 = 1_000;
/// How long we wait for close-ok after sending connection.close.
pub const CLOSE_OK_TIMEOUT_MS: u64 = 3_000;
/// Largest accepted message body (RabbitMQ 3.10: 128 MiB).
pub const MESSAGE_SIZE_MAX_BYTES: u64 = 128 * 1024 * 1024;
/// Kernel receive buffer of client sockets (RabbitMQ recommends 192 KiB for `recbuf`).
pub const SOCKET_RECV_BUFFER_BYTES: u32 = 192 * 1024;
/// Largest TCP segment we send (TCP_MAXSEG). Over loopback (a 64 KiB MTU) the MSS is 64 KiB; a
/// Java client's receive window settles at 64,624 bytes, below one such segment, and Linux then
/// sends nothing until its persist timer fires (the sender-side silly-window test): deliveries
/// to PerfTest's consumer stalled at ~2,260 msg/s in 6 of 27 runs without the clamp. The MSS is
/// fixed at the handshake, so it is set on the listener. On links with an MTU up to 16 KiB
/// (1500: MSS 1,448; 9000: 8,948, measured over a veth pair) it changes nothing.
/// `TCP_NOTSENT_LOWAT` also avoided the stall (0 of 25 runs) but cost PerfTest 9-14%
/// (docs/benchmarks/notes/2026-11-27-persistent-confirms-and-workers.md).
pub const SEGMENT_MAX_BYTES: u32 = 16 * 1024;
/// Read buffer granted per socket read once a read has filled the one it had (a client sending
/// in bulk).
pub const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Read buffer of a connection that sends little (every connection at first): what an idle
/// connection holds. A read that fills it grows it to `READ_BUFFER_BYTES`; a small read that
/// leaves nothing unprocessed shrinks it back, so a burst does not pin 64 KiB per connection
/// (at 10,000 idle connections the two 64 KiB buffers were two thirds of the broker's RSS).
pub const READ_BUFFER_IDLE_BYTES: usize = 4 * 1024;
/// A queue with consumers that holds more ready messages (or bytes) than this is falling
/// behind: connections publishing into it stall their reads (bounded, see `PUBLISH_STALL_MS`).
pub const QUEUE_PRESSURE_MSGS: usize = 2_000;
pub const QUEUE_PRESSURE_BYTES: u64 = 8 * 1024 * 1024;
/// A pressured queue is relieved once it holds fewer ready messages than this.
pub const QUEUE_RELIEF_MSGS: usize = 1_000;
/// The longest a connection that also consumes waits for a pressured queue per read batch.
/// Bounded, so it cannot deadlock on its own unread acks; publish-only connections wait for
/// relief.
pub const PUBLISH_STALL_MS: u64 = 10;
/// A publish-only connection waiting for credit re-checks its queues this often (a safety net:
/// relief also wakes it).
pub const CREDIT_RECHECK_MS: u64 = 100;
/// What a publish-only connection still starved after `CREDIT_RECHECK_MS` may read: a trickle
/// (at most ten such reads a second) that keeps its publisher alive while the queue drains.
pub const STARVED_READ_BYTES: usize = 4096;

const _: () = assert!(QUEUE_RELIEF_MSGS < QUEUE_PRESSURE_MSGS);

/// A queue holding more ready messages (or body bytes) in memory than this keeps the messages
/// that arrive after on disk only (its log, or a scratch log for a non-durable queue), until
/// consumers have taken everything in memory. RabbitMQ's classic queues keep a similar few
/// thousand messages in memory.
pub const PAGE_OUT_MSGS: usize = 16_384;
pub const PAGE_OUT_BYTES: u64 = 8 * 1024 * 1024;
/// How much is read back at a time: one large sequential read.
pub const PAGE_IN_BYTES: usize = 1024 * 1024;

/// How often memory and disk are sampled for the resource alarms.
pub const ALARM_CHECK_MS: u64 = 500;
/// RabbitMQ's defaults: alarm at 0.4 of RAM, and below 50 MB of free disk.
pub const MEMORY_HIGH_WATERMARK: f64 = 0.4;
pub const DISK_FREE_LIMIT_BYTES: u64 = 50_000_000;

/// The consumer (delivery acknowledgement) timeout's default (RabbitMQ: 30 min).
pub const CONSUMER_TIMEOUT_MS: u64 = 1_800_000;
/// A connection whose channels hold manual-ack deliveries checks their age at least this often.
pub const CONSUMER_TIMEOUT_CHECK_MS: u64 = 1_000;
/// Late acks of deliveries a timeout took back are ignored; a channel remembers this many tags.
pub const RECLAIMED_TAGS_MAX: usize = 65_536;

/// How often queues holding messages with a TTL are checked for expired heads.
pub const TTL_SWEEP_MS: u64 = 50;
/// A connection's unsent output above which queues stop dispatching to its consumers.
pub const OUTBOX_HIGH_BYTES: usize = 1024 * 1024;
/// A connection whose unsent replies exceed this stops processing its client's requests until
/// the writer catches up: deliveries already stop at the high mark, and this bounds what a
/// client that sends requests but never reads the replies can make the broker hold.
pub const OUTBOX_READ_PAUSE_BYTES: usize = 4 * 1024 * 1024;
/// Below this, a writer that had hit the high mark wakes the queues that held back.
pub const OUTBOX_LOW_BYTES: usize = 256 * 1024;

const _: () = assert!(OUTBOX_LOW_BYTES < OUTBOX_HIGH_BYTES);
const _: () = assert!(OUTBOX_HIGH_BYTES < OUTBOX_READ_PAUSE_BYTES);
const _: () = assert!(FRAME_MAX >= warren_protocol::frame::FRAME_MIN_SIZE);
