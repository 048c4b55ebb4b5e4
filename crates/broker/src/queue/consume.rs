//! The consuming side: consumers joining and leaving, basic.get, and settling what was
//! delivered (acks, rejects, requeues with quorum queues' delivery limit).

use std::sync::Arc;

use warren_queue::Host;

use super::{Consumer, Queue, QueuedMessage, RemovedConsumer, Settled};
use crate::error::{AmqpError, AmqpResult};
use crate::metrics::{bump, delivered};

impl Queue {
    /// basic.get: takes the head message. `ack_mode` counts it as unacked.
    pub fn get(self: &Arc<Self>, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> bool {
        self.locked(|q, st, host| match st.get(ack_mode, host) {
            Some((m, left)) => {
                let st = &q.stats;
                delivered(
                    &st.get,
                    &st.get_no_ack,
                    &st.redeliver,
                    !ack_mode,
                    m.redelivered,
                );
                take(&m, left);
                true
            }
            None => {
                bump(&q.stats.get_empty, 1);
                false
            }
        })
    }

    /// Settles acked messages and, with `dispatch`, dispatches. A channel under a channel-wide
    /// limit passes false and dispatches all its queues itself, in a fair order.
    pub fn settle(self: &Arc<Self>, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        self.locked(|q, st, host| {
            let mut n = 0;
            st.settle(msgs.into_iter().inspect(|_| n += 1), dispatch, host);
            bump(&q.stats.ack, n);
        })
    }

    /// Rejected without requeue: settled, and dead-lettered if the queue has a DLX.
    /// `dispatch` as for [`Queue::settle`].
    pub fn discard(self: &Arc<Self>, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        self.locked(|_, st, host| st.discard(msgs, dispatch, host))
    }

    /// Puts unacked messages back at their original positions, marked redelivered (see
    /// `warren_queue::State::requeue` for the length limits).
    pub fn requeue(self: &Arc<Self>, msgs: impl IntoIterator<Item = Settled>) {
        self.locked(|_, st, host| st.requeue(msgs, host))
    }

    /// Adds a consumer; `on_added` runs under the queue lock (it sends consume-ok), so no
    /// delivery can overtake the consume-ok.
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        on_added: impl FnOnce(),
    ) -> AmqpResult<()> {
        self.locked(|q, st, host| {
            let entry = warren_queue::Consumer {
                key: c.key,
                priority: c.priority,
                no_ack: c.no_ack,
                exclusive: c.exclusive,
                prefetch: u32::from(c.prefetch),
                outstanding: 0,
                handle: c,
            };
            let now = host.now();
            match st.add_consumer(entry, now) {
                Ok(()) => {}
                Err(warren_queue::ConsumeRefused::Deleted) => {
                    return Err(AmqpError::not_found(format!("no {}", q.describe())));
                }
                Err(warren_queue::ConsumeRefused::Exclusive) => {
                    return Err(AmqpError::access_refused(format!(
                        "{} in exclusive use",
                        q.describe()
                    )));
                }
            }
            on_added();
            st.dispatch(host);
            Ok(())
        })
    }

    pub fn remove_consumer(self: &Arc<Self>, c: &Arc<Consumer>) -> RemovedConsumer {
        self.locked(|_, st, host| {
            let (_, auto_delete_now) = st.remove_consumer(c.key, host);
            RemovedConsumer { auto_delete_now }
        })
    }

    /// Delivered and not yet settled (management API's messages_unacknowledged).
    pub fn unacked_count(&self) -> u32 {
        self.state.lock().core.unacked() as u32
    }

    /// Its ready messages' body bytes, and how many of them are paged out (in the log only):
    /// read by Prometheus under the queue's lock, never per message.
    pub fn ready_bytes_and_paged(&self) -> (u64, u32) {
        let st = self.state.lock();
        (st.core.ready_bytes(), st.core.paged_len() as u32)
    }

    pub fn consumer_count(&self) -> u32 {
        self.state.lock().core.consumers().len() as u32
    }

    /// The consumers in dispatch order (with a single active consumer, the first is the
    /// active one), for the management side.
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        let st = self.state.lock();
        st.core
            .consumers()
            .iter()
            .map(|c| c.handle.clone())
            .collect()
    }
}
