//! Connection tracking: what the management API lists about each open connection, and the
//! handle that asks a connection to close (320 CONNECTION_FORCED) from outside its task.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use warren_protocol::FieldTable;

use crate::channel::ChannelShared;

pub struct ConnInfo {
    /// The node serving it (its pids carry the name).
    pub node: Arc<str>,
    /// Its output (octets sent, for the management API).
    pub outbox: Arc<crate::outbox::Outbox>,
    /// Octets and reads received; written by the connection's task only.
    pub recv_oct: AtomicU64,
    pub recv_cnt: AtomicU64,
    pub id: u64,
    /// RabbitMQ's connection name: "peer -> local".
    pub name: String,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// Unix time in ms.
    pub connected_at_ms: u64,
    pub user: String,
    pub vhost: String,
    /// The client's properties (product, version, connection_name, …) as sent, in the client's
    /// order: rabbitmqctl lists them that way. Kept once, as decoded; the management API's JSON
    /// is made when asked ([`Self::client_properties_json`]), not held by every connection.
    pub client_table: FieldTable,
    /// Channels opened on this connection, for `list_channels`; closed ones are dropped as
    /// more open, and skipped when listing.
    open_channels: Mutex<Vec<Arc<ChannelShared>>>,
    pub channels: AtomicU32,
    pub frame_max: AtomicU64,
    pub heartbeat_s: AtomicU32,
    close_reason: Mutex<Option<String>>,
    close: tokio::sync::Notify,
}

impl ConnInfo {
    /// `addrs`: the peer's and ours.
    pub fn new(
        node: Arc<str>,
        outbox: Arc<crate::outbox::Outbox>,
        id: u64,
        (peer, local): (SocketAddr, SocketAddr),
        user: String,
        vhost: String,
        client_properties: FieldTable,
    ) -> ConnInfo {
        ConnInfo {
            node,
            outbox,
            recv_oct: AtomicU64::new(0),
            recv_cnt: AtomicU64::new(0),
            id,
            name: format!("{peer} -> {local}"),
            peer,
            local,
            connected_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            user,
            vhost,
            client_table: client_properties,
            open_channels: Mutex::new(Vec::new()),
            channels: AtomicU32::new(0),
            frame_max: AtomicU64::new(0),
            heartbeat_s: AtomicU32::new(0),
            close_reason: Mutex::new(None),
            close: tokio::sync::Notify::new(),
        }
    }

    /// The client's properties as the management API shows them.
    pub fn client_properties_json(&self) -> serde_json::Value {
        crate::json::table_to_json(&self.client_table)
    }

    /// Asks the connection to close with 320 CONNECTION_FORCED and `reason`.
    pub fn force_close(&self, reason: &str) {
        self.close_reason
            .lock()
            .get_or_insert_with(|| reason.to_string());
        self.close.notify_one();
    }

    /// Resolves once [`force_close`](Self::force_close) was called; returns the reason.
    pub async fn closed(&self) -> String {
        self.close.notified().await;
        self.close_reason.lock().clone().unwrap_or_default()
    }

    pub fn set_channels(&self, n: usize) {
        self.channels.store(n as u32, Ordering::Relaxed);
    }

    /// Records a channel just opened (channel.open), for listings.
    pub fn channel_opened(&self, ch: Arc<ChannelShared>) {
        let mut chs = self.open_channels.lock();
        chs.retain(|c| !c.is_closed());
        chs.push(ch);
    }

    /// The open channels, by channel number.
    pub fn channels(&self) -> Vec<Arc<ChannelShared>> {
        let mut chs: Vec<_> = self
            .open_channels
            .lock()
            .iter()
            .filter(|c| !c.is_closed())
            .cloned()
            .collect();
        chs.sort_by_key(|c| c.id);
        chs
    }

    /// rabbitmqctl's `pid` of this connection. Warren has no Erlang processes; the form is an
    /// Erlang pid's, as scripts expect, and names the connection: `<NODE.1.ID.0>`.
    pub fn pid(&self) -> String {
        format!("<{}.1.{}.0>", self.node, self.id)
    }

    /// The `pid` of channel `number` on this connection: `<NODE.1.ID.NUMBER>` (never 0).
    pub fn channel_pid(&self, number: u16) -> String {
        format!("<{}.1.{}.{number}>", self.node, self.id)
    }
}
