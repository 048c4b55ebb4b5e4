//! A member's copy of the queue ([`Replica`], without the bodies): inserting and settling ids,
//! the order they are read back in, and where a snapshot may be taken.

use super::{Replica, CHECKPOINT_BYTES, CHECKPOINT_ENTRIES, GONE};

impl Replica {
    pub(super) fn holds(&self, id: u64) -> bool {
        id >= self.base
            && self
                .sizes
                .get((id - self.base) as usize)
                .is_some_and(|s| *s != GONE)
    }

    pub(super) fn insert(&mut self, id: u64, size: u64) {
        if self.sizes.is_empty() {
            self.base = id;
        }
        while self.base + (self.sizes.len() as u64) < id {
            self.sizes.push_back(GONE);
        }
        let size = size.min(u64::from(GONE - 1)) as u32;
        self.sizes.push_back(size);
        self.live += 1;
        self.live_bytes += u64::from(size);
    }

    pub(super) fn remove(&mut self, id: u64) {
        if !self.holds(id) {
            return;
        }
        let at = (id - self.base) as usize;
        self.live_bytes -= u64::from(self.sizes[at]);
        self.live -= 1;
        self.sizes[at] = GONE;
        while self.sizes.front() == Some(&GONE) {
            self.sizes.pop_front();
            self.base += 1;
        }
        self.returns.remove(&id);
        self.delivered.remove(&id);
        self.legacy.remove(&id);
        self.dead.remove(&id);
    }

    /// The oldest message still in the queue, or the next id if none is.
    pub(super) fn oldest(&self) -> u64 {
        if self.live == 0 {
            self.next_id
        } else {
            self.base
        }
    }

    /// The ids in the queue from `from` on, in order.
    pub(super) fn ids_from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        let skip = from.saturating_sub(self.base) as usize;
        self.sizes
            .iter()
            .enumerate()
            .skip(skip)
            .filter(|(_, s)| **s != GONE)
            .map(|(i, _)| self.base + i as u64)
    }

    /// Entry `index` (of `len` bytes) was applied.
    pub(super) fn applied(&mut self, index: u64, len: usize) {
        self.since_checkpoint.0 += 1;
        self.since_checkpoint.1 += len;
        if self.since_checkpoint.0 >= CHECKPOINT_ENTRIES
            || self.since_checkpoint.1 >= CHECKPOINT_BYTES
        {
            self.checkpoints.push_back((index, self.next_id));
            self.since_checkpoint = (0, 0);
        }
        // Only the newest checkpoint below the oldest message is of use.
        let oldest = self.oldest();
        while self.checkpoints.get(1).is_some_and(|c| c.1 <= oldest) {
            self.checkpoints.pop_front();
        }
    }

    /// The newest checkpoint before every message still in the queue: `(index, next id)`.
    pub(super) fn release(&self) -> Option<(u64, u64)> {
        self.checkpoints
            .front()
            .copied()
            .filter(|c| c.1 <= self.oldest())
    }
}
