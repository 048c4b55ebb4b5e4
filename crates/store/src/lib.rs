//! Warren's storage: one append-only log per durable queue, and atomic snapshot files.
//!
//! Layout:
//! - [`record`]: the on-disk record (magic, length, CRC-32, payload) and its scanner.
//! - [`log`]: [`QueueLog`], a queue's segments: buffered appends written in groups, acks,
//!   reclamation of fully acked segments, recovery that truncates a torn tail and skips a corrupt
//!   record in the middle.
//! - [`stream`]: [`stream::StreamLog`], a stream's segments: offsets, a sparse index, reads by
//!   offset or time without a lock, retention by whole segments.
//! - [`tracking`]: a stream's stored consumer offsets and publisher sequences, beside its
//!   segments.
//! - [`snapshot`]: a small file replaced atomically (write, fsync, rename, fsync dir).
//! - [`checkpoint`]: a pair of numbers rewritten often without an fsync, never torn.
//!
//! Invariant: this crate knows record bytes, sequence numbers and files, never AMQP methods.
//! It does no fsync scheduling: callers decide when to sync (group commit lives in the broker).

pub mod checkpoint;
pub mod log;
pub mod record;
pub mod snapshot;
pub mod stream;
pub mod tracking;

pub use log::{segment_ids, segment_path, Cursor, LiveSet, QueueLog, Recovery, Written};
