//! Names: the server-generated ones (queues, consumer tags, reply-to queues) and RabbitMQ's
//! CR/LF stripping of the names a client gives.

use warren_protocol::ByteString;

/// A server-generated name: prefix plus 22 URL-safe random characters, as RabbitMQ makes them.
pub fn gen_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    let mut s = String::with_capacity(prefix.len() + 22);
    s.push_str(prefix);
    for _ in 0..22 {
        s.push(ALPHABET[rng.gen_range(0..ALPHABET.len())] as char);
    }
    s
}

/// RabbitMQ strips CR and LF from exchange and queue names in declare, delete and bind methods
/// (`rabbit_channel:strip_cr_lf`); basic.publish, consume, get and queue.purge take names as given.
pub(super) fn strip_cr_lf(name: &ByteString) -> ByteString {
    if !name.bytes().any(|b| b == b'\r' || b == b'\n') {
        return name.clone();
    }
    ByteString::from(name.replace(['\r', '\n'], ""))
}
