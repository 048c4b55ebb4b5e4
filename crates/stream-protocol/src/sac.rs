//! Single active consumer (RabbitMQ 3.11's `rabbit_stream_sac_coordinator`): subscriptions with
//! `single-active-consumer=true` and the same `name` on one stream form a group, across
//! connections; only one member at a time receives.
//!
//! - On a plain stream the first to subscribe is active; when it goes (unsubscribed, its
//!   connection closed), the next in subscription order is.
//! - On a super stream's partition (the subscription names its `super-stream`), the active
//!   member is the one at `partition index % members` in subscription order, RabbitMQ's rule,
//!   so a group's consumers spread over the partitions: each partition's group moves its
//!   active member when one joins or leaves. The member giving way is told first (a consumer
//!   update with `active=false`); once its client answers (or its connection goes), the new
//!   one is made active.
//!
//! A member is made active by its connection, which sends the client a consumer update and
//! starts the subscription at the offset the client answers with.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::sync::mpsc;

/// A group: (vhost, stream, consumer name).
pub type GroupKey = (String, String, String);

/// What a connection is told by the groups.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Its subscription `id` is now its group's active member.
    Activate { id: u8 },
    /// Its subscription `id` is to give way: it stops, tells its client, and then says so
    /// ([`Groups::stepped_down`]).
    Deactivate { id: u8 },
}

struct Member {
    conn: u64,
    id: u8,
    tell: mpsc::UnboundedSender<Event>,
}

#[derive(Default)]
struct Group {
    members: Vec<Member>,
    /// The member that receives (or was told to), by (connection, subscription).
    active: Option<(u64, u8)>,
    /// The active member was told to give way and has not answered yet.
    stepping_down: bool,
    /// Its stream's index among its super stream's partitions; `None` for a plain stream.
    partition: Option<usize>,
}

impl Group {
    /// The member that should be active.
    fn wanted(&self) -> Option<usize> {
        let n = self.members.len();
        match (self.partition, n) {
            (_, 0) => None,
            (Some(p), n) => Some(p % n),
            (None, _) => Some(0),
        }
    }

    /// Moves the group towards its wanted member: activates it when none is active, asks the
    /// active one to give way when it is another one (a super stream's partition).
    fn rebalance(&mut self) {
        loop {
            let Some(w) = self.wanted() else {
                self.active = None;
                return;
            };
            match self.active {
                None => {
                    let m = &self.members[w];
                    if m.tell.send(Event::Activate { id: m.id }).is_ok() {
                        self.active = Some((m.conn, m.id));
                        return;
                    }
                    // Its connection is gone: it cannot take over.
                    self.members.remove(w);
                }
                Some(a) if self.partition.is_none() => {
                    // A plain stream's active member stays until it goes.
                    if !self.members.iter().any(|m| (m.conn, m.id) == a) {
                        self.active = None;
                        continue;
                    }
                    return;
                }
                Some(a) => {
                    let want = (self.members[w].conn, self.members[w].id);
                    if a == want || self.stepping_down {
                        return;
                    }
                    match self.members.iter().find(|m| (m.conn, m.id) == a) {
                        Some(m) if m.tell.send(Event::Deactivate { id: m.id }).is_ok() => {
                            self.stepping_down = true;
                            return;
                        }
                        _ => {
                            self.members.retain(|m| (m.conn, m.id) != a);
                            self.active = None;
                        }
                    }
                }
            }
        }
    }
}

/// Every group of this node.
#[derive(Default)]
pub struct Groups {
    groups: Mutex<HashMap<GroupKey, Group>>,
}

impl Groups {
    /// Adds a member (`partition`: its stream's index in its super stream); the group's active
    /// member is told (or asked to give way) as the rule wants.
    pub fn join(
        &self,
        key: GroupKey,
        conn: u64,
        id: u8,
        tell: mpsc::UnboundedSender<Event>,
        partition: Option<usize>,
    ) {
        let mut g = self.groups.lock();
        let group = g.entry(key).or_default();
        group.partition = group.partition.or(partition);
        group.members.push(Member { conn, id, tell });
        group.rebalance();
    }

    /// Removes a member; the group's active member is then chosen again.
    pub fn leave(&self, key: &GroupKey, conn: u64, id: u8) {
        let mut g = self.groups.lock();
        let Some(group) = g.get_mut(key) else {
            return;
        };
        group.members.retain(|m| (m.conn, m.id) != (conn, id));
        if group.active == Some((conn, id)) {
            group.active = None;
            group.stepping_down = false;
        }
        group.rebalance();
        if group.members.is_empty() {
            g.remove(key);
        }
    }

    /// A member asked to give way has (its client answered): the wanted one is made active.
    pub fn stepped_down(&self, key: &GroupKey, conn: u64, id: u8) {
        let mut g = self.groups.lock();
        let Some(group) = g.get_mut(key) else {
            return;
        };
        if group.active == Some((conn, id)) && group.stepping_down {
            group.active = None;
            group.stepping_down = false;
            group.rebalance();
        }
    }

