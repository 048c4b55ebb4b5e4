//! Names: RabbitMQ's CR/LF stripping of the names a client gives (the server-generated ones
//! are `vhost::gen_name`).

use warren_protocol::ByteString;

/// RabbitMQ strips CR and LF from exchange and queue names in declare, delete and bind methods
/// (`rabbit_channel:strip_cr_lf`); basic.publish, consume, get and queue.purge take names as given.
pub(super) fn strip_cr_lf(name: &ByteString) -> ByteString {
    if !name.bytes().any(|b| b == b'\r' || b == b'\n') {
        return name.clone();
    }
    ByteString::from(name.replace(['\r', '\n'], ""))
}
