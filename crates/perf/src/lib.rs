//! `warren perf`: an AMQP 0-9-1 load generator that takes RabbitMQ PerfTest's flags, so published
//! PerfTest commands run unchanged against Warren or any other broker.
//!
//! Layout: [`cli`] (flags, validation), [`client`] (handshake and setup methods over
//! `warren-protocol`), [`producer`] and [`consumer`] (the hot loops), [`stats`] (counters,
//! HdrHistogram latencies, samples), [`run`] (one run), [`modes`] (sweep, steps, compare),
//! [`report`] (JSON, HTML, SVG), [`display`] (console lines, live status).
//!
//! Must not depend on the broker: it measures any broker from the outside.

pub mod body;
pub mod cli;
pub mod client;
pub mod consumer;
pub mod display;
pub mod modes;
pub mod producer;
pub mod report;
pub mod run;
pub mod stats;
pub mod uri;

use std::ffi::OsString;

/// Runs `warren perf` with its arguments (without the program name); returns the exit code:
/// 0 success, 1 a run failed, 2 bad flags.
pub fn main(args: Vec<OsString>) -> i32 {
    let options = match cli::parse(args) {
        cli::Parsed::Run(o) => *o,
        cli::Parsed::Exit { text, code } => {
            if code == 0 {
                print!("{text}");
            } else {
                eprint!("warren perf: {text}");
            }
            return code;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren perf: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(modes::execute(options))
}
