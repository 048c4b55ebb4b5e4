//! A published message, shared by every queue it was routed to.

use bytes::Bytes;
use warren_protocol::ByteString;

#[derive(Debug)]
pub struct Message {
    pub exchange: ByteString,
    pub routing_key: ByteString,
    /// Property flags and values as the publisher sent them; delivered verbatim.
    pub properties: Bytes,
    pub body: Bytes,
    pub persistent: bool,
    /// From the `priority` property, read only when the publisher set it.
    pub priority: Option<u8>,
    /// From the `expiration` property (ms), read only when the publisher set it.
    pub expiration_ms: Option<u64>,
}

impl Message {
    /// Bytes this message holds in memory, for queue accounting.
    pub fn size(&self) -> usize {
        self.body.len() + self.properties.len()
    }
}
