//! AMQP 0-9-1 as RabbitMQ speaks it: frames, methods, field tables and content headers.
//!
//! Layout:
//! - [`frame`]: splitting a byte stream into frames (check first, then parse) and writing them.
//! - [`method`]: every method of the 0-9-1 spec (with RabbitMQ's extensions), generated from one
//!   declarative table by a macro, with `decode`/`encode`.
//! - [`table`]: field tables and field values.
//! - [`properties`]: the content header; properties stay raw bytes and are decoded on demand.
//! - [`codec`]: the primitive reader/writer (bit packing lives here).
//! - [`reply`]: reply codes.
//! - `invariants`: what the decoders hold for any input, checked by the fuzzers and tests.
//!
//! Invariant: no I/O, no async runtime, no clock. Strings are `ByteString` slices of the frame
//! buffer, so decoding a `basic.publish` does not allocate.
//!
//! Why hand-written rather than amq-protocol: the broker's hot path needs message bodies as shared
//! `Bytes` (amq-protocol's body frames own a `Vec<u8>`) and properties kept as the raw encoded bytes
//! to send back verbatim (amq-protocol decodes them eagerly). The method table is checked against
//! amq-protocol in the tests, so a third-party codec stands on the other side.

#[cfg(test)]
mod arb;
pub mod codec;
pub mod error;
pub mod frame;
#[doc(hidden)]
pub mod invariants;
pub mod method;
pub mod properties;
pub mod reply;
pub mod table;

pub use bytestring::ByteString;
pub use error::DecodeError;
pub use frame::{Frame, FrameDecoder, FrameKind};
pub use method::Method;
pub use table::{FieldTable, FieldValue};

/// The protocol header a 0-9-1 client sends first, and what the server answers to a wrong one.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
