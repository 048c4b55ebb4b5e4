//! A connection's subscriptions: subscribe (a plain one starts at once; a single active
//! consumer's joins its group), and a group's member made active or asked to give way.

use warren_broker::access::Perm;
use warren_broker::queue::QueueRef;

use super::{Conn, SacMember};
use crate::frame::*;
use crate::sac::GroupKey;
use crate::subscription::{Filter, Subscription};

impl Conn {
    /// Subscription `id` became its group's active member: the client is asked where to start
    /// (a consumer update); its answer starts it.
    pub(super) fn activate(&mut self, id: u8) {
        if !self.sac.contains_key(&id) || self.subscriptions.contains_key(&id) {
            return;
        }
        self.next_corr = self.next_corr.wrapping_add(1);
        let corr = self.next_corr;
        self.updates.insert(corr, (id, true));
        self.out
            .send(|w| w.begin(CONSUMER_UPDATE, 1).u32(corr).u8(id).u8(1).end());
    }

    /// Subscription `id` is to give way to another member of its group (a super stream's
    /// partition): it stops receiving, and its client is told (a consumer update with
    /// `active=false`); its answer lets the group activate the other one.
    pub(super) fn deactivate(&mut self, id: u8) {
        if !self.sac.contains_key(&id) {
            return;
        }
        if let Some(s) = self.subscriptions.remove(&id) {
            s.stop();
        }
        self.next_corr = self.next_corr.wrapping_add(1);
        let corr = self.next_corr;
        self.updates.insert(corr, (id, false));
        self.out
            .send(|w| w.begin(CONSUMER_UPDATE, 1).u32(corr).u8(id).u8(0).end());
    }

    /// The client's answer to a consumer update: an activation starts the subscription at its
    /// offset; a deactivation lets its group go on.
    pub(super) fn activated(&mut self, corr: u32, offset: Option<OffsetSpec>) {
        let Some((id, active)) = self.updates.remove(&corr) else {
            return;
        };
        let Some(m) = self.sac.get(&id) else {
            return;
        };
        if !active {
            let key = m.key.clone();
            self.groups.stepped_down(&key, self.id, id);
            return;
        }
        let started = Subscription::start(
            m.stream.clone(),
            id,
            offset.unwrap_or(OffsetSpec::Next),
            m.credit,
            m.filter.clone(),
            self.out.clone(),
            self.frame_max,
            || {},
        );
        match started {
            Ok(s) => {
                self.subscriptions.insert(id, s);
            }
            Err(e) => {
                tracing::debug!(conn = self.id, subscription = id, error = %e, "active consumer not started")
            }
        }
    }

    pub(super) fn subscribe(
        &mut self,
        corr: u32,
        id: u8,
        name: &str,
        offset: OffsetSpec,
        credit: u16,
        properties: &[(String, String)],
    ) {
        if self.subscriptions.contains_key(&id) || self.sac.contains_key(&id) {
            return self.respond(SUBSCRIBE, corr, code::SUBSCRIPTION_ID_ALREADY_EXISTS);
        }
        if !self.permitted(Perm::Read, name) {
            return self.respond(SUBSCRIBE, corr, code::ACCESS_REFUSED);
        }
        let Some(QueueRef::Stream(s)) = self.stream(name) else {
            return self.respond(SUBSCRIBE, corr, code::STREAM_DOES_NOT_EXIST);
        };
        let prop = |k: &str| {
            properties
                .iter()
                .find(|(p, _)| p == k)
                .map(|(_, v)| v.as_str())
        };
        let filter = Filter::from_properties(properties);
        if prop("single-active-consumer") == Some("true") {
            // RabbitMQ needs the group's name.
            let Some(group) = prop("name") else {
                return self.respond(SUBSCRIBE, corr, code::PRECONDITION_FAILED);
            };
            let key: GroupKey = (
                self.vhost().name.to_string(),
                name.to_string(),
                group.to_string(),
            );
            // A super stream's partition: its index among the partitions (RabbitMQ's rule
            // spreads a group's active members over them).
            let partition = prop("super-stream").and_then(|ss| {
                crate::super_stream::partitions(self.vhost(), ss)?
                    .iter()
                    .position(|p| p == name)
            });
            self.sac.insert(
                id,
                SacMember {
                    key: key.clone(),
                    stream: s,
                    credit,
                    filter,
                },
            );
            self.respond(SUBSCRIBE, corr, code::OK);
            // The group tells this connection (an event) whether this member is active.
            self.groups
                .join(key, self.id, id, self.events.clone(), partition);
            return;
        }
        let out = self.out.clone();
        let max = self.frame_max;
        match Subscription::start(s, id, offset, credit, filter, out.clone(), max, || {
            out.send(|w| w.response(SUBSCRIBE, corr, code::OK))
        }) {
            Ok(sub) => {
                self.subscriptions.insert(id, sub);
            }
            Err(e) => {
                tracing::debug!(conn = self.id, stream = name, error = %e, "subscribe refused");
                self.respond(SUBSCRIBE, corr, code::INTERNAL_ERROR);
            }
        }
    }
}
