//! Topic matching: words separated by '.', `*` matches exactly one word, `#` zero or more.
//! Empty words are words ("a..b" has three), but the empty key has no words at all, so `*` does not
//! match it and `#` does, as in RabbitMQ.
//!
//! [`Trie`] routes a publish through all of an exchange's patterns at once; [`matches`] is the
//! single-pattern matcher it is tested against.

use ahash::AHashMap;
use smallvec::SmallVec;

use crate::Seen;

/// True if routing `key` matches binding `pattern`.
pub fn matches(pattern: &str, key: &str) -> bool {
    let p = words(pattern);
    let k = words(key);
    match_words(&p, &k)
}

fn words(s: &str) -> Vec<&str> {
    word_iter(s).collect()
}

fn word_iter(s: &str) -> impl Iterator<Item = &str> {
    // The empty key has no words; `split` would yield one empty word.
    s.split('.').take(if s.is_empty() { 0 } else { usize::MAX })
}

/// A topic exchange's binding patterns as a trie of words. A publish advances the set of trie
/// nodes its key has reached so far, word by word: one pass over the key whatever the number of
/// bindings, and (as a set of states, not backtracking) never exponential in the `#`s of a
/// pattern. RabbitMQ routes topics through a trie too.
#[derive(Debug, Clone, Default)]
pub struct Trie {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    words: Children,
    star: Option<u32>,
    hash: Option<u32>,
    /// Reached through a `#`: stays reached on any further word.
    is_hash: bool,
    /// Bindings (indices) whose pattern ends here.
    ends: SmallVec<[u32; 1]>,
}

impl Trie {
    /// Rebuilds the trie from every binding's pattern, in binding order.
    pub fn rebuild<'a>(&mut self, patterns: impl Iterator<Item = &'a str>) {
        self.nodes.clear();
        self.nodes.push(Node::default());
        for (i, pattern) in patterns.enumerate() {
            let mut at = 0;
            let mut after_hash = false;
            for w in word_iter(pattern) {
                // "#.#" matches exactly what "#" does.
                if w == "#" && after_hash {
                    continue;
                }
                after_hash = w == "#";
                at = self.child(at, w);
            }
            self.nodes[at as usize].ends.push(i as u32);
        }
    }

    fn child(&mut self, at: u32, w: &str) -> u32 {
        let node = &self.nodes[at as usize];
        let existing = match w {
            "*" => node.star,
            "#" => node.hash,
            _ => node.words.get(w),
        };
        if let Some(c) = existing {
            return c;
        }
        let c = self.nodes.len() as u32;
        self.nodes.push(Node {
            is_hash: w == "#",
            ..Node::default()
        });
        let node = &mut self.nodes[at as usize];
        match w {
            "*" => node.star = Some(c),
            "#" => node.hash = Some(c),
            _ => node.words.insert(w, c),
        }
        c
    }

    /// Appends the indices of the bindings whose pattern matches `key`, ascending, each once.
    pub fn matches(&self, key: &str, out: &mut SmallVec<[u32; 8]>) {
        if self.nodes.is_empty() {
            return;
        }
        let (mut cur, mut next) = (SmallVec::new(), SmallVec::new());
        let mut seen = Seen::default();
        self.reach(&mut cur, &mut seen, 0);
        for w in word_iter(key) {
            next.clear();
            seen.clear();
            for &n in &cur {
                let node = &self.nodes[n as usize];
                if node.is_hash {
                    self.reach(&mut next, &mut seen, n);
                }
                if let Some(c) = node.words.get(w) {
                    self.reach(&mut next, &mut seen, c);
                }
                if let Some(c) = node.star {
                    self.reach(&mut next, &mut seen, c);
                }
            }
            std::mem::swap(&mut cur, &mut next);
            if cur.is_empty() {
                return;
            }
        }
        let start = out.len();
        for &n in &cur {
            out.extend_from_slice(&self.nodes[n as usize].ends);
        }
        // Each binding ends at one node, so there are no duplicates; sorting restores binding
        // order, which scanning the bindings would have given.
        out[start..].sort_unstable();
    }

    /// Adds node `n` to the reached set, and the `#` below it (which may match no word at all).
    fn reach(&self, states: &mut States, seen: &mut Seen<u32>, n: u32) {
        if seen.insert(states.iter().copied(), n) {
            states.push(n);
            if let Some(h) = self.nodes[n as usize].hash {
                self.reach(states, seen, h);
            }
        }
    }
}

