//! What a connection sends, gathered between socket writes: responses from the reading task,
//! confirms from the persister's thread, chunks from each subscription's task. One writer task
//! per connection takes it all in one write.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::frame::Writer;

/// What the server sends, gathered between socket writes.
pub struct Out {
    w: Mutex<Writer>,
    ready: Notify,
    /// Woken after each socket write.
    wrote: Notify,
    /// Bytes taken by the writer and not yet written.
    in_write: std::sync::atomic::AtomicUsize,
    /// The writer stopped (the socket failed): nothing will drain.
    closed: std::sync::atomic::AtomicBool,
}

/// Above this much unsent, the connection stops reading its client: a client that publishes
/// without reading its confirms cannot make the server buffer them without bound (chunks are
/// bounded by the client's credit already).
pub const HIGH_BYTES: usize = 4 * 1024 * 1024;

impl Out {
    pub fn new() -> Arc<Out> {
        Arc::new(Out {
            w: Mutex::new(Writer::default()),
            ready: Notify::new(),
            wrote: Notify::new(),
            in_write: std::sync::atomic::AtomicUsize::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Writes a frame (or several) and wakes the writer.
    pub fn send(&self, f: impl FnOnce(&mut Writer)) {
        f(&mut self.w.lock());
        self.ready.notify_one();
    }

    /// Bytes waiting to be written.
    pub fn pending(&self) -> usize {
        self.w.lock().buf.len()
    }

    /// The next bytes to write (for the writer task), counted until [`Out::written`].
    pub async fn next(&self) -> Bytes {
        loop {
            {
                let mut w = self.w.lock();
                if !w.buf.is_empty() {
                    let b = w.take();
                    self.in_write
                        .store(b.len(), std::sync::atomic::Ordering::Release);
                    return b;
                }
            }
            self.ready.notified().await;
        }
    }

    /// The writer wrote what [`Out::next`] gave it.
    pub fn written(&self) {
        self.in_write.store(0, std::sync::atomic::Ordering::Release);
        self.wrote.notify_waiters();
    }

    /// The writer stopped: [`Out::below_high`] waits no more.
    pub fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.wrote.notify_waiters();
    }

    /// Returns once less than [`HIGH_BYTES`] waits to be written (or the writer stopped).
    pub async fn below_high(&self) {
        loop {
            let wrote = self.wrote.notified();
            tokio::pin!(wrote);
            wrote.as_mut().enable();
            let waiting = self.pending() + self.in_write.load(std::sync::atomic::Ordering::Acquire);
            if waiting < HIGH_BYTES || self.closed.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            wrote.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_reader_waits_while_too_much_is_unsent() {
        let out = Out::new();
        out.send(|w| {
            w.buf.extend_from_slice(&vec![0u8; HIGH_BYTES]);
        });
        let waiter = {
            let out = out.clone();
            tokio::spawn(async move { out.below_high().await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "went on with 4 MiB unsent");
        let b = out.next().await;
        assert_eq!(b.len(), HIGH_BYTES);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "went on while the write was in progress"
        );
        out.written();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("woken by the write")
            .expect("no panic");
    }
}
