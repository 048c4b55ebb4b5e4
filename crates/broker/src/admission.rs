//! Admission control: how many connections the node, each vhost and each user may hold open,
//! and how many queues each vhost may hold, answered with RabbitMQ's codes and texts.
//!
//! A connection takes its place at connection.open (where RabbitMQ checks its limits) and holds
//! a [`Place`] until it ends; dropping the place gives it back. Sockets that never reach
//! connection.open are bounded by the handshake timeout instead.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::LimitsConfig;
use crate::error::AmqpError;

pub struct Admission {
    /// Open connections on the node (0 = no limit).
    connection_max: u32,
    /// Per-vhost and per-user limits from the config, by name.
    vhosts: HashMap<String, crate::config::VhostLimits>,
    users: HashMap<String, crate::config::UserLimits>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    node: u32,
    vhosts: HashMap<String, u32>,
    users: HashMap<String, u32>,
}

/// One open connection's place in the counts, given back on drop.
pub struct Place {
    admission: Arc<Admission>,
    user: String,
    vhost: String,
}

impl Admission {
    pub fn new(l: &LimitsConfig) -> Arc<Admission> {
        Arc::new(Admission {
            connection_max: l.connection_max,
            vhosts: l.vhosts.clone(),
            users: l.users.clone(),
            counts: Mutex::new(Counts::default()),
        })
    }

    /// The most queues vhost `v` may hold (0 = no limit).
    pub fn max_queues(&self, vhost: &str) -> u32 {
        self.vhosts.get(vhost).map_or(0, |l| l.max_queues)
    }

    /// Takes a place for a connection of `user` to `vhost`, or answers 530 as RabbitMQ does.
    pub fn admit(self: &Arc<Self>, user: &str, vhost: &str) -> Result<Place, AmqpError> {
        let mut c = self.counts.lock();
        if self.connection_max > 0 && c.node >= self.connection_max {
            return Err(AmqpError::not_allowed(format!(
                "connection refused: node connection limit ({}) is reached",
                self.connection_max
            )));
        }
        let vmax = self.vhosts.get(vhost).map_or(0, |l| l.max_connections);
        if vmax > 0 && c.vhosts.get(vhost).copied().unwrap_or(0) >= vmax {
            return Err(AmqpError::not_allowed(format!(
                "access to vhost '{vhost}' refused for user '{user}': connection limit ({vmax}) is reached"
            )));
        }
        let umax = self.users.get(user).map_or(0, |l| l.max_connections);
        if umax > 0 && c.users.get(user).copied().unwrap_or(0) >= umax {
            return Err(AmqpError::not_allowed(format!(
                "connection refused for user '{user}': user connection limit ({umax}) is reached"
            )));
        }
        c.node += 1;
        *c.vhosts.entry(vhost.to_string()).or_default() += 1;
        *c.users.entry(user.to_string()).or_default() += 1;
        Ok(Place {
            admission: self.clone(),
            user: user.to_string(),
            vhost: vhost.to_string(),
        })
    }

    /// Open connections on the node.
    pub fn open_connections(&self) -> u32 {
        self.counts.lock().node
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut guard = self.admission.counts.lock();
        let c = &mut *guard;
        c.node = c.node.saturating_sub(1);
        for (map, key) in [(&mut c.vhosts, &self.vhost), (&mut c.users, &self.user)] {
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(key);
                }
            }
        }
    }
}

/// RabbitMQ's answer to a queue.declare past the vhost's max-queues.
pub fn queue_limit_reached(queue: &str, vhost: &str, max: u32) -> AmqpError {
    AmqpError::precondition_failed(format!(
        "cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({max}) is reached"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{UserLimits, VhostLimits};

    #[test]
    fn limits_count_and_release() {
        let mut l = LimitsConfig {
            connection_max: 3,
            ..Default::default()
        };
        l.vhosts.insert(
            "v".into(),
            VhostLimits {
                max_connections: 1,
                max_queues: 0,
            },
        );
        l.users
            .insert("u".into(), UserLimits { max_connections: 1 });
        let a = Admission::new(&l);
        let p1 = a.admit("u", "/").expect("first");
        let e = a.admit("u", "/").err().expect("user limit");
        assert_eq!(
            e.text,
            "NOT_ALLOWED - connection refused for user 'u': user connection limit (1) is reached"
        );
        let _p2 = a.admit("x", "v").expect("vhost v");
        let e = a.admit("y", "v").err().expect("vhost limit");
        assert_eq!(e.code, 530);
        let _p3 = a.admit("y", "/").expect("third");
        let e = a.admit("z", "/").err().expect("node limit");
        assert!(e.text.contains("node connection limit (3)"), "{}", e.text);
        drop(p1);
        assert_eq!(a.open_connections(), 2);
        a.admit("u", "/").expect("a place was given back");
    }
}
