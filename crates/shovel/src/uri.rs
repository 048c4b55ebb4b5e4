//! A shovel's URIs as RabbitMQ's `amqp_uri` reads them: `amqp://` with no host is this broker
//! (a local end, reached through the broker API; `amqp:///vhost` names the vhost), anything
//! else another broker over AMQP 0-9-1, `amqps://` over TLS with RabbitMQ's query keys for the
//! certificates (`cacertfile`, `certfile`, `keyfile`, `verify`, `server_name_indication`).

use percent_encoding::percent_decode_str;

/// One URI of a shovel's end.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// As it was given (status shows it with the password hidden, [`Endpoint::redacted`]).
    pub uri: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// This broker, in this vhost.
    Local {
        vhost: String,
    },
    Remote(Remote),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    pub heartbeat: Option<u16>,
    pub frame_max: Option<u32>,
    pub channel_max: Option<u16>,
    /// Milliseconds, as RabbitMQ's `connection_timeout`.
    pub connection_timeout: Option<u64>,
    /// PEM files: the CA that signs the server's certificate, this client's certificate and key.
    pub cacertfile: Option<String>,
    pub certfile: Option<String>,
    pub keyfile: Option<String>,
    /// `verify=verify_peer` (the default here) or `verify_none`.
    pub verify_peer: bool,
}

impl Endpoint {
    /// The URI without its user and password, as RabbitMQ's shovel status shows it.
    pub fn redacted(&self) -> String {
        let Some(s) = self.uri.find("://") else {
            return self.uri.clone();
        };
        let rest = &self.uri[s + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => format!("{}{}", &self.uri[..s + 3], &rest[at + 1..]),
            None => self.uri.clone(),
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self.target, Target::Local { .. })
    }
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| format!("{s} is not valid percent-encoded UTF-8"))
}

