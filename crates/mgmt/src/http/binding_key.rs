//! A binding's `properties_key`: how RabbitMQ names one binding in a URL
//! (`/api/bindings/{vhost}/e/{source}/q/{queue}/{props}`), written into listings and read back
//! from URLs.

use serde_json::Value;

/// RabbitMQ's `properties_key` (`rabbit_mgmt_format:pack_binding_props`): `~` for an empty
/// routing key without arguments, else the key quoted as a query-string value (`~` too), and
/// with arguments `~` and a hash of them. RabbitMQ hashes the Erlang term (`erlang:phash2`);
/// Warren hashes the arguments' JSON (FNV-1a, 32 bits, base64url), so a key with arguments is
/// Warren's own: clients take it from a listing, as RabbitMQ's UI does.
pub(super) fn properties_key(routing_key: &str, arguments: &Value) -> String {
    let no_args = arguments.as_object().is_none_or(|m| m.is_empty());
    if no_args {
        if routing_key.is_empty() {
            return "~".to_string();
        }
        return quote_plus(routing_key);
    }
    format!("{}~{}", quote_plus(routing_key), args_hash(arguments))
}

/// The hash of a binding's arguments in its properties key.
fn args_hash(arguments: &Value) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in arguments.to_string().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.to_be_bytes())
}

/// A properties key from a URL, read as RabbitMQ's `unpack_binding_props` reads it: the routing
/// key (unquoted: `+` is a space, `%XX` a byte) and the arguments' hash, if any.
fn unpack(props: &str) -> (String, Option<String>) {
    if props == "~" {
        return (String::new(), None);
    }
    match props.split_once('~') {
        None => (unquote(props), None),
        Some((key, hash)) => (unquote(key), Some(unquote(hash))),
    }
}

fn unquote(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Does binding `x` (a listing's object) have the key and arguments `props` names?
pub(super) fn has_props(x: &Value, props: &str) -> bool {
    let (key, hash) = unpack(props);
    if x.get("routing_key").and_then(Value::as_str) != Some(key.as_str()) {
        return false;
    }
    let args = x.get("arguments").unwrap_or(&Value::Null);
    let no_args = args.as_object().is_none_or(|m| m.is_empty());
    match hash {
        None => no_args,
        Some(h) => !no_args && args_hash(args) == h,
    }
}

/// `rabbit_http_util:quote_plus` with `~` escaped as well: letters, digits, `.`, `-`, `_` stay,
/// a space is `+`, anything else `%XX`.
fn quote_plus(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn properties_keys_as_rabbitmq_packs_them() {
        assert_eq!(properties_key("", &json!({})), "~");
        assert_eq!(properties_key("a.b-c_d", &json!({})), "a.b-c_d");
        assert_eq!(properties_key("a b/c~", &Value::Null), "a+b%2Fc%7E");
        let k = properties_key("rk", &json!({"x-match": "all"}));
        assert!(k.starts_with("rk~") && k.len() > 3, "{k}");
        assert_ne!(k, properties_key("rk", &json!({"x-match": "any"})));
    }

    #[test]
    fn a_properties_key_is_read_back_quoted_or_not() {
        let b = json!({"routing_key": "a b~c", "arguments": {}});
        assert!(has_props(&b, "a+b%7Ec"));
        assert!(has_props(&b, "a+b%7ec"));
        assert!(!has_props(&b, "a+b"));
        let empty = json!({"routing_key": "", "arguments": {}});
        assert!(has_props(&empty, "~"));
        let args = json!({"routing_key": "k", "arguments": {"x": 1}});
        assert!(has_props(&args, &properties_key("k", &json!({"x": 1}))));
        assert!(!has_props(&args, "k"));
        assert_eq!(unquote("100%"), "100%");
        assert_eq!(unquote("%2"), "%2");
        assert_eq!(unquote("x.%23"), "x.#");
    }
}
