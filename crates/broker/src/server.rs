//! The broker: configuration, users, vhosts, and the accept loop with graceful shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::alarms::{Alarms, Thresholds};
use crate::auth::Users;
use crate::config::Config;
use crate::connection;
use crate::limits;
use crate::persist::Persister;
use crate::vhost::{Storage, VHost};

pub struct Broker {
    pub config: Config,
    pub users: Users,
    vhosts: HashMap<String, Arc<VHost>>,
    next_connection_id: AtomicU64,
    pub persister: Arc<Persister>,
    pub alarms: Arc<Alarms>,
}

impl Broker {
    /// Opens the data directory (recovering durable definitions and messages) and builds the
    /// broker. Vhost `v` lives in `<data_dir>/vhosts/<hex of v>`.
    pub fn new(config: Config) -> std::io::Result<Arc<Broker>> {
        let users = Users::from_config(&config);
        let persister = Persister::start();
        let mut vhosts = HashMap::new();
        for v in &config.vhosts {
            let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
            let dir = config.data_dir.join("vhosts").join(if hex.is_empty() {
                "00".to_string()
            } else {
                hex
            });
            vhosts.insert(
                v.clone(),
                VHost::open(
                    v,
                    Storage {
                        dir,
                        persister: persister.clone(),
                    },
                )?,
            );
        }
        let alarms = Alarms::new(
            Thresholds::from_limits(&config.limits),
            config.data_dir.clone(),
        );
        Ok(Arc::new(Broker {
            config,
            users,
            vhosts,
            next_connection_id: AtomicU64::new(1),
            persister,
            alarms,
        }))
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.get(name).cloned()
    }

    pub fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Expires messages whose TTL passed in queues nobody is touching (consumers and publishers
    /// expire at the head as they go; this covers idle queues, so dead-lettering by TTL is timely).
    async fn sweep_expired(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::TTL_SWEEP_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for v in self.vhosts.values() {
                for q in v.expiring_queues() {
                    q.expire();
                }
                v.delete_unused();
            }
        }
    }

    /// Accepts connections until `shutdown` turns true, then asks every connection to close
    /// (connection.close 320) and waits for them, bounded.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let sweeper = tokio::spawn(self.clone().sweep_expired());
        let alarms = tokio::spawn(self.alarms.clone().run());
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        conns.spawn(connection::serve(self.clone(), stream, peer, shutdown.clone()));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = shutdown.changed() => break,
            }
            while conns.try_join_next().is_some() {}
        }
        drop(listener);
        sweeper.abort();
        alarms.abort();
        let n = conns.len();
        if n > 0 {
            tracing::info!(connections = n, "closing client connections");
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        let p = self.persister.clone();
        let _ = tokio::task::spawn_blocking(move || p.stop()).await;
    }
}
