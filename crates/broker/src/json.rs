//! Field tables to JSON and back, as RabbitMQ's management API maps them: integers become
//! `long`, strings `longstr`, objects tables, lists arrays.

use serde_json::{Map, Number, Value};
use warren_protocol::{FieldTable, FieldValue};

pub fn table_to_json(t: &FieldTable) -> Value {
    let mut m = Map::new();
    for (k, v) in &t.0 {
        m.insert(k.to_string(), value_to_json(v));
    }
    Value::Object(m)
}

pub fn value_to_json(v: &FieldValue) -> Value {
    if let Some(n) = v.as_i64() {
        return Value::Number(n.into());
    }
    match v {
        FieldValue::Bool(b) => Value::Bool(*b),
        FieldValue::U64(n) => Value::Number((*n).into()),
        FieldValue::F32(f) => Number::from_f64(*f as f64).map_or(Value::Null, Value::Number),
        FieldValue::F64(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        FieldValue::Decimal(scale, n) => Number::from_f64(*n as f64 / 10f64.powi(*scale as i32))
            .map_or(Value::Null, Value::Number),
        FieldValue::LongStr(b) | FieldValue::Bytes(b) => {
            Value::String(String::from_utf8_lossy(b).into_owned())
        }
        FieldValue::Array(a) => Value::Array(a.iter().map(value_to_json).collect()),
        FieldValue::Timestamp(t) => Value::Number((*t).into()),
        FieldValue::Table(t) => table_to_json(t),
        _ => Value::Null,
    }
}

/// A JSON object as a field table; anything else is an error naming what was given.
pub fn json_to_table(v: &Value) -> Result<FieldTable, String> {
    match v {
        Value::Null => Ok(FieldTable::new()),
        Value::Object(m) => {
            let mut t = FieldTable::new();
            for (k, v) in m {
                t.insert(k, json_to_value(v));
            }
            Ok(t)
        }
        other => Err(format!("arguments must be an object, got {other}")),
    }
}

pub fn json_to_value(v: &Value) -> FieldValue {
    match v {
        Value::Null => FieldValue::Void,
        Value::Bool(b) => FieldValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => FieldValue::I64(i),
            None => FieldValue::F64(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => FieldValue::str(s),
        Value::Array(a) => FieldValue::Array(a.iter().map(json_to_value).collect()),
        Value::Object(_) => FieldValue::Table(json_to_table(v).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let v: Value = serde_json::from_str(
            r#"{"x-max-length":10,"x-dead-letter-exchange":"dlx","b":true,"l":[1,"a"]}"#,
        )
        .expect("json");
        let t = json_to_table(&v).expect("table");
        assert_eq!(t.get("x-max-length"), Some(&FieldValue::I64(10)));
        assert_eq!(table_to_json(&t), v);
    }
}
