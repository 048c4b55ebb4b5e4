//! Routing: exchanges and their bindings, resolved to a set of destination queues.
//!
//! A [`Table`] is an immutable snapshot. The broker builds a new one on every declare, bind, unbind
//! or delete and swaps it in atomically, so the publish path routes without taking a lock.
//! Exchange-to-exchange bindings are followed with a visited set, so cycles terminate.
//! `consistent_hash.rs` holds the `x-consistent-hash` exchange's ring, rebuilt with the snapshot.
//!
//! Invariant: no I/O, no runtime, no clock. Queues are an opaque `Q` (the broker's queue handle).

pub mod consistent_hash;
pub mod counter;
pub mod federation;
pub mod headers;
pub mod topic;

use std::sync::Arc;

use ahash::AHashMap;
use smallvec::SmallVec;

use warren_protocol::properties::BasicProperties;
use warren_protocol::{ByteString, FieldTable};

pub use consistent_hash::HashRing;

/// The delayed-message exchange type (RabbitMQ's `rabbitmq_delayed_message_exchange` plugin).
pub const DELAYED_TYPE: &str = "x-delayed-message";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
    /// `x-consistent-hash`: binding keys are weights; a message goes to one destination.
    ConsistentHash,
    /// `x-federation-upstream`: a fanout that drops a message past its hops or back at its
    /// downstream (`federation.rs`).
    FederationUpstream,
}

impl ExchangeKind {
    pub fn parse(s: &str) -> Option<ExchangeKind> {
        Some(match s {
            "direct" => ExchangeKind::Direct,
            "fanout" => ExchangeKind::Fanout,
            "topic" => ExchangeKind::Topic,
            "headers" => ExchangeKind::Headers,
            "x-consistent-hash" => ExchangeKind::ConsistentHash,
            "x-federation-upstream" => ExchangeKind::FederationUpstream,
            _ => return None,
        })
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
            ExchangeKind::ConsistentHash => "x-consistent-hash",
            ExchangeKind::FederationUpstream => "x-federation-upstream",
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
    /// How bindings match; for an `x-delayed-message` exchange, its `x-delayed-type`.
    pub kind: ExchangeKind,
    /// An `x-delayed-message` exchange: a message with a positive `x-delay` header is held by
    /// the broker and routed as `kind` once due.
    pub delayed: bool,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    pub bindings: Vec<Binding<Q>>,
    /// `alternate-exchange`: where a message goes that no binding of this exchange matched.
    pub alternate: Option<Arc<str>>,
    /// A consistent-hash exchange's buckets, kept in step with `bindings` by
    /// [`Exchange::bindings_changed`]; empty for other kinds.
    pub ring: HashRing,
    /// A direct exchange's bindings by routing key (indices into `bindings`, in order), kept in
    /// step by [`Exchange::bindings_changed`]: a publish looks its key up instead of comparing it
    /// with every binding. Empty for other kinds.
    pub direct: AHashMap<Arc<str>, SmallVec<[u32; 2]>>,
    /// A topic exchange's patterns as a trie, kept in step by [`Exchange::bindings_changed`].
    pub topic: topic::Trie,
    /// Message statistics, shared by every rebuild of this exchange.
    pub stats: std::sync::Arc<counter::ExchangeStats>,
}

impl<Q> Exchange<Q> {
    /// The type clients declared it with.
    pub fn type_name(&self) -> &'static str {
        if self.delayed {
            DELAYED_TYPE
        } else {
            self.kind.as_str()
        }
    }

    /// Rebuilds what is derived from the bindings; call after every change to `bindings`.
    pub fn bindings_changed(&mut self) {
        match self.kind {
            ExchangeKind::ConsistentHash => self
                .ring
                .rebuild(self.bindings.iter().map(|b| &*b.routing_key)),
            ExchangeKind::Topic => self
                .topic
                .rebuild(self.bindings.iter().map(|b| &*b.routing_key)),
            ExchangeKind::Direct => {
                self.direct.clear();
                for (i, b) in self.bindings.iter().enumerate() {
                    self.direct
                        .entry(b.routing_key.clone())
                        .or_default()
                        .push(i as u32);
                }
            }
            _ => {}
        }
    }
}

