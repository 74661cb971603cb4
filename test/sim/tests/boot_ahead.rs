#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Boot in parallel, join in series (issue 39), with both real controller binaries and real
//! etcd on Machines that take 10–20 s to boot: every Machine a creation needs is created as soon
//! as the first member is healthy, and they boot together, while their members still join one
//! at a time, each a learner added once every member is healthy and promoted before the next.

mod lifecycle_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim::boot_delay::BootDelay;
use etcdadm_sim::plane::Plane;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(240);

/// The joiners' boot delays of this seed (10.8, 15.0, 15.0 and 18.8 s after the first member's
/// 18.2 s) put two Machines' boots 10 ms apart: one of them must wait for the other's join.
const SEED: u64 = 15;

/// Every status message of a Machine of `cluster` that waited for its turn to join, polled until
/// the task is aborted.
fn record_waiting(
    client: &kube::Client,
    cluster: &str,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (client, name, recorded) = (client.clone(), format!("{cluster}-etcd"), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            if let Ok(etcd) = etcd_api(&client).get(&name).await {
                let status = etcd.status.unwrap_or_default();
                for member in &status.members {
                    let message = member.message.clone().unwrap_or_default();
                    if message.contains("waiting for its turn to join") {
                        recorded
                            .lock()
                            .unwrap()
                            .push(format!("{}: {message}", member.name));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    (seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_on_slow_machines_boot_together_and_join_one_at_a_time() {
    let work = TempDir::new("sim-boot-ahead");
    let mut options = plane_options(36, &work, Duration::from_secs(1));
    options.boot_delay = BootDelay::Seeded {
        min: Duration::from_secs(10),
        max: Duration::from_secs(20),
        seed: SEED,
    };
    let plane = Plane::start(options).await.unwrap();
    let client = plane.client.clone();
    let started = Instant::now();
    create(&client, "b5", 5, true, json!({}), json!({})).await;
    let watchers = Watchers::start(&client, "b5").await;
    let (waiting, poller) = record_waiting(&client, "b5");
    wait_settled(&client, "b5", 5, TIMEOUT, &work).await;
    println!(
        "created 5 members on Machines booting in 10-20 s (seed {SEED}) in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    poller.abort();
    let (history, machine_log) = watchers.finish();
    save_logs(&work, "boot-ahead");

    // Never two joins in flight, never two learners, members removed before Machines.
    assert_safe(&history, &machine_log);
    assert_learner_joins(&history, 4);
    // Booted together: all five Machines existed before the first learner was added.
    let five_machines = machine_log
        .counts
        .iter()
        .find(|(_, n)| *n == 5)
        .map(|(at, _)| *at)
        .expect("five Machines were never seen");
    let first_learner = history
        .snapshots
        .iter()
        .find(|s| s.members.len() > 1)
        .map(|s| s.at)
        .expect("no member ever joined");
    assert!(
        five_machines < first_learner,
        "Machines created at {five_machines:?}, the first learner added at {first_learner:?}: they did not boot ahead\n{machine_log:#?}\n{history:#?}"
    );
    assert_eq!(
        machine_log.max_between(Duration::ZERO, watchers_end(&machine_log)),
        5,
        "more Machines than replicas: {machine_log:#?}"
    );
    // A Machine that booted while another joined said so, and was no failed join.
    let waited = waiting.lock().unwrap().clone();
    assert!(
        !waited.is_empty(),
        "no Machine was seen waiting for its turn\n{}",
        logs(&work)
    );
    let reasons: Vec<String> = events(&client, "b5").await.into_iter().map(|(r, _)| r).collect();
    assert!(
        !reasons.iter().any(|r| r == "MemberJoinFailed"),
        "a waiting Machine was taken for a failed join: {reasons:?}"
    );
}

/// When the last change of the Machine set was recorded.
fn watchers_end(log: &etcdadm_sim::history::MachineLog) -> Duration {
    log.counts.last().map(|(at, _)| *at).unwrap_or_default() + Duration::from_secs(1)
}
