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

#[test]
fn a_seed_replays_the_same_run() {
    let a = run(&Options::new(11, 3));
    let b = run(&Options::new(11, 3));
    assert_eq!(
        (
            a.confirmed,
            a.ops,
            a.failed_ops,
            a.crashes,
            a.partitions,
            a.applies
        ),
        (
            b.confirmed,
            b.ops,
            b.failed_ops,
            b.crashes,
            b.partitions,
            b.applies
        )
    );
    assert!(a.crashes + a.partitions > 0, "the schedule had no fault");
}
