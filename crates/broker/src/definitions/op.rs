//! The definitions command: one change of the definitions ([`DefOp`]), its outcome
//! ([`DefReply`]), and the context of a change being made on this node ([`Applying`]). A cluster
//! replicates the command as a metadata entry (serde JSON; the variant names are the encoding,
//! so entries and snapshots written before it had this name still read); `proposer` is the
//! interface that proposes it. Imports nothing from the cluster or the vhost: both use it.

use serde::{Deserialize, Serialize};

use crate::definitions::records::{Limits, MgmtError, PermissionDef, PolicyDef, UserDef, VhostDef};
use crate::error::{AmqpError, AmqpResult};

/// A change of the definitions. Vhost changes carry the AMQP method that makes them (the
/// definitions file's encoding, see `definitions/mod.rs`).
#[derive(Debug, Serialize, Deserialize)]
pub enum DefOp {
    Vhost {
        vhost: String,
        /// An encoded exchange/queue declare, delete, bind or unbind method.
        method: Vec<u8>,
        /// For a queue.declare: where it lives and who owns it.
        #[serde(default)]
        queue: Option<QueueMeta>,
    },
    AddVhost(VhostDef),
    DeleteVhost(String),
    PutUser(UserDef),
    DeleteUser(String),
    SetPermissions(PermissionDef),
    ClearPermissions {
        user: String,
        vhost: String,
    },
    PutPolicy(PolicyDef),
    DeletePolicy {
        vhost: String,
        name: String,
    },
    SetLimits {
        user: bool,
        name: String,
        def: Limits,
        replace: bool,
    },
    ClearLimit {
        user: bool,
        name: String,
        key: Option<String>,
    },
    /// A global runtime parameter (`cluster_name`).
    SetGlobalParameter {
        name: String,
        value: serde_json::Value,
    },
    /// A component's runtime parameter (`shovel`, ...), checked where it was asked for.
    SetParameter {
        component: String,
        vhost: String,
        name: String,
        value: serde_json::Value,
    },
    ClearParameter {
        component: String,
        vhost: String,
        name: String,
    },
    /// A replicated queue's members changed (add_member, delete_member, grow, shrink).
    QueueMembers {
        vhost: String,
        queue: String,
        members: Vec<String>,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueMeta {
    /// The node that runs it.
    pub home: String,
    /// The owning connection of an exclusive queue (connection ids are unique in the cluster).
    pub owner: Option<u64>,
    pub server_named: bool,
    /// A replicated queue's group id (the index of the entry that first declared it; `None` in
    /// that entry itself) and its members, the initial leader first.
    #[serde(default)]
    pub group: Option<u64>,
    #[serde(default)]
    pub members: Vec<String>,
}

/// The outcome of an applied op, as the proposer reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum DefReply {
    Ok,
    /// A queue.delete made here deleted a queue that held `message_count` ready messages.
    Deleted {
        message_count: u32,
    },
    Amqp {
        code: u16,
        text: String,
    },
    Mgmt {
        kind: u8,
        text: String,
    },
}

impl DefReply {
    pub fn amqp(r: AmqpResult<()>) -> DefReply {
        match r {
            Ok(()) => DefReply::Ok,
            Err(e) => DefReply::Amqp {
                code: e.code,
                text: e.text,
            },
        }
    }

    pub fn mgmt(r: Result<(), MgmtError>) -> DefReply {
        match r {
            Ok(()) => DefReply::Ok,
            Err(MgmtError::NotFound(t)) => DefReply::Mgmt { kind: 0, text: t },
            Err(MgmtError::BadRequest(t)) => DefReply::Mgmt { kind: 1, text: t },
            Err(MgmtError::Internal(t)) | Err(MgmtError::Unavailable(t)) => {
                DefReply::Mgmt { kind: 2, text: t }
            }
        }
    }

    /// A vhost change's outcome as its AMQP method answers it; `Err(text)`: it could not be
    /// recorded (no majority), which closes the connection (320), as RabbitMQ does.
    pub fn into_amqp(r: Result<DefReply, String>) -> AmqpResult<()> {
        match r {
            Ok(DefReply::Ok | DefReply::Deleted { .. }) => Ok(()),
            Ok(DefReply::Amqp { code, text }) => Err(AmqpError {
                code,
                text,
                class_id: 0,
                method_id: 0,
            }),
            Ok(DefReply::Mgmt { text, .. }) => Err(AmqpError::internal_error(text)),
            Err(t) => Err(AmqpError::new(warren_protocol::reply::CONNECTION_FORCED, t)),
        }
    }

    /// A management change's outcome; `Err(text)`: it could not be recorded (HTTP 503).
    pub fn into_mgmt(r: Result<DefReply, String>) -> Result<(), MgmtError> {
        match r {
            Ok(DefReply::Ok | DefReply::Deleted { .. }) => Ok(()),
            Ok(DefReply::Mgmt { kind: 0, text }) => Err(MgmtError::NotFound(text)),
            Ok(DefReply::Mgmt { kind: 1, text }) => Err(MgmtError::BadRequest(text)),
            Ok(DefReply::Mgmt { text, .. }) | Ok(DefReply::Amqp { text, .. }) => {
                Err(MgmtError::Internal(text))
            }
            Err(t) => Err(MgmtError::Unavailable(t)),
        }
    }
}

/// A change being applied on this node: what the applier (`server/apply.rs`) passes the vhost,
/// access and broker code it calls, so that code makes the change here instead of proposing it
/// again. Code that can do either takes `Option<Applying>`: `None` for a change asked for on
/// this node, which goes to the [`Proposer`](super::proposer::Proposer) (the cluster's, or a
/// single node's applier), `Some` for one being applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applying {
    /// The Raft index of the committed entry that carries the change: a new replicated queue's
    /// group id and a new durable queue's log id. 0 when it is no one entry (a metadata
    /// snapshot being restored, this node's definitions dropped to join another cluster, or a
    /// change a single node makes at once).
    pub index: u64,
    /// Made at once by a single node: with no entry to name it, a new durable queue's log gets
    /// a fresh random id.
    pub local: bool,
}

impl Applying {
    /// The committed entry at `index`.
    pub const fn entry(index: u64) -> Applying {
        Applying {
            index,
            local: false,
        }
    }

    /// A metadata snapshot being restored, or this node's definitions being dropped.
    pub const RESTORE: Applying = Applying::entry(0);

    /// A change a single node makes at once (`server/apply.rs`'s `LocalApplier`).
    pub const LOCAL: Applying = Applying {
        index: 0,
        local: true,
    };
}
