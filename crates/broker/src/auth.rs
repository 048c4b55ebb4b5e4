//! Users and SASL. PLAIN (`\0user\0password`) and AMQPLAIN (a field table without its length
//! prefix, with LOGIN and PASSWORD) as RabbitMQ accepts them.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use warren_protocol::codec::Reader;
use warren_protocol::FieldTable;

use crate::access::Access;
pub use crate::access::User;

/// Login checks: credentials from the [`Access`] registry, then the loopback rule.
pub struct Users {
    pub access: Arc<Access>,
    loopback_only: Vec<String>,
}

pub enum AuthError {
    /// The mechanism is not PLAIN or AMQPLAIN.
    UnknownMechanism,
    /// The response could not be parsed.
    Malformed,
    BadCredentials {
        user: String,
    },
    LoopbackOnly {
        user: String,
    },
}

impl Users {
    pub fn new(access: Arc<Access>, loopback_only: Vec<String>) -> Users {
        Users {
            access,
            loopback_only,
        }
    }

    pub fn authenticate(
        &self,
        mechanism: &str,
        response: &Bytes,
        peer: IpAddr,
    ) -> Result<User, AuthError> {
        let (name, password) = match mechanism {
            "PLAIN" => parse_plain(response).ok_or(AuthError::Malformed)?,
            "AMQPLAIN" => parse_amqplain(response).ok_or(AuthError::Malformed)?,
            _ => return Err(AuthError::UnknownMechanism),
        };
        let Some(user) = self.access.login(&name, &password) else {
            return Err(AuthError::BadCredentials { user: name });
        };
        if self.loopback_only.contains(&name) && !peer.is_loopback() {
            return Err(AuthError::LoopbackOnly { user: name });
        }
        Ok(user)
    }
}

fn parse_plain(b: &[u8]) -> Option<(String, String)> {
    let mut parts = b.split(|&c| c == 0);
    let _authzid = parts.next()?;
    let user = std::str::from_utf8(parts.next()?).ok()?.to_string();
    let pass = std::str::from_utf8(parts.next()?).ok()?.to_string();
    Some((user, pass))
}

fn parse_amqplain(b: &Bytes) -> Option<(String, String)> {
    let mut framed = BytesMut::with_capacity(b.len() + 4);
    framed.put_u32(b.len() as u32);
    framed.put_slice(b);
    let framed = framed.freeze();
    let table: FieldTable = Reader::new(&framed).table().ok()?;
    let user = table.get("LOGIN")?.as_str()?.to_string();
    let pass = table.get("PASSWORD")?.as_str()?.to_string();
    Some((user, pass))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_protocol::FieldValue;

    #[test]
    fn plain_and_amqplain() {
        let c = crate::config::Config::default();
        let access = Access::from_file(Access::seed(&c), None).expect("seed");
        let users = Users::new(Arc::new(access), c.loopback_users);
        let lo = IpAddr::from([127, 0, 0, 1]);
        assert!(users
            .authenticate("PLAIN", &Bytes::from_static(b"\0guest\0guest"), lo)
            .is_ok());
        assert!(matches!(
            users.authenticate("PLAIN", &Bytes::from_static(b"\0guest\0nope"), lo),
            Err(AuthError::BadCredentials { .. })
        ));
        assert!(matches!(
            users.authenticate(
                "PLAIN",
                &Bytes::from_static(b"\0guest\0guest"),
                IpAddr::from([10, 0, 0, 1])
            ),
            Err(AuthError::LoopbackOnly { .. })
        ));
        let mut t = FieldTable::new();
        t.insert("LOGIN", FieldValue::str("guest"));
        t.insert("PASSWORD", FieldValue::str("guest"));
        let mut b = BytesMut::new();
        t.encode(&mut b);
        let resp = b.freeze().slice(4..);
        assert!(users.authenticate("AMQPLAIN", &resp, lo).is_ok());
        assert!(matches!(
            users.authenticate("EXTERNAL", &resp, lo),
            Err(AuthError::UnknownMechanism)
        ));
        assert!(matches!(
            users.authenticate("PLAIN", &Bytes::from_static(b"junk"), lo),
            Err(AuthError::Malformed)
        ));
    }
}