impl<Q: Clone> Exchange<Q> {
    fn matches(&self, b: &Binding<Q>, routing_key: &str, headers: Option<&FieldTable>) -> bool {
        match self.kind {
            ExchangeKind::Direct => &*b.routing_key == routing_key,
            ExchangeKind::Fanout => true,
            ExchangeKind::FederationUpstream => federation::forwards(&self.arguments, headers),
            // Routed by `topic` in `Table::walk`, never binding by binding.
            ExchangeKind::Topic => false,
            ExchangeKind::Headers => headers::matches(&b.arguments, headers),
            // Routed by `ring` in `Table::walk`, never binding by binding.
            ExchangeKind::ConsistentHash => false,
        }
    }
}

/// One vhost's exchanges: an immutable snapshot.
#[derive(Debug, Clone)]
pub struct Table<Q> {
    /// Exchanges behind `Arc` so that a new snapshot shares every exchange it did not change.
    /// aHash, not SipHash: looked up twice per publish
    /// (docs/benchmarks/notes/2026-11-23-where-s1-time-goes.md).
    pub exchanges: AHashMap<Arc<str>, Arc<Exchange<Q>>>,
}

impl<Q> Default for Table<Q> {
    fn default() -> Self {
        Table {
            exchanges: AHashMap::new(),
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
    /// Appends every queue that a message published to `exchange` reaches, each once. An
    /// exchange none of whose bindings matched sends the message on to its alternate exchange.
    /// The message's properties are needed only by headers exchanges and consistent-hash
    /// exchanges hashing a header or property, so `props` is a closure called at most once.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        props: &mut dyn FnMut() -> Option<BasicProperties>,
        out: &mut Vec<Q>,
    ) {
        self.walk(exchange, routing_key, &[], props, out)
    }

    /// [`Table::route`] with more routing keys (RabbitMQ's `CC` and `BCC` headers): the whole
    /// key set is matched at every exchange of the walk, exchange-to-exchange hops included, and
    /// each queue is reached once.
    #[inline]
    pub fn route_keys(
        &self,
        exchange: &str,
        routing_key: &str,
        extra_keys: &[ByteString],
        props: &mut dyn FnMut() -> Option<BasicProperties>,
        out: &mut Vec<Q>,
    ) {
        if extra_keys.is_empty() {
            self.route(exchange, routing_key, props, out)
        } else {
            self.walk(exchange, routing_key, extra_keys, props, out)
        }
    }

    /// RabbitMQ's `rabbit_exchange:route/2`: a walk over exchanges, each visited once, where
    /// every exchange matches its bindings against the message's whole key set (routing key,
    /// then `extra_keys`), a matched exchange binding adds that exchange to the walk, and an
    /// exchange that matched nothing adds its alternate exchange. Checked against RabbitMQ 3.10
    /// (tests/interop/python/test_dead_letter_routing.py).
    // Inlined into each caller, so `route` (no extra keys) keeps no loop over them.
    #[inline(always)]
    fn walk<'a>(
        &'a self,
        exchange: &'a str,
        routing_key: &str,
        extra_keys: &[ByteString],
        props: &mut dyn FnMut() -> Option<BasicProperties>,
        out: &mut Vec<Q>,
    ) {
        let mut decoded: Option<Option<BasicProperties>> = None;
        // On the stack: routing allocates nothing for the common shallow case.
        let mut visited: SmallVec<[&str; 8]> = SmallVec::new();
        let mut stack: SmallVec<[&str; 8]> = SmallVec::new();
        let mut seen = Seen::default();
        stack.push(exchange);
        while let Some(name) = stack.pop() {
            if visited.contains(&name) {
                continue;
            }
            visited.push(name);
            let Some(ex) = self.exchanges.get(name) else {
                continue;
            };
            let needs_props = match ex.kind {
                ExchangeKind::Headers | ExchangeKind::FederationUpstream => true,
                ExchangeKind::ConsistentHash => ex.ring.on.needs_properties(),
                _ => false,
            };
            if needs_props && decoded.is_none() {
                decoded = Some(props());
            }
            let p = decoded.as_ref().and_then(|d| d.as_ref());
            // Whether any binding of this exchange matched (its destination may be a queue
            // already reached, which `follow` does not add again).
            let mut matched = false;
            match ex.kind {
                // One destination per message, picked by the hash of its routing key.
                ExchangeKind::ConsistentHash => {
                    let hash = ex.ring.on.hash(routing_key, p);
                    if let Some(b) = ex.ring.pick(hash).and_then(|i| ex.bindings.get(i)) {
                        matched = true;
                        follow(&b.destination, out, &mut stack, &mut seen);
                    }
                }
                ExchangeKind::Topic => {
                    let mut hits: SmallVec<[u32; 8]> = SmallVec::new();
                    ex.topic.matches(routing_key, &mut hits);
                    for k in extra_keys {
                        ex.topic.matches(k, &mut hits);
                    }
                    matched = !hits.is_empty();
                    for b in hits.iter().filter_map(|&i| ex.bindings.get(i as usize)) {
                        follow(&b.destination, out, &mut stack, &mut seen);
                    }
                }
                // A few bindings are cheaper to compare than to hash the key (callgrind: the
                // index costs ~140 instructions per publish with one binding).
                ExchangeKind::Direct if ex.bindings.len() > DIRECT_SCAN_MAX => {
                    let keys = std::iter::once(routing_key).chain(extra_keys.iter().map(|k| &**k));
                    for key in keys {
                        let hits = ex.direct.get(key).into_iter().flatten();
                        for b in hits.filter_map(|&i| ex.bindings.get(i as usize)) {
                            matched = true;
                            follow(&b.destination, out, &mut stack, &mut seen);
                        }
                    }
                }
                _ => {
                    let h = p.and_then(|p| p.headers.as_ref());
                    for b in &ex.bindings {
                        if ex.matches(b, routing_key, h)
                            || extra_keys.iter().any(|k| ex.matches(b, k, h))
                        {
                            matched = true;
                            follow(&b.destination, out, &mut stack, &mut seen);
                        }
                    }
                }
            }
            // Nothing matched here: the alternate exchange takes the message at this hop.
            if !matched {
                if let Some(ae) = ex.alternate.as_deref() {
                    stack.push(ae);
                }
            }
        }
    }
}

