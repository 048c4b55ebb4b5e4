//! Admission control: how many connections the node, each vhost and each user may hold open,
//! how many channels each user may hold open, and how many queues each vhost may hold,
//! answered with RabbitMQ's codes and texts.
//!
//! A connection takes its place at connection.open (where RabbitMQ checks its limits) and holds
//! a [`Place`] until it ends; dropping the place gives it back. A channel likewise holds a
//! [`ChannelPlace`] from channel.open. Sockets that never reach connection.open are bounded by
//! the handshake timeout instead.
//!
//! Per-vhost and per-user limits come from two places: the config file (`[limits.vhosts.V]`,
//! `[limits.users.U]`, 0 = no limit) and the runtime limits set through the management API or
//! `warren ctl set_vhost_limits`/`set_user_limits` (kept in `access.json`; a negative value =
//! no limit, 0 = nothing allowed, as in RabbitMQ). A runtime limit overrides the config's for
//! the same vhost or user and name. Limits are read at each check, so a change applies to the
//! next connection, channel or queue; nothing already open is closed.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::access::{Access, LimitScope, MAX_CHANNELS, MAX_CONNECTIONS, MAX_QUEUES};
use crate::config::LimitsConfig;
use crate::error::AmqpError;

pub struct Admission {
    /// Open connections on the node (0 = no limit).
    connection_max: u32,
    /// Per-vhost and per-user limits from the config, by name.
    vhosts: HashMap<String, crate::config::VhostLimits>,
    users: HashMap<String, crate::config::UserLimits>,
    /// Where the runtime limits live.
    access: Arc<Access>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    node: u32,
    vhosts: HashMap<String, u32>,
    users: HashMap<String, u32>,
    /// Open channels per user, across their connections (RabbitMQ's max-channels counts so).
    channels: HashMap<String, u32>,
}

