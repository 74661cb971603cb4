#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Learner joins (issue 21), with both real controller binaries and real etcd: every join after
//! the first is a learner the controller pre-adds and then promotes, so a machine that never
//! boots never counts toward quorum and costs the serving members nothing.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::{Fault, MachineState};
use kube::ResourceExt;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);

/// Every member that joined after the first was first seen as a learner and later as a voter.
fn assert_learner_joins(history: &etcdadm_sim::history::History, joined: usize) {
    let joins = history.joins();
    let promoted = joins
        .iter()
        .filter(|(_, learner, voter)| *learner && *voter)
        .count();
    assert_eq!(
        (joins.len(), promoted),
        (joined, joined),
        "every join must be a learner add, then its promotion: {joins:?}\n{history:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_three_every_join_is_a_learner_add_then_its_promotion() {
    let work = TempDir::new("sim-learners-create");
    let plane = start_plane(30, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "l3", 3, false, json!({}), json!({})).await;
    let started = Instant::now();
    let watchers = Watchers::start(&client, "l3").await;
    let etcd = wait_settled(&client, "l3", 3, TIMEOUT, &work).await;
    println!(
        "created 3 members with learner joins in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let (history, machine_log) = watchers.finish();
    save_logs(&work, "learners-create");
    assert_safe(&history, &machine_log);
    assert_learner_joins(&history, 2);
    let status = etcd.status.unwrap();
    assert!(
        status.members.iter().all(|m| !m.is_learner && m.healthy),
        "{status:?}"
    );
    let reasons: Vec<String> = events(&client, "l3").await.into_iter().map(|(r, _)| r).collect();
    for expected in ["LearnerAdded", "LearnerPromoted"] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected} Event: {reasons:?}"
        );
    }
}

/// Power off the next Machine of `cluster` not in `known` as soon as it boots, before its node
/// can start etcd (it first waits until its learner is listed). Returns its name.
async fn power_off_the_next_machine(plane: &Plane, cluster: &str, known: &BTreeSet<String>) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        for machine in machines(&plane.client, cluster).await {
            let name = machine.name_any();
            if !known.contains(&name) && plane.runtime.state(&name) == MachineState::Booting {
                plane.runtime.fault(&name, Fault::PowerOff).unwrap();
                return name;
            }
        }
        assert!(Instant::now() < deadline, "no new Machine of {cluster} booted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_machine_that_never_boots_costs_the_first_member_no_write() {
    let work = TempDir::new("sim-learners-dead-join");
    let plane = start_plane(31, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "l1", 1, false, json!({}), json!({})).await;
    wait_settled(&client, "l1", 1, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "l1").await;
    let (endpoints, follower) = follow_status_endpoints(&client, "l1");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(&client, "l1", endpoints, watchers.started).await;
    let known: BTreeSet<String> = machines(&client, "l1")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();

    let started = Instant::now();
    patch_spec(&client, "l1", json!({"replicas": 3})).await;
    let dead = power_off_the_next_machine(&plane, "l1", &known).await;
    wait_settled(&client, "l1", 3, TIMEOUT, &work).await;
    let wall = started.elapsed();
    let report = workload.finish().await;
    follower.abort();
    let (history, machine_log) = watchers.finish();
    save_logs(&work, "learners-dead-join");

    // The dead Machine's learner never started, was removed, and its Machine replaced.
    let failures: Vec<String> = events(&client, "l1")
        .await
        .into_iter()
        .filter(|(r, n)| r == "MemberJoinFailed" && n.contains(&dead))
        .map(|(_, n)| n)
        .collect();
    assert!(
        !failures.is_empty(),
        "no MemberJoinFailed for {dead}\n{}",
        logs(&work)
    );
    assert!(
        !history.ever_member(&dead),
        "{dead}'s member started: {history:#?}"
    );
    let names: BTreeSet<String> = machines(&client, "l1")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert!(!names.contains(&dead), "{dead} is still there");
    assert_eq!(history.failed_joins().len(), 1, "{history:#?}");
    let pending = history.changes_while_a_failed_join_was_pending();
    assert!(pending.is_empty(), "{pending:?}\n{history:#?}");
    assert_safe(&history, &machine_log);
    // Joins: the dead learner (never promoted), then the two that made it.
    let joins = history.joins();
    assert!(joins.iter().all(|(_, learner, _)| *learner), "{joins:?}");
    assert_eq!(
        joins.iter().filter(|(_, _, voter)| *voter).count(),
        2,
        "{joins:?}"
    );

    // The first member served writes throughout: a voter join would have stalled them for the
    // whole join deadline (30 s) until the dead member was removed.
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 20, "the client hardly wrote: {report:?}");
    assert!(
        report.max_gap < Duration::from_secs(10),
        "writes stopped for {:?} (ending at {:?}): the dead learner counted toward quorum",
        report.max_gap,
        report.max_gap_at
    );
    println!(
        "grew 1 → 3 with {dead} never booting in {:.1}s; client: {} writes, longest gap {:?}",
        wall.as_secs_f64(),
        report.acked,
        report.max_gap
    );
}
