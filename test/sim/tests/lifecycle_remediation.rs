#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Remediation with both real controller binaries and real etcd: a member killed for good is
//! removed and replaced soon after `unhealthyAfter`; with two of three dead nothing is removed
//! and `QuorumLost` is reported; when they come back the cluster is Ready with the same
//! Machines.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim_machines::Fault;
use kube::ResourceExt;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
/// `fast_health()`'s `unhealthyAfter`.
const UNHEALTHY_AFTER: Duration = Duration::from_secs(5);
/// Detection (a few 1 s checks), removal, and a new member's boot and join.
const MARGIN: Duration = Duration::from_secs(25);

/// One scenario at a time in this binary: both share the machine's two cores with real etcd.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_and_a_lost_quorum_is_waited_out() {
    let _turn = ONE_AT_A_TIME.lock().await;
    remediation(None, 6).await;
}

/// The same on a real kube-apiserver, each controller acting as its own ServiceAccount with the
/// permissions config/rbac grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_on_a_real_api_server_under_the_controllers_own_rbac() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = real_apiserver::start().await;
    let started = Instant::now();
    remediation(Some(&real), 10).await;
    println!(
        "remediation on a real kube-apiserver: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

async fn remediation(real: Option<&real_apiserver::RealApiServer>, prefix: u8) {
    let work = TempDir::new("sim-lifecycle-remediation");
    let plane = start_plane_on(real, prefix, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "h1", 3, true, json!({}), json!({})).await;
    let etcd = wait_settled(&client, "h1", 3, TIMEOUT, &work).await;
    let watchers = Watchers::start(&client, "h1").await;

    // The leader's machine powers off for good.
    let dead = leader(&etcd);
    plane.runtime.fault(&dead, Fault::PowerOff).unwrap();
    let killed = Instant::now();
    let deadline = killed + UNHEALTHY_AFTER + MARGIN;
    let mut seen_unhealthy = None;
    loop {
        if seen_unhealthy.is_none() {
            let etcd = etcd_api(&client).get("h1-etcd").await.unwrap();
            let members = etcd.status.map(|s| s.members).unwrap_or_default();
            if members.iter().any(|m| m.name == dead && !m.healthy) {
                seen_unhealthy = Some(killed.elapsed());
            }
        }
        if settled(&client, "h1", 3).await.is_ok() && !machine_names(&client, "h1").await.contains(&dead) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{dead} not replaced within {:?}\n{}",
            UNHEALTHY_AFTER + MARGIN,
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let remediation = killed.elapsed();
    println!(
        "member {dead} killed → unhealthy in status after {:.2}s (interval 1s, timeout 1s); removed and \
         replaced, Ready in {:.1}s (unhealthyAfter {:?})",
        seen_unhealthy.unwrap_or_default().as_secs_f64(),
        remediation.as_secs_f64(),
        UNHEALTHY_AFTER
    );
    assert!(
        seen_unhealthy.is_some(),
        "{dead} was never reported unhealthy before its replacement"
    );
    assert!(remediation > UNHEALTHY_AFTER, "remediated before unhealthyAfter");
    let events = events(&client, "h1").await;
    let note = events
        .iter()
        .find(|(reason, _)| reason == "MemberRemediation")
        .map(|(_, note)| note.clone())
        .unwrap_or_else(|| panic!("no MemberRemediation Event: {events:?}"));
    assert!(note.contains(&dead), "{note}");
    let etcd = etcd_api(&client).get("h1-etcd").await.unwrap();
    let record = etcd.annotations()["etcdcluster.cluster.x-k8s.io/remediation"].clone();
    assert!(record.contains(&dead), "{record}");
    // The replacement carries the record: if it fails soon too, the next remediation backs off.
    let replacement = machines(&client, "h1")
        .await
        .into_iter()
        .find(|m| {
            m.annotations()
                .contains_key("etcdcluster.cluster.x-k8s.io/remediation-for")
        })
        .expect("a Machine marked as the replacement");
    assert_eq!(
        replacement.annotations()["etcdcluster.cluster.x-k8s.io/remediation-for"],
        record
    );

    // Two of three stop (SIGSTOP): quorum is lost, nothing is removed however long it lasts.
    let survivors = machine_names(&client, "h1").await;
    let stopped: Vec<String> = survivors.iter().take(2).cloned().collect();
    for name in &stopped {
        plane.runtime.fault(name, Fault::Pause).unwrap();
    }
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let etcd = etcd_api(&client).get("h1-etcd").await.unwrap();
        let (status, reason, _) = condition(&etcd, "Ready");
        if status == "False" && reason == "QuorumLost" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "QuorumLost never reported\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lost = Instant::now();
    while lost.elapsed() < UNHEALTHY_AFTER + Duration::from_secs(5) {
        let machines = machines(&client, "h1").await;
        assert!(
            machines.iter().all(|m| !m.is_deleting()),
            "a Machine deleted without quorum"
        );
        assert_eq!(machine_names(&client, "h1").await, survivors);
        let etcd = etcd_api(&client).get("h1-etcd").await.unwrap();
        assert_eq!(condition(&etcd, "Ready").1, "QuorumLost");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reasons: Vec<String> = lifecycle_support::events(&client, "h1")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(reasons.iter().any(|r| r == "QuorumLost"), "{reasons:?}");

    // They come back: Ready again, with the same Machines.
    for name in &stopped {
        plane.runtime.fault(name, Fault::Resume).unwrap();
    }
    let resumed = Instant::now();
    wait_settled(&client, "h1", 3, TIMEOUT, &work).await;
    println!(
        "quorum lost for {:.1}s, nothing removed; Ready {:.1}s after the members came back",
        resumed.duration_since(lost).as_secs_f64(),
        resumed.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_settled(&client, "h1", 3, TIMEOUT, &work).await;
    assert_eq!(
        machine_names(&client, "h1").await,
        survivors,
        "a member that came back was replaced"
    );
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);
    drop(plane);
}
