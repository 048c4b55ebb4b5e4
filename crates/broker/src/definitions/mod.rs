//! The durable definitions of a vhost (exchanges, queues, bindings), kept as one file of
//! checksummed records whose payloads are the AMQP methods that recreate them (lavinmq keeps its
//! definitions as AMQP frames too): the codec we already trust, exact field tables, no second
//! schema.
//!
//! Two files per vhost: `definitions`, a snapshot rewritten atomically, and `definitions.log`,
//! a journal that each change to a durable definition appends one record to (and fsyncs), so a
//! change costs one small write, not a rewrite of every definition. Both start with a
//! generation record; the journal is replayed over the snapshot only if their generations
//! match. Compaction writes the snapshot with the next generation first, then resets the
//! journal: a crash between the two leaves a journal that is ignored, its changes already in
//! the snapshot.
//!
//! Beside it, `op`: the definitions command ([`op::DefOp`]), which a change of users, vhosts,
//! permissions, policies, limits, exchanges, queues or bindings is made as in a cluster, and
//! `proposer`: [`proposer::Proposer`], the interface through which the vhost, the access
//! registry and the broker propose one.

pub mod op;
pub mod proposer;
pub mod records;

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::method::{
    ExchangeBind, ExchangeDeclare, ExchangeDelete, ExchangeUnbind, QueueBind, QueueDeclare,
    QueueDelete, QueueUnbind,
};
use warren_protocol::Method;
use warren_store::record::{self, Scan};

const KIND_EXCHANGE: u8 = 10;
const KIND_QUEUE: u8 = 11;
const KIND_QUEUE_BIND: u8 = 12;
const KIND_EXCHANGE_BIND: u8 = 13;
const KIND_EXCHANGE_DELETE: u8 = 14;
const KIND_QUEUE_DELETE: u8 = 15;
const KIND_QUEUE_UNBIND: u8 = 16;
const KIND_EXCHANGE_UNBIND: u8 = 17;
const KIND_GENERATION: u8 = 18;

#[derive(Debug, Clone, PartialEq)]
pub enum Definition {
    Exchange(ExchangeDeclare),
    /// A durable queue and the id of its log directory.
    Queue(u64, QueueDeclare),
    QueueBind(QueueBind),
    ExchangeBind(ExchangeBind),
    // Journal only: changes replayed through the same calls that made them.
    ExchangeDelete(ExchangeDelete),
    QueueDelete(QueueDelete),
    QueueUnbind(QueueUnbind),
    ExchangeUnbind(ExchangeUnbind),
    /// The first record of both files.
    Generation(u64),
}

pub fn encode(defs: &[Definition]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut payload = BytesMut::new();
    for d in defs {
        payload.clear();
        let (kind, seq, m): (u8, u64, Method) = match d {
            Definition::Exchange(x) => (KIND_EXCHANGE, 0, x.clone().into()),
            Definition::Queue(id, q) => (KIND_QUEUE, *id, q.clone().into()),
            Definition::QueueBind(b) => (KIND_QUEUE_BIND, 0, b.clone().into()),
            Definition::ExchangeBind(b) => (KIND_EXCHANGE_BIND, 0, b.clone().into()),
            Definition::ExchangeDelete(x) => (KIND_EXCHANGE_DELETE, 0, x.clone().into()),
            Definition::QueueDelete(q) => (KIND_QUEUE_DELETE, 0, q.clone().into()),
            Definition::QueueUnbind(b) => (KIND_QUEUE_UNBIND, 0, b.clone().into()),
            Definition::ExchangeUnbind(b) => (KIND_EXCHANGE_UNBIND, 0, b.clone().into()),
            Definition::Generation(g) => {
                record::encode(&mut out, KIND_GENERATION, *g, &[]);
                continue;
            }
        };
        m.encode_payload(&mut payload);
        record::encode(&mut out, kind, seq, &payload);
    }
    out.to_vec()
}

