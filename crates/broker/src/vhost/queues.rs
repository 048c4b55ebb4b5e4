//! Declaring and deleting queues: proposed (in a cluster, with the queue's home and members)
//! and made when the change is applied; the vhost's queue limit; and the `x-expires` sweep.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use warren_protocol::method::{QueueDeclare, QueueDelete};
use warren_routing::Destination;

use super::equivalence::{check_args_equivalent, inequivalent};
use super::{DeletedQueue, QueueSpec, VHost};
use crate::definitions::op::{Applying, QueueMeta};
use crate::definitions::Definition;
use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Queue, QueueOptions, QueueRef};

impl VHost {
    pub fn no_queue(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no queue '{name}' in vhost '{}'", self.name))
    }

    /// Declares (or checks) a queue; returns it.
    pub fn declare_queue(self: &Arc<Self>, spec: &QueueSpec<'_>) -> AmqpResult<QueueRef> {
        let q = self.declare_queue_at(spec, None)?;
        self.churn.queue_declared.fetch_add(1, Relaxed);
        Ok(q)
    }

    /// [`VHost::declare_queue`], or (`at`) the declare being applied: a committed entry's (a new
    /// replicated queue's group and a new durable queue's log are named after its index), or a
    /// single node's. A new queue is proposed (`proposer`) and made when that comes back here.
    pub(super) fn declare_queue_at(
        self: &Arc<Self>,
        spec: &QueueSpec<'_>,
        at: Option<Applying>,
    ) -> AmqpResult<QueueRef> {
        if spec.passive && at.is_none() {
            let existing = self.defs.lock().queues.get(spec.name).cloned();
            if let Some(q) = existing {
                q.check_home()?;
            }
        }
        if let (false, Some(p)) = (spec.passive, self.proposer(at)) {
            let existing = self.defs.lock().queues.get(spec.name).cloned();
            // Redeclaring what exists needs no change: checked here, as a passive declare.
            if let Some(q) = existing {
                // Its home must be up, as RabbitMQ checks with the queue's process.
                q.check_home()?;
                return self.declare_queue_once(spec, at);
            }
            let m = QueueDeclare {
                queue: spec.name.into(),
                durable: spec.durable,
                exclusive: spec.exclusive,
                auto_delete: spec.auto_delete,
                arguments: spec.arguments.clone(),
                ..Default::default()
            };
            let (home, members) = match &self.cluster {
                Some(c) => self.placement(&**c, spec)?,
                None => (String::new(), Vec::new()),
            };
            let meta = QueueMeta {
                home,
                owner: spec.exclusive.then_some(spec.conn_id),
                server_named: spec.server_named,
                group: None,
                members,
            };
            p.vhost_change(&self.name, m.into(), Some(meta))?;
            let q = self.defs.lock().queues.get(spec.name).cloned();
            if let (Some(c), Some(q)) = (&self.cluster, &q) {
                // declare-ok once a replicated queue's group has its first leader.
                c.first_leader(q)?;
            }
            return q.ok_or_else(|| self.no_queue(spec.name));
        }
        self.declare_queue_once(spec, at)
    }

    /// A new queue's home in a cluster, by RabbitMQ's locators (its argument, else its policy),
    /// and its members if it is replicated.
    fn placement(
        &self,
        c: &dyn crate::vhost::ClusterNode,
        spec: &QueueSpec<'_>,
    ) -> AmqpResult<(String, Vec<String>)> {
        let home = match spec.home {
            Some(h) => h.to_string(),
            // An exclusive queue lives with its connection.
            None if spec.exclusive => c.me().to_string(),
            None => {
                let policies = self.policies.lock();
                let from_policy =
                    crate::policy::matching(&policies, spec.name, true).and_then(|p| {
                        ["queue-master-locator", "queue-leader-locator"]
                            .iter()
                            .find_map(|k| {
                                p.definition
                                    .get(*k)
                                    .and_then(|v| v.as_str())
                                    .map(String::from)
                            })
                    });
                let from_args = ["x-queue-master-locator", "x-queue-leader-locator"]
                    .iter()
                    .find_map(|k| {
                        spec.arguments
                            .get(k)
                            .and_then(|v| v.as_str())
                            .map(String::from)
                    });
                drop(policies);
                c.place(from_args.or(from_policy).as_deref())
            }
        };
        let policy = || {
            let policies = self.policies.lock();
            crate::policy::matching(&policies, spec.name, true).map(|p| p.definition.clone())
        };
        let members = c.members(&home, spec.arguments, spec.exclusive, &policy)?;
        Ok((home, members))
    }

