//! proptest strategies for every field type, field tables and basic properties, used by the
//! encode -> decode round-trip properties (`method::any_method` builds one per method).

use bytes::Bytes;
use bytestring::ByteString;
use proptest::collection::vec;
use proptest::prelude::*;

use crate::properties::BasicProperties;
use crate::table::{FieldTable, FieldValue};

/// A strategy for one method field type.
pub trait Arb: Sized {
    fn arb() -> BoxedStrategy<Self>;
}

macro_rules! arb_any {
    ($($t:ty),*) => { $(impl Arb for $t { fn arb() -> BoxedStrategy<Self> { any::<$t>().boxed() } })* };
}
arb_any!(u8, u16, u32, u64, bool);

impl Arb for ByteString {
    fn arb() -> BoxedStrategy<Self> {
        short_str().boxed()
    }
}

impl Arb for Bytes {
    fn arb() -> BoxedStrategy<Self> {
        vec(any::<u8>(), 0..64).prop_map(Bytes::from).boxed()
    }
}

impl Arb for FieldTable {
    fn arb() -> BoxedStrategy<Self> {
        table()
    }
}

/// Any text that fits a short string (at most 60 chars of at most 4 octets).
pub fn short_str() -> impl Strategy<Value = ByteString> {
    "\\PC{0,60}".prop_map(ByteString::from)
}

/// Floats without NaN, so decoded values compare equal.
fn f32s() -> impl Strategy<Value = f32> {
    use proptest::num::f32::*;
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO | INFINITE
}

fn f64s() -> impl Strategy<Value = f64> {
    use proptest::num::f64::*;
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO | INFINITE
}

/// Field tables with every value type, nested up to three levels, duplicate keys included.
pub fn table() -> BoxedStrategy<FieldTable> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any::<i8>().prop_map(FieldValue::I8),
        any::<u8>().prop_map(FieldValue::U8),
        any::<i16>().prop_map(FieldValue::I16),
        any::<u16>().prop_map(FieldValue::U16),
        any::<i32>().prop_map(FieldValue::I32),
        any::<u32>().prop_map(FieldValue::U32),
        any::<i64>().prop_map(FieldValue::I64),
        any::<u64>().prop_map(FieldValue::U64),
        f32s().prop_map(FieldValue::F32),
        f64s().prop_map(FieldValue::F64),
        (any::<u8>(), any::<u32>()).prop_map(|(s, v)| FieldValue::Decimal(s, v)),
        Bytes::arb().prop_map(FieldValue::LongStr),
        any::<u64>().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
        Bytes::arb().prop_map(FieldValue::Bytes),
    ];
    let value = leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(FieldValue::Array),
            vec((short_str(), inner), 0..4).prop_map(|e| FieldValue::Table(FieldTable(e))),
        ]
    });
    vec((short_str(), value), 0..6).prop_map(FieldTable).boxed()
}

/// Basic properties with any subset of the fourteen set.
pub fn properties() -> impl Strategy<Value = BasicProperties> {
    let s = || proptest::option::of(short_str());
    (
        (s(), s(), proptest::option::of(table())),
        (
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u8>()),
        ),
        (s(), s(), s(), s()),
        proptest::option::of(any::<u64>()),
        (s(), s(), s(), s()),
    )
        .prop_map(
            |(
                (content_type, content_encoding, headers),
                (delivery_mode, priority),
                (correlation_id, reply_to, expiration, message_id),
                timestamp,
                (kind, user_id, app_id, cluster_id),
            )| BasicProperties {
                content_type,
                content_encoding,
                headers,
                delivery_mode,
                priority,
                correlation_id,
                reply_to,
                expiration,
                message_id,
                timestamp,
                kind,
                user_id,
                app_id,
                cluster_id,
            },
        )
}
