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
}

impl Out {
    pub fn new() -> Arc<Out> {
        Arc::new(Out {
            w: Mutex::new(Writer::default()),
            ready: Notify::new(),
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

    pub async fn next(&self) -> Bytes {
        loop {
            {
                let mut w = self.w.lock();
                if !w.buf.is_empty() {
                    return w.take();
                }
            }
            self.ready.notified().await;
        }
    }
}