/// Takes one off `key`'s count, forgetting it at zero.
fn release(map: &mut HashMap<String, u32>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// The limit in force: the runtime value if one is set (negative = none), else the config's
/// (0 = none).
fn in_force(runtime: Option<i64>, config: u32) -> Option<u32> {
    match runtime {
        Some(n) if n < 0 => None,
        Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        None => (config > 0).then_some(config),
    }
}

/// One open connection's place in the counts, given back on drop.
pub struct Place {
    admission: Arc<Admission>,
    user: String,
    vhost: String,
}

impl Admission {
    pub fn new(l: &LimitsConfig, access: Arc<Access>) -> Arc<Admission> {
        Arc::new(Admission {
            connection_max: l.connection_max,
            vhosts: l.vhosts.clone(),
            users: l.users.clone(),
            access,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// Vhost `vhost`'s limit `key` in force (`None` = no limit).
    fn vhost_limit(&self, vhost: &str, key: &str) -> Option<u32> {
        let config = self.vhosts.get(vhost).map_or(0, |l| match key {
            MAX_CONNECTIONS => l.max_connections,
            _ => l.max_queues,
        });
        in_force(self.access.limit(LimitScope::Vhost, vhost, key), config)
    }

    /// User `user`'s limit `key` in force (`None` = no limit).
    fn user_limit(&self, user: &str, key: &str) -> Option<u32> {
        let config = self.users.get(user).map_or(0, |l| match key {
            MAX_CONNECTIONS => l.max_connections,
            _ => l.max_channels,
        });
        in_force(self.access.limit(LimitScope::User, user, key), config)
    }

    /// The most queues vhost `v` may hold (`None` = no limit).
    pub fn max_queues(&self, vhost: &str) -> Option<u32> {
        self.vhost_limit(vhost, MAX_QUEUES)
    }

    /// Takes a place for a connection of `user` to `vhost`, or answers 530 as RabbitMQ does.
    pub fn admit(self: &Arc<Self>, user: &str, vhost: &str) -> Result<Place, AmqpError> {
        let vmax = self.vhost_limit(vhost, MAX_CONNECTIONS);
        let umax = self.user_limit(user, MAX_CONNECTIONS);
        let mut c = self.counts.lock();
        if self.connection_max > 0 && c.node >= self.connection_max {
            return Err(AmqpError::not_allowed(format!(
                "connection refused: node connection limit ({}) is reached",
                self.connection_max
            )));
        }
        if let Some(vmax) = vmax.filter(|&m| c.vhosts.get(vhost).copied().unwrap_or(0) >= m) {
            return Err(AmqpError::not_allowed(format!(
                "access to vhost '{vhost}' refused for user '{user}': connection limit ({vmax}) is reached"
            )));
        }
        if let Some(umax) = umax.filter(|&m| c.users.get(user).copied().unwrap_or(0) >= m) {
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

    /// Takes a place for a channel of `user`, or answers 530 as RabbitMQ does past the user's
    /// max-channels (counted across all of the user's connections).
    pub fn open_channel(self: &Arc<Self>, user: &str) -> Result<ChannelPlace, AmqpError> {
        let max = self.user_limit(user, MAX_CHANNELS);
        let mut c = self.counts.lock();
        if let Some(max) = max.filter(|&m| c.channels.get(user).copied().unwrap_or(0) >= m) {
            return Err(AmqpError::not_allowed(format!(
                "number of channels opened for user '{user}' has reached the maximum allowed user limit of ({max})"
            )));
        }
        *c.channels.entry(user.to_string()).or_default() += 1;
        Ok(ChannelPlace {
            admission: self.clone(),
            user: user.to_string(),
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
        release(&mut c.vhosts, &self.vhost);
        release(&mut c.users, &self.user);
    }
}

/// One open channel's place in its user's count, given back on drop.
pub struct ChannelPlace {
    admission: Arc<Admission>,
    user: String,
}

impl Drop for ChannelPlace {
    fn drop(&mut self) {
        release(&mut self.admission.counts.lock().channels, &self.user);
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
    use crate::access::{hash_password, AccessFile, UserDef, VhostDef};
    use crate::config::{UserLimits, VhostLimits};

    fn access() -> Access {
        let mut f = AccessFile::default();
        for v in ["/", "v"] {
            f.vhosts.push(VhostDef {
                name: v.into(),
                description: String::new(),
            });
        }
        for u in ["u", "x", "y", "z"] {
            f.users.push(UserDef {
                name: u.into(),
                password_hash: hash_password("p"),
                hashing_algorithm: crate::access::HASH_SHA256.into(),
                tags: vec![],
                limits: Default::default(),
            });
        }
        Access::from_file(f, None).expect("access")
    }

    fn limits(json: serde_json::Value) -> crate::access::Limits {
        json.as_object().expect("object").clone()
    }

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
        l.users.insert(
            "u".into(),
            UserLimits {
                max_connections: 1,
                max_channels: 0,
            },
        );
        let a = Admission::new(&l, Arc::new(access()));
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

    #[test]
    fn runtime_limits_override_the_config() {
        let mut l = LimitsConfig::default();
        l.vhosts.insert(
            "v".into(),
            VhostLimits {
                max_connections: 1,
                max_queues: 3,
            },
        );
        let access = Arc::new(access());
        let a = Admission::new(&l, access.clone());
        assert_eq!(a.max_queues("v"), Some(3));
        assert_eq!(a.max_queues("/"), None);
        // A negative runtime value lifts the config's limit; 0 refuses everything.
        let v = LimitScope::Vhost;
        access
            .set_limits(
                v,
                "v",
                &limits(serde_json::json!({"max-connections": -1})),
                false,
            )
            .expect("set");
        let _p1 = a.admit("x", "v").expect("no limit now");
        let _p2 = a.admit("x", "v").expect("no limit now");
        access
            .set_limits(v, "v", &limits(serde_json::json!({"max-queues": 0})), true)
            .expect("set");
        assert_eq!(a.max_queues("v"), Some(0));
        // Replaced: max-connections is back to the config's 1, already exceeded.
        let e = a.admit("y", "v").err().expect("config limit again");
        assert_eq!(
            e.text,
            "NOT_ALLOWED - access to vhost 'v' refused for user 'y': connection limit (1) is reached"
        );
        access.clear_limit(v, "v", None).expect("clear");
        assert_eq!(a.max_queues("v"), Some(3));
        access
            .set_limits(
                v,
                "/",
                &limits(serde_json::json!({"max-connections": 0})),
                false,
            )
            .expect("set");
        assert!(a.admit("x", "/").is_err());
        let e = access
            .set_limits(
                v,
                "/",
                &limits(serde_json::json!({"max-channels": 1})),
                false,
            )
            .expect_err("unknown vhost limit");
        assert!(e.to_string().contains("Unrecognised terms"), "{e}");
    }

    #[test]
    fn user_channel_limit_counts_across_connections() {
        let access = Arc::new(access());
        let a = Admission::new(&LimitsConfig::default(), access.clone());
        let u = LimitScope::User;
        access
            .set_limits(
                u,
                "u",
                &limits(serde_json::json!({"max-channels": "2"})),
                false,
            )
            .expect("set");
        let c1 = a.open_channel("u").expect("first");
        let _c2 = a.open_channel("u").expect("second");
        let e = a.open_channel("u").err().expect("third");
        assert_eq!(e.code, 530);
        assert_eq!(
            e.text,
            "NOT_ALLOWED - number of channels opened for user 'u' has reached the maximum allowed user limit of (2)"
        );
        let _other = a.open_channel("x").expect("another user");
        drop(c1);
        let _c3 = a.open_channel("u").expect("a place was given back");
        access
            .clear_limit(u, "u", Some(MAX_CHANNELS))
            .expect("clear");
        let _c4 = a.open_channel("u").expect("no limit");
        let e = access
            .set_limits(
                u,
                "u",
                &limits(serde_json::json!({"max-channels": "many"})),
                false,
            )
            .expect_err("not a number");
        assert_eq!(
            e.to_string(),
            "max-channels should be a number, actually was \"many\""
        );
    }
}
