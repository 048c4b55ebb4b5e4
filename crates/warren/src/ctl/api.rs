//! The management API client every command goes through, and the failure that ends a command
//! with its exit status.

use serde_json::Value;

/// Why a command failed, and the exit status that says so.
pub(super) struct Failure {
    pub(super) code: u8,
    pub(super) message: String,
}

/// A failure with exit status 1: the broker refused, or a value was not usable.
pub(super) fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

/// The broker's management API: where it is, the basic-auth header, how long to wait.
pub(super) struct Api {
    base: String,
    auth: String,
    timeout: std::time::Duration,
}

/// Percent-encodes one path segment (vhost `/` becomes `%2F`).
pub(super) fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// The API at `base` (no trailing '/'), as `username`; `timeout_s` bounds each request.
    pub(super) fn new(base: String, username: &str, password: &str, timeout_s: u64) -> Api {
        Api {
            base,
            auth: format!(
                "Basic {}",
                base64_lite::encode(format!("{username}:{password}").as_bytes())
            ),
            timeout: std::time::Duration::from_secs(timeout_s),
        }
    }

    /// Sends a request; `Ok(None)` is a 404.
    pub(super) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Option<Value>, Failure> {
        let url = format!("{}{path}", self.base);
        let mut req = ureq::request(method, &url)
            .set("authorization", &self.auth)
            .timeout(self.timeout);
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let r = match body {
            Some(b) => req
                .set("content-type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        match r {
            Ok(resp) => {
                let text = resp
                    .into_string()
                    .map_err(|e| fail(format!("reading the reply: {e}")))?;
                if text.trim().is_empty() {
                    return Ok(Some(Value::Null));
                }
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| fail(format!("the broker's reply is not JSON: {e}")))
            }
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(ureq::Error::Status(code, resp)) => Err(self.refused(code, resp)),
            Err(e) => Err(Failure {
                code: 69,
                message: format!(
                    "unable to reach the broker's management API at {}: {e}",
                    self.base
                ),
            }),
        }
    }

    /// An error status (not 404) as a failure: the reply's `reason` when it gives one.
    fn refused(&self, code: u16, resp: ureq::Response) -> Failure {
        let text = resp.into_string().unwrap_or_default();
        let reason = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("reason").cloned())
            .map(|r| match r {
                Value::String(s) => s,
                other => other.to_string(),
            })
            .unwrap_or(text);
        fail(match code {
            401 => format!("access refused by the broker ({}): {reason}", self.base),
            _ => format!("{reason} (HTTP {code})"),
        })
    }

    pub(super) fn get(&self, path: &str) -> Result<Option<Value>, Failure> {
        self.call("GET", path, None, &[])
    }

    /// As `call`, with a 404 failing with `missing`.
    pub(super) fn must(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        missing: String,
    ) -> Result<Value, Failure> {
        self.call(method, path, body, &[])?
            .ok_or_else(|| fail(missing))
    }

    /// The node name the broker reports (for banners that name it, as rabbitmqctl's do).
    pub(super) fn node_name(&self) -> Result<String, Failure> {
        let o = self.must(
            "GET",
            "/api/overview",
            None,
            "the broker has no overview".into(),
        )?;
        Ok(o.get("node")
            .and_then(Value::as_str)
            .unwrap_or("warren")
            .to_string())
    }
}

/// Standard base64 for the basic-auth header (the one place the binary needs it).
mod base64_lite {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(input: &[u8]) -> String {
        let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
        for chunk in input.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    #[test]
    fn known_values() {
        assert_eq!(encode(b"guest:guest"), "Z3Vlc3Q6Z3Vlc3Q=");
        assert_eq!(encode(b"a"), "YQ==");
        assert_eq!(encode(b"ab"), "YWI=");
    }
}