/// The trie nodes reached so far.
type States = SmallVec<[u32; 8]>;

/// A node's literal-word children: compared in a short list (cheaper than hashing the word,
/// callgrind), in a map once there are many.
#[derive(Debug, Clone)]
enum Children {
    Few(SmallVec<[(Box<str>, u32); 2]>),
    Many(AHashMap<Box<str>, u32>),
}

const CHILDREN_SCAN_MAX: usize = 8;

impl Default for Children {
    fn default() -> Self {
        Children::Few(SmallVec::new())
    }
}

impl Children {
    fn get(&self, w: &str) -> Option<u32> {
        match self {
            Children::Few(v) => v.iter().find(|(k, _)| &**k == w).map(|&(_, c)| c),
            Children::Many(m) => m.get(w).copied(),
        }
    }

    fn insert(&mut self, w: &str, c: u32) {
        match self {
            Children::Few(v) if v.len() < CHILDREN_SCAN_MAX => v.push((w.into(), c)),
            Children::Few(v) => {
                let mut m: AHashMap<Box<str>, u32> = v.drain(..).collect();
                m.insert(w.into(), c);
                *self = Children::Many(m);
            }
            Children::Many(m) => {
                m.insert(w.into(), c);
            }
        }
    }
}

fn match_words(p: &[&str], k: &[&str]) -> bool {
    // Iterative matcher with backtracking to the last '#', linear in practice.
    let (mut pi, mut ki) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ki < k.len() {
        if pi < p.len() && p[pi] == "#" {
            star = Some((pi, ki));
            pi += 1;
        } else if pi < p.len() && (p[pi] == "*" || p[pi] == k[ki]) {
            pi += 1;
            ki += 1;
        } else if let Some((sp, sk)) = star {
            pi = sp + 1;
            ki = sk + 1;
            star = Some((sp, sk + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == "#" {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn table() {
        let cases: &[(&str, &str, bool)] = &[
            ("a.b.c", "a.b.c", true),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.c", false),
            ("a.#.c", "a.c", true),
            ("a.#.c", "a.b.b.c", true),
            ("a.#", "a", true),
            ("#", "", true),
            ("#", "a.b", true),
            ("*", "", false),
            ("*", "a.b", false),
            ("", "", true),
            ("", "a", false),
            ("a..b", "a..b", true),
            ("a.*.b", "a..b", true),
            ("#.#", "x", true),
            ("#.a.#", "b.a", true),
            ("#.a.#", "b.c", false),
            ("*.#", "", false),
            ("#", "", true),
            ("a.#", "a.", true),
            ("a.*", "a.", true),
            ("*.*", "a", false),
            ("a.#.b.#.c", "a.x.b.y.z.c", true),
            ("a.#.b", "a.b.c", false),
            ("#.b", "a.b.b", true),
        ];
        for (p, k, want) in cases {
            assert_eq!(matches(p, k), *want, "pattern {p:?} key {k:?}");
        }
    }

    /// A naive recursive matcher to compare against.
    fn naive(p: &[&str], k: &[&str]) -> bool {
        match p.split_first() {
            None => k.is_empty(),
            Some((&"#", rest)) => (0..=k.len()).any(|i| naive(rest, &k[i..])),
            Some((w, rest)) => !k.is_empty() && (*w == "*" || *w == k[0]) && naive(rest, &k[1..]),
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_naive(p in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "*", "#", ""]), 0..6),
                             k in proptest::collection::vec(proptest::sample::select(vec!["a", "b", ""]), 0..6)) {
            let ps = p.join(".");
            let ks = k.join(".");
            let (pw, kw) = (super::words(&ps), super::words(&ks));
            proptest::prop_assert_eq!(matches(&ps, &ks), naive(&pw, &kw));
        }

        #[test]
        fn trie_agrees_with_matches(
            ps in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "*", "#", ""]), 0..6),
                0..8),
            k in proptest::collection::vec(proptest::sample::select(vec!["a", "b", ""]), 0..6)) {
            let patterns: Vec<String> = ps.iter().map(|p| p.join(".")).collect();
            let key = k.join(".");
            let mut trie = super::Trie::default();
            trie.rebuild(patterns.iter().map(String::as_str));
            let mut got = smallvec::SmallVec::new();
            trie.matches(&key, &mut got);
            let want: Vec<u32> = (0..patterns.len() as u32)
                .filter(|&i| matches(&patterns[i as usize], &key))
                .collect();
            proptest::prop_assert_eq!(got.to_vec(), want);
        }
    }

    #[test]
    fn trie_table_and_duplicates() {
        let cases: &[(&str, &str, bool)] = &[
            ("#", "", true),
            ("*", "", false),
            ("", "", true),
            ("", "a", false),
            ("a.#", "a", true),
            ("a.*", "a.", true),
            ("#.#", "x", true),
            ("#.a.#", "b.c", false),
        ];
        for (p, k, want) in cases {
            let mut trie = super::Trie::default();
            trie.rebuild([*p].into_iter());
            let mut got = smallvec::SmallVec::new();
            trie.matches(k, &mut got);
            assert_eq!(!got.is_empty(), *want, "pattern {p:?} key {k:?}");
        }
        // The same pattern twice is two bindings.
        let mut trie = super::Trie::default();
        trie.rebuild(["a.*", "b", "a.*"].into_iter());
        let mut got = smallvec::SmallVec::new();
        trie.matches("a.x", &mut got);
        assert_eq!(got.to_vec(), vec![0, 2]);
    }

    /// Agreement where the short-list paths give way to maps and sets: a node with 20 literal
    /// children, and keys that keep dozens of trie nodes reached at once.
    #[test]
    fn trie_agrees_with_matches_when_wide() {
        let mut patterns: Vec<String> = (0..20).map(|i| format!("x.w{i}")).collect();
        let mut stack = vec![String::new()];
        for _ in 0..4 {
            stack = stack
                .iter()
                .flat_map(|p| {
                    ["a", "*", "#"].map(|w| {
                        if p.is_empty() {
                            w.to_string()
                        } else {
                            format!("{p}.{w}")
                        }
                    })
                })
                .collect();
            patterns.extend(stack.iter().cloned());
        }
        let mut trie = super::Trie::default();
        trie.rebuild(patterns.iter().map(String::as_str));
        for key in [
            "",
            "x.w7",
            "x.w19",
            "x.w20",
            "a",
            "a.a",
            "a.a.a",
            "a.a.a.a",
            "a.a.a.a.a",
            "x.a.a",
        ] {
            let mut got = smallvec::SmallVec::new();
            trie.matches(key, &mut got);
            let want: Vec<u32> = (0..patterns.len() as u32)
                .filter(|&i| matches(&patterns[i as usize], key))
                .collect();
            assert_eq!(got.to_vec(), want, "key {key:?}");
        }
    }

    #[test]
    fn many_hashes_do_not_explode() {
        // Backtracking over these would try on the order of 127^6 splits.
        let pattern = "#.a.#.a.#.a.#.a.#.a.#.a.#.b";
        let key = vec!["a"; 127].join(".");
        let mut trie = super::Trie::default();
        trie.rebuild([pattern].into_iter());
        // An exponential walk would not finish; the states walk does 128 steps.
        let mut got = smallvec::SmallVec::new();
        trie.matches(&key, &mut got);
        assert!(got.is_empty());
        trie.matches(&format!("{key}.b"), &mut got);
        assert_eq!(got.to_vec(), vec![0]);
    }
}