    /// The members of a group, in order: (connection, subscription id).
    pub fn members(&self, key: &GroupKey) -> Vec<(u64, u8)> {
        self.groups
            .lock()
            .get(key)
            .map(|g| g.members.iter().map(|m| (m.conn, m.id)).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_next_member_takes_over_when_the_active_one_leaves() {
        let groups = Groups::default();
        let key: GroupKey = ("/".into(), "s".into(), "app".into());
        let (t1, mut r1) = mpsc::unbounded_channel();
        let (t2, mut r2) = mpsc::unbounded_channel();
        let (t3, mut r3) = mpsc::unbounded_channel();
        groups.join(key.clone(), 1, 0, t1, None);
        assert_eq!(r1.try_recv().unwrap(), Event::Activate { id: 0 });
        groups.join(key.clone(), 2, 5, t2, None);
        groups.join(key.clone(), 3, 1, t3, None);
        assert!(
            r2.try_recv().is_err(),
            "a plain stream's active member stays"
        );
        // An inactive member leaving changes nothing.
        groups.leave(&key, 3, 1);
        assert!(r3.try_recv().is_err());
        groups.leave(&key, 1, 0);
        assert_eq!(r2.try_recv().unwrap(), Event::Activate { id: 5 });
        assert_eq!(groups.members(&key), [(2, 5)]);
        groups.leave(&key, 2, 5);
        assert!(groups.members(&key).is_empty());
    }

    #[test]
    fn a_member_whose_connection_is_gone_is_passed_over() {
        let groups = Groups::default();
        let key: GroupKey = ("/".into(), "s".into(), "app".into());
        let (t1, _r1) = mpsc::unbounded_channel();
        let (t2, r2) = mpsc::unbounded_channel();
        let (t3, mut r3) = mpsc::unbounded_channel();
        groups.join(key.clone(), 1, 0, t1, None);
        groups.join(key.clone(), 2, 0, t2, None);
        groups.join(key.clone(), 3, 0, t3, None);
        drop(r2);
        groups.leave(&key, 1, 0);
        assert_eq!(r3.try_recv().unwrap(), Event::Activate { id: 0 });
        assert_eq!(groups.members(&key), [(3, 0)]);
    }

    #[test]
    fn a_partitions_active_member_is_its_index_modulo_the_members_and_gives_way_first() {
        // Partition 1 of a super stream: with two members the second is active.
        let groups = Groups::default();
        let key: GroupKey = ("/".into(), "invoices-1".into(), "app".into());
        let (t1, mut r1) = mpsc::unbounded_channel();
        let (t2, mut r2) = mpsc::unbounded_channel();
        groups.join(key.clone(), 1, 0, t1, Some(1));
        assert_eq!(
            r1.try_recv().unwrap(),
            Event::Activate { id: 0 },
            "alone: active"
        );
        groups.join(key.clone(), 2, 7, t2, Some(1));
        // 1 % 2 = 1: the first member gives way, and only then is the second activated.
        assert_eq!(r1.try_recv().unwrap(), Event::Deactivate { id: 0 });
        assert!(r2.try_recv().is_err());
        groups.stepped_down(&key, 1, 0);
        assert_eq!(r2.try_recv().unwrap(), Event::Activate { id: 7 });
        // The active one leaves: 1 % 1 = 0, the first is active again.
        groups.leave(&key, 2, 7);
        assert_eq!(r1.try_recv().unwrap(), Event::Activate { id: 0 });
        // Partition 0 keeps its first member active as others join.
        let key0: GroupKey = ("/".into(), "invoices-0".into(), "app".into());
        let (t3, mut r3) = mpsc::unbounded_channel();
        let (t4, mut r4) = mpsc::unbounded_channel();
        groups.join(key0.clone(), 1, 1, t3, Some(0));
        groups.join(key0.clone(), 2, 8, t4, Some(0));
        assert_eq!(r3.try_recv().unwrap(), Event::Activate { id: 1 });
        assert!(r3.try_recv().is_err() && r4.try_recv().is_err());
    }

    #[test]
    fn a_member_leaving_while_asked_to_give_way_hands_over_at_once() {
        let groups = Groups::default();
        let key: GroupKey = ("/".into(), "s-1".into(), "app".into());
        let (t1, mut r1) = mpsc::unbounded_channel();
        let (t2, mut r2) = mpsc::unbounded_channel();
        groups.join(key.clone(), 1, 0, t1, Some(1));
        groups.join(key.clone(), 2, 0, t2, Some(1));
        assert_eq!(r1.try_recv().unwrap(), Event::Activate { id: 0 });
        assert_eq!(r1.try_recv().unwrap(), Event::Deactivate { id: 0 });
        groups.leave(&key, 1, 0);
        assert_eq!(r2.try_recv().unwrap(), Event::Activate { id: 0 });
    }
}
