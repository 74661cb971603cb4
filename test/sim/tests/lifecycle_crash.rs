#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Crash safety: the etcdadm-controller process is SIGKILLed at seeded random moments during
//! scale up, remediation, scale down and rolling replacement, and restarted. Each run must
//! converge with no duplicate or orphan member, no extra Machine, and no membership change
//! repeated (etcd's own history says so).
//!
//! `SIM_KILL_RUNS` sets the number of runs (default 20, a CI-sized budget; e.g. 200 for a long
//! soak), `SIM_KILL_SEED` the base seed (printed, so a failing run can be replayed). The runs
//! are split over two planes, one per test, which the test harness runs side by side.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim_machines::Fault;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug)]
enum Operation {
    ScaleUp,
    Remediation,
    ScaleDown,
    Rollout,
}

impl Operation {
    /// Replicas before and after, the most Machines (and members) allowed meanwhile, and the
    /// window in which the controller is killed.
    fn shape(self) -> (usize, usize, usize, u64) {
        match self {
            Operation::ScaleUp => (1, 3, 3, 6000),
            Operation::Remediation => (3, 3, 3, 6000),
            Operation::ScaleDown => (3, 1, 3, 2500),
            Operation::Rollout => (1, 1, 2, 4000),
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn runs() -> (u64, u64) {
    let runs = env_u64("SIM_KILL_RUNS", 20);
    let seed = env_u64("SIM_KILL_SEED", 0x5eed_e7cd);
    (runs, seed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_resumes_every_operation_first_half() {
    let (runs, seed) = runs();
    crash_runs(12, "k1", seed, 0..runs / 2, runs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_resumes_every_operation_second_half() {
    let (runs, seed) = runs();
    crash_runs(8, "k2", seed, runs / 2..runs, runs).await;
}

/// Runs `runs` (seeded by run number; operations cycle through scale up 1 → 3, remediation,
/// scale down 3 → 1, rollout of the single member) on a plane of its own at `127.0.<prefix>.x`.
async fn crash_runs(prefix: u8, cluster: &str, seed: u64, runs: std::ops::Range<u64>, total: u64) {
    println!("{cluster}: runs {runs:?} of SIM_KILL_RUNS={total}, SIM_KILL_SEED={seed}");
    let work = TempDir::new(&format!("sim-lifecycle-crash-{cluster}"));
    let mut plane = start_plane(prefix, &work, Duration::from_millis(300)).await;
    let client = plane.client.clone();
    create_managed_cluster(
        &client,
        client.default_namespace(),
        &ManagedCluster {
            name: cluster,
            replicas: 1,
            zones: &["zone-a", "zone-b", "zone-c"],
            config_spec: json!({}),
            health_check: json!({"interval": "1s", "timeout": "1s", "unhealthyAfter": "3s"}),
            with_kcp: true,
            extra_spec: json!({}),
        },
    )
    .await
    .unwrap();
    wait_settled(&client, cluster, 1, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, cluster).await;
    let started = Instant::now();
    let mut kills = 0;
    let cycle = [
        Operation::ScaleUp,
        Operation::Remediation,
        Operation::ScaleDown,
        Operation::Rollout,
    ];
    let count = runs.end - runs.start;
    let first = runs.start;
    for run in runs {
        // Each plane starts at one member, so its cycle starts at the scale up.
        let operation = cycle[((run - first) % 4) as usize];
        let (from, to, bound, window) = operation.shape();
        let run_seed = seed.wrapping_add(run);
        let mut rng = Rng::new(run_seed);
        let before = machine_names(&client, cluster).await;
        assert_eq!(before.len(), from, "run {run} starts from {from} members");
        let t0 = watchers.now();
        let began = Instant::now();
        let gone: Option<String> = match operation {
            Operation::ScaleUp | Operation::ScaleDown => {
                patch_spec(&client, cluster, json!({"replicas": to})).await;
                None
            }
            Operation::Remediation => {
                let names: Vec<&String> = before.iter().collect();
                let victim = names[(rng.next_u64() % names.len() as u64) as usize].clone();
                plane.runtime.fault(&victim, Fault::PowerOff).unwrap();
                Some(victim)
            }
            Operation::Rollout => {
                let spec = json!({"etcdadmConfigSpec": {"etcdadmBuiltin": true, "preEtcdadmCommands": [format!("echo run-{run}")]}});
                patch_spec(&client, cluster, spec).await;
                before.iter().next().cloned()
            }
        };
        let mut points = vec![];
        for _ in 0..1 + rng.next_u64() % 3 {
            let wait = rng.millis(window);
            tokio::time::sleep(wait).await;
            plane.kill_controller(CONTROLLER).await.unwrap();
            kills += 1;
            points.push(began.elapsed());
            tokio::time::sleep(rng.millis(400)).await;
            plane.restart_controller(CONTROLLER).unwrap();
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let state = settled(&client, cluster, to).await;
            let replaced = match &gone {
                Some(name) => !machine_names(&client, cluster).await.contains(name),
                None => true,
            };
            if state.is_ok() && replaced {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "run {run} ({operation:?}, seed {run_seed}, kills at {points:?}) did not converge: {state:?}\n{}",
                logs(&work)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let t1 = watchers.now();
        save_logs(&work, &format!("crash-{cluster}"));
        let history = watchers.history();
        let machine_log = watchers.machines();
        let peak_machines = machine_log.max_between(t0, t1);
        let peak_members = history.max_size_between(t0, t1);
        println!(
            "{cluster} run {run:>3} {operation:?} seed {run_seed}: killed at {points:?}, converged in {:.1}s (peak {peak_machines} Machines, {peak_members} members)",
            began.elapsed().as_secs_f64()
        );
        assert!(
            peak_machines <= bound,
            "run {run}: {peak_machines} Machines, at most {bound} allowed"
        );
        assert!(
            peak_members <= bound,
            "run {run}: {peak_members} members, at most {bound} allowed"
        );
        let names = history.last().unwrap().names();
        assert_eq!(
            names,
            machine_names(&client, cluster).await,
            "run {run}: etcd members ≠ Machines"
        );
        assert_safe(&history, &machine_log);
    }
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    println!(
        "{cluster}: {count} runs, {kills} SIGKILLs, {:.0}s",
        started.elapsed().as_secs_f64()
    );
    drop(plane);
}
