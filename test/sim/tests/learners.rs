#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Learner joins (issue 21), with both real controller binaries and real etcd: every join after
//! the first is a learner the controller pre-adds and then promotes, so a machine that never
//! boots never counts toward quorum and costs the serving members nothing.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::names;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::{Fault, MachineState};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lifecycle_support::*;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);

/// No acknowledged write lost, and none waited for as long as `max_gap`.
fn assert_writes_flowed(report: &WorkloadReport, max_gap: Duration) {
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 20, "the client hardly wrote: {report:?}");
    assert!(
        report.max_gap < max_gap,
        "writes stopped for {:?} (ending at {:?})",
        report.max_gap,
        report.max_gap_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_one_three_five_every_join_is_a_learner_add_then_its_promotion() {
    let work = TempDir::new("sim-learners-create");
    let plane = start_plane(30, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    for (cluster, size) in [("l1", 1), ("l3", 3), ("l5", 5)] {
        create(&client, cluster, size as i32, false, json!({}), json!({})).await;
        let started = Instant::now();
        let watchers = Watchers::start(&client, cluster).await;
        let etcd = wait_settled(&client, cluster, size, TIMEOUT, &work).await;
        println!(
            "created {size} members with learner joins in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let (history, machine_log) = watchers.finish();
        assert_safe(&history, &machine_log);
        assert_learner_joins(&history, size - 1);
        let status = etcd.status.unwrap();
        assert!(
            status.members.iter().all(|m| !m.is_learner && m.healthy),
            "{status:?}"
        );
        let reasons: Vec<String> = events(&client, cluster)
            .await
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        for expected in ["LearnerAdded", "LearnerPromoted"] {
            assert_eq!(
                reasons.iter().any(|r| r == expected),
                size > 1,
                "{expected} Events of {cluster}: {reasons:?}"
            );
        }
    }
    save_logs(&work, "learners-create");
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
    assert_writes_flowed(&report, Duration::from_secs(10));
    println!(
        "grew 1 → 3 with {dead} never booting in {:.1}s; client: {} writes, longest gap {:?}",
        wall.as_secs_f64(),
        report.acked,
        report.max_gap
    );
}

/// `object` as a new object named `name`: what the API server and CAPI assign is dropped, and
/// every reference to `from` by name points at `name` (a Machine's config and infra machine).
fn renamed(object: &impl serde::Serialize, from: &str, name: &str) -> Value {
    let mut value = serde_json::to_value(object).unwrap();
    let meta = value["metadata"].as_object_mut().unwrap();
    for assigned in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        meta.remove(assigned);
    }
    meta.insert("name".into(), json!(name));
    // CAPI makes the Machine an owner of its config and infra machine: that one is not ours.
    if let Some(Value::Array(owners)) = meta.get_mut("ownerReferences") {
        owners.retain(|o| o["kind"] != "Machine");
    }
    value.as_object_mut().unwrap().remove("status");
    if let Some(spec) = value["spec"].as_object_mut() {
        for by_name in ["bootstrap", "infrastructureRef"] {
            if let Some(reference) = spec.get_mut(by_name) {
                let text = reference
                    .to_string()
                    .replace(&format!("\"{from}\""), &format!("\"{name}\""));
                *reference = serde_json::from_str(&text).unwrap();
            }
        }
        if let Some(bootstrap) = spec.get_mut("bootstrap").and_then(Value::as_object_mut) {
            bootstrap.remove("dataSecretName");
        }
        spec.remove("providerID");
    }
    value
}

/// What the previous controller version created for a new member: EtcdadmConfig (without the
/// learner-join annotation), infra machine and Machine, like those of the first member.
async fn create_as_the_previous_version(client: &Client, first: &str, name: &str) {
    let configs: Api<EtcdadmConfig> = Api::default_namespaced(client.clone());
    let mut config: EtcdadmConfig =
        serde_json::from_value(renamed(&configs.get(first).await.unwrap(), first, name)).unwrap();
    config.metadata.annotations = None;
    configs.create(&PostParams::default(), &config).await.unwrap();
    let sims: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &etcdadm_sim::capi::sim_machine_resource(),
    );
    let sim: DynamicObject =
        serde_json::from_value(renamed(&sims.get(first).await.unwrap(), first, name)).unwrap();
    sims.create(&PostParams::default(), &sim).await.unwrap();
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let machine: Machine =
        serde_json::from_value(renamed(&machines.get(first).await.unwrap(), first, name)).unwrap();
    machines.create(&PostParams::default(), &machine).await.unwrap();
}

async fn set_paused(client: &Client, cluster: &str, paused: bool) {
    let value = paused.then_some("");
    etcd_api(client)
        .patch(
            &format!("{cluster}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {names::PAUSED_ANNOTATION: value}}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_the_previous_version_grew_with_voter_joins_is_adopted_without_change() {
    let work = TempDir::new("sim-learners-adopt");
    let plane = start_plane(32, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    // The first member, then two more as the previous version made them (this controller
    // paused meanwhile): their configs lack the annotation, so etcdadm adds each as a voter.
    create(&client, "a3", 1, false, json!({}), json!({})).await;
    wait_settled(&client, "a3", 1, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "a3").await;
    let first = machines(&client, "a3").await[0].name_any();
    set_paused(&client, "a3", true).await;
    patch_spec(&client, "a3", json!({"replicas": 3})).await;
    for (n, name) in ["a3-etcd-prev1", "a3-etcd-prev2"].iter().enumerate() {
        create_as_the_previous_version(&client, &first, name).await;
        let deadline = Instant::now() + TIMEOUT;
        while !watchers.history().last().is_some_and(|s| {
            s.members.len() == n + 2
                && s.members
                    .iter()
                    .all(|(_, name, started, learner)| *started && !learner && !name.is_empty())
        }) {
            assert!(
                Instant::now() < deadline,
                "{name} never joined: {:#?}\n{}",
                watchers.history(),
                logs(&work)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let joins = watchers.history().joins();
    assert!(
        joins.len() == 2 && joins.iter().all(|(_, learner, _)| !learner),
        "voter joins expected: {joins:?}"
    );

    // This version takes over: nothing to change, so nothing changes.
    let before = watchers.history().snapshots.len();
    let events_before: BTreeSet<(String, String)> = events(&client, "a3").await.into_iter().collect();
    set_paused(&client, "a3", false).await;
    let etcd = wait_settled(&client, "a3", 3, TIMEOUT, &work).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (history, machine_log) = watchers.finish();
    save_logs(&work, "learners-adopt");
    assert_safe(&history, &machine_log);
    assert_eq!(
        history.snapshots.len(),
        before,
        "membership changed after adoption: {history:#?}"
    );
    let names: BTreeSet<String> = machines(&client, "a3")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([first.clone(), "a3-etcd-prev1".into(), "a3-etcd-prev2".into()])
    );
    let configs: Api<EtcdadmConfig> = Api::default_namespaced(client.clone());
    for name in ["a3-etcd-prev1", "a3-etcd-prev2"] {
        let config = configs.get(name).await.unwrap();
        assert!(
            !config.joins_as_learner(),
            "{name}'s config was changed: {:?}",
            config.metadata.annotations
        );
    }
    assert!(
        etcd.status
            .unwrap()
            .members
            .iter()
            .all(|m| !m.is_learner && m.healthy)
    );
    // No Event of anything done to members or Machines since.
    let acted = [
        "MachineCreated",
        "MachineAdopted",
        "LearnerAdded",
        "LearnerPromoted",
        "MemberRemoved",
        "LeadershipMoved",
        "MachinesDeleted",
        "LeftoversDeleted",
        "ScalingDown",
        "RollingUpdate",
        "MemberJoinFailed",
        "MemberRemediation",
    ];
    let changes: Vec<(String, String)> = events(&client, "a3")
        .await
        .into_iter()
        .filter(|e| !events_before.contains(e) && acted.contains(&e.0.as_str()))
        .collect();
    assert!(
        changes.is_empty(),
        "the adopted cluster was acted on: {changes:?}"
    );
}

fn config(version: &str) -> Value {
    json!({"cloudInitConfig": {"version": version}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_member_rollout_with_max_surge_one_keeps_writes_flowing() {
    let work = TempDir::new("sim-learners-rollout");
    let plane = start_plane(33, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "o1", 1, false, config("3.4.22"), json!({})).await;
    wait_settled(&client, "o1", 1, TIMEOUT, &work).await;
    let old = machines(&client, "o1").await[0].name_any();
    let watchers = Watchers::start(&client, "o1").await;
    let (endpoints, follower) = follow_status_endpoints(&client, "o1");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(&client, "o1", endpoints, watchers.started).await;

    let started = Instant::now();
    let mut upgrade = config("3.4.23");
    upgrade["preEtcdadmCommands"] = json!(["echo upgraded"]);
    patch_spec(
        &client,
        "o1",
        json!({"etcdadmConfigSpec": upgrade, "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}),
    )
    .await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let etcd = wait_settled(&client, "o1", 1, TIMEOUT, &work).await;
        if etcd.status.unwrap().members.iter().all(|m| m.name != old) {
            break;
        }
        assert!(Instant::now() < deadline, "{old} never replaced\n{}", logs(&work));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    let report = workload.finish().await;
    follower.abort();
    let (history, machine_log) = watchers.finish();
    save_logs(&work, "learners-rollout");

    assert_safe(&history, &machine_log);
    assert_learner_joins(&history, 1);
    assert_eq!(history.max_size(), 2, "add first, then remove: {history:#?}");
    // As in lifecycle_rollout: a client never waits longer than this for a write.
    assert_writes_flowed(&report, Duration::from_secs(2));
    println!(
        "rolled 1 member (maxSurge 1) in {:.1}s; client: {} writes, longest gap {:?}",
        wall.as_secs_f64(),
        report.acked,
        report.max_gap
    );
}
