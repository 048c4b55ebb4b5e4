//! The exchange class: exchange.declare, delete, bind and unbind, each checked against the
//! user's permissions where RabbitMQ's `rabbit_channel` checks them, then done by the vhost.

use warren_protocol::method::{
    ExchangeBind, ExchangeBindOk, ExchangeDeclare, ExchangeDeclareOk, ExchangeDelete,
    ExchangeDeleteOk, ExchangeUnbind, ExchangeUnbindOk,
};

use super::names::strip_cr_lf;
use super::{Channel, Ctx};
use crate::access::{Perm, Resource};
use crate::error::AmqpResult;
use crate::vhost::ExchangeSpec;

impl Channel {
    /// exchange.declare (passive or not).
    pub(super) fn exchange_declare(&mut self, x: ExchangeDeclare, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let xname = strip_cr_lf(&x.exchange);
        if !x.passive && !xname.is_empty() {
            self.allow(ctx, Perm::Configure, Resource::Exchange, &xname)?;
            if let Some(ae) = x
                .arguments
                .get("alternate-exchange")
                .and_then(|v| v.as_str())
            {
                self.allow(ctx, Perm::Read, Resource::Exchange, &xname)?;
                self.allow(ctx, Perm::Write, Resource::Exchange, ae)?;
            }
        }
        vhost.declare_exchange(&ExchangeSpec {
            name: &xname,
            kind: &x.kind,
            passive: x.passive,
            durable: x.durable,
            auto_delete: x.auto_delete,
            internal: x.internal,
            arguments: &x.arguments,
        })?;
        if !x.nowait {
            self.reply(ExchangeDeclareOk {});
        }
        Ok(())
    }

    /// exchange.delete.
    pub(super) fn exchange_delete(&mut self, x: ExchangeDelete, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let xname = strip_cr_lf(&x.exchange);
        if !xname.is_empty() && !xname.starts_with("amq.") {
            self.allow(ctx, Perm::Configure, Resource::Exchange, &xname)?;
        }
        vhost.delete_exchange(&xname, x.if_unused)?;
        if !x.nowait {
            self.reply(ExchangeDeleteOk {});
        }
        Ok(())
    }

    /// exchange.bind: an exchange-to-exchange binding.
    pub(super) fn exchange_bind(&mut self, b: ExchangeBind, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let (dest, source) = (strip_cr_lf(&b.destination), strip_cr_lf(&b.source));
        self.allow(ctx, Perm::Write, Resource::Exchange, &dest)?;
        self.allow(ctx, Perm::Read, Resource::Exchange, &source)?;
        vhost.bind_exchange(&dest, &source, &b.routing_key, &b.arguments, true)?;
        if !b.nowait {
            self.reply(ExchangeBindOk {});
        }
        Ok(())
    }

    /// exchange.unbind.
    pub(super) fn exchange_unbind(&mut self, b: ExchangeUnbind, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let (dest, source) = (strip_cr_lf(&b.destination), strip_cr_lf(&b.source));
        self.allow(ctx, Perm::Write, Resource::Exchange, &dest)?;
        self.allow(ctx, Perm::Read, Resource::Exchange, &source)?;
        vhost.bind_exchange(&dest, &source, &b.routing_key, &b.arguments, false)?;
        if !b.nowait {
            self.reply(ExchangeUnbindOk {});
        }
        Ok(())
    }
}
