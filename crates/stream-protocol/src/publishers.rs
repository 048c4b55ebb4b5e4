//! Publishers' state: the confirms a connection waits for, and a named publisher's ids.
//!
//! Deduplication, as RabbitMQ's: a publisher declared with a reference has its last
//! publishing id kept by the stream (`Stream::record_publisher_sequence`); a message whose id
//! is not above the last one accepted is confirmed without being stored. The stream records
//! confirmed ids at most every [`RECORD_EVERY`] (or on the publisher's end), not one write per
//! message, so after a broker crash the last ids of that window can be published again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use warren_broker::confirm::ConfirmTarget;
use warren_broker::queue::stream::Stream;

use crate::frame::*;
use crate::out::Out;

/// How often a publisher's confirmed publishing ids are recorded by its stream.
const RECORD_EVERY: Duration = Duration::from_millis(50);

/// A publish waiting for its confirm: its publisher, publishing id and deduplication.
type Waiting = (u8, u64, Option<Arc<Dedup>>);

/// Publish confirms from the persister: mapped back to (publisher, publishing id) and sent
/// as `PublishConfirm` / `PublishError` frames.
pub struct Confirms {
    out: Arc<Out>,
    /// seq -> (publisher id, publishing id, its deduplication).
    pub waiting: Mutex<HashMap<u64, Waiting>>,
}

impl Confirms {
    pub fn new(out: Arc<Out>) -> Confirms {
        Confirms {
            out,
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl ConfirmTarget for Confirms {
    fn confirmed(self: Arc<Self>, seq: u64, ok: bool) {
        let Some((publisher, id, dedup)) = self.waiting.lock().remove(&seq) else {
            return;
        };
        if let Some(d) = dedup {
            d.settled(id, ok);
        }
        self.out.send(|w| confirm(w, publisher, id, ok));
    }
}

pub fn confirm(w: &mut Writer, publisher: u8, id: u64, ok: bool) {
    if ok {
        w.confirm(publisher, id);
    } else {
        w.begin(PUBLISH_ERROR, 1)
            .u8(publisher)
            .u32(1)
            .u64(id)
            .u16(code::INTERNAL_ERROR)
            .end();
    }
}

/// A named publisher's ids.
pub struct Dedup {
    stream: Arc<Stream>,
    reference: String,
    state: Mutex<Ids>,
}

struct Ids {
    /// The last id taken to be stored (a message at or below it is a duplicate).
    accepted: Option<u64>,
    /// The last id confirmed stored, and the last the stream recorded.
    confirmed: Option<u64>,
    recorded: Option<u64>,
    recorded_at: Instant,
}

impl Dedup {
    /// A publisher `reference` of `stream`, going on from the last id the stream recorded.
    pub fn new(stream: Arc<Stream>, reference: String) -> Dedup {
        let last = stream.publisher_sequence(&reference);
        Dedup {
            stream,
            reference,
            state: Mutex::new(Ids {
                accepted: last,
                confirmed: last,
                recorded: last,
                recorded_at: Instant::now(),
            }),
        }
    }

    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The last id confirmed stored.
    pub fn confirmed(&self) -> Option<u64> {
        self.state.lock().confirmed
    }

    pub fn duplicate(&self, id: u64) -> bool {
        self.state.lock().accepted.is_some_and(|a| id <= a)
    }

    pub fn accept(&self, id: u64) {
        let mut s = self.state.lock();
        s.accepted = Some(s.accepted.map_or(id, |a| a.max(id)));
    }

    /// A publish was confirmed (`ok`) or refused: a refused id may come again.
    pub fn settled(&self, id: u64, ok: bool) {
        let mut s = self.state.lock();
        if !ok {
            s.accepted = s.confirmed;
            return;
        }
        s.confirmed = Some(s.confirmed.map_or(id, |c| c.max(id)));
        if s.recorded_at.elapsed() >= RECORD_EVERY {
            self.record(&mut s);
        }
    }

    fn record(&self, s: &mut Ids) {
        if let Some(c) = s.confirmed.filter(|c| s.recorded.is_none_or(|r| *c > r)) {
            self.stream.record_publisher_sequence(&self.reference, c);
            s.recorded = Some(c);
        }
        s.recorded_at = Instant::now();
    }
}

pub struct Publisher {
    pub stream: String,
    pub dedup: Option<Arc<Dedup>>,
}

impl Publisher {
    /// Its confirmed ids recorded now (the publisher or its connection ends).
    pub fn flush(&self) {
        if let Some(d) = &self.dedup {
            let mut s = d.state.lock();
            d.record(&mut s);
        }
    }
}
