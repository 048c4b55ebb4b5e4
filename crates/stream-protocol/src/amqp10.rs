//! Messages between AMQP 1.0 (what the stream protocol carries) and AMQP 0-9-1 properties and
//! body (what Warren's streams hold today), with RabbitMQ 3.10's mapping
//! (`rabbit_msg_record:to_amqp091/1` and `from_amqp091/2`):
//!
//! | AMQP 1.0 | AMQP 0-9-1 |
//! |---|---|
//! | properties `message-id`, `correlation-id` (a string; a ulong, uuid or binary id becomes text with an `x-message-id-type` / `x-correlation-id-type` header) | `message_id`, `correlation_id` |
//! | properties `user-id` (binary), `reply-to`, `content-type`, `content-encoding` | the same names |
//! | properties `creation-time` (ms) | `timestamp` (s) |
//! | application-properties (scalars) | `headers` |
//! | application-properties `x-basic-type`, `x-basic-app-id` | `type`, `app_id` |
//! | message-annotations `x-basic-priority`, `x-basic-delivery-mode`, `x-basic-expiration` | `priority`, `delivery_mode`, `expiration` |
//! | one data section | the body |
//! | any other body (amqp-value, amqp-sequence, several data sections) | the sections' bytes as the body, `type` `amqp-1.0` |
//!
//! AMQP 1.0's type system is serde_amqp's (the fe2o3 project's codec); the sections are found by
//! their encoded sizes here ([`sections`]), so a message's body is never decoded as a value.

use base64::Engine;
use bytes::Bytes;
use bytestring::ByteString;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::primitives::{OrderedMap, Symbol, Timestamp};
use serde_amqp::Value;
use warren_protocol::properties::BasicProperties;
use warren_protocol::{FieldTable, FieldValue};

const HEADER: u64 = 0x70;
const DELIVERY_ANNOTATIONS: u64 = 0x71;
const MESSAGE_ANNOTATIONS: u64 = 0x72;
const PROPERTIES: u64 = 0x73;
const APPLICATION_PROPERTIES: u64 = 0x74;
const DATA: u64 = 0x75;
const FOOTER: u64 = 0x78;

/// The `type` of a 0-9-1 message whose body is AMQP 1.0 sections.
pub const AMQP10_TYPE: &str = "amqp-1.0";
/// Warren's streams stamp each stored message with its offset (a 0-9-1 header); a stream
/// protocol reader gets the offset from the chunk instead.
const STREAM_OFFSET: &str = "x-stream-offset";

/// A message's sections, as byte ranges of it.
#[derive(Debug, Default, PartialEq)]
pub struct Sections<'a> {
    pub message_annotations: Option<&'a [u8]>,
    pub properties: Option<&'a [u8]>,
    pub application_properties: Option<&'a [u8]>,
    /// The body sections (data, amqp-sequence, amqp-value), whole.
    pub body: &'a [u8],
    /// The payload of the body when it is exactly one data section.
    pub data: Option<&'a [u8]>,
}

/// The size of the encoded value at the start of `b` (AMQP 1.0 part 1, 1.2: a format code,
/// then a fixed width or a size field).
fn value_len(b: &[u8]) -> Option<usize> {
    let code = *b.first()?;
    let size = |w: usize| -> Option<usize> {
        let s = b.get(1..1 + w)?;
        let n = if w == 1 {
            s[0] as usize
        } else {
            u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize
        };
        Some(1 + w + n)
    };
    let n = match code {
        0x00 => {
            let d = value_len(&b[1..])?;
            1 + d + value_len(b.get(1 + d..)?)?
        }
        0x40..=0x45 => 1,
        0x50..=0x56 => 2,
        0x60..=0x61 => 3,
        0x70..=0x74 => 5,
        0x80..=0x84 => 9,
        0x94 | 0x98 => 17,
        0xa0 | 0xa1 | 0xa3 | 0xc0 | 0xc1 | 0xe0 => size(1)?,
        0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => size(4)?,
        _ => return None,
    };
    (n <= b.len()).then_some(n)
}