    fn declare_queue_once(
        self: &Arc<Self>,
        spec: &QueueSpec<'_>,
        at: Option<Applying>,
    ) -> AmqpResult<QueueRef> {
        // RabbitMQ checks the name before looking the queue up: a client-chosen 'amq.' name is
        // refused even when that queue exists (a server-named 'amq.gen-' one declared again).
        if !spec.passive && !spec.server_named && spec.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        let mut defs = self.defs.lock();
        if let Some(q) = defs.queues.get(spec.name) {
            if let Some(owner) = q.options().exclusive_owner {
                if owner != spec.conn_id {
                    return Err(self.locked(spec.name));
                }
            }
            q.touch();
            if spec.passive {
                return Ok(q.clone());
            }
            let (n, v, o) = (spec.name, &*self.name, q.options());
            if o.durable != spec.durable {
                return Err(inequivalent(
                    "queue",
                    "durable",
                    n,
                    v,
                    spec.durable,
                    o.durable,
                ));
            }
            if o.exclusive_owner.is_some() != spec.exclusive {
                return Err(self.locked(spec.name));
            }
            if o.auto_delete != spec.auto_delete {
                return Err(inequivalent(
                    "queue",
                    "auto_delete",
                    n,
                    v,
                    spec.auto_delete,
                    o.auto_delete,
                ));
            }
            check_args_equivalent(n, v, spec.arguments, &o.arguments)?;
            return Ok(q.clone());
        }
        if spec.passive {
            return Err(self.no_queue(spec.name));
        }
        let max = self.max_queues.load(std::sync::atomic::Ordering::Relaxed);
        if max != u32::MAX
            && defs.queues.len() >= max as usize
            && !self.loading.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(crate::admission::queue_limit_reached(
                spec.name, &self.name, max,
            ));
        }
        let args = super::queue_type::check(spec, &self.name)?;
        let name: Arc<str> = spec.name.into();
        let options = QueueOptions {
            durable: spec.durable,
            exclusive_owner: spec.exclusive.then_some(spec.conn_id),
            auto_delete: spec.auto_delete,
            arguments: spec.arguments.clone(),
            args,
        };
        let remote_home = match (&self.cluster, spec.home) {
            (Some(c), Some(h)) if h != c.me() => Some((c, h)),
            _ => None,
        };
        if let (Some(c), Some((group, members)), true) = (
            &self.cluster,
            spec.members,
            crate::queue::args::is_stream(spec.arguments),
        ) {
            // A replicated stream: each member holds a copy (its log named after the group);
            // a node that is none, a read copy fed from theirs.
            let group = group.or(at.map(|a| a.index)).unwrap_or(0);
            let q = self.open_stream(name.clone(), options, group)?;
            if let Some(s) = q.stream() {
                if let Err(e) = c.clone().stream_member(s, group, members.to_vec()) {
                    q.mark_deleted();
                    return Err(e);
                }
            }
            defs.queues.insert(name, q.clone());
            self.publish_snapshot(&defs);
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, group = %format!("{group:016x}"), members = ?members, "stream declared");
            return Ok(q);
        }
        if let (Some(c), Some((group, members))) = (&self.cluster, spec.members) {
            // A replicated queue: every node holds the same handle; members run its group.
            let group = group.or(at.map(|a| a.index)).unwrap_or(0);
            let q =
                c.clone()
                    .replicated_queue(name.clone(), self, options, group, members.to_vec());
            defs.queues.insert(name, q.clone());
            self.publish_snapshot(&defs);
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, group = %format!("{group:016x}"), members = ?members, "quorum queue declared");
            return Ok(q);
        }
        if let Some((c, home)) = remote_home {
            let q =
                c.clone()
                    .remote_queue(name.clone(), self.name.clone(), options, home.to_string());
            defs.queues.insert(name, q.clone());
            self.publish_snapshot(&defs);
            tracing::info!(vhost = %self.name, queue = spec.name, home, "queue declared");
            return Ok(q);
        }
        // Exclusive queues die with their connection, so their messages are never written.
        // A cluster's queue log is named after the Raft entry that declared it, so replaying
        // the log at restart finds the same log again.
        if crate::queue::args::is_stream(spec.arguments) {
            // Validated as durable, not exclusive: its log is always on disk.
            let q = self.open_stream(name.clone(), options, rand::random::<u64>())?;
            defs.queues.insert(name, q.clone());
            if let Err(e) = self.changed(&mut defs, Self::queue_def(&q).into_iter().collect()) {
                q.mark_deleted();
                return Err(e);
            }
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, "stream declared");
            return Ok(q);
        }
        if let Some(q) = self.open_on_machine(&name, &options, None) {
            defs.queues.insert(name, q.clone());
            if let Err(e) = self.changed(&mut defs, Self::queue_def(&q).into_iter().collect()) {
                q.mark_deleted();
                return Err(e);
            }
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, "quorum queue declared (a group of one member)");
            return Ok(q);
        }
        let durable_id = (spec.durable && !spec.exclusive).then(|| {
            at.filter(|a| !a.local)
                .map_or_else(rand::random::<u64>, |a| a.index)
        });
        let backing = match self.backing(durable_id) {
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                return Err(AmqpError::internal_error(format!(
                    "cannot create the log of queue '{}': {e}",
                    spec.name
                )))
            }
            None => None,
        };
        let q = QueueRef::Local(Queue::with_log(
            name.clone(),
            self.name.clone(),
            options,
            Arc::downgrade(self),
            backing,
        ));
        defs.queues.insert(name, q.clone());
        if let Err(e) = self.changed(&mut defs, Self::queue_def(&q).into_iter().collect()) {
            q.mark_deleted(); // its new log goes with it
            return Err(e);
        }
        self.churn.queue_created.fetch_add(1, Relaxed);
        tracing::info!(vhost = %self.name, queue = spec.name, durable = spec.durable, exclusive = spec.exclusive, auto_delete = spec.auto_delete, "queue declared");
        Ok(q)
    }

    pub fn locked(&self, name: &str) -> AmqpError {
        AmqpError::resource_locked(format!(
            "cannot obtain exclusive access to locked queue '{name}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
            self.name
        ))
    }

    /// Deletes a queue. Missing is not an error (RabbitMQ answers delete-ok with 0).
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<DeletedQueue> {
        self.delete_queue_at(name, if_unused, if_empty, conn_id, None)
    }

    /// [`VHost::delete_queue`], or (`at`) the delete a committed entry carries.
    pub fn delete_queue_at(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        conn_id: Option<u64>,
        at: Option<Applying>,
    ) -> AmqpResult<DeletedQueue> {
        if let Some(p) = self.proposer(at) {
            let Some(q) = self.defs.lock().queues.get(name).cloned() else {
                return Ok(DeletedQueue {
                    message_count: 0,
                    consumers: Vec::new(),
                });
            };
            if let (Some(owner), Some(me)) = (q.options().exclusive_owner, conn_id) {
                if owner != me {
                    return Err(self.locked(name));
                }
            }
            let counted = match (&self.cluster, q.home_counts()) {
                // A queue that lives or is led elsewhere is asked (fresh counts).
                (_, Some(n)) => {
                    let n = n?;
                    deletable(&q, n.consumers, n.messages, if_unused, if_empty)?
                }
                (Some(_), None) => deletable(
                    &q,
                    q.consumer_count(),
                    q.message_count(),
                    if_unused,
                    if_empty,
                )?,
                // On a single node the count comes from the delete itself; counted before it
                // only for if-empty, since counting expires the head, and a deleted queue's
                // messages are not dead-lettered.
                (None, None) => {
                    let messages = if if_empty { q.message_count() } else { 0 };
                    deletable(&q, q.consumer_count(), messages, if_unused, if_empty)?
                }
            };
            // RabbitMQ answers delete-ok with 0 messages for a stream.
            let counted = if q.stream().is_some() { 0 } else { counted };
            let m = QueueDelete {
                queue: name.into(),
                ..Default::default()
            };
            // Its consumers are told where the delete is made (`apply_method`).
            let deleted = p.vhost_change_counted(&self.name, m.into(), None)?;
            let message_count = match &self.cluster {
                Some(_) => counted,
                None => deleted.unwrap_or(0),
            };
            return Ok(DeletedQueue {
                message_count,
                consumers: Vec::new(),
            });
        }
        let mut defs = self.defs.lock();
        let Some(q) = defs.queues.get(name).cloned() else {
            return Ok(DeletedQueue {
                message_count: 0,
                consumers: Vec::new(),
            });
        };
        if let (Some(owner), Some(me)) = (q.options().exclusive_owner, conn_id) {
            if owner != me {
                return Err(self.locked(name));
            }
        }
        // Counted only for if-empty: counting expires the head, and a deleted queue's messages
        // are not dead-lettered.
        let messages = if if_empty { q.message_count() } else { 0 };
        deletable(&q, q.consumer_count(), messages, if_unused, if_empty)?;
        defs.queues.remove(name);
        let mut ops: Vec<Definition> = Self::kept(&q)
            .then(|| {
                Definition::QueueDelete(QueueDelete {
                    queue: name.into(),
                    ..Default::default()
                })
            })
            .into_iter()
            .collect();
        Self::remove_bindings_to(
            &mut defs,
            &|d| matches!(d, Destination::Queue(x) if x.ptr_eq(&q)),
            &mut ops,
        );
        self.changed(&mut defs, ops)?;
        drop(defs);
        let (message_count, consumers) = q.mark_deleted();
        self.churn.queue_deleted.fetch_add(1, Relaxed);
        tracing::info!(vhost = %self.name, queue = name, "queue deleted");
        Ok(DeletedQueue {
            message_count,
            consumers,
        })
    }

    /// Deletes `x-expires` queues whose lease ran out.
    pub fn delete_unused(&self) {
        let now = crate::clock::now_ms();
        let due: Vec<QueueRef> = self
            .snapshot
            .load()
            .queues
            .values()
            .filter(|q| q.lease_expired(now))
            .cloned()
            .collect();
        for q in due {
            tracing::info!(vhost = %self.name, queue = %q.name(), "queue expired (x-expires)");
            let _ = self.delete_queue(q.name(), false, false, None);
        }
    }
}

/// queue.delete's `if-unused` and `if-empty` against the queue's counts (406, in RabbitMQ's
/// words); its message count if it may go.
fn deletable(
    q: &QueueRef,
    consumers: u32,
    messages: u32,
    if_unused: bool,
    if_empty: bool,
) -> AmqpResult<u32> {
    if if_unused && consumers > 0 {
        return Err(AmqpError::precondition_failed(format!(
            "{} in use",
            q.describe()
        )));
    }
    if if_empty && messages > 0 {
        return Err(AmqpError::precondition_failed(format!(
            "{} not empty",
            q.describe()
        )));
    }
    Ok(messages)
}
