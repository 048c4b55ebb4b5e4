//! Command line: PerfTest's flags with PerfTest's meaning, plus Warren's modes and outputs.
//!
//! PerfTest (Apache Commons CLI) has multi-letter short flags (`-qp`, `-qpf`, `-ad`, ...), which
//! clap cannot express; [`normalise`] rewrites them to their long forms before parsing. `-h` is
//! the URI, as in PerfTest, so help is only `--help`.
//!
//! By job: `args` declares the flags (clap), `options` checks them against each other and turns
//! them into a [`Scenario`] and a [`Mode`], `values` parses the values PerfTest's flags take
//! (queue arguments, queue patterns, rates). This file rewrites the arguments, runs the parse
//! and says how it ended. Everything is re-exported here.

mod args;
mod options;
mod values;

use std::ffi::OsString;

use clap::Parser;

pub use args::{Args, DEFAULT_SWEEP};
pub use options::{validate, Mode, Options, Scenario, Topology};
pub use values::{format_pattern, parse_queue_args, parse_steps, parse_sweep, random_uuid};

/// PerfTest's multi-letter short flags and the long flag each one means.
const MULTI_LETTER: &[(&str, &str)] = &[
    ("-qp", "--queue-pattern"),
    ("-qpf", "--queue-pattern-from"),
    ("-qpt", "--queue-pattern-to"),
    ("-ad", "--auto-delete"),
    ("-qa", "--queue-args"),
    ("-ca", "--consumer-args"),
    ("-qq", "--quorum-queue"),
    ("-prsd", "--producer-random-start-delay"),
    ("-ew", "--exit-when"),
    ("-niot", "--nio-threads"),
    ("-niotp", "--nio-thread-pool"),
    ("-ctp", "--consumers-thread-pools"),
    ("-hst", "--heartbeat-sender-threads"),
];

/// Rewrites PerfTest's multi-letter short flags to long flags. Only whole arguments that are a
/// known flag are rewritten, so values are left alone.
pub fn normalise(args: Vec<OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| {
            match a
                .to_str()
                .and_then(|s| MULTI_LETTER.iter().find(|(short, _)| *short == s))
            {
                Some((_, long)) => OsString::from(*long),
                None => a,
            }
        })
        .collect()
}

/// Parse outcome: options, or what to print and the exit code (help: 0, usage errors: 2).
pub enum Parsed {
    Run(Box<Options>),
    Exit { text: String, code: i32 },
}

/// Parses and validates `warren perf` arguments (without the program name).
pub fn parse(args: Vec<OsString>) -> Parsed {
    let command_line = args
        .iter()
        .map(|a| mask_password(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut argv = vec![OsString::from("warren perf")];
    argv.extend(normalise(args));
    let parsed = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            return Parsed::Exit {
                text: e.render().to_string(),
                code,
            };
        }
    };
    match validate(parsed, command_line) {
        Ok(o) => Parsed::Run(Box::new(o)),
        Err(msg) => Parsed::Exit {
            text: format!("error: {msg}\n\nFor more information, try '--help'.\n"),
            code: 2,
        },
    }
}

/// `amqp://user:secret@host` -> `amqp://user:***@host`, for reports (each URI of a list).
pub fn mask_password(arg: &str) -> String {
    arg.split(',')
        .map(|part| {
            let Some(rest) = part.strip_prefix("amqp://") else {
                return part.to_string();
            };
            match (rest.find(':'), rest.find('@')) {
                (Some(c), Some(at)) if c < at => {
                    format!("amqp://{}:***{}", &rest[..c], &rest[at..])
                }
                _ => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What the tests of every part share: a command line run through [`parse`].
#[cfg(test)]
mod testutil {
    use std::ffi::OsString;

    use super::{parse, Options, Parsed};

    pub(super) fn opts(args: &[&str]) -> Result<Options, (String, i32)> {
        match parse(args.iter().map(OsString::from).collect()) {
            Parsed::Run(o) => Ok(*o),
            Parsed::Exit { text, code } => Err((text, code)),
        }
    }

    pub(super) fn err(args: &[&str]) -> String {
        match opts(args) {
            Ok(o) => panic!("{args:?} accepted: {o:?}"),
            Err((text, code)) => {
                assert_eq!(code, 2, "{args:?}: {text}");
                text
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use warren_protocol::FieldValue;

    use super::testutil::*;
    use super::*;

    #[test]
    fn multi_letter_short_flags() {
        let o = opts(&[
            "-qp",
            "q-%03d",
            "-qpf",
            "1",
            "-qpt",
            "3",
            "-ad",
            "false",
            "-qa",
            "x-max-length=10,x-overflow=reject-publish,x-single-active-consumer=true",
            "-prsd",
            "2",
            "-ew",
            "empty",
            "-niot",
            "4",
            "-niotp",
            "6",
            "-ctp",
            "2",
            "-hst",
            "2",
            "-f",
            "persistent",
            "-f",
            "mandatory",
        ])
        .expect("parses");
        let s = o.scenario;
        let Topology::Pattern { queues } = &s.topology else {
            panic!("pattern")
        };
        assert_eq!(queues, &["q-001", "q-002", "q-003"]);
        assert!(!s.auto_delete && s.persistent && s.mandatory && s.exit_when_idle);
        assert_eq!(s.producer_random_start_delay_s, 2);
        assert_eq!(s.queue_args.get("x-max-length"), Some(&FieldValue::I64(10)));
        assert_eq!(
            s.queue_args.get("x-overflow"),
            Some(&FieldValue::LongStr("reject-publish".into()))
        );
        assert_eq!(
            s.queue_args.get("x-single-active-consumer"),
            Some(&FieldValue::Bool(true))
        );
        let o = opts(&["-qq", "-u", "q"]).expect("quorum");
        assert!(o.scenario.durable && !o.scenario.auto_delete);
        assert_eq!(
            o.scenario.queue_args.get("x-queue-type"),
            Some(&FieldValue::LongStr("quorum".into()))
        );
    }

    #[test]
    fn values_that_look_like_flags_are_values() {
        // Only whole arguments are rewritten: a routing key "-qp" stays what it is.
        assert_eq!(
            normalise(vec!["-k".into(), "x-qp".into(), "-qp".into()]),
            vec![
                OsString::from("-k"),
                "x-qp".into(),
                "--queue-pattern".into()
            ]
        );
        let o = opts(&["-k", "qp", "-u", "-qp-"]).expect("plain values");
        let Topology::Fixed { routing_key, queue } = o.scenario.topology else {
            panic!()
        };
        assert_eq!(
            (routing_key.as_str(), queue.as_deref()),
            ("qp", Some("-qp-"))
        );
    }

    #[test]
    fn help_is_long_only() {
        match parse(vec!["--help".into()]) {
            Parsed::Exit { text, code } => {
                assert_eq!(code, 0);
                assert!(
                    text.contains("--producers") && text.contains("--queue-pattern"),
                    "{text}"
                );
            }
            Parsed::Run(_) => panic!("--help ran"),
        }
        // -h without a value is an error, not help.
        assert!(err(&["-h"]).contains("-h"));
    }

    #[test]
    fn passwords_are_masked_in_the_recorded_command() {
        assert_eq!(
            mask_password("amqp://u:s3cret@h:5672/%2f,amqp://h2"),
            "amqp://u:***@h:5672/%2f,amqp://h2"
        );
        let o = opts(&["-h", "amqp://u:s3cret@h:5672/%2f"]).expect("ok");
        assert!(!o.command_line.contains("s3cret"), "{}", o.command_line);
        assert_eq!(o.scenario.uris[0].password, "s3cret");
    }
}
