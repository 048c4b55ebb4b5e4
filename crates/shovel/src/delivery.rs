//! A message as the shovel carries it from its source to its destination.

use bytes::Bytes;
use bytestring::ByteString;

/// A message taken from the source.
pub struct Delivery {
    /// The source's delivery tag (the shovel's own for a local source).
    pub tag: u64,
    pub exchange: ByteString,
    pub routing_key: ByteString,
    pub properties: Bytes,
    pub body: Bytes,
}
