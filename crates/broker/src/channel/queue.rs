//! The queue class: queue.declare (the direct reply-to pseudo-queue included), bind, unbind,
//! purge and delete, each checked against the user's permissions where RabbitMQ's
//! `rabbit_channel` checks them, then done by the vhost.

use std::sync::Arc;

use warren_protocol::method::{
    QueueBind, QueueBindOk, QueueDeclare, QueueDeclareOk, QueueDelete, QueueDeleteOk, QueuePurge,
    QueuePurgeOk, QueueUnbind, QueueUnbindOk,
};
use warren_protocol::ByteString;

use super::names::strip_cr_lf;
use super::{Channel, Ctx};
use crate::access::{Perm, Resource};
use crate::error::{AmqpError, AmqpResult};
use crate::queue::notify_cancelled;
use crate::vhost::gen_name;
use crate::vhost::{QueueSpec, VHost, DIRECT_REPLY_TO};

impl Channel {
    /// queue.declare (passive or not); a server-named queue gets an `amq.gen-` name.
    pub(super) fn queue_declare(&mut self, d: QueueDeclare, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        if d.queue.starts_with(DIRECT_REPLY_TO) {
            return self.declare_direct_reply_to(d, ctx.vhost);
        }
        let vhost = ctx.vhost;
        let name = strip_cr_lf(&d.queue);
        let server_named = name.is_empty() && !d.passive;
        let name = if server_named {
            ByteString::from(gen_name("amq.gen-"))
        } else {
            name
        };
        // A client-chosen 'amq.' name gets the reserved-prefix refusal from the vhost.
        if !d.passive && (server_named || !name.starts_with("amq.")) {
            self.allow(ctx, Perm::Configure, Resource::Queue, &name)?;
            if let Some(dlx) = d
                .arguments
                .get("x-dead-letter-exchange")
                .and_then(|v| v.as_str())
            {
                self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
                self.allow(ctx, Perm::Write, Resource::Exchange, dlx)?;
            }
        }
        let q = vhost.declare_queue(&QueueSpec {
            name: &name,
            passive: d.passive,
            durable: d.durable,
            exclusive: d.exclusive,
            auto_delete: d.auto_delete,
            arguments: &d.arguments,
            conn_id: ctx.conn_id,
            server_named,
            home: None,
            members: None,
        })?;
        if q.options().exclusive_owner == Some(ctx.conn_id)
            && !ctx.exclusive_queues.iter().any(|x| x.ptr_eq(&q))
        {
            ctx.exclusive_queues.push(q.clone());
        }
        self.last_queue = Some(name.clone());
        if !d.nowait {
            self.reply(QueueDeclareOk {
                queue: name,
                message_count: q.message_count(),
                consumer_count: q.consumer_count(),
            });
        }
        Ok(())
    }

    // RabbitMQ answers any declare of the direct reply-to pseudo-queue, passive or not,
    // whatever its flags and arguments, with declare-ok: 0 messages, 1 consumer; the
    // same for a requester's encoded name (`amq.rabbitmq.reply-to.<token>`, as its
    // replies' reply_to reads) while that requester consumes, else 404.
    fn declare_direct_reply_to(&mut self, d: QueueDeclare, vhost: &Arc<VHost>) -> AmqpResult<()> {
        let name = strip_cr_lf(&d.queue);
        if &*name != DIRECT_REPLY_TO && !vhost.direct_reply_exists(&name) {
            return Err(vhost.no_queue(&name));
        }
        self.last_queue = Some(name.clone());
        if !d.nowait {
            self.reply(QueueDeclareOk {
                queue: name,
                message_count: 0,
                consumer_count: 1,
            });
        }
        Ok(())
    }

    /// queue.bind.
    pub(super) fn queue_bind(&mut self, b: QueueBind, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let name = strip_cr_lf(&self.queue_name(&b.queue)?);
        let exchange = strip_cr_lf(&b.exchange);
        let key = self.binding_key(&b.queue, &b.routing_key)?;
        self.allow(ctx, Perm::Write, Resource::Queue, &name)?;
        self.allow(ctx, Perm::Read, Resource::Exchange, &exchange)?;
        // RabbitMQ's order: default exchange (403), source (404), queue (404), binding
        // arguments (406), then another connection's exclusive queue (405).
        vhost.bind_queue(
            &name,
            &exchange,
            &key,
            &b.arguments,
            true,
            Some(ctx.conn_id),
        )?;
        if !b.nowait {
            self.reply(QueueBindOk {});
        }
        Ok(())
    }

    /// queue.unbind (which has no nowait).
    pub(super) fn queue_unbind(&mut self, b: QueueUnbind, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let name = strip_cr_lf(&self.queue_name(&b.queue)?);
        let exchange = strip_cr_lf(&b.exchange);
        let key = self.binding_key(&b.queue, &b.routing_key)?;
        self.allow(ctx, Perm::Write, Resource::Queue, &name)?;
        self.allow(ctx, Perm::Read, Resource::Exchange, &exchange)?;
        if vhost.queue(&name).is_some() {
            vhost.queue_for(&name, ctx.conn_id)?;
        }
        vhost.bind_queue(&name, &exchange, &key, &b.arguments, false, None)?;
        self.reply(QueueUnbindOk {});
        Ok(())
    }

    /// queue.purge: refused by stream queues, as in RabbitMQ.
    pub(super) fn queue_purge(&mut self, p: QueuePurge, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let name = self.queue_name(&p.queue)?;
        self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
        let q = vhost.queue_for(&name, ctx.conn_id)?;
        if q.stream().is_some() {
            return Err(AmqpError::not_implemented(format!(
                "queue.purge not supported by stream queues {}",
                q.describe()
            )));
        }
        let n = q.purge();
        if !p.nowait {
            self.reply(QueuePurgeOk { message_count: n });
        }
        Ok(())
    }

    /// queue.delete: its consumers get a server-sent basic.cancel.
    pub(super) fn queue_delete(&mut self, d: QueueDelete, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let name = strip_cr_lf(&self.queue_name(&d.queue)?);
        self.allow(ctx, Perm::Configure, Resource::Queue, &name)?;
        let deleted = vhost.delete_queue(&name, d.if_unused, d.if_empty, Some(ctx.conn_id))?;
        notify_cancelled(&deleted.consumers);
        ctx.exclusive_queues.retain(|q| **q.name() != *name);
        if !d.nowait {
            self.reply(QueueDeleteOk {
                message_count: deleted.message_count,
            });
        }
        Ok(())
    }

    /// queue.bind/unbind with an empty queue name and an empty routing key bind the last
    /// declared queue with its name as the key (RabbitMQ's `expand_routing_key_shortcut`).
    fn binding_key(&self, queue: &ByteString, key: &ByteString) -> AmqpResult<ByteString> {
        if queue.is_empty() && key.is_empty() {
            self.queue_name(queue)
        } else {
            Ok(key.clone())
        }
    }
}
