//! The consistent-hash exchange (`x-consistent-hash`, RabbitMQ's
//! rabbitmq_consistent_hash_exchange plugin): each binding's key is its weight, the number of
//! buckets it owns; a message's hash picks one bucket with jump consistent hashing (Lamping and
//! Veach), as the plugin does since 3.8, so exactly one destination gets it.
//!
//! Buckets are numbered in binding order, so adding a binding appends buckets and jump hashing
//! moves only the keys that land on the new ones (about weight / total). Removing a binding
//! renumbers the buckets after it, as in RabbitMQ.
//!
//! The ring is built when the exchange's bindings change; routing does a hash, a jump-hash walk
//! (O(log buckets)) and a binary search, and allocates nothing.

use warren_protocol::properties::BasicProperties;
use warren_protocol::{FieldTable, FieldValue};

/// What a message is hashed on: the exchange's `hash-header` / `hash-property` argument.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HashOn {
    #[default]
    RoutingKey,
    Header(String),
    MessageId,
    CorrelationId,
    Timestamp,
}

/// The properties `hash-property` accepts (RabbitMQ's list).
pub const HASH_PROPERTIES: &[&str] = &["correlation_id", "message_id", "timestamp"];

/// Why an exchange's arguments are refused. The broker turns these into RabbitMQ's replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// 406: `hash-header and hash-property are mutually exclusive`, `Unsupported property: x`.
    Invalid(String),
    /// A value that is not a string: RabbitMQ's validation crashes on it (541 INTERNAL_ERROR).
    NotAString,
}

impl HashOn {
    /// Reads and checks the exchange arguments, as the plugin's `validate/1` does.
    pub fn from_arguments(args: &FieldTable) -> Result<HashOn, ArgsError> {
        let text = |k: &str| -> Result<Option<&str>, ArgsError> {
            match args.get(k) {
                None => Ok(None),
                Some(v) => v.as_str().map(Some).ok_or(ArgsError::NotAString),
            }
        };
        let (header, property) = (args.get("hash-header"), args.get("hash-property"));
        if header.is_some() && property.is_some() {
            return Err(ArgsError::Invalid(
                "hash-header and hash-property are mutually exclusive".into(),
            ));
        }
        if let Some(h) = text("hash-header")? {
            return Ok(HashOn::Header(h.to_string()));
        }
        Ok(match text("hash-property")? {
            None => HashOn::RoutingKey,
            Some("message_id") => HashOn::MessageId,
            Some("correlation_id") => HashOn::CorrelationId,
            Some("timestamp") => HashOn::Timestamp,
            Some(other) => {
                return Err(ArgsError::Invalid(format!("Unsupported property: {other}")))
            }
        })
    }

    /// Whether hashing needs the message's properties decoded.
    pub fn needs_properties(&self) -> bool {
        *self != HashOn::RoutingKey
    }

    /// The message's hash. A missing header or property hashes as one fixed value, so such
    /// messages all go to one destination (RabbitMQ hashes `undefined`).
    pub fn hash(&self, routing_key: &str, props: Option<&BasicProperties>) -> u64 {
        let mut h = Fnv::new();
        match self {
            HashOn::RoutingKey => h.tagged(b's', routing_key.as_bytes()),
            HashOn::Header(name) => {
                match props
                    .and_then(|p| p.headers.as_ref())
                    .and_then(|t| t.get(name))
                {
                    Some(v) => h.value(v),
                    None => h.byte(b'u'),
                }
            }
            HashOn::MessageId | HashOn::CorrelationId => {
                let v = props.and_then(|p| match self {
                    HashOn::MessageId => p.message_id.as_ref(),
                    _ => p.correlation_id.as_ref(),
                });
                match v {
                    Some(s) => h.tagged(b's', s.as_bytes()),
                    None => h.byte(b'u'),
                }
            }
            HashOn::Timestamp => match props.and_then(|p| p.timestamp) {
                Some(t) => h.tagged(b'i', &t.to_le_bytes()),
                None => h.byte(b'u'),
            },
        }
        h.finish()
    }
}

