//! A stream's tracking, for the stream protocol: offsets consumers store under a reference
//! (`store_offset` / `query_offset`), and each named publisher's last publishing id
//! (deduplication). Kept in `warren_store::tracking` beside the segments.

use super::Stream;

impl Stream {
    /// The offset stored under `reference`.
    pub fn stored_offset(&self, reference: &str) -> Option<u64> {
        self.tracking.lock().as_ref()?.offset(reference)
    }

    /// Stores `offset` under `reference` (the last one stored wins); a replicated stream's
    /// group stores it on every member.
    pub fn store_offset(&self, reference: &str, offset: u64) {
        match self.group.get() {
            Some(g) => g.track(super::Track::Offset(reference.into(), offset)),
            None => self.store_offset_here(reference, offset),
        }
    }

    pub(super) fn store_offset_here(&self, reference: &str, offset: u64) {
        if let Some(t) = self.tracking.lock().as_mut() {
            if let Err(e) = t.set_offset(reference, offset) {
                tracing::warn!(stream = %self.name, reference, error = %e, "cannot store the offset");
            }
        }
    }

    /// The last publishing id recorded for the publisher `reference`.
    pub fn publisher_sequence(&self, reference: &str) -> Option<u64> {
        self.tracking.lock().as_ref()?.publisher(reference)
    }

    /// Records `id` as the publisher's last stored one (never going back); a replicated
    /// stream's group records it on every member.
    pub fn record_publisher_sequence(&self, reference: &str, id: u64) {
        match self.group.get() {
            Some(g) => g.track(super::Track::Publisher(reference.into(), id)),
            None => self.record_publisher_here(reference, id),
        }
    }

    pub(super) fn record_publisher_here(&self, reference: &str, id: u64) {
        if let Some(t) = self.tracking.lock().as_mut() {
            if let Err(e) = t.set_publisher(reference, id) {
                tracing::warn!(stream = %self.name, reference, error = %e, "cannot record the publisher's sequence");
            }
        }
    }
}
