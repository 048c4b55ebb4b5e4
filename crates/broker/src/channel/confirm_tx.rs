//! Publisher confirms and transactions: confirm.select, tx.select, tx.commit and tx.rollback,
//! and the flush of ready confirms at the end of each read batch. A channel is in one mode or
//! the other, never both.

use std::sync::atomic::Ordering;

use warren_protocol::method::{
    ConfirmSelect, ConfirmSelectOk, TxCommitOk, TxRollbackOk, TxSelectOk,
};

use super::deliveries::finish_with;
use super::{Channel, Ctx, TxOp};
use crate::error::{AmqpError, AmqpResult};

impl Channel {
    /// confirm.select: from now on every publish is confirmed (not in a transaction).
    pub(super) fn confirm_select(&mut self, c: ConfirmSelect) -> AmqpResult<()> {
        if self.tx.is_some() {
            return Err(AmqpError::precondition_failed(
                "cannot switch from tx to confirm mode",
            ));
        }
        self.confirm = true;
        self.shared.modes.confirm.store(true, Ordering::Relaxed);
        if !c.nowait {
            self.reply(ConfirmSelectOk {});
        }
        Ok(())
    }

    /// tx.select: publishes and settles are held until commit (not with confirms).
    pub(super) fn tx_select(&mut self) -> AmqpResult<()> {
        if self.confirm {
            return Err(AmqpError::precondition_failed(
                "cannot switch from confirm to tx mode",
            ));
        }
        if self.tx.is_none() {
            self.tx = Some(Vec::new());
        }
        self.shared
            .modes
            .transactional
            .store(true, Ordering::Relaxed);
        self.reply(TxSelectOk {});
        Ok(())
    }

    /// tx.commit: routes the held publishes and settles the held acks, nacks and rejects.
    pub(super) fn tx_commit(&mut self, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let ops = self
            .tx
            .as_mut()
            .ok_or_else(|| AmqpError::precondition_failed("channel is not transactional"))?;
        let ops = std::mem::take(ops);
        let capped = self.shared.capped();
        let mut settled = false;
        for op in ops {
            match op {
                TxOp::Publish(msg, mandatory, cc) => self.route(msg, &cc, mandatory, vhost)?,
                TxOp::Settle(taken, how) => {
                    settled = true;
                    finish_with(taken, how, !capped);
                }
            }
        }
        // As for an ack outside a transaction: the room opened is the channel's.
        if capped && settled {
            self.kick_consumers();
        }
        self.reply(TxCommitOk {});
        Ok(())
    }

    /// tx.rollback: held publishes are dropped, held settles put back unacked.
    pub(super) fn tx_rollback(&mut self) -> AmqpResult<()> {
        let ops = self
            .tx
            .as_mut()
            .ok_or_else(|| AmqpError::precondition_failed("channel is not transactional"))?;
        for op in std::mem::take(ops).into_iter().rev() {
            if let TxOp::Settle(taken, _) = op {
                self.shared.untake(taken);
            }
        }
        self.reply(TxRollbackOk {});
        Ok(())
    }

    /// Sends the confirms that are ready, merging runs into `multiple` acks.
    pub fn flush_confirms(&mut self) {
        self.confirms.flush();
    }
}