/// Why a binding key is refused (RabbitMQ's texts, answered with 406).
pub fn parse_weight(key: &str) -> Result<u64, String> {
    // Erlang's list_to_integer: an optional sign, then digits; nothing else.
    let digits = key.strip_prefix(['+', '-']).unwrap_or(key);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "The binding key must be an integer: {}",
            erl_binary(key)
        ));
    }
    if key.starts_with('-') || digits.bytes().all(|b| b == b'0') {
        return Err("The binding key must be greater than 0".into());
    }
    // Beyond u64 RabbitMQ would try to allocate that many buckets; saturate instead.
    Ok(digits.parse::<u64>().unwrap_or(u64::MAX))
}

/// A binary as RabbitMQ's `~p` prints it: `<<>>`, `<<"text">>` (UTF-8 text included), or
/// `<<1,97>>` when it holds control characters.
fn erl_binary(s: &str) -> String {
    if s.is_empty() {
        return "<<>>".into();
    }
    if !s.chars().any(char::is_control) {
        let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
        return format!("<<\"{escaped}\">>");
    }
    let bytes: Vec<String> = s.bytes().map(|b| b.to_string()).collect();
    format!("<<{}>>", bytes.join(","))
}

/// The buckets of one exchange: `ends[i]` is one past the last bucket of binding `i`.
#[derive(Debug, Clone, Default)]
pub struct HashRing {
    pub on: HashOn,
    ends: Vec<u64>,
}

impl HashRing {
    pub fn new(on: HashOn) -> HashRing {
        HashRing {
            on,
            ends: Vec::new(),
        }
    }

    /// Rebuilds the buckets from the binding keys, in binding order. Keys were checked with
    /// [`parse_weight`] when bound; one that does not parse owns no bucket.
    pub fn rebuild<'a>(&mut self, keys: impl Iterator<Item = &'a str>) {
        self.ends.clear();
        let mut total: u64 = 0;
        for k in keys {
            // Jump hashing takes at most i64::MAX buckets.
            total = total
                .saturating_add(parse_weight(k).unwrap_or(0))
                .min(i64::MAX as u64);
            self.ends.push(total);
        }
    }

    pub fn buckets(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The index of the binding that owns `hash`'s bucket; `None` without buckets.
    pub fn pick(&self, hash: u64) -> Option<usize> {
        let n = self.buckets();
        if n == 0 {
            return None;
        }
        let bucket = jump(hash, n);
        Some(self.ends.partition_point(|&end| end <= bucket))
    }
}

/// Jump consistent hash: the bucket in `0..n` for `key`; growing `n` moves a key only to one of
/// the new buckets.
fn jump(mut key: u64, n: u64) -> u64 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while (j as u64) < n {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
        if j < 0 {
            break;
        }
    }
    b as u64
}

