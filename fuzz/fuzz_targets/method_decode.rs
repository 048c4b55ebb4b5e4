//! See `warren_protocol::invariants::method_decode` for what this target checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warren_protocol::invariants::method_decode(data));
