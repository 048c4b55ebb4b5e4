//! Random command sequences against one queue's state machine: no panic, and after every
//! command each message is in exactly one place, dispatch is work-conserving, and deadlines,
//! limits and counts hold (`warren_queue::testing::run_ops`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_queue::testing::{ops_from_bytes, run_ops};

fuzz_target!(|data: &[u8]| {
    let (ops, config, limits) = ops_from_bytes(data);
    if let Err(e) = run_ops(ops, config, limits) {
        panic!("invariant broken: {e}");
    }
});
