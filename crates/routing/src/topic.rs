//! Topic matching: words separated by '.', `*` matches exactly one word, `#` zero or more.
//! Empty words are words ("a..b" has three), but the empty key has no words at all, so `*` does not
//! match it and `#` does, as in RabbitMQ.

/// True if routing `key` matches binding `pattern`.
pub fn matches(pattern: &str, key: &str) -> bool {
    let p = words(pattern);
    let k = words(key);
    match_words(&p, &k)
}

fn words(s: &str) -> Vec<&str> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split('.').collect()
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
    }
}