/// De-duplication of what a list already holds: a linear scan while the list is short (no
/// allocation on the common path), a hash set past `SEEN_SCAN_MAX`, where the scan would make a
/// wide fanout (or a topic key that keeps many patterns alive) quadratic.
pub(crate) struct Seen<K>(Option<ahash::AHashSet<K>>);

impl<K> Default for Seen<K> {
    fn default() -> Self {
        Seen(None)
    }
}

const SEEN_SCAN_MAX: usize = 16;

impl<K: Copy + Eq + std::hash::Hash> Seen<K> {
    /// Whether `k` is new to `held` (the keys of the list's items); records it. The caller then
    /// adds the item to the list.
    pub(crate) fn insert<I>(&mut self, mut held: I, k: K) -> bool
    where
        I: ExactSizeIterator<Item = K>,
    {
        if self.0.is_none() && held.len() < SEEN_SCAN_MAX {
            return !held.any(|h| h == k);
        }
        self.0.get_or_insert_with(|| held.collect()).insert(k)
    }

    /// Forgets everything, for a list that was cleared.
    pub(crate) fn clear(&mut self) {
        if let Some(set) = &mut self.0 {
            set.clear();
        }
    }
}

/// Direct exchanges with at most this many bindings are scanned, not looked up in the index.
const DIRECT_SCAN_MAX: usize = 8;