/// Decodes what it can; a damaged record is logged and skipped.
pub fn decode(bytes: Vec<u8>) -> Vec<Definition> {
    let file = Bytes::from(bytes);
    let mut out = Vec::new();
    let mut at = 0;
    while at < file.len() {
        let (r, next) = match record::scan(&file, at) {
            Scan::Record(r, next) => (r, next),
            _ => {
                tracing::warn!(offset = at, "damaged record in the definitions file");
                match record::resync(&file, at) {
                    Some(n) => {
                        at = n;
                        continue;
                    }
                    None => break,
                }
            }
        };
        at = next;
        if r.kind == KIND_GENERATION {
            out.push(Definition::Generation(r.seq));
            continue;
        }
        let d = match (r.kind, Method::decode(&r.data)) {
            (KIND_EXCHANGE, Ok(Method::ExchangeDeclare(x))) => Definition::Exchange(x),
            (KIND_QUEUE, Ok(Method::QueueDeclare(q))) => Definition::Queue(r.seq, q),
            (KIND_QUEUE_BIND, Ok(Method::QueueBind(b))) => Definition::QueueBind(b),
            (KIND_EXCHANGE_BIND, Ok(Method::ExchangeBind(b))) => Definition::ExchangeBind(b),
            (KIND_EXCHANGE_DELETE, Ok(Method::ExchangeDelete(x))) => Definition::ExchangeDelete(x),
            (KIND_QUEUE_DELETE, Ok(Method::QueueDelete(q))) => Definition::QueueDelete(q),
            (KIND_QUEUE_UNBIND, Ok(Method::QueueUnbind(b))) => Definition::QueueUnbind(b),
            (KIND_EXCHANGE_UNBIND, Ok(Method::ExchangeUnbind(b))) => Definition::ExchangeUnbind(b),
            (kind, _) => {
                tracing::warn!(kind, "unknown record in the definitions file");
                continue;
            }
        };
        out.push(d);
    }
    out
}

/// Where a vhost's durable definitions are kept. A change is recorded durably before the vhost
/// publishes it, and refused if it cannot be; `load` gives back, in order, what recovery replays.
/// [`FileStore`] is the one-node store; a Raft metadata group implements the same interface
/// (record = commit on a majority).
pub trait DefinitionsStore: Send + Sync {
    /// Everything recorded, in order (a snapshot, then the changes after it).
    fn load(&self) -> std::io::Result<Vec<Definition>>;
    /// Records `ops` durably. `all` gives every definition, for a store that folds its changes
    /// into a new snapshot now.
    fn append(&self, ops: &[Definition], all: &dyn Fn() -> Vec<Definition>) -> std::io::Result<()>;
    /// Replaces what is recorded with `all` (compaction, and the boot-time rewrite).
    fn compact(&self, all: Vec<Definition>) -> std::io::Result<()>;
}

/// The journal is folded into a new snapshot once it outgrows both this and the snapshot, so
/// compaction costs O(1) amortized per change.
const JOURNAL_COMPACT_MIN_BYTES: u64 = 256 * 1024;

/// The definitions of one vhost in two files under its directory: `definitions` (a snapshot)
/// and `definitions.log` (the journal), as the module documentation describes.
pub struct FileStore {
    path: PathBuf,
    /// For log lines.
    vhost: String,
    journal: Mutex<Journal>,
}

/// The journal and what decides when to compact it.
#[derive(Default)]
struct Journal {
    /// Open for appending; `None` before the first snapshot or after an I/O error, when every
    /// change rewrites the snapshot instead.
    file: Option<std::fs::File>,
    /// Of the last snapshot written (or recovered).
    generation: u64,
    bytes: u64,
    snapshot_bytes: u64,
}

impl FileStore {
    pub fn new(dir: &Path, vhost: &str) -> FileStore {
        FileStore {
            path: dir.join("definitions"),
            vhost: vhost.into(),
            journal: Mutex::new(Journal::default()),
        }
    }
}

impl DefinitionsStore for FileStore {
    fn load(&self) -> std::io::Result<Vec<Definition>> {
        let mut defs = warren_store::snapshot::read(&self.path)?
            .map(decode)
            .unwrap_or_default();
        let generation = match defs.first() {
            Some(Definition::Generation(g)) => *g,
            _ => 0,
        };
        let journal = warren_store::snapshot::read(&self.path.with_extension("log"))?
            .map(decode)
            .unwrap_or_default();
        match journal.first() {
            Some(Definition::Generation(g)) if *g == generation => defs.extend(journal),
            Some(_) => tracing::info!(
                vhost = %self.vhost,
                "definitions journal predates the snapshot; ignored"
            ),
            None => {}
        }
        self.journal.lock().generation = generation;
        Ok(defs
            .into_iter()
            .filter(|d| !matches!(d, Definition::Generation(_)))
            .collect())
    }

