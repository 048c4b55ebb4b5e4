//! Routing: exchanges and their bindings, resolved to a set of destination queues.
//!
//! A [`Table`] is an immutable snapshot. The broker builds a new one on every declare, bind, unbind
//! or delete and swaps it in atomically, so the publish path routes without taking a lock.
//! Exchange-to-exchange bindings are followed with a visited set, so cycles terminate.
//!
//! Invariant: no I/O, no runtime, no clock. Queues are an opaque `Q` (the broker's queue handle).

pub mod headers;
pub mod topic;

use std::collections::HashMap;
use std::sync::Arc;

use warren_protocol::FieldTable;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    pub fn parse(s: &str) -> Option<ExchangeKind> {
        Some(match s {
            "direct" => ExchangeKind::Direct,
            "fanout" => ExchangeKind::Fanout,
            "topic" => ExchangeKind::Topic,
            "headers" => ExchangeKind::Headers,
            _ => return None,
        })
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// Where a binding leads.
#[derive(Debug, Clone)]
pub enum Destination<Q> {
    Queue(Q),
    Exchange(Arc<str>),
}

#[derive(Debug, Clone)]
pub struct Binding<Q> {
    pub destination: Destination<Q>,
    pub routing_key: Arc<str>,
    pub arguments: FieldTable,
}

/// An exchange's definition and its outgoing bindings.
#[derive(Debug, Clone)]
pub struct Exchange<Q> {
    pub name: Arc<str>,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    pub bindings: Vec<Binding<Q>>,
    /// `alternate-exchange`: where a message goes that no binding of this exchange matched.
    pub alternate: Option<Arc<str>>,
}

impl<Q: Clone> Exchange<Q> {
    fn matches(&self, b: &Binding<Q>, routing_key: &str, headers: Option<&FieldTable>) -> bool {
        match self.kind {
            ExchangeKind::Direct => &*b.routing_key == routing_key,
            ExchangeKind::Fanout => true,
            ExchangeKind::Topic => topic::matches(&b.routing_key, routing_key),
            ExchangeKind::Headers => headers::matches(&b.arguments, headers),
        }
    }
}

/// One vhost's exchanges: an immutable snapshot.
#[derive(Debug, Clone)]
pub struct Table<Q> {
    /// Exchanges behind `Arc` so that a new snapshot shares every exchange it did not change.
    pub exchanges: HashMap<Arc<str>, Arc<Exchange<Q>>>,
}

impl<Q> Default for Table<Q> {
    fn default() -> Self {
        Table {
            exchanges: HashMap::new(),
        }
    }
}

/// Identity of a queue for de-duplication during routing.
pub trait QueueKey {
    fn key(&self) -> usize;
}

/// Shared handles are the same queue when they point at the same allocation.
impl<T> QueueKey for Arc<T> {
    fn key(&self) -> usize {
        Arc::as_ptr(self) as *const () as usize
    }
}

impl<Q: Clone + QueueKey> Table<Q> {
    /// Appends every queue that a message published to `exchange` reaches, each once. If nothing
    /// matched and the exchange names an alternate exchange, routes there instead (repeatedly).
    /// `headers` is needed only by headers exchanges, so it is a closure called at most once.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: &mut dyn FnMut() -> Option<FieldTable>,
        out: &mut Vec<Q>,
    ) {
        let mut decoded: Option<Option<FieldTable>> = None;
        let mut tried: Vec<&str> = Vec::new();
        let mut current = exchange;
        loop {
            let before = out.len();
            self.route_from(current, routing_key, headers, &mut decoded, out);
            if out.len() > before {
                return;
            }
            tried.push(current);
            match self
                .exchanges
                .get(current)
                .and_then(|x| x.alternate.as_deref())
            {
                Some(ae) if !tried.contains(&ae) => current = ae,
                _ => return,
            }
        }
    }

    fn route_from<'a>(
        &'a self,
        exchange: &'a str,
        routing_key: &str,
        headers: &mut dyn FnMut() -> Option<FieldTable>,
        decoded: &mut Option<Option<FieldTable>>,
        out: &mut Vec<Q>,
    ) {
        let mut visited: Vec<&str> = Vec::new();
        let mut stack: Vec<&str> = vec![exchange];
        while let Some(name) = stack.pop() {
            if visited.contains(&name) {
                continue;
            }
            visited.push(name);
            let Some(ex) = self.exchanges.get(name) else {
                continue;
            };
            if ex.kind == ExchangeKind::Headers && decoded.is_none() {
                *decoded = Some(headers());
            }
            let h = decoded.as_ref().and_then(|d| d.as_ref());
            for b in &ex.bindings {
                if !ex.matches(b, routing_key, h) {
                    continue;
                }
                match &b.destination {
                    Destination::Queue(q) => {
                        if !out.iter().any(|o| o.key() == q.key()) {
                            out.push(q.clone());
                        }
                    }
                    Destination::Exchange(e) => stack.push(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Q(usize);
    impl QueueKey for Q {
        fn key(&self) -> usize {
            self.0
        }
    }

    fn ex(name: &str, kind: ExchangeKind, bindings: Vec<Binding<Q>>) -> Exchange<Q> {
        Exchange {
            name: name.into(),
            kind,
            durable: false,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::new(),
            bindings,
            alternate: None,
        }
    }
    fn to_q(q: usize, key: &str) -> Binding<Q> {
        Binding {
            destination: Destination::Queue(Q(q)),
            routing_key: key.into(),
            arguments: FieldTable::new(),
        }
    }
    fn to_x(x: &str, key: &str) -> Binding<Q> {
        Binding {
            destination: Destination::Exchange(x.into()),
            routing_key: key.into(),
            arguments: FieldTable::new(),
        }
    }

    #[test]
    fn e2e_bindings_dedupe_and_cycles() {
        let mut t = Table::default();
        t.exchanges.insert(
            "a".into(),
            Arc::new(ex(
                "a",
                ExchangeKind::Fanout,
                vec![to_q(1, ""), to_x("b", "")],
            )),
        );
        t.exchanges.insert(
            "b".into(),
            Arc::new(ex(
                "b",
                ExchangeKind::Direct,
                vec![to_q(1, "k"), to_q(2, "k"), to_x("a", "k")],
            )),
        );
        let mut out = Vec::new();
        t.route("a", "k", &mut || None, &mut out);
        assert_eq!(out, vec![Q(1), Q(2)]);
        out.clear();
        t.route("a", "other", &mut || None, &mut out);
        assert_eq!(out, vec![Q(1)]);
        out.clear();
        t.route("missing", "k", &mut || None, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn alternate_exchange_takes_unrouted_messages() {
        let mut t = Table::default();
        let mut main = ex("main", ExchangeKind::Direct, vec![to_q(1, "k")]);
        main.alternate = Some("ae".into());
        let mut ae = ex("ae", ExchangeKind::Fanout, vec![to_q(2, "")]);
        ae.alternate = Some("main".into());
        t.exchanges.insert("main".into(), Arc::new(main));
        t.exchanges.insert("ae".into(), Arc::new(ae));
        let mut out = Vec::new();
        t.route("main", "k", &mut || None, &mut out);
        assert_eq!(out, vec![Q(1)], "routed normally: AE not used");
        out.clear();
        t.route("main", "other", &mut || None, &mut out);
        assert_eq!(out, vec![Q(2)]);
        Arc::make_mut(t.exchanges.get_mut("ae").expect("ae"))
            .bindings
            .clear();
        out.clear();
        t.route("main", "other", &mut || None, &mut out);
        assert!(out.is_empty(), "AE cycle terminates");
    }
}
