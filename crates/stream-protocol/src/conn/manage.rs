//! A connection's commands that manage streams: create and delete (of streams and super
//! streams), metadata, and a super stream's route and partitions.

use bytes::Bytes;
use warren_broker::access::Perm;
use warren_broker::vhost::QueueSpec;
use warren_protocol::{FieldTable, FieldValue};

use super::Conn;
use crate::frame::*;

impl Conn {
    pub(super) fn streams_response(&self, key: u16, corr: u32, found: Option<Vec<String>>) {
        self.out.send(|w| {
            w.begin(key | RESPONSE, 1).u32(corr);
            match &found {
                Some(streams) => {
                    w.u16(code::OK).u32(streams.len() as u32);
                    for s in streams {
                        w.string(s);
                    }
                }
                None => {
                    w.u16(code::STREAM_DOES_NOT_EXIST).u32(0);
                }
            }
            w.end();
        });
    }

    pub(super) fn create_super_stream(
        &self,
        name: &str,
        partitions: &[String],
        keys: &[String],
        arguments: &[(String, String)],
    ) -> u16 {
        if !self.permitted(Perm::Configure, name)
            || partitions
                .iter()
                .any(|p| !self.permitted(Perm::Configure, p))
        {
            return code::ACCESS_REFUSED;
        }
        let Some(mut args) = stream_arguments(arguments) else {
            return code::PRECONDITION_FAILED;
        };
        // RabbitMQ spreads a super stream's leaders unless told otherwise.
        if !args.0.iter().any(|(k, _)| &**k == "x-queue-leader-locator") {
            args.0.push((
                "x-queue-leader-locator".into(),
                FieldValue::LongStr(Bytes::from_static(b"balanced")),
            ));
        }
        match crate::super_stream::create(self.vhost(), name, partitions, keys, &args, self.id) {
            Ok(()) => code::OK,
            Err(crate::super_stream::Refused::Exists(why)) => {
                tracing::debug!(
                    conn = self.id,
                    super_stream = name,
                    why,
                    "super stream refused"
                );
                code::STREAM_ALREADY_EXISTS
            }
            Err(crate::super_stream::Refused::Invalid(why)) => {
                tracing::debug!(
                    conn = self.id,
                    super_stream = name,
                    why,
                    "super stream refused"
                );
                code::PRECONDITION_FAILED
            }
        }
    }

    pub(super) fn create(&mut self, corr: u32, name: &str, arguments: &[(String, String)]) {
        if !self.permitted(Perm::Configure, name) {
            return self.respond(CREATE, corr, code::ACCESS_REFUSED);
        }
        // A queue of that name already: "already exists" when it is declared as asked, a
        // failed precondition when not (RabbitMQ checks the equivalence first).
        let existed = self.vhost().queue(name).is_some();
        let Some(extra) = stream_arguments(arguments) else {
            return self.respond(CREATE, corr, code::PRECONDITION_FAILED);
        };
        let mut args = FieldTable(vec![(
            "x-queue-type".into(),
            FieldValue::LongStr(Bytes::from_static(b"stream")),
        )]);
        args.0.extend(extra.0);
        let spec = QueueSpec {
            name,
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: &args,
            conn_id: self.id,
            server_named: false,
            home: None,
            members: None,
        };
        let code = match self.vhost().declare_queue(&spec) {
            Ok(_) if existed => code::STREAM_ALREADY_EXISTS,
            Ok(_) => code::OK,
            Err(e) => {
                tracing::debug!(conn = self.id, stream = name, error = %e.text, "stream create refused");
                code::PRECONDITION_FAILED
            }
        };
        self.respond(CREATE, corr, code);
    }

    pub(super) fn delete(&mut self, corr: u32, name: &str) {
        if !self.permitted(Perm::Configure, name) {
            return self.respond(DELETE, corr, code::ACCESS_REFUSED);
        }
        if self.stream(name).is_none() {
            return self.respond(DELETE, corr, code::STREAM_DOES_NOT_EXIST);
        }
        let code = match self.vhost().delete_queue(name, false, false, Some(self.id)) {
            Ok(_) => code::OK,
            Err(_) => code::STREAM_DOES_NOT_EXIST,
        };
        self.respond(DELETE, corr, code);
    }

