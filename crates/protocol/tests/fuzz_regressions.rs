//! Every input that ever crashed a fuzz target (`fuzz/`), kept under `tests/crashers/<target>/`
//! and replayed through the same invariant checks the fuzzers run. To add one, copy the file
//! from `fuzz/artifacts/<target>/` into the matching folder.

use std::path::Path;

use warren_protocol::invariants;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    // At run time first: a target dir shared by checkouts at different paths can hold a test
    // binary compiled for another one, with that checkout's path baked in.
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    let dir = Path::new(&root).join("tests/crashers").join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("crashers folder exists") {
        let path = entry.expect("readable folder").path();
        if path.file_name().is_some_and(|f| f == ".gitkeep") {
            continue;
        }
        let data = std::fs::read(&path).expect("readable crasher");
        check(&data);
        n += 1;
    }
    n
}

#[test]
fn frame_decode_crashers() {
    assert!(replay("frame_decode", invariants::frame_decode) > 0);
}

#[test]
fn method_decode_crashers() {
    replay("method_decode", invariants::method_decode);
}

#[test]
fn field_table_crashers() {
    replay("field_table", invariants::field_table);
}

#[test]
fn content_header_crashers() {
    replay("content_header", invariants::content_header);
}

/// A header claiming a 4 GiB frame with frame_max 0 used to reserve 4 GiB up front.
#[test]
fn huge_frame_claim_reserves_little() {
    invariants::frame_decode(&[0, 255, 1, 0, 1, 0xff, 0xff, 0xff, 0xf0, 0]);
}

/// A size field near u32::MAX with frame_max u32::MAX used to overflow computing the size.
#[test]
fn frame_size_overflow() {
    invariants::frame_decode(&[3, 255, 1, 0, 1, 0xff, 0xff, 0xff, 0xff, 0]);
}

/// A table holding `levels` nested tables (or arrays), each under key `k`.
fn deep(levels: usize, array: bool) -> Vec<u8> {
    let tag = if array { b'A' } else { b'F' };
    // Built inside out: each level wraps the previous value.
    let mut value = vec![tag, 0, 0, 0, 0];
    for _ in 1..levels {
        let mut body = Vec::new();
        if !array {
            body.extend_from_slice(&[1, b'k']);
        }
        body.extend_from_slice(&value);
        value = vec![tag];
        value.extend_from_slice(&(body.len() as u32).to_be_bytes());
        value.extend_from_slice(&body);
    }
    let mut table = ((value.len() + 2) as u32).to_be_bytes().to_vec();
    table.extend_from_slice(&[1, b'k']);
    table.extend_from_slice(&value);
    table
}

/// Tables and arrays nested far deeper than any real header, in a method that fits one frame
/// of the default frame_max: decoding used to recurse once per level and overflow the stack.
#[test]
fn deeply_nested_tables_are_refused() {
    for array in [false, true] {
        let table = deep(20_000, array);
        invariants::field_table(&table);
        let b = bytes::Bytes::from(table);
        assert_eq!(
            warren_protocol::codec::Reader::new(&b).table(),
            Err(warren_protocol::DecodeError::TooDeep)
        );
        // Inside a queue.declare's arguments.
        let mut m = vec![0, 50, 0, 10, 0, 0, 1, b'q', 0];
        m.extend_from_slice(&b);
        assert_eq!(
            warren_protocol::Method::decode(&bytes::Bytes::from(m)),
            Err(warren_protocol::DecodeError::TooDeep)
        );
    }
    // Nesting as deep as the limit allows still decodes; one more level does not.
    for array in [false, true] {
        let max = warren_protocol::table::MAX_NESTING - 1;
        let ok = bytes::Bytes::from(deep(max, array));
        assert!(warren_protocol::codec::Reader::new(&ok).table().is_ok());
        let over = bytes::Bytes::from(deep(max + 1, array));
        assert!(warren_protocol::codec::Reader::new(&over).table().is_err());
    }
}