/// FNV-1a with a final avalanche (splitmix64), so short keys that differ in one byte spread
/// over the whole range jump hashing reads. Fixed: the same key picks the same bucket in every
/// run, unlike a randomly seeded hasher.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn byte(&mut self, b: u8) {
        self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn bytes(&mut self, bs: &[u8]) {
        for &b in bs {
            self.byte(b);
        }
    }
    /// A type tag, the length and the bytes, so different types and splits never collide.
    fn tagged(&mut self, tag: u8, bs: &[u8]) {
        self.byte(tag);
        self.bytes(&(bs.len() as u64).to_le_bytes());
        self.bytes(bs);
    }
    fn value(&mut self, v: &FieldValue) {
        match v {
            FieldValue::Bool(b) => self.tagged(b'b', &[*b as u8]),
            FieldValue::F32(f) => self.tagged(b'f', &(*f as f64).to_le_bytes()),
            FieldValue::F64(f) => self.tagged(b'f', &f.to_le_bytes()),
            FieldValue::Decimal(s, n) => {
                self.tagged(b'd', &[*s]);
                self.bytes(&n.to_le_bytes());
            }
            FieldValue::Timestamp(t) => self.tagged(b't', &t.to_le_bytes()),
            FieldValue::Array(items) => {
                self.tagged(b'a', &(items.len() as u64).to_le_bytes());
                for i in items {
                    self.value(i);
                }
            }
            FieldValue::Table(t) => {
                self.tagged(b'm', &(t.0.len() as u64).to_le_bytes());
                for (k, v) in &t.0 {
                    self.tagged(b'k', k.as_bytes());
                    self.value(v);
                }
            }
            FieldValue::Bytes(b) | FieldValue::LongStr(b) => self.tagged(b's', b),
            FieldValue::U64(n) => self.tagged(b'i', &n.to_le_bytes()),
            FieldValue::Void => self.byte(b'v'),
            // The remaining integer types: one value, one hash, whatever the width.
            other => self.tagged(b'i', &other.as_i64().unwrap_or(0).to_le_bytes()),
        }
    }
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: usize = 100_000;

    fn ring(weights: &[&str]) -> HashRing {
        let mut r = HashRing::new(HashOn::RoutingKey);
        r.rebuild(weights.iter().copied());
        r
    }

    fn pick_key(r: &HashRing, key: &str) -> usize {
        r.pick(r.on.hash(key, None)).expect("a bucket")
    }

    fn shares(r: &HashRing, n: usize) -> Vec<f64> {
        let mut counts = vec![0usize; n];
        for i in 0..KEYS {
            counts[pick_key(r, &format!("key-{i}"))] += 1;
        }
        counts.iter().map(|&c| c as f64 / KEYS as f64).collect()
    }

    #[test]
    fn shares_follow_weights() {
        let r = ring(&["1", "2", "3", "4"]);
        assert_eq!(r.buckets(), 10);
        for (got, want) in shares(&r, 4).iter().zip([0.1, 0.2, 0.3, 0.4]) {
            assert!(
                (got - want).abs() < 0.01,
                "share {got} vs weight share {want}"
            );
        }
        // Equal weights: equal shares, however many buckets each binding has.
        let r = ring(&["20", "20", "20"]);
        for got in shares(&r, 3) {
            assert!((got - 1.0 / 3.0).abs() < 0.01, "share {got}");
        }
    }

    #[test]
    fn same_key_same_binding_in_every_build() {
        let (a, b) = (ring(&["3", "5", "1"]), ring(&["3", "5", "1"]));
        for i in 0..1000 {
            let k = format!("order-{i}");
            assert_eq!(pick_key(&a, &k), pick_key(&b, &k));
        }
        // Pinned: the hash is fixed, not seeded per process, so keys keep their queue across
        // restarts and versions.
        assert_eq!(
            HashOn::RoutingKey.hash("order-1", None),
            3234059678347687300
        );
        assert_ne!(
            HashOn::RoutingKey.hash("a", None),
            HashOn::RoutingKey.hash("b", None)
        );
    }

    #[test]
    fn adding_a_binding_moves_only_its_share_to_it() {
        let before = ring(&["1", "2", "3"]);
        let after = ring(&["1", "2", "3", "2"]);
        let mut moved = 0;
        for i in 0..KEYS {
            let k = format!("key-{i}");
            let (x, y) = (pick_key(&before, &k), pick_key(&after, &k));
            if x != y {
                assert_eq!(y, 3, "a key moved between old bindings");
                moved += 1;
            }
        }
        let share = moved as f64 / KEYS as f64;
        assert!(
            (share - 0.25).abs() < 0.01,
            "moved {share}, the new binding's share is 0.25"
        );
    }

    #[test]
    fn header_and_property_hashing() {
        let headers = |v: FieldValue| {
            let mut t = FieldTable::new();
            t.insert("user", v);
            BasicProperties {
                headers: Some(t),
                ..Default::default()
            }
        };
        let on = HashOn::Header("user".into());
        let r = {
            let mut r = HashRing::new(on.clone());
            r.rebuild(["1", "1", "1", "1"].into_iter());
            r
        };
        // The routing key is ignored: the header alone picks the binding.
        let p = headers(FieldValue::str("alice"));
        let first = r.pick(on.hash("rk-1", Some(&p)));
        for i in 0..100 {
            assert_eq!(r.pick(on.hash(&format!("rk-{i}"), Some(&p))), first);
        }
        // Different header values spread over every binding.
        let mut seen = [false; 4];
        for i in 0..200 {
            let p = headers(FieldValue::str(&format!("user-{i}")));
            seen[r.pick(on.hash("rk", Some(&p))).expect("bucket")] = true;
        }
        assert_eq!(seen, [true; 4]);
        // A string and an integer of the same digits are different values.
        assert_ne!(
            on.hash("", Some(&headers(FieldValue::str("5")))),
            on.hash("", Some(&headers(FieldValue::I32(5))))
        );
        assert_eq!(
            on.hash("", Some(&headers(FieldValue::I64(5)))),
            on.hash("", Some(&headers(FieldValue::U8(5))))
        );
        // Missing header: one fixed hash, with or without properties.
        assert_eq!(
            on.hash("a", None),
            on.hash("b", Some(&BasicProperties::default()))
        );

        let id = |m: &str, c: &str, t: u64| BasicProperties {
            message_id: Some(m.into()),
            correlation_id: Some(c.into()),
            timestamp: Some(t),
            ..Default::default()
        };
        let (a, b) = (id("m1", "c1", 1), id("m1", "c2", 2));
        assert_eq!(
            HashOn::MessageId.hash("x", Some(&a)),
            HashOn::MessageId.hash("y", Some(&b))
        );
        assert_ne!(
            HashOn::CorrelationId.hash("x", Some(&a)),
            HashOn::CorrelationId.hash("x", Some(&b))
        );
        assert_ne!(
            HashOn::Timestamp.hash("x", Some(&a)),
            HashOn::Timestamp.hash("x", Some(&b))
        );
        assert_eq!(
            HashOn::Timestamp.hash("x", Some(&a)),
            HashOn::Timestamp.hash("z", Some(&a))
        );
    }

    #[test]
    fn arguments_and_weights_validated_as_rabbitmq() {
        let args = |kv: &[(&str, FieldValue)]| {
            let mut t = FieldTable::new();
            for (k, v) in kv {
                t.insert(k, v.clone());
            }
            t
        };
        assert_eq!(HashOn::from_arguments(&args(&[])), Ok(HashOn::RoutingKey));
        assert_eq!(
            HashOn::from_arguments(&args(&[("hash-header", FieldValue::str("h"))])),
            Ok(HashOn::Header("h".into()))
        );
        assert_eq!(
            HashOn::from_arguments(&args(&[("hash-property", FieldValue::str("timestamp"))])),
            Ok(HashOn::Timestamp)
        );
        assert_eq!(
            HashOn::from_arguments(&args(&[
                ("hash-header", FieldValue::str("h")),
                ("hash-property", FieldValue::str("message_id"))
            ])),
            Err(ArgsError::Invalid(
                "hash-header and hash-property are mutually exclusive".into()
            ))
        );
        assert_eq!(
            HashOn::from_arguments(&args(&[("hash-property", FieldValue::str("app_id"))])),
            Err(ArgsError::Invalid("Unsupported property: app_id".into()))
        );
        assert_eq!(
            HashOn::from_arguments(&args(&[("hash-header", FieldValue::I32(5))])),
            Err(ArgsError::NotAString)
        );
        assert_eq!(parse_weight("10"), Ok(10));
        assert_eq!(parse_weight("+3"), Ok(3));
        assert_eq!(parse_weight("99999999999999999999999"), Ok(u64::MAX));
        assert_eq!(
            parse_weight(""),
            Err("The binding key must be an integer: <<>>".to_string())
        );
        assert_eq!(
            parse_weight("a\"b"),
            Err("The binding key must be an integer: <<\"a\\\"b\">>".to_string())
        );
        assert_eq!(
            parse_weight("é"),
            Err("The binding key must be an integer: <<\"é\">>".to_string())
        );
        assert_eq!(
            parse_weight("\u{1}a"),
            Err("The binding key must be an integer: <<1,97>>".to_string())
        );
        for bad in ["abc", " 3", "3 ", "1.5", "+", "-"] {
            assert_eq!(
                parse_weight(bad),
                Err(format!("The binding key must be an integer: <<\"{bad}\">>"))
            );
        }
        for low in ["0", "-3", "+0", "000"] {
            assert_eq!(
                parse_weight(low),
                Err("The binding key must be greater than 0".to_string())
            );
        }
    }

    #[test]
    fn huge_weights_do_not_allocate_buckets() {
        let r = ring(&["99999999999999999999", "1"]);
        assert_eq!(r.buckets(), i64::MAX as u64);
        assert!(r.pick(12345).is_some());
        assert_eq!(ring(&[]).pick(1), None);
    }
}
