//! What a link is given: who it is, and where its status goes.

use std::sync::Arc;

use parking_lot::Mutex;
use warren_broker::server::Broker;

use crate::params::Upstream;
use crate::status::LinkStatus;

/// What a link federates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Exchange,
    Queue,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Exchange => "exchange",
            Kind::Queue => "queue",
        }
    }
}

/// Who a link is.
pub struct LinkCtx {
    pub broker: Arc<Broker>,
    pub vhost: String,
    /// The federated exchange's or queue's name.
    pub name: String,
    /// The policy that federates it (for the connection's name).
    pub policy: String,
    pub upstream: Upstream,
    pub status: Arc<Mutex<LinkStatus>>,
}
