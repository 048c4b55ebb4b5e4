//! The replicated changes ([`MetaOp`]) and their outcomes ([`MetaReply`]), and which entry
//! this thread is applying ([`applying`]): what the proposer and the state machine share.

use std::cell::Cell;

use serde::{Deserialize, Serialize};

use crate::access::{MgmtError, PermissionDef, PolicyDef, UserDef, VhostDef};
use crate::error::AmqpResult;

/// What the state machine hands back to a proposer: the entry's index and its outcome.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Applied {
    pub(super) index: u64,
    pub(super) reply: MetaReply,
}

thread_local! {
    /// The Raft index of the entry this thread is applying, so the vhost and access code
    /// called from the apply changes state here instead of proposing again.
    pub(super) static APPLYING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The log index being applied on this thread, if this is the apply.
pub fn applying() -> Option<u64> {
    APPLYING.with(|a| a.get())
}

/// A replicated change. Vhost changes carry the AMQP method that makes them (the definitions
/// file's encoding, see `definitions.rs`).
#[derive(Debug, Serialize, Deserialize)]
pub enum MetaOp {
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
        def: crate::access::Limits,
        replace: bool,
    },
    ClearLimit {
        user: bool,
        name: String,
        key: Option<String>,
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
#[derive(Debug, Serialize, Deserialize)]
pub enum MetaReply {
    Ok,
    Amqp { code: u16, text: String },
    Mgmt { kind: u8, text: String },
}

impl MetaReply {
    pub(super) fn amqp(r: AmqpResult<()>) -> MetaReply {
        match r {
            Ok(()) => MetaReply::Ok,
            Err(e) => MetaReply::Amqp {
                code: e.code,
                text: e.text,
            },
        }
    }
    pub(super) fn mgmt(r: Result<(), MgmtError>) -> MetaReply {
        match r {
            Ok(()) => MetaReply::Ok,
            Err(MgmtError::NotFound(t)) => MetaReply::Mgmt { kind: 0, text: t },
            Err(MgmtError::BadRequest(t)) => MetaReply::Mgmt { kind: 1, text: t },
            Err(MgmtError::Internal(t)) | Err(MgmtError::Unavailable(t)) => {
                MetaReply::Mgmt { kind: 2, text: t }
            }
        }
    }
}
