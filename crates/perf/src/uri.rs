//! AMQP URIs as RabbitMQ's Java client reads them: `amqp://user:pass@host:port/vhost`, with
//! percent-decoding; an absent or empty path means vhost `/`.

#[derive(Debug, Clone, PartialEq)]
pub struct AmqpUri {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
}

impl AmqpUri {
    pub fn parse(s: &str) -> Result<AmqpUri, String> {
        let rest = if let Some(r) = s.strip_prefix("amqp://") {
            r
        } else if s.starts_with("amqps://") {
            return Err(format!(
                "'{s}': amqps (TLS) is not supported by warren perf"
            ));
        } else {
            return Err(format!(
                "'{s}' is not an AMQP URI (expected amqp://user:pass@host:port/vhost)"
            ));
        };
        let rest = rest.split(['?', '#']).next().unwrap_or("");
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(ui) => match ui.split_once(':') {
                Some((u, p)) => (decode(u, s)?, decode(p, s)?),
                None => (decode(ui, s)?, "guest".to_string()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            // [ipv6]:port
            let Some((h, after)) = h.split_once(']') else {
                return Err(format!("'{s}': unterminated [ in host"));
            };
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        let port = match port {
            None | Some("") => 5672,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("'{s}': bad port '{p}'"))?,
        };
        let host = if host.is_empty() {
            "localhost".into()
        } else {
            host
        };
        let vhost = match path {
            None | Some("") => "/".to_string(),
            Some(p) => decode(p, s)?,
        };
        Ok(AmqpUri {
            host,
            port,
            user,
            password,
            vhost,
        })
    }

    /// The URI without the password, for output and reports.
    pub fn display(&self) -> String {
        let v = if self.vhost == "/" {
            "%2f".to_string()
        } else {
            self.vhost.clone()
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("amqp://{}@{}:{}/{}", self.user, host, self.port, v)
    }
}

fn decode(p: &str, whole: &str) -> Result<String, String> {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = p
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("'{whole}': bad percent-escape in '{p}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{whole}': '{p}' is not UTF-8 once decoded"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let u = AmqpUri::parse("amqp://localhost").expect("ok");
        assert_eq!(
            (
                u.host.as_str(),
                u.port,
                u.user.as_str(),
                u.password.as_str(),
                u.vhost.as_str()
            ),
            ("localhost", 5672, "guest", "guest", "/")
        );
        let u = AmqpUri::parse("amqp://a%40b:p%3Aw@10.0.0.1:5673/%2f?heartbeat=5").expect("ok");
        assert_eq!((u.user.as_str(), u.password.as_str()), ("a@b", "p:w"));
        assert_eq!(
            (u.host.as_str(), u.port, u.vhost.as_str()),
            ("10.0.0.1", 5673, "/")
        );
        assert_eq!(AmqpUri::parse("amqp://h/").expect("ok").vhost, "/");
        assert_eq!(AmqpUri::parse("amqp://h/prod").expect("ok").vhost, "prod");
        let u = AmqpUri::parse("amqp://[::1]:5700").expect("ok");
        assert_eq!((u.host.as_str(), u.port), ("::1", 5700));
        assert_eq!(u.display(), "amqp://guest@[::1]:5700/%2f");
    }

    #[test]
    fn errors() {
        assert!(AmqpUri::parse("amqps://h").unwrap_err().contains("TLS"));
        assert!(AmqpUri::parse("localhost").unwrap_err().contains("amqp://"));
        assert!(AmqpUri::parse("amqp://h:99999")
            .unwrap_err()
            .contains("port"));
        assert!(AmqpUri::parse("amqp://h/%zz")
            .unwrap_err()
            .contains("percent"));
    }
}
