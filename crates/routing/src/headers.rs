//! Headers exchange matching. `x-match` is `all` (default), `any`, `all-with-x` or `any-with-x`;
//! without `-with-x`, binding arguments starting with `x-` are ignored. A binding argument of type
//! void matches on presence alone.

use warren_protocol::{FieldTable, FieldValue};

pub fn matches(binding_args: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mode = binding_args
        .get("x-match")
        .and_then(|v| v.as_str())
        .unwrap_or("all");
    let (any, with_x) = match mode {
        "any" => (true, false),
        "any-with-x" => (true, true),
        "all-with-x" => (false, true),
        _ => (false, false),
    };
    let empty = FieldTable::new();
    let headers = headers.unwrap_or(&empty);
    for (k, want) in &binding_args.0 {
        if &**k == "x-match" || (!with_x && k.starts_with("x-")) {
            continue;
        }
        let hit = match headers.get(k) {
            None => false,
            Some(_) if *want == FieldValue::Void => true,
            Some(got) => values_equal(got, want),
        };
        if any && hit {
            return true;
        }
        if !any && !hit {
            return false;
        }
    }
    // Reaching here means no hit for "any" and no miss for "all" ("all" over nothing matches).
    !any
}

/// Integers compare by value across widths, as RabbitMQ's term comparison does.
fn values_equal(a: &FieldValue, b: &FieldValue) -> bool {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x == y,
        _ => match (a, b) {
            (
                FieldValue::LongStr(x) | FieldValue::Bytes(x),
                FieldValue::LongStr(y) | FieldValue::Bytes(y),
            ) => x == y,
            _ => a == b,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, FieldValue)]) -> FieldTable {
        let mut t = FieldTable::new();
        for (k, v) in pairs {
            t.insert(k, v.clone());
        }
        t
    }

    #[test]
    fn modes() {
        let s = FieldValue::str;
        let h = t(&[("a", s("1")), ("b", s("2")), ("x-k", s("x"))]);
        assert!(
            matches(&t(&[("a", s("1")), ("b", s("2"))]), Some(&h)),
            "all by default"
        );
        assert!(!matches(&t(&[("a", s("1")), ("b", s("9"))]), Some(&h)));
        assert!(matches(
            &t(&[("x-match", s("any")), ("a", s("9")), ("b", s("2"))]),
            Some(&h)
        ));
        assert!(!matches(
            &t(&[("x-match", s("any")), ("a", s("9"))]),
            Some(&h)
        ));
        // x- arguments are ignored unless -with-x
        assert!(matches(
            &t(&[("x-match", s("all")), ("a", s("1")), ("x-k", s("nope"))]),
            Some(&h)
        ));
        assert!(!matches(
            &t(&[
                ("x-match", s("all-with-x")),
                ("a", s("1")),
                ("x-k", s("nope"))
            ]),
            Some(&h)
        ));
        assert!(matches(
            &t(&[("x-match", s("all-with-x")), ("x-k", s("x"))]),
            Some(&h)
        ));
        assert!(matches(
            &t(&[("x-match", s("any-with-x")), ("x-k", s("x")), ("z", s("0"))]),
            Some(&h)
        ));
        assert!(
            !matches(&t(&[("x-match", s("any")), ("x-k", s("x"))]), Some(&h)),
            "any over only x- args"
        );
        // void matches presence; integers compare across widths
        assert!(matches(&t(&[("a", FieldValue::Void)]), Some(&h)));
        let hi = t(&[("n", FieldValue::I32(5))]);
        assert!(matches(&t(&[("n", FieldValue::I64(5))]), Some(&hi)));
        // empty binding: all matches everything, any matches nothing
        assert!(matches(&t(&[]), None));
        assert!(!matches(&t(&[("x-match", s("any"))]), Some(&h)));
        assert!(!matches(&t(&[("a", s("1"))]), None), "no headers");
    }
}
