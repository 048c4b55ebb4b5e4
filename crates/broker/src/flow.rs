//! Credit flow: how a broker that falls behind slows its publishers down instead of growing
//! its memory, from the consumer's socket back to the publisher's. This module holds the two
//! mechanisms every link of the chain uses ([`SpaceWaiter`], [`wait_relief`]); the links
//! themselves live with what they guard:
//!
//! 1. **Outbox -> queue.** A connection's output (`outbox.rs`) refuses deliveries above its
//!    high mark (`limits::OUTBOX_HIGH_BYTES`): the queue's offer to a consumer on that
//!    connection comes back `Offer::OutboxFull` (`channel/mod.rs`, `ChannelShared::offer`), and
//!    the queue registers itself as a [`SpaceWaiter`] with the outbox through its
//!    `DeliverySink` (`queue/handle.rs`). When the writer task drains the outbox below its low
//!    mark (`limits::OUTBOX_LOW_BYTES`), every waiter is woken: a queue dispatches again
//!    (`queue/mod.rs`), a stream wakes its consumer tasks (`queue/stream/`), a remote
//!    consumer's proxy sends its withheld credit home (`cluster/remote/proxy.rs`).
//! 2. **Queue -> publisher.** A queue whose consumers are held back by their connections and
//!    whose backlog passes `limits::QUEUE_PRESSURE_MSGS`/`_BYTES` is *pressured*
//!    (`Queue::pressured`; a stream by its unwritten bytes, `queue/stream/write.rs`; a queue
//!    on another node by its publish window, `cluster/remote/queue.rs`; a replicated queue by
//!    its replicator's uncommitted entries, `cluster/quorum/replicator.rs`). The channel
//!    collects the pressured queues a publish went to (`channel/mod.rs`), and the connection's
//!    reader stops reading its socket until they are relieved ([`wait_relief`], called by each
//!    kind's `stall`; `connection/reader.rs`, `await_credit`): TCP then pushes back on the
//!    publisher. A connection that also consumes waits a bounded time
//!    (`limits::PUBLISH_STALL_MS`), since it must keep reading its own acks.
//! 3. **Across the cluster.** A publish forwarded to a queue's home node takes one unit of the
//!    sender's publish window (`cluster/remote/queue.rs`, `PUBLISH_WINDOW`), given back by the
//!    home's `K_PUB_CREDIT` once the queue took it (`cluster/remote/inbound.rs`); deliveries to
//!    a consumer on another node travel in a window (`cluster/remote/sink.rs`, `WINDOW`) whose
//!    credit the consumer's node sends back (`K_CREDIT`) only while that consumer's outbox has
//!    room (link 1).
//! 4. **Alarms.** Above the memory or disk watermark (`alarms.rs`), every publishing
//!    connection's reader stops reading (`connection/reader.rs`, `apply_alarm`) and the client
//!    is told with connection.blocked, as RabbitMQ does.
//! 5. **A reader's own output.** A connection whose unsent replies pass
//!    `limits::OUTBOX_READ_PAUSE_BYTES` stops processing its client's requests until its writer
//!    catches up (`connection/reader.rs`).

use std::sync::Arc;

/// Something waiting for a connection's output to drain below its low mark (link 1 above).
/// Registered with the outbox through the consumer's `DeliverySink::wait_for_space`; the
/// outbox holds it weakly, so a waiter that went away is simply not woken.
pub trait SpaceWaiter: Send + Sync {
    /// The output drained: deliver again (a queue dispatches, a stream wakes its consumers, a
    /// remote consumer sends its credit home).
    fn space(self: Arc<Self>);
}

/// Waits, for at most `max`, until `relieved` is notified, unless `pressured()` is already
/// false: a publisher's stall on a queue, stream or remote queue that holds it back (link 2).
pub async fn wait_relief(
    relieved: &tokio::sync::Notify,
    pressured: impl Fn() -> bool,
    max: std::time::Duration,
) {
    let notified = relieved.notified();
    tokio::pin!(notified);
    // Registered before the check, so a relief between the two is not missed.
    notified.as_mut().enable();
    if pressured() {
        let _ = tokio::time::timeout(max, notified).await;
    }
}
