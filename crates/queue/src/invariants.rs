//! The bookkeeping checked against the contents, for tests and the fuzz target: counts match
//! what is held, lanes are in seq order and hold their own level, consumers are in priority
//! order and within their prefetch.

use crate::{Payload, State};

impl<C, M: Payload> State<C, M> {
    /// Checks the bookkeeping against the contents; for tests and the fuzz target.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mem: usize = self.ready.iter().map(|l| l.len()).sum();
        let mem_bytes: u64 = self.ready.iter().flatten().map(|e| e.msg.body_len()).sum();
        let (tc, tb) = self.tail.map_or((0, 0), |t| (t.count, t.bytes));
        if self.tail.is_some_and(|t| t.count == 0) {
            return Err("empty tail kept".into());
        }
        if mem + tc != self.ready_len {
            return Err(format!("ready_len {} != {mem} + {tc}", self.ready_len));
        }
        if mem_bytes + tb != self.ready_bytes {
            return Err(format!(
                "ready_bytes {} != {mem_bytes} + {tb}",
                self.ready_bytes
            ));
        }
        for (i, lane) in self.ready.iter().enumerate() {
            if lane
                .iter()
                .zip(lane.iter().skip(1))
                .any(|(a, b)| a.seq >= b.seq)
            {
                return Err(format!("level {i} out of seq order"));
            }
            if lane.iter().any(|e| e.seq >= self.next_seq) {
                return Err(format!("level {i} holds a seq not yet given"));
            }
            if lane.iter().any(|e| self.level(&e.msg) != i) {
                return Err(format!("level {i} holds a message of another level"));
            }
        }
        if self.tail.is_some() && self.ready.len() > 1 {
            return Err("a priority queue with a tail".into());
        }
        if self
            .consumers
            .iter()
            .zip(self.consumers.iter().skip(1))
            .any(|(a, b)| a.priority < b.priority)
        {
            return Err("consumers out of priority order".into());
        }
        if let Some(c) = self
            .consumers
            .iter()
            .find(|c| c.prefetch > 0 && !c.no_ack && c.outstanding > c.prefetch)
        {
            return Err(format!("consumer {} holds more than its prefetch", c.key));
        }
        if self.deleted && (self.ready_len > 0 || !self.consumers.is_empty()) {
            return Err("a deleted queue holds messages or consumers".into());
        }
        Ok(())
    }
}