/// Reads `uri`; the error is RabbitMQ's "not a valid URI" text.
pub fn parse(uri: &str) -> Result<Endpoint, String> {
    // RabbitMQ's text: the reason, then the URI, as an Erlang tuple.
    let bad = |why: String| format!("\"{uri}\" not a valid URI: {{{why},\"{uri}\"}}");
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(bad("{bad_uri,missing_scheme}".into()));
    };
    let tls = match scheme {
        "amqp" => false,
        "amqps" => true,
        other => return Err(bad(format!("{{unexpected_uri_scheme,\"{other}\"}}"))),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, q),
        None => (rest, ""),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let vhost = match path {
        None | Some("") => "/".to_string(),
        Some(p) if p.contains('/') => return Err(bad("{bad_vhost,\"vhost has a '/'\"}".into())),
        Some(p) => decode(p).map_err(bad)?,
    };
    if authority.is_empty() {
        if tls {
            return Err(bad(
                "{unexpected_uri_scheme,\"amqps\"} for this broker".into()
            ));
        }
        return Ok(Endpoint {
            uri: uri.to_string(),
            target: Target::Local { vhost },
        });
    }
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => ("guest".to_string(), "guest".to_string()),
        Some(u) => match u.split_once(':') {
            Some((n, p)) => (decode(n).map_err(bad)?, decode(p).map_err(bad)?),
            None => (decode(u).map_err(bad)?, String::new()),
        },
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        // [v6]:port
        let (h, after) = h.split_once(']').ok_or_else(|| bad("{bad_host}".into()))?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad("{bad_host}".into()));
    }
    let port = match port {
        None | Some("") => {
            if tls {
                5671
            } else {
                5672
            }
        }
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| bad(format!("{{bad_port,\"{p}\"}}")))?,
    };
    let mut r = Remote {
        tls,
        host: decode(&host).map_err(bad)?,
        port,
        user,
        password,
        vhost,
        heartbeat: None,
        frame_max: None,
        channel_max: None,
        connection_timeout: None,
        cacertfile: None,
        certfile: None,
        keyfile: None,
        verify_peer: true,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v).map_err(bad)?;
        let num = |what: &str| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{{bad_{what},\"{v}\"}}")))
        };
        match k {
            "heartbeat" => r.heartbeat = Some(num(k)?.min(u16::MAX as u64) as u16),
            "frame_max" => r.frame_max = Some(num(k)?.min(u32::MAX as u64) as u32),
            "channel_max" => r.channel_max = Some(num(k)?.min(u16::MAX as u64) as u16),
            "connection_timeout" => r.connection_timeout = Some(num(k)?),
            "cacertfile" => r.cacertfile = Some(v),
            "certfile" => r.certfile = Some(v),
            "keyfile" => r.keyfile = Some(v),
            "verify" => match v.as_str() {
                "verify_peer" => r.verify_peer = true,
                "verify_none" => r.verify_peer = false,
                _ => return Err(bad(format!("{{bad_verify,\"{v}\"}}"))),
            },
            // Accepted as RabbitMQ accepts them; the client's defaults serve.
            "server_name_indication"
            | "fail_if_no_peer_cert"
            | "auth_mechanism"
            | "depth"
            | "password" => {}
            other => return Err(bad(format!("{{unknown_parameter,\"{other}\"}}"))),
        }
    }
    if !tls && (r.cacertfile.is_some() || r.certfile.is_some()) {
        return Err(bad("{ssl_options_on_amqp_scheme}".into()));
    }
    Ok(Endpoint {
        uri: uri.to_string(),
        target: Target::Remote(r),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn remote(u: &str) -> Remote {
        match parse(u).unwrap().target {
            Target::Remote(r) => r,
            t => panic!("{t:?}"),
        }
    }

    #[test]
    fn local_and_remote_uris() {
        assert_eq!(
            parse("amqp://").unwrap().target,
            Target::Local { vhost: "/".into() }
        );
        assert_eq!(
            parse("amqp:///v%2F1").unwrap().target,
            Target::Local {
                vhost: "v/1".into()
            }
        );
        let r = remote("amqp://u:p%40ss@127.0.0.1:5673/%2f?heartbeat=5");
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.1", 5673));
        assert_eq!((r.user.as_str(), r.password.as_str()), ("u", "p@ss"));
        assert_eq!(r.vhost, "/");
        assert_eq!(r.heartbeat, Some(5));
        let r = remote("amqp://broker");
        assert_eq!(
            (r.user.as_str(), r.port, r.vhost.as_str()),
            ("guest", 5672, "/")
        );
        let r = remote("amqps://h/v?cacertfile=/c/ca.pem&certfile=/c/c.pem&keyfile=/c/k.pem&verify=verify_peer");
        assert!(r.tls && r.verify_peer);
        assert_eq!(r.port, 5671);
        assert_eq!(r.cacertfile.as_deref(), Some("/c/ca.pem"));
        assert_eq!(r.vhost, "v");
        let r = remote("amqp://[::1]:5000");
        assert_eq!((r.host.as_str(), r.port), ("::1", 5000));
    }

    #[test]
    fn bad_uris_say_why() {
        assert_eq!(
            parse("http://x").unwrap_err(),
            "\"http://x\" not a valid URI: {{unexpected_uri_scheme,\"http\"},\"http://x\"}"
        );
        assert!(parse("amqp://h:port").unwrap_err().contains("bad_port"));
        assert!(parse("amqp://h?colour=red")
            .unwrap_err()
            .contains("unknown_parameter"));
        assert!(parse("nothing").is_err());
        assert!(parse("amqp://h?cacertfile=/x").is_err());
    }

    #[test]
    fn status_hides_the_credentials() {
        let e = parse("amqp://u:secret@h:5672/v?heartbeat=5").unwrap();
        assert_eq!(e.redacted(), "amqp://h:5672/v?heartbeat=5");
        assert_eq!(parse("amqp://").unwrap().redacted(), "amqp://");
    }
}