/// The descriptor code of a section (`0x00 0x53 CODE` or `0x00 0x80 CODE64`).
fn descriptor(b: &[u8]) -> Option<(u64, usize)> {
    match b {
        [0x00, 0x53, c, ..] => Some((*c as u64, 3)),
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(&rest[..8]);
            Some((u64::from_be_bytes(a), 10))
        }
        _ => None,
    }
}

/// The payload of a data section's binary value (`b` after the descriptor).
fn binary(b: &[u8]) -> Option<&[u8]> {
    match b.first()? {
        0xa0 => b.get(2..2 + *b.get(1)? as usize),
        0xb0 => {
            let n = u32::from_be_bytes(b.get(1..5)?.try_into().ok()?) as usize;
            b.get(5..5 + n)
        }
        _ => None,
    }
}

/// Splits an encoded message into its sections.
pub fn sections(msg: &[u8]) -> Result<Sections<'_>, String> {
    let mut s = Sections::default();
    let mut at = 0;
    let mut body_start = None;
    let mut data_sections = 0;
    let mut other_body = false;
    while at < msg.len() {
        let rest = &msg[at..];
        let n = value_len(rest).ok_or_else(|| format!("unreadable AMQP 1.0 value at byte {at}"))?;
        let (code, d) =
            descriptor(rest).ok_or_else(|| format!("not a message section at byte {at}"))?;
        let section = &rest[..n];
        match code {
            HEADER | DELIVERY_ANNOTATIONS | FOOTER => {}
            MESSAGE_ANNOTATIONS => s.message_annotations = Some(section),
            PROPERTIES => s.properties = Some(section),
            APPLICATION_PROPERTIES => s.application_properties = Some(section),
            DATA => {
                body_start.get_or_insert(at);
                data_sections += 1;
                s.data = binary(&section[d..]);
            }
            0x76 | 0x77 => {
                body_start.get_or_insert(at);
                other_body = true;
            }
            c => return Err(format!("unknown section {c:#x}")),
        }
        if matches!(code, DATA | 0x76 | 0x77) {
            s.body = &msg[body_start.unwrap_or(at)..at + n];
        }
        at += n;
    }
    if data_sections != 1 || other_body {
        s.data = None;
    }
    Ok(s)
}

/// A section's value (after its descriptor).
fn section_value(section: &[u8]) -> Result<Value, String> {
    let (_, d) = descriptor(section).ok_or("not a section")?;
    serde_amqp::from_slice::<Value>(&section[d..]).map_err(|e| e.to_string())
}

