//! The `x-federation-upstream` exchange (RabbitMQ's `rabbit_federation_upstream_exchange`),
//! which a federation link declares on its upstream: it routes as a fanout, except that a
//! message that already made `x-max-hops` hops (entries in its `x-received-from` header), or
//! that came from the link's own downstream (an entry with its cluster name and vhost: a
//! cycle), goes nowhere.

use warren_protocol::{FieldTable, FieldValue};

/// The exchange argument with the hops a message may make.
pub const MAX_HOPS_ARG: &str = "x-max-hops";
/// The exchange argument with the downstream's cluster name.
pub const DOWNSTREAM_NAME_ARG: &str = "x-downstream-name";
/// The exchange argument with the downstream's vhost.
pub const DOWNSTREAM_VHOST_ARG: &str = "x-downstream-vhost";
/// The header a federation link prepends an entry to, one per hop.
pub const RECEIVED_FROM: &str = "x-received-from";

/// RabbitMQ's check of a declare: `x-max-hops` present, of RabbitMQ's table type `long`
/// (`l`, 64-bit signed; a 32-bit `I` is its `signedint`, refused).
pub fn validate(args: &FieldTable) -> Result<(), String> {
    match args.get(MAX_HOPS_ARG) {
        None => Err(format!("Argument {MAX_HOPS_ARG} missing")),
        Some(FieldValue::I64(_)) => Ok(()),
        Some(_) => Err(format!("Argument {MAX_HOPS_ARG} must be of type long")),
    }
}

fn text(v: Option<&FieldValue>) -> Option<&[u8]> {
    match v {
        Some(FieldValue::LongStr(b)) => Some(b),
        _ => None,
    }
}

/// Whether a message with these headers goes on through an upstream exchange with `args`.
pub fn forwards(args: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let Some(FieldValue::Array(hops)) = headers.and_then(|h| h.get(RECEIVED_FROM)) else {
        return true;
    };
    let max_hops = args
        .get(MAX_HOPS_ARG)
        .and_then(FieldValue::as_i64)
        .unwrap_or(i64::MAX);
    if hops.len() as i64 >= max_hops {
        return false;
    }
    let (name, vhost) = (
        text(args.get(DOWNSTREAM_NAME_ARG)),
        text(args.get(DOWNSTREAM_VHOST_ARG)),
    );
    !hops.iter().any(|h| match h {
        FieldValue::Table(t) => {
            name.is_some() && text(t.get("cluster-name")) == name && text(t.get("vhost")) == vhost
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongStr(Bytes::copy_from_slice(v.as_bytes()))
    }

    fn table(pairs: &[(&str, FieldValue)]) -> FieldTable {
        FieldTable(
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), v.clone()))
                .collect(),
        )
    }

    fn hop(cluster: &str, vhost: &str) -> FieldValue {
        FieldValue::Table(table(&[("cluster-name", s(cluster)), ("vhost", s(vhost))]))
    }

    #[test]
    fn hops_and_cycles() {
        let args = table(&[
            (MAX_HOPS_ARG, FieldValue::I64(2)),
            (DOWNSTREAM_NAME_ARG, s("down")),
            (DOWNSTREAM_VHOST_ARG, s("/")),
        ]);
        assert!(forwards(&args, None));
        let headers = |hops: Vec<FieldValue>| table(&[(RECEIVED_FROM, FieldValue::Array(hops))]);
        assert!(forwards(&args, Some(&headers(vec![hop("up", "/")]))));
        assert!(!forwards(
            &args,
            Some(&headers(vec![hop("a", "/"), hop("b", "/")]))
        ));
        // It came from the downstream itself.
        assert!(!forwards(&args, Some(&headers(vec![hop("down", "/")]))));
        // The same cluster name in another vhost is another downstream.
        assert!(forwards(&args, Some(&headers(vec![hop("down", "other")]))));
    }

    #[test]
    fn declares_need_a_long_max_hops() {
        assert_eq!(
            validate(&FieldTable::new()).unwrap_err(),
            "Argument x-max-hops missing"
        );
        assert_eq!(
            validate(&table(&[(MAX_HOPS_ARG, FieldValue::I32(1))])).unwrap_err(),
            "Argument x-max-hops must be of type long"
        );
        assert!(validate(&table(&[(MAX_HOPS_ARG, FieldValue::I64(1))])).is_ok());
    }
}
