//! The queue as commands: a [`Command`] names one typed method of [`State`] with its
//! arguments, and [`State::apply`] runs it and answers a [`Reply`] (both types are in `types`).
//! This is what a replicated host logs and replays, and what tests and the fuzz target drive;
//! the local host calls the typed methods directly. Invariant: a command makes the calls the
//! local host makes for the same operation (an added consumer is dispatched to at once, as a
//! host does after consume-ok), so replaying a log gives the state the typed calls gave.

use crate::types::{Command, Reply};
use crate::{Host, Payload, State};

impl<C, M: Payload> State<C, M> {
    pub fn apply(&mut self, cmd: Command<C, M>, host: &mut impl Host<C, M>) -> Reply<C, M> {
        match cmd {
            Command::Publish { msg, logged } => Reply::Published(self.publish(msg, logged, host)),
            Command::Dispatch => {
                self.dispatch(host);
                Reply::Ok
            }
            Command::Expire => {
                let now = host.now();
                self.expire(now, host);
                Reply::Ok
            }
            Command::Get { ack } => Reply::Got(self.get(ack, host)),
            Command::Settle { entries, dispatch } => {
                self.settle(entries, dispatch, host);
                Reply::Ok
            }
            Command::Discard { entries, dispatch } => {
                self.discard(entries, dispatch, host);
                Reply::Ok
            }
            Command::Requeue { entries } => {
                self.requeue(entries, host);
                Reply::Ok
            }
            Command::AddConsumer(c) => {
                let r = self.add_consumer(c, host.now());
                if r.is_ok() {
                    self.dispatch(host);
                }
                Reply::Consume(r)
            }
            Command::RemoveConsumer { key } => {
                let (consumer, auto_delete_now) = self.remove_consumer(key, host);
                Reply::Removed {
                    consumer,
                    auto_delete_now,
                }
            }
            Command::Purge => Reply::Count(self.purge(host)),
            Command::Delete => {
                let (ready, consumers) = self.delete(host);
                Reply::Deleted { ready, consumers }
            }
            Command::SetLimits(l) => {
                self.set_limits(l);
                Reply::Ok
            }
            Command::Touch => {
                self.touch(host.now());
                Reply::Ok
            }
        }
    }
}
