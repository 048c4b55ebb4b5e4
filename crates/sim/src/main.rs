//! `warren-sim`: runs seeds of the replicated queue group's simulation (see the library) and
//! prints one line per failing seed, then a summary; exit status 1 if any failed.
//!   warren-sim --from 1 --seeds 10000 --members 3,5

use clap::Parser;

#[derive(Parser)]
#[command(about = "Deterministic simulation of a replicated queue's Raft group (turmoil)")]
struct Args {
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// How many seeds (each is run with every member count).
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    /// Member counts, comma-separated.
    #[arg(long, default_value = "3,5", value_delimiter = ',')]
    members: Vec<usize>,
    /// Simulated seconds of workload (with faults) per run.
    #[arg(long, default_value_t = 12)]
    work_s: u64,
    /// Print every run, not only failures.
    #[arg(long)]
    verbose: bool,
    /// No faults (the workload alone).
    #[arg(long)]
    no_faults: bool,
}

fn main() {
    let a = Args::parse();
    let (mut runs, mut failed, mut confirmed, mut crashes, mut partitions) = (0, 0, 0, 0, 0);
    let started = std::time::Instant::now();
    for seed in a.from..a.from + a.seeds {
        for &members in &a.members {
            let mut o = warren_sim::Options::new(seed, members);
            o.work = std::time::Duration::from_secs(a.work_s);
            o.faults = !a.no_faults;
            let r = warren_sim::run(&o);
            runs += 1;
            confirmed += r.confirmed;
            crashes += r.crashes;
            partitions += r.partitions;
            if !r.ok() {
                failed += 1;
                println!(
                    "FAIL seed {} members {}: {:?}",
                    r.seed, r.members, r.violations
                );
            } else if a.verbose {
                println!(
                    "ok seed {} members {}: {} confirmed of {} ops ({} failed), {} crashes, {} partitions, {} applies",
                    r.seed, r.members, r.confirmed, r.ops, r.failed_ops, r.crashes, r.partitions, r.applies
                );
            }
        }
    }
    println!(
        "{runs} runs (seeds {}..={}, members {:?}), {failed} failed; {confirmed} confirmed messages, {crashes} crashes, {partitions} partitions; {:.0} s",
        a.from,
        a.from + a.seeds - 1,
        a.members,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
