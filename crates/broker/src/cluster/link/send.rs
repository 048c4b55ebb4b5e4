//! Appending frames to a link's output: one frame ([`Link::send`]), or one item of a run
//! ([`Link::send_run`]), in the lane its kind goes to; the writer task (`io.rs`) takes them.

use std::sync::atomic::Ordering;

use bytes::{BufMut, BytesMut};

use super::{Link, Run, RUN_BYTES};

impl Link {
    /// Appends one frame; `fill` writes its payload.
    pub fn send(&self, kind: u8, fill: impl FnOnce(&mut BytesMut)) {
        let mut lanes = self.out.lock();
        let was_empty = lanes.control.is_empty() && lanes.bulk.is_empty();
        let (out, run) = lanes.lane(kind);
        *run = None;
        let at = out.len();
        out.put_u32(0);
        out.put_u8(kind);
        fill(out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.bulk_len.store(lanes.bulk.len(), Ordering::Relaxed);
        drop(lanes);
        if was_empty {
            self.wake_writer.notify_one();
        }
    }

    /// Appends one item to a run: a frame `head | u32 count | items` of one kind for one `key`
    /// (publishes to one queue, deliveries to one consumer, acks from one). While the lane's
    /// last frame is still that run, the item joins it, so the receiver pays its lookups and
    /// its bookkeeping once per run, not once per message; `head` is written only by the item
    /// that starts a run.
    pub fn send_run(
        &self,
        kind: u8,
        key: u128,
        head: impl FnOnce(&mut BytesMut),
        item: impl FnOnce(&mut BytesMut),
    ) {
        let mut lanes = self.out.lock();
        let was_empty = lanes.control.is_empty() && lanes.bulk.is_empty();
        let (out, run) = lanes.lane(kind);
        let r = match run.take() {
            Some(r) if r.kind == kind && r.key == key && out.len() - r.at < RUN_BYTES => r,
            _ => {
                let at = out.len();
                out.put_u32(0);
                out.put_u8(kind);
                head(out);
                let count_at = out.len();
                out.put_u32(0);
                Run {
                    kind,
                    key,
                    at,
                    count_at,
                    count: 0,
                }
            }
        };
        item(out);
        let r = Run {
            count: r.count + 1,
            ..r
        };
        let len = (out.len() - r.at - 4) as u32;
        out[r.at..r.at + 4].copy_from_slice(&len.to_be_bytes());
        out[r.count_at..r.count_at + 4].copy_from_slice(&r.count.to_be_bytes());
        *run = Some(r);
        self.bulk_len.store(lanes.bulk.len(), Ordering::Relaxed);
        drop(lanes);
        if was_empty {
            self.wake_writer.notify_one();
        }
    }
}