    fn append(&self, ops: &[Definition], all: &dyn Fn() -> Vec<Definition>) -> std::io::Result<()> {
        let mut j = self.journal.lock();
        let (len, grown) = (
            j.bytes,
            j.bytes > JOURNAL_COMPACT_MIN_BYTES && j.bytes > j.snapshot_bytes,
        );
        let Some(file) = j.file.as_mut().filter(|_| !grown) else {
            drop(j);
            return self.compact(all());
        };
        let rec = encode(ops);
        match off_worker(|| file.write_all(&rec).and_then(|()| file.sync_data())) {
            Ok(()) => {
                j.bytes += rec.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Cut back what part of the record got in (all of it, if only the fsync
                // failed), so a change refused now cannot come back at recovery; the snapshot
                // rewrite below, if it succeeds, replaces the journal anyway.
                tracing::error!(vhost = %self.vhost, error = %e, "cannot append to the definitions journal; rewriting the snapshot");
                let _ = file.set_len(len);
                j.file = None;
                drop(j);
                self.compact(all())
            }
        }
    }

    fn compact(&self, all: Vec<Definition>) -> std::io::Result<()> {
        let mut j = self.journal.lock();
        let generation = j.generation + 1;
        let mut out = Vec::with_capacity(all.len() + 1);
        out.push(Definition::Generation(generation));
        out.extend(all);
        let snapshot = encode(&out);
        let log = self.path.with_extension("log");
        let header = encode(&[Definition::Generation(generation)]);
        let reset = off_worker(|| {
            warren_store::snapshot::write_atomic(&self.path, &snapshot)?;
            // The snapshot holds everything now; a crash before the journal is reset leaves an
            // older-generation journal, which recovery ignores.
            Ok::<_, std::io::Error>(
                warren_store::snapshot::write_atomic(&log, &header)
                    .and_then(|()| std::fs::OpenOptions::new().append(true).open(&log)),
            )
        })?;
        *j = Journal {
            file: reset
                .map_err(|e| tracing::error!(vhost = %self.vhost, error = %e, "cannot reset the definitions journal; rewriting the snapshot on each change"))
                .ok(),
            generation,
            bytes: header.len() as u64,
            snapshot_bytes: snapshot.len() as u64,
        };
        Ok(())
    }
}

/// Runs blocking file I/O (an fsync) so that it does not hold up the tasks of a tokio worker:
/// on the multi-threaded runtime the worker hands its other tasks to another thread first
/// (`block_in_place`); elsewhere (a plain thread, a test's current-thread runtime) it just runs.
pub fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warren_protocol::{FieldTable, FieldValue};

    #[test]
    fn round_trip() {
        let mut args = FieldTable::new();
        args.insert("x-max-length", FieldValue::I32(5));
        let defs = vec![
            Definition::Exchange(ExchangeDeclare {
                exchange: "x".into(),
                kind: "topic".into(),
                durable: true,
                ..Default::default()
            }),
            Definition::Queue(
                42,
                QueueDeclare {
                    queue: "q".into(),
                    durable: true,
                    arguments: args,
                    ..Default::default()
                },
            ),
            Definition::QueueBind(QueueBind {
                queue: "q".into(),
                exchange: "x".into(),
                routing_key: "a.#".into(),
                ..Default::default()
            }),
        ];
        let mut defs = defs;
        defs.insert(0, Definition::Generation(7));
        defs.extend([
            Definition::QueueUnbind(QueueUnbind {
                queue: "q".into(),
                exchange: "x".into(),
                routing_key: "a.#".into(),
                ..Default::default()
            }),
            Definition::ExchangeUnbind(ExchangeUnbind {
                destination: "y".into(),
                source: "x".into(),
                ..Default::default()
            }),
            Definition::QueueDelete(QueueDelete {
                queue: "q".into(),
                ..Default::default()
            }),
            Definition::ExchangeDelete(ExchangeDelete {
                exchange: "x".into(),
                ..Default::default()
            }),
        ]);
        assert_eq!(decode(encode(&defs)), defs);
    }

    fn queue_def(name: &str) -> Definition {
        Definition::Queue(
            1,
            QueueDeclare {
                queue: name.into(),
                durable: true,
                ..Default::default()
            },
        )
    }

    #[test]
    fn file_store_replays_the_snapshot_then_the_journal() {
        let dir = std::env::temp_dir().join(format!("warren-defs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir, "/");
        assert!(store.load().unwrap().is_empty());
        store.compact(vec![queue_def("a")]).unwrap();
        store.append(&[queue_def("b")], &|| unreachable!()).unwrap();
        let delete = Definition::QueueDelete(QueueDelete {
            queue: "a".into(),
            ..Default::default()
        });
        store
            .append(std::slice::from_ref(&delete), &|| unreachable!())
            .unwrap();
        let again = FileStore::new(&dir, "/");
        assert_eq!(
            again.load().unwrap(),
            vec![queue_def("a"), queue_def("b"), delete]
        );
        // A compaction leaves only what it was given; the old journal is not replayed.
        again.compact(vec![queue_def("b")]).unwrap();
        assert_eq!(
            FileStore::new(&dir, "/").load().unwrap(),
            vec![queue_def("b")]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
