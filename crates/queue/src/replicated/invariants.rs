//! A replicated queue's invariants, checked by its tests and fuzz runs after each command.

use std::collections::BTreeMap;

use super::Machine;

impl Machine {
    /// The core's invariants, plus the machine's own: the core counts exactly the held
    /// deliveries, and no seq is both ready and held, or held by two consumers.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.core.check_invariants()?;
        if self.core.unacked() != self.checked_out() {
            return Err(format!(
                "core counts {} unacked, checkouts hold {}",
                self.core.unacked(),
                self.checked_out()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        let ready = self.core.ready.iter().flat_map(|l| l.iter());
        let held = self
            .checkouts
            .values()
            .flat_map(|m| m.values().map(|h| &h.entry));
        let seqs = ready
            .chain(held)
            .chain(self.delayed.values())
            .map(|e| e.seq);
        for seq in seqs.chain(self.paged.iter().map(|e| e.seq)) {
            if !seen.insert(seq) {
                return Err(format!("seq {seq} is in two places"));
            }
        }
        let in_memory: usize = self.core.ready.iter().map(|l| l.len()).sum();
        if in_memory + self.paged.len() != self.core.ready_len() {
            return Err(format!(
                "{} ready in memory and {} paged, the core counts {}",
                in_memory,
                self.paged.len(),
                self.core.ready_len()
            ));
        }
        for c in self.core.consumers() {
            let held = self.checkouts.get(&c.key).map_or(0, BTreeMap::len);
            if !c.no_ack && c.outstanding as usize != held {
                return Err(format!(
                    "consumer {} counts {} outstanding, holds {held}",
                    c.key, c.outstanding
                ));
            }
        }
        Ok(())
    }
}