fn map_entries(v: Value) -> Vec<(Value, Value)> {
    match v {
        Value::Map(m) => m.into_iter().collect(),
        _ => Vec::new(),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

/// An AMQP 1.0 header value as a 0-9-1 one (RabbitMQ's `to_091`: scalars; a timestamp in
/// seconds; what has no 0-9-1 form is left out).
fn to_091(v: Value) -> Option<FieldValue> {
    Some(match v {
        Value::String(s) => FieldValue::LongStr(Bytes::from(s)),
        Value::Symbol(s) => FieldValue::LongStr(Bytes::from(s.0)),
        Value::Long(n) => FieldValue::I64(n),
        Value::Byte(n) => FieldValue::I8(n),
        Value::Ubyte(n) => FieldValue::U8(n),
        Value::Short(n) => FieldValue::I16(n),
        Value::Ushort(n) => FieldValue::U16(n),
        Value::Uint(n) => FieldValue::U32(n),
        Value::Int(n) => FieldValue::I32(n),
        Value::Ulong(n) => FieldValue::U64(n),
        Value::Double(f) => FieldValue::F64(f.into_inner()),
        Value::Float(f) => FieldValue::F32(f.into_inner()),
        Value::Timestamp(t) => FieldValue::Timestamp((t.milliseconds() / 1000).max(0) as u64),
        Value::Binary(b) => FieldValue::Bytes(Bytes::from(b.into_vec())),
        Value::Bool(b) => FieldValue::Bool(b),
        Value::Null => FieldValue::Void,
        _ => return None,
    })
}

/// A 0-9-1 header value as an AMQP 1.0 one (RabbitMQ's `from_091`); arrays and tables have
/// none.
fn from_091(v: &FieldValue) -> Option<Value> {
    Some(match v {
        FieldValue::LongStr(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        FieldValue::I64(n) => Value::Long(*n),
        FieldValue::U64(n) => Value::Ulong(*n),
        FieldValue::U8(n) => Value::Ubyte(*n),
        FieldValue::I8(n) => Value::Byte(*n),
        FieldValue::I16(n) => Value::Short(*n),
        FieldValue::U16(n) => Value::Ushort(*n),
        FieldValue::U32(n) => Value::Uint(*n),
        FieldValue::I32(n) => Value::Int(*n),
        FieldValue::F64(f) => Value::Double((*f).into()),
        FieldValue::F32(f) => Value::Float((*f).into()),
        FieldValue::Bool(b) => Value::Bool(*b),
        FieldValue::Bytes(b) => Value::Binary(serde_bytes::ByteBuf::from(b.to_vec())),
        FieldValue::Timestamp(s) => Value::Timestamp(Timestamp::from((*s as i64) * 1000)),
        FieldValue::Void => Value::Null,
        FieldValue::Decimal(..) | FieldValue::Array(_) | FieldValue::Table(_) => return None,
    })
}

/// A message id of another type than string, as RabbitMQ's `message_id/3` writes it for
/// 0-9-1: its text, and a header naming its type.
fn id_091(v: Value, header: &str, headers: &mut FieldTable) -> Option<ByteString> {
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    match v {
        Value::String(s) if s.len() > 256 => {
            headers.insert(header.trim_end_matches("-type"), long(&s));
            None
        }
        Value::String(s) => Some(s.into()),
        Value::Ulong(n) => {
            headers.insert(header, long("ulong"));
            Some(n.to_string().into())
        }
        Value::Uuid(u) => {
            headers.insert(header, long("uuid"));
            Some(uuid_text(u.as_inner()).into())
        }
        Value::Binary(b) => {
            let e = base64::engine::general_purpose::STANDARD.encode(&b[..]);
            if e.len() > 256 {
                headers.insert(
                    header.trim_end_matches("-type"),
                    FieldValue::LongStr(Bytes::from(b.into_vec())),
                );
                None
            } else {
                headers.insert(header, long("binary"));
                Some(e.into())
            }
        }
        _ => None,
    }
}

fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// An AMQP 1.0 message as 0-9-1 properties and body.
pub fn to_amqp091(msg: &Bytes) -> Result<(BasicProperties, Bytes), String> {
    let s = sections(msg)?;
    let mut p = BasicProperties::default();
    let mut headers = FieldTable::new();
    let body = match s.data {
        Some(d) => msg.slice_ref(d),
        None => {
            if !s.body.is_empty() {
                p.kind = Some(AMQP10_TYPE.into());
            }
            msg.slice_ref(s.body)
        }
    };
    if let Some(ap) = s.application_properties {
        for (k, v) in map_entries(section_value(ap)?) {
            let Some(k) = text(&k) else { continue };
            match k.as_str() {
                "x-basic-type" => p.kind = text(&v).map(Into::into),
                "x-basic-app-id" => p.app_id = text(&v).map(Into::into),
                _ => {
                    if let Some(v) = to_091(v) {
                        headers.0.push((k.as_str().into(), v));
                    }
                }
            }
        }
    }
    if let Some(ma) = s.message_annotations {
        for (k, v) in map_entries(section_value(ma)?) {
            match (text(&k).as_deref(), v) {
                (Some("x-basic-priority"), Value::Ubyte(n)) => p.priority = Some(n),
                (Some("x-basic-delivery-mode"), Value::Ubyte(n)) => p.delivery_mode = Some(n),
                (Some("x-basic-expiration"), v) => p.expiration = text(&v).map(Into::into),
                _ => {}
            }
        }
    }
    if let Some(props) = s.properties {
        if let Value::List(fields) = section_value(props)? {
            let mut f = fields.into_iter();
            let mut next = || f.next().unwrap_or(Value::Null);
            let (message_id, user_id, _to, _subject, reply_to, correlation_id) =
                (next(), next(), next(), next(), next(), next());
            let (content_type, content_encoding, _expiry, creation_time) =
                (next(), next(), next(), next());
            p.message_id = id_091(message_id, "x-message-id-type", &mut headers);
            p.correlation_id = id_091(correlation_id, "x-correlation-id-type", &mut headers);
            if let Value::Binary(b) = user_id {
                p.user_id = Some(String::from_utf8_lossy(&b).into_owned().into());
            }
            p.reply_to = text(&reply_to).map(Into::into);
            p.content_type = text(&content_type).map(Into::into);
            p.content_encoding = text(&content_encoding).map(Into::into);
            if let Value::Timestamp(t) = creation_time {
                p.timestamp = Some((t.milliseconds() / 1000).max(0) as u64);
            }
        }
    }
    if !headers.0.is_empty() {
        p.headers = Some(headers);
    }
    Ok((p, body))
}

fn section(code: u64, v: Value) -> Vec<u8> {
    let d = Value::Described(Box::new(Described {
        descriptor: Descriptor::Code(code),
        value: v,
    }));
    // Encoding a value built here cannot fail (no map key or float serde_amqp refuses).
    serde_amqp::to_vec(&d).unwrap_or_default()
}

/// 0-9-1 properties and body as an AMQP 1.0 message.
pub fn from_amqp091(p: &BasicProperties, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 64);
    let sym = |s: &str| Value::Symbol(Symbol::from(s));
    let mut ma: Vec<(Value, Value)> = Vec::new();
    if let Some(n) = p.priority {
        ma.push((sym("x-basic-priority"), Value::Ubyte(n)));
    }
    if let Some(n) = p.delivery_mode {
        ma.push((sym("x-basic-delivery-mode"), Value::Ubyte(n)));
    }
    if let Some(e) = &p.expiration {
        ma.push((sym("x-basic-expiration"), Value::String(e.to_string())));
    }
    if !ma.is_empty() {
        out.extend(section(
            MESSAGE_ANNOTATIONS,
            Value::Map(ma.into_iter().collect::<OrderedMap<_, _>>()),
        ));
    }
    let s = |v: &Option<ByteString>| v.as_ref().map(|s| s.to_string());
    let props = [
        s(&p.message_id).map(Value::String),
        s(&p.user_id).map(|u| Value::Binary(serde_bytes::ByteBuf::from(u.into_bytes()))),
        None,
        None,
        s(&p.reply_to).map(Value::String),
        s(&p.correlation_id).map(Value::String),
        s(&p.content_type).map(|c| sym(&c)),
        s(&p.content_encoding).map(|c| sym(&c)),
        None,
        p.timestamp
            .map(|t| Value::Timestamp(Timestamp::from((t as i64).saturating_mul(1000)))),
    ];
    if let Some(last) = props.iter().rposition(Option::is_some) {
        let fields = props[..=last]
            .iter()
            .map(|v| v.clone().unwrap_or(Value::Null))
            .collect();
        out.extend(section(PROPERTIES, Value::List(fields)));
    }
    let mut ap: Vec<(Value, Value)> = Vec::new();
    if let Some(a) = &p.app_id {
        ap.push((
            Value::String("x-basic-app-id".into()),
            Value::String(a.to_string()),
        ));
    }
    let amqp10_body = p.kind.as_deref() == Some(AMQP10_TYPE);
    if let Some(t) = p.kind.as_ref().filter(|_| !amqp10_body) {
        ap.push((
            Value::String("x-basic-type".into()),
            Value::String(t.to_string()),
        ));
    }
    for (k, v) in p.headers.iter().flat_map(|h| h.0.iter()) {
        if &**k == STREAM_OFFSET {
            continue;
        }
        if let Some(v) = from_091(v) {
            ap.push((Value::String(k.to_string()), v));
        }
    }
    if !ap.is_empty() {
        out.extend(section(
            APPLICATION_PROPERTIES,
            Value::Map(ap.into_iter().collect::<OrderedMap<_, _>>()),
        ));
    }
    if amqp10_body {
        out.extend_from_slice(body);
    } else {
        // A data section, written here: its binary's size decides the short or long form.
        out.extend_from_slice(&[0x00, 0x53, DATA as u8]);
        if body.len() <= 255 {
            out.extend_from_slice(&[0xa0, body.len() as u8]);
        } else {
            out.push(0xb0);
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        }
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn props() -> BasicProperties {
        BasicProperties {
            content_type: Some("text/plain".into()),
            content_encoding: Some("gzip".into()),
            headers: Some(FieldTable(vec![
                ("k".into(), FieldValue::LongStr(Bytes::from_static(b"v"))),
                ("n".into(), FieldValue::I32(7)),
                ("t".into(), FieldValue::Timestamp(1_700_000_000)),
                ("x-stream-offset".into(), FieldValue::I64(3)),
            ])),
            delivery_mode: Some(2),
            priority: Some(4),
            correlation_id: Some("c1".into()),
            reply_to: Some("r".into()),
            expiration: Some("60000".into()),
            message_id: Some("m1".into()),
            timestamp: Some(1_700_000_001),
            kind: Some("order".into()),
            user_id: Some("guest".into()),
            app_id: Some("app".into()),
            cluster_id: None,
        }
    }

    #[test]
    fn a_091_message_goes_to_amqp10_and_back() {
        let body = vec![7u8; 300];
        let m = Bytes::from(from_amqp091(&props(), &body));
        let s = sections(&m).unwrap();
        assert_eq!(s.data, Some(&body[..]));
        assert!(s.message_annotations.is_some() && s.properties.is_some());
        let (p, b) = to_amqp091(&m).unwrap();
        assert_eq!(&b[..], &body[..]);
        let mut want = props();
        // The stream's own offset header is not part of the message.
        want.headers
            .as_mut()
            .unwrap()
            .0
            .retain(|(k, _)| &**k != "x-stream-offset");
        assert_eq!(p, want);
    }

    #[test]
    fn an_empty_message_is_one_data_section() {
        let m = Bytes::from(from_amqp091(&BasicProperties::default(), b"hi"));
        assert_eq!(&m[..], &[0x00, 0x53, 0x75, 0xa0, 2, b'h', b'i']);
        let (p, b) = to_amqp091(&m).unwrap();
        assert_eq!(p, BasicProperties::default());
        assert_eq!(&b[..], b"hi");
    }

    #[test]
    fn other_bodies_and_ids_map_as_rabbitmq_maps_them() {
        // properties (message-id a ulong), then an amqp-value body: the body goes whole, typed
        // amqp-1.0; the id as text with its type in a header.
        let mut m = section(PROPERTIES, Value::List(vec![Value::Ulong(42)]));
        let value = section(0x77, Value::String("hello".into()));
        m.extend(&value);
        let (p, b) = to_amqp091(&Bytes::from(m)).unwrap();
        assert_eq!(&b[..], &value[..]);
        assert_eq!(p.kind.as_deref(), Some(AMQP10_TYPE));
        assert_eq!(p.message_id.as_deref(), Some("42"));
        assert_eq!(
            p.headers.unwrap().get("x-message-id-type"),
            Some(&FieldValue::LongStr(Bytes::from_static(b"ulong")))
        );
        // A binary correlation id: base64 text, its type in a header.
        let m = section(
            PROPERTIES,
            Value::List(vec![
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Binary(serde_bytes::ByteBuf::from(b"ab".to_vec())),
            ]),
        );
        let (p2, _) = to_amqp091(&Bytes::from(m)).unwrap();
        assert_eq!(p2.correlation_id.as_deref(), Some("YWI="));
        assert_eq!(
            p2.headers.unwrap().get("x-correlation-id-type"),
            Some(&FieldValue::LongStr(Bytes::from_static(b"binary")))
        );
        // And back: an amqp-1.0 body goes as the sections it is.
        let back = from_amqp091(
            &BasicProperties {
                kind: Some(AMQP10_TYPE.into()),
                ..Default::default()
            },
            &value,
        );
        assert_eq!(back, value);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &[0xffu8][..],
            &[0x00, 0x53],
            &[0x00, 0x53, 0x75, 0xb0, 0, 0, 0, 9, 1],
        ] {
            assert!(to_amqp091(&Bytes::copy_from_slice(bad)).is_err(), "{bad:?}");
        }
    }
}
