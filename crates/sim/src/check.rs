//! What the simulation checks while it runs, shared by every simulated node: members agree at
//! each index (the machine's whole state after the entry, hashed), the machine's invariants
//! hold after every entry (a message is in one place only: never held by two consumers), and a
//! message delivered again is flagged redelivered. Violations are collected, not panicked on,
//! so a run reports all of them with its seed.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Default)]
pub struct Check {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Per applied index: the hash of the machine after it, and the first node that applied it.
    agree: HashMap<u64, (u64, String)>,
    violations: Vec<String>,
    applied: u64,
}

impl Check {
    pub fn new() -> Arc<Check> {
        Arc::new(Check::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn violation(&self, what: String) {
        let mut c = self.lock();
        // A broken run can repeat one fault many times: the first few say it.
        if c.violations.len() < 50 {
            c.violations.push(what);
        }
    }

    /// `node`'s machine after applying `index`, as `fingerprint`.
    pub fn applied(&self, node: &str, index: u64, fingerprint: &str) {
        let mut h = DefaultHasher::new();
        fingerprint.hash(&mut h);
        let hash = h.finish();
        let mut c = self.lock();
        c.applied += 1;
        match c.agree.get(&index) {
            Some((other, first)) if *other != hash => {
                let what = format!(
                    "{node} and {first} differ after index {index} (members must agree at the same index)"
                );
                drop(c);
                self.violation(what);
            }
            Some(_) => {}
            None => {
                c.agree.insert(index, (hash, node.to_string()));
            }
        }
    }

    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Entries applied, over all nodes (replays included).
    pub fn applies(&self) -> u64 {
        self.lock().applied
    }
}