/// Adds a matched queue (once) to `out`, or a matched exchange to the walk.
fn follow<'a, Q: Clone + QueueKey>(
    dest: &'a Destination<Q>,
    out: &mut Vec<Q>,
    stack: &mut SmallVec<[&'a str; 8]>,
    seen: &mut Seen<usize>,
) {
    match dest {
        Destination::Queue(q) => {
            if seen.insert(out.iter().map(QueueKey::key), q.key()) {
                out.push(q.clone());
            }
        }
        Destination::Exchange(e) => stack.push(e),
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
        let mut x = Exchange {
            name: name.into(),
            kind,
            delayed: false,
            durable: false,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::new(),
            bindings,
            alternate: None,
            ring: HashRing::default(),
            direct: AHashMap::new(),
            topic: topic::Trie::default(),
            stats: Default::default(),
        };
        x.bindings_changed();
        x
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
    fn extra_keys_route_each_queue_once_and_alternate_only_when_none_match() {
        let mut t = Table::default();
        t.exchanges.insert(
            "d".into(),
            Arc::new(ex(
                "d",
                ExchangeKind::Direct,
                vec![to_q(1, "a"), to_q(2, "b"), to_q(3, "b"), to_x("t", "c")],
            )),
        );
        t.exchanges.insert(
            "t".into(),
            Arc::new(ex(
                "t",
                ExchangeKind::Topic,
                vec![to_q(2, "#"), to_q(4, "c")],
            )),
        );
        let mut alt = ex("alt", ExchangeKind::Fanout, vec![to_q(9, "")]);
        alt.alternate = None;
        t.exchanges.insert("alt".into(), Arc::new(alt));
        let mut d = (**t.exchanges.get("d").expect("d")).clone();
        d.alternate = Some("alt".into());
        t.exchanges.insert("d".into(), Arc::new(d));
        let route = |key: &str, extra: &[&str]| {
            let extra: Vec<ByteString> = extra.iter().map(|k| ByteString::from(*k)).collect();
            let mut out = Vec::new();
            t.route_keys("d", key, &extra, &mut || None, &mut out);
            out
        };
        assert_eq!(route("a", &[]), vec![Q(1)]);
        assert_eq!(route("a", &["b", "a", "b"]), vec![Q(1), Q(2), Q(3)]);
        assert_eq!(
            route("none", &["c"]),
            vec![Q(2), Q(4)],
            "through e2e, once each"
        );
        assert_eq!(
            route("none", &["zzz"]),
            vec![Q(9)],
            "no key matched: alternate"
        );
    }

    #[test]
    fn the_whole_key_set_is_matched_at_every_hop() {
        // RabbitMQ 3.10: direct `x1` (key "", CC rk1, BCC rk2) bound to topic `x2` with rk1,
        // which binds a queue with rk2: delivered.
        let mut t = Table::default();
        t.exchanges.insert(
            "x1".into(),
            Arc::new(ex("x1", ExchangeKind::Direct, vec![to_x("x2", "rk1")])),
        );
        t.exchanges.insert(
            "x2".into(),
            Arc::new(ex("x2", ExchangeKind::Topic, vec![to_q(1, "rk2")])),
        );
        let route = |t: &Table<Q>, key: &str, extra: &[&str]| {
            let extra: Vec<ByteString> = extra.iter().map(|k| ByteString::from(*k)).collect();
            let mut out = Vec::new();
            t.route_keys("x1", key, &extra, &mut || None, &mut out);
            out
        };
        assert_eq!(route(&t, "", &["rk1", "rk2"]), vec![Q(1)]);
        assert!(route(&t, "", &["rk1"]).is_empty());
        assert!(route(&t, "rk2", &[]).is_empty());
        // A direct exchange past the scan threshold matches every key through its index too.
        let pad = (100..100 + DIRECT_SCAN_MAX).map(|i| to_q(i, &format!("pad{i}")));
        let big = ex(
            "x1",
            ExchangeKind::Direct,
            pad.chain([to_x("x2", "rk1")]).collect(),
        );
        t.exchanges.insert("x1".into(), Arc::new(big));
        assert_eq!(route(&t, "", &["rk1", "rk2"]), vec![Q(1)]);
    }

    #[test]
    fn alternate_exchange_is_taken_at_the_hop_that_matched_nothing() {
        // RabbitMQ 3.10: y1 (AE ae1) binds y2 (AE ae2) with k; y2 has no binding. A message
        // with key k reaches ae2's queue; one with another key ae1's.
        let mut t = Table::default();
        let mut y1 = ex("y1", ExchangeKind::Direct, vec![to_x("y2", "k")]);
        y1.alternate = Some("ae1".into());
        let mut y2 = ex("y2", ExchangeKind::Direct, vec![]);
        y2.alternate = Some("ae2".into());
        t.exchanges.insert("y1".into(), Arc::new(y1));
        t.exchanges.insert("y2".into(), Arc::new(y2));
        t.exchanges.insert(
            "ae1".into(),
            Arc::new(ex("ae1", ExchangeKind::Fanout, vec![to_q(1, "")])),
        );
        t.exchanges.insert(
            "ae2".into(),
            Arc::new(ex("ae2", ExchangeKind::Fanout, vec![to_q(2, "")])),
        );
        let mut out = Vec::new();
        t.route("y1", "k", &mut || None, &mut out);
        assert_eq!(out, vec![Q(2)]);
        out.clear();
        t.route("y1", "zz", &mut || None, &mut out);
        assert_eq!(out, vec![Q(1)]);
        // A binding that matched a queue already reached still counts as a match.
        let mut z = ex("z", ExchangeKind::Fanout, vec![to_q(1, ""), to_x("w", "")]);
        z.alternate = Some("ae2".into());
        let mut w = ex("w", ExchangeKind::Fanout, vec![to_q(1, "")]);
        w.alternate = Some("ae2".into());
        t.exchanges.insert("z".into(), Arc::new(z));
        t.exchanges.insert("w".into(), Arc::new(w));
        out.clear();
        t.route("z", "k", &mut || None, &mut out);
        assert_eq!(out, vec![Q(1)]);
    }

    #[test]
    fn direct_index_follows_binding_changes() {
        // Padded past the scan threshold, so that the index is what routes.
        let pad = (100..100 + DIRECT_SCAN_MAX).map(|i| to_q(i, &format!("pad{i}")));
        let mut d = ex(
            "d",
            ExchangeKind::Direct,
            [to_q(1, "k"), to_q(2, "j"), to_q(3, "k"), to_q(4, "")]
                .into_iter()
                .chain(pad)
                .collect(),
        );
        let route = |d: &Exchange<Q>, key: &str| {
            let mut t = Table::default();
            t.exchanges.insert("d".into(), Arc::new(d.clone()));
            let mut out = Vec::new();
            t.route("d", key, &mut || None, &mut out);
            out
        };
        assert_eq!(route(&d, "k"), vec![Q(1), Q(3)], "binding order kept");
        assert_eq!(route(&d, "j"), vec![Q(2)]);
        assert_eq!(
            route(&d, ""),
            vec![Q(4)],
            "empty key is a key like any other"
        );
        assert!(route(&d, "K").is_empty(), "keys are case-sensitive");
        assert!(route(&d, "missing").is_empty());
        d.bindings.remove(0);
        d.bindings_changed();
        assert_eq!(route(&d, "k"), vec![Q(3)]);
        assert_eq!(
            route(&d, "j"),
            vec![Q(2)],
            "indices shifted with the removal"
        );
        d.bindings.push(to_q(5, "j"));
        d.bindings_changed();
        assert_eq!(route(&d, "j"), vec![Q(2), Q(5)]);
    }

    #[test]
    fn wide_fanout_reaches_each_queue_once_in_order() {
        // Past the linear-scan threshold, duplicates arrive through a second path.
        let n = 3 * SEEN_SCAN_MAX;
        let mut t = Table::default();
        let mut direct: Vec<Binding<Q>> = (0..n).map(|i| to_q(i, "k")).collect();
        direct.push(to_x("f", "k"));
        t.exchanges
            .insert("d".into(), Arc::new(ex("d", ExchangeKind::Direct, direct)));
        let fan = (0..n + 5).rev().map(|i| to_q(i, "")).collect();
        t.exchanges
            .insert("f".into(), Arc::new(ex("f", ExchangeKind::Fanout, fan)));
        let mut out = Vec::new();
        t.route("d", "k", &mut || None, &mut out);
        let want: Vec<Q> = (0..n).map(Q).chain((n..n + 5).rev().map(Q)).collect();
        assert_eq!(out, want);
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

    #[test]
    fn consistent_hash_routes_to_exactly_one_destination() {
        let mut t = Table::default();
        let mut ch = ex(
            "ch",
            ExchangeKind::ConsistentHash,
            vec![to_q(1, "1"), to_q(2, "3"), to_x("fan", "2")],
        );
        ch.bindings_changed();
        ch.alternate = Some("ae".into());
        t.exchanges.insert("ch".into(), Arc::new(ch));
        t.exchanges.insert(
            "fan".into(),
            Arc::new(ex("fan", ExchangeKind::Fanout, vec![to_q(3, "")])),
        );
        t.exchanges.insert(
            "ae".into(),
            Arc::new(ex("ae", ExchangeKind::Fanout, vec![to_q(9, "")])),
        );
        let mut counts = [0usize; 4];
        let mut out = Vec::new();
        for i in 0..6000 {
            out.clear();
            t.route("ch", &format!("k{i}"), &mut || None, &mut out);
            assert_eq!(out.len(), 1, "one destination per message");
            counts[out[0].0] += 1;
        }
        assert_eq!(counts[0], 0);
        // Weights 1:3:2 over 6000 keys.
        for (got, want) in counts[1..].iter().zip([1000.0, 3000.0, 2000.0]) {
            assert!((*got as f64 - want).abs() < 250.0, "{got} vs {want}");
        }
        // No bindings: nothing picked, so the alternate exchange takes it.
        let x = Arc::make_mut(t.exchanges.get_mut("ch").expect("ch"));
        x.bindings.clear();
        x.bindings_changed();
        out.clear();
        t.route("ch", "k", &mut || None, &mut out);
        assert_eq!(out, vec![Q(9)]);
    }
}
