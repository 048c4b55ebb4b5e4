//! The stream log's tests: writes, reads by offset and time, recovery, retention.

use super::*;
use crate::record;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-stream-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

fn read_all(log: &StreamLog<u32>, from: u64) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut next = from;
    let mut hint = None;
    while let Some(plan) = log.plan(next, hint) {
        let (got, end) = read(&plan, 100).expect("reads");
        if got.is_empty() {
            break;
        }
        for e in got {
            if e.offset >= next {
                next = e.offset + 1;
                out.push((e.offset, e.data));
            }
        }
        hint = Some((next, plan.segment, end));
    }
    out
}

#[test]
fn append_write_read_and_offsets() {
    let d = dir("rw");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 100).expect("opens");
    for i in 0..10u32 {
        let o = log.append(1000 + i as u64, Bytes::from(format!("m{i}")), Some(i));
        assert_eq!(o, i as u64);
        if i % 3 == 2 {
            let (tokens, file, end) = log.write_pending().expect("writes");
            assert!(file.is_some());
            assert_eq!(end, i as u64 + 1);
            assert_eq!(tokens.len(), 3);
        }
    }
    log.write_pending().expect("writes");
    assert!(log.segment_count() > 1, "small segments rotate");
    assert_eq!(log.last_chunk(), 9);
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 10);
    assert!(all.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
    assert_eq!(read_all(&log, 7)[0], (7, Bytes::from("m7")));
    // By time: the first entry at or after 1004.
    let plan = log.plan_at_time(1004).expect("found");
    let (got, _) = read(&plan, 1 << 20).expect("reads");
    assert!(got.iter().any(|e| e.ts_ms == 1004));
    assert!(log.plan_at_time(5000).is_none());
    // Reopen: same offsets, same last chunk.
    drop(log);
    let mut log: StreamLog<u32> = StreamLog::open(&d, 100).expect("reopens");
    assert_eq!(log.next_offset(), 10);
    assert_eq!(log.last_chunk(), 9);
    assert_eq!(log.append(0, Bytes::from("m10"), None), 10);
    log.write_pending().expect("writes");
    assert_eq!(read_all(&log, 0).len(), 11);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn retention_drops_whole_old_segments() {
    let d = dir("ret");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 200).expect("opens");
    for i in 0..40u64 {
        log.append(i, Bytes::from(vec![b'x'; 50]), None);
        log.write_pending().expect("writes");
    }
    let before = log.segment_count();
    assert!(before > 3);
    let removed = log.retain(Some(500), None);
    assert!(removed > 0);
    assert!(log.disk_bytes() <= 500 || log.segment_count() == 1);
    assert_eq!(log.first_offset(), removed);
    // Reading below the first retained offset starts at the first.
    assert_eq!(read_all(&log, 0)[0].0, removed);
    // By age: everything older than ts 39 goes, but never the current segment.
    log.retain(None, Some(39));
    assert_eq!(log.segment_count(), 1);
    drop(log);
    let log: StreamLog<u32> = StreamLog::open(&d, 200).expect("reopens");
    assert_eq!(log.next_offset(), 40);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn torn_tail_is_truncated() {
    let d = dir("torn");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("opens");
    for i in 0..5u64 {
        log.append(i, Bytes::from("abc"), None);
    }
    log.write_pending().expect("writes");
    drop(log);
    let path = segment_path(&d, 0);
    let len = fs::metadata(&path).expect("exists").len();
    let f = OpenOptions::new().write(true).open(&path).expect("opens");
    f.set_len(len - 3).expect("cuts");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("reopens");
    assert_eq!(log.next_offset(), 4);
    assert_eq!(log.append(9, Bytes::from("new"), None), 4);
    log.write_pending().expect("writes");
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 5);
    assert_eq!(all[4], (4, Bytes::from("new")));
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn entry_encoding_is_a_record() {
    let mut a = BytesMut::new();
    encode_entry(&mut a, KIND_CHUNK, 9, 77, b"payload");
    let mut b = BytesMut::new();
    let mut data = 77u64.to_be_bytes().to_vec();
    data.extend_from_slice(b"payload");
    record::encode(&mut b, KIND_CHUNK, 9, &data);
    assert_eq!(a, b);
}

#[test]
fn big_entry_is_read_whole() {
    let d = dir("big");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 30).expect("opens");
    log.append(1, Bytes::from(vec![7u8; 3 * READ_BYTES as usize]), None);
    log.append(2, Bytes::from("small"), None);
    log.write_pending().expect("writes");
    let plan = log.plan(0, None).expect("written");
    let (got, _) = read(&plan, 1000).expect("reads");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data.len(), 3 * READ_BYTES as usize);
    drop(log);
    let log: StreamLog<u32> = StreamLog::open(&d, 1 << 30).expect("reopens");
    assert_eq!(log.next_offset(), 2);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn entries_that_start_a_chunk_are_written_as_chunks_of_their_own() {
    let d = dir("chunks");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("opens");
    for entry in 0..3u64 {
        log.start_chunk();
        for i in 0..4u64 {
            log.append(entry * 10 + i, Bytes::from("x"), None);
        }
    }
    let mut ends = Vec::new();
    while log.has_pending() {
        let (_, _, end) = log.write_pending().expect("writes");
        ends.push(end);
    }
    assert_eq!(ends, vec![4, 8, 12]);
    assert_eq!(log.last_chunk(), 8);
    assert_eq!(log.pending_bytes(), 0);
    drop(log);
    let log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("reopens");
    assert_eq!((log.next_offset(), log.last_chunk()), (12, 8));
}

