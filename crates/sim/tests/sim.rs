//! The replicated queue group's deterministic simulation, a bounded number of seeds (a longer
//! campaign: `bench/sim.sh`, recorded in docs/reliability.md).

use warren_sim::{run, Options};

#[test]
fn seeds_of_3_and_5_members_under_faults_lose_nothing_and_agree() {
    let mut failed = Vec::new();
    let mut confirmed = 0;
    for seed in 1..=8 {
        for members in [3, 5] {
            let r = run(&Options::new(seed, members));
            confirmed += r.confirmed;
            if !r.ok() {
                failed.push(format!(
                    "seed {seed}, {members} members: {:?}",
                    r.violations
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        confirmed > 100,
        "the workload did little: {confirmed} confirmed"
    );
}

/// A seed, run again in a fresh process, replays the same run: the same schedule, the same
/// commands, the same outcomes (counts of confirmed, failed and applied). (Within one process,
/// a run after others may differ: some state below the simulation is process-wide.)
#[test]
fn a_seed_replays_the_same_run_in_a_fresh_process() {
    let run_once = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren-sim"))
            .args([
                "--from",
                "11",
                "--seeds",
                "1",
                "--members",
                "3",
                "--verbose",
            ])
            .output()
            .expect("warren-sim runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let (a, b) = (run_once(), run_once());
    assert!(a.starts_with("ok seed 11 members 3:"), "{a}");
    assert_eq!(a, b);
    assert!(
        !a.contains(" 0 crashes, 0 partitions"),
        "the schedule had no fault: {a}"
    );
}
