//! Single active consumer (RabbitMQ 3.11's `rabbit_stream_sac_coordinator`): subscriptions with
//! `single-active-consumer=true` and the same `name` on one stream form a group, across
//! connections; only one member at a time receives. The first to subscribe is active; when it
//! goes (unsubscribed, its connection closed), the next in subscription order is. A member is
//! made active by its connection, which sends the client a consumer update and starts the
//! subscription at the offset the client answers with.

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
}

struct Member {
    conn: u64,
    id: u8,
    tell: mpsc::UnboundedSender<Event>,
}

/// Every group of this node.
#[derive(Default)]
pub struct Groups {
    groups: Mutex<HashMap<GroupKey, Vec<Member>>>,
}

impl Groups {
    /// Adds a member; true when it is the group's active one (it was empty).
    pub fn join(
        &self,
        key: GroupKey,
        conn: u64,
        id: u8,
        tell: mpsc::UnboundedSender<Event>,
    ) -> bool {
        let mut g = self.groups.lock();
        let members = g.entry(key).or_default();
        members.push(Member { conn, id, tell });
        members.len() == 1
    }

    /// Removes a member; when it was the active one, the next member still reachable is told
    /// it is active now.
    pub fn leave(&self, key: &GroupKey, conn: u64, id: u8) {
        let mut g = self.groups.lock();
        let Some(members) = g.get_mut(key) else {
            return;
        };
        let Some(at) = members.iter().position(|m| m.conn == conn && m.id == id) else {
            return;
        };
        members.remove(at);
        if at == 0 {
            // A member whose connection is gone cannot take over: the next one does.
            while let Some(next) = members.first() {
                if next.tell.send(Event::Activate { id: next.id }).is_ok() {
                    break;
                }
                members.remove(0);
            }
        }
        if members.is_empty() {
            g.remove(key);
        }
    }

    /// The members of a group, in order: (connection, subscription id).
    pub fn members(&self, key: &GroupKey) -> Vec<(u64, u8)> {
        self.groups
            .lock()
            .get(key)
            .map(|ms| ms.iter().map(|m| (m.conn, m.id)).collect())
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
        let (t1, _r1) = mpsc::unbounded_channel();
        let (t2, mut r2) = mpsc::unbounded_channel();
        let (t3, mut r3) = mpsc::unbounded_channel();
        assert!(groups.join(key.clone(), 1, 0, t1));
        assert!(!groups.join(key.clone(), 2, 5, t2));
        assert!(!groups.join(key.clone(), 3, 1, t3));
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
        groups.join(key.clone(), 1, 0, t1);
        groups.join(key.clone(), 2, 0, t2);
        groups.join(key.clone(), 3, 0, t3);
        drop(r2);
        groups.leave(&key, 1, 0);
        assert_eq!(r3.try_recv().unwrap(), Event::Activate { id: 0 });
        assert_eq!(groups.members(&key), [(3, 0)]);
    }
}