    /// Each stream's leader and replicas, and where each listens: this node at the address
    /// the client reached, another at its link address's host and its stream port. A
    /// replicated stream's leader is where a client publishes, its replicas where it
    /// consumes; one whose leader is unknown (an election) or has no stream port is not
    /// available, as RabbitMQ answers.
    pub(super) async fn metadata(&self, corr: u32, streams: &[String]) {
        let me = (self.local.ip().to_string(), self.local.port());
        let cluster = warren_broker::cluster::Cluster::of(&self.broker);
        // Brokers by reference: (node, host, port); this node's first.
        let mut brokers: Vec<(Option<String>, String, u16)> = vec![(None, me.0, me.1)];
        let mut answers: Vec<Result<(u16, Vec<u16>), u16>> = Vec::new();
        for s in streams {
            let Some(q) = self.stream(s) else {
                answers.push(Err(code::STREAM_DOES_NOT_EXIST));
                continue;
            };
            let (Some(c), Some((_, members))) = (cluster.as_ref(), q.group()) else {
                answers.push(Ok((0, Vec::new())));
                continue;
            };
            let mut refs = Vec::new();
            for node in std::iter::once(q.leader()).chain(members.into_iter().map(Some)) {
                let Some(node) = node else {
                    refs.push(None);
                    continue;
                };
                let known = brokers
                    .iter()
                    .position(|(n, _, _)| n.as_deref() == Some(&*node));
                let r = match known {
                    Some(i) => Some(i as u16),
                    None if node == self.broker.config.node_name => Some(0),
                    None => match c.stream_endpoint(&node).await {
                        Some((host, port)) => {
                            brokers.push((Some(node), host, port));
                            Some((brokers.len() - 1) as u16)
                        }
                        None => None,
                    },
                };
                refs.push(r);
            }
            match refs.first().copied().flatten() {
                Some(leader) => {
                    let mut replicas: Vec<u16> = refs[1..].iter().flatten().copied().collect();
                    replicas.retain(|r| *r != leader);
                    replicas.dedup();
                    answers.push(Ok((leader, replicas)));
                }
                None => answers.push(Err(code::STREAM_NOT_AVAILABLE)),
            }
        }
        self.out.send(|w| {
            w.begin(METADATA | RESPONSE, 1)
                .u32(corr)
                .u32(brokers.len() as u32);
            for (i, (_, host, port)) in brokers.iter().enumerate() {
                w.u16(i as u16).string(host).u32(*port as u32);
            }
            w.u32(streams.len() as u32);
            for (s, a) in streams.iter().zip(&answers) {
                w.string(s);
                match a {
                    Ok((leader, replicas)) => {
                        w.u16(code::OK).u16(*leader).u32(replicas.len() as u32);
                        for r in replicas {
                            w.u16(*r);
                        }
                    }
                    Err(c) => {
                        w.u16(*c).u16(u16::MAX).u32(0);
                    }
                }
            }
            w.end();
        });
    }
}

/// A create's arguments as a stream's `x-` arguments (RabbitMQ's `stream_queue_arguments`);
/// `None` when a number does not read. Unknown keys are left out, as RabbitMQ leaves them.
fn stream_arguments(arguments: &[(String, String)]) -> Option<FieldTable> {
    let mut args = FieldTable::new();
    for (k, v) in arguments {
        let value = match k.as_str() {
            "max-length-bytes" | "stream-max-segment-size-bytes" | "initial-cluster-size" => {
                FieldValue::I64(v.parse::<i64>().ok()?)
            }
            "max-age" | "queue-leader-locator" => FieldValue::LongStr(Bytes::from(v.clone())),
            _ => continue,
        };
        args.0.push((format!("x-{k}").as_str().into(), value));
    }
    Some(args)
}