#[test]
fn truncate_cuts_at_an_offset_and_appends_continue_from_it() {
    let d = dir("truncate");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 200).expect("opens");
    for i in 0..20u64 {
        log.append(i, Bytes::from(format!("m{i}")), None);
        if i % 4 == 3 {
            log.write_pending().expect("writes");
        }
    }
    assert!(log.segment_count() > 2);
    log.truncate_to(9).expect("truncates");
    assert_eq!(log.next_offset(), 9);
    assert_eq!(read_all(&log, 0).len(), 9);
    log.append(100, Bytes::from("again"), None);
    log.write_pending().expect("writes");
    drop(log);
    let log: StreamLog<u32> = StreamLog::open(&d, 200).expect("reopens");
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 10);
    assert_eq!(all[9], (9, Bytes::from("again")));
    assert!(all.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
    // At a segment's first offset, and to the very start.
    let mut log = log;
    log.truncate_to(0).expect("truncates");
    assert_eq!((log.next_offset(), log.segment_count()), (0, 1));
    assert!(read_all(&log, 0).is_empty());
}

#[test]
fn reset_starts_empty_at_an_offset() {
    let d = dir("reset");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("opens");
    log.append(1, Bytes::from("a"), None);
    log.write_pending().expect("writes");
    log.reset(500).expect("resets");
    assert_eq!((log.first_offset(), log.next_offset()), (500, 500));
    assert_eq!(log.append(2, Bytes::from("b"), None), 500);
    log.write_pending().expect("writes");
    drop(log);
    let log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("reopens");
    assert_eq!((log.first_offset(), log.next_offset()), (500, 501));
    assert_eq!(read_all(&log, 0), vec![(500, Bytes::from("b"))]);
}

#[test]
fn a_newer_segment_version_is_refused_and_a_headerless_one_read() {
    let d = dir("version");
    let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("opens");
    log.append(1, Bytes::from("a"), None);
    log.write_pending().expect("writes");
    drop(log);
    let path = segment_path(&d, 0);
    let bytes = fs::read(&path).expect("reads");
    // A segment of the first form: no header, the same records.
    let cut = header_len() as usize;
    fs::write(&path, &bytes[cut..]).expect("writes");
    let log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("reads version 1");
    assert_eq!(read_all(&log, 0), vec![(0, Bytes::from("a"))]);
    drop(log);
    // A newer version than this build knows.
    let mut b = BytesMut::new();
    encode_entry(&mut b, KIND_HEADER, 0, 0, &[SEGMENT_VERSION + 1]);
    b.extend_from_slice(&bytes[cut..]);
    fs::write(&path, &b).expect("writes");
    let err = StreamLog::<u32>::open(&d, 1 << 20).err().expect("refused");
    assert!(err.to_string().contains("newer than this build"), "{err}");
    assert_eq!(
        fs::read(&path).expect("kept").len(),
        b.len(),
        "left as it is"
    );
}
