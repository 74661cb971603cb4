#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Scale 5 → 3 → 1 → 3 and `kubectl delete machine`, with both real controller binaries and
//! real etcd: one membership change at a time, every member removed before its Machine goes,
//! one control plane endpoint update per resize, zones kept balanced.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::testing::TempDir;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_five_three_one_three_and_delete_a_machine_remove_members_first() {
    let work = TempDir::new("sim-lifecycle-scale");
    let plane = start_plane(4, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "s1", 5, true, json!({}), json!({})).await;
    let started = Instant::now();
    wait_settled(&client, "s1", 5, TIMEOUT, &work).await;
    println!("created 5 members in {:.1}s", started.elapsed().as_secs_f64());
    let watchers = Watchers::start(&client, "s1").await;

    let kcp_writes = || plane.kcp_record.lock().unwrap().endpoint_changes.len();
    for (from, to) in [(5, 3), (3, 1), (1, 3)] {
        let writes = kcp_writes();
        let t0 = watchers.now();
        let started = Instant::now();
        patch_spec(&client, "s1", json!({"replicas": to})).await;
        let etcd = wait_settled(&client, "s1", to, TIMEOUT, &work).await;
        println!("scaled {from} → {to} in {:.1}s", started.elapsed().as_secs_f64());
        let history = watchers.history();
        let peak = history.max_size_between(t0, watchers.now());
        assert_eq!(
            peak,
            from.max(to),
            "membership went past the larger size: {history:#?}"
        );
        let zones: Vec<String> = machines(&client, "s1")
            .await
            .iter()
            .filter_map(|m| m.spec.failure_domain.clone())
            .collect();
        let distinct: BTreeSet<&String> = zones.iter().collect();
        assert_eq!(distinct.len(), to.min(3), "zones unbalanced: {zones:?}");
        assert_eq!(condition(&etcd, "ResizeCompleted").0, "True");
        // The control plane got the new endpoints once (the stand-in records on its next tick).
        let deadline = Instant::now() + Duration::from_secs(5);
        while kcp_writes() == writes && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(kcp_writes(), writes + 1, "{:?}", plane.kcp_record.lock().unwrap());
    }
    let reasons: Vec<String> = events(&client, "s1").await.into_iter().map(|(r, _)| r).collect();
    for expected in [
        "ScalingDown",
        "MemberRemoved",
        "PreTerminateHookReleased",
        "MachineCreated",
    ] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected} Event: {reasons:?}"
        );
    }

    // `kubectl delete machine` of a member that does not lead: its member goes first, then a
    // replacement joins; membership never exceeds three.
    let etcd = etcd_api(&client).get("s1-etcd").await.unwrap();
    let victim = etcd
        .status
        .unwrap()
        .members
        .iter()
        .find(|m| !m.is_leader)
        .unwrap()
        .name
        .clone();
    let t0 = watchers.now();
    Api::<Machine>::default_namespaced(client.clone())
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let started = Instant::now();
    let deadline = Instant::now() + TIMEOUT;
    let etcd = loop {
        let etcd = wait_settled(&client, "s1", 3, TIMEOUT, &work).await;
        let names: Vec<String> = machines(&client, "s1")
            .await
            .iter()
            .map(|m| m.name_any())
            .collect();
        if !names.contains(&victim) {
            break etcd;
        }
        assert!(Instant::now() < deadline, "{victim} never replaced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "deleted Machine {victim} replaced in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(etcd.status.unwrap().members.iter().all(|m| m.name != victim));
    let (history, machine_log) = watchers.finish();
    assert_eq!(history.max_size_between(t0, Duration::MAX), 3, "{history:#?}");
    assert!(history.left_at(&victim).is_some(), "the member left etcd");
    let seen = history.last_seen(&victim).expect("the member was recorded");
    let gone = machine_log.lives[&victim].gone.expect("the Machine went");
    assert!(
        seen < gone,
        "member still in etcd at {seen:?}, Machine gone at {gone:?}"
    );
    assert_safe(&history, &machine_log);
    drop(plane);
}
