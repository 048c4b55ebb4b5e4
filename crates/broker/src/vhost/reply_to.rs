//! Direct reply-to: the private pseudo-queue behind each channel's `amq.rabbitmq.reply-to`
//! consumer. They are not in the snapshot; routing finds them by name in their own map.

use std::sync::Arc;

use warren_protocol::FieldTable;

use super::{VHost, DIRECT_REPLY_TO};
use crate::queue::{Queue, QueueArgs, QueueOptions, QueueRef};

impl VHost {
    /// Creates the private queue behind a channel's direct reply-to consumer.
    pub fn new_direct_reply_queue(self: &Arc<Self>) -> QueueRef {
        let name: Arc<str> = super::gen_name(&format!("{DIRECT_REPLY_TO}.")).into();
        let opts = QueueOptions {
            durable: false,
            exclusive_owner: None,
            auto_delete: false,
            arguments: FieldTable::new(),
            args: QueueArgs::default(),
        };
        let q = QueueRef::Local(Queue::new(
            name.clone(),
            self.name.clone(),
            opts,
            Arc::downgrade(self),
        ));
        self.direct_reply.lock().insert(name, q.clone());
        q
    }

    /// Whether `name` is a live direct reply-to pseudo-queue (its requester still consumes).
    pub fn direct_reply_exists(&self, name: &str) -> bool {
        self.direct_reply.lock().contains_key(name)
    }

    pub fn drop_direct_reply_queue(&self, name: &str) {
        if let Some(q) = self.direct_reply.lock().remove(name) {
            q.mark_deleted();
        }
    }
}
