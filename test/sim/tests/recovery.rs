#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `recover` annotation's refusals with both real controller binaries and real etcd: on a
//! healthy cluster it is refused and changes nothing (Ready stays, same Machines, members and
//! CA); once two of three machines are powered off for good, `latest` without an object store is
//! refused saying a store is needed, and still nothing is deleted; the annotation stays until the
//! user removes it, and its answer goes with it.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim_machines::Fault;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const RECOVER: &str = "etcdcluster.cluster.x-k8s.io/recover";

async fn annotate(client: &kube::Client, value: Option<&str>) {
    etcd_api(client)
        .patch(
            "q1-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RECOVER: value}}})),
        )
        .await
        .unwrap();
}

/// Wait until the `Recovery` condition's message contains `says`; its reason.
async fn answer(client: &kube::Client, says: &str, work: &TempDir) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let etcd = etcd_api(client).get("q1-etcd").await.unwrap();
        let (_, reason, message) = condition(&etcd, "Recovery");
        if message.contains(says) {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "no Recovery answer saying {says:?}: {reason} {message}\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Machine names, member IDs and the CA, which a refused recovery never changes.
async fn fingerprint(client: &kube::Client) -> (BTreeSet<String>, BTreeSet<String>, Option<String>) {
    let machines = machines(client, "q1")
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let etcd = etcd_api(client).get("q1-etcd").await.unwrap();
    let members = etcd
        .status
        .unwrap()
        .members
        .into_iter()
        .filter_map(|m| m.member_id)
        .collect();
    let ca = Api::<Secret>::default_namespaced(client.clone())
        .get("q1-managed-etcd")
        .await
        .unwrap()
        .data
        .and_then(|d| {
            d.get("tls.crt")
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        });
    (machines, members, ca)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_is_refused_unless_quorum_is_lost_and_a_store_is_set_and_nothing_is_deleted() {
    let work = TempDir::new("sim-recovery-refusals");
    let plane = start_plane_on(None, 17, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    create(&client, "q1", 3, false, json!({}), json!({})).await;
    let etcd = wait_settled(&client, "q1", 3, TIMEOUT, &work).await;
    let before = fingerprint(&client).await;

    // (d) On a healthy cluster: refused, and nothing changes.
    annotate(&client, Some("latest")).await;
    assert_eq!(
        answer(&client, "quorum is not lost", &work).await,
        "RecoveryRefused"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settled(&client, "q1", 3).await.unwrap();
    assert_eq!(fingerprint(&client).await, before);
    let etcd_now = etcd_api(&client).get("q1-etcd").await.unwrap();
    assert_eq!(
        etcd_now.annotations().get(RECOVER).map(String::as_str),
        Some("latest")
    );
    let warnings: Vec<String> = events(&client, "q1")
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "RecoveryRefused")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("quorum is not lost"), "{}", warnings[0]);

    // Two of three machines gone for good: `latest` has no store to put a snapshot in.
    let members = etcd.status.unwrap().members;
    for m in members.iter().filter(|m| !m.is_leader).take(2) {
        plane.runtime.fault(&m.name, Fault::PowerOff).unwrap();
    }
    let reason = answer(&client, "needs an object store", &work).await;
    assert_eq!(reason, "RecoveryRefused");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = fingerprint(&client).await;
    assert_eq!(
        (&after.0, &after.2),
        (&before.0, &before.2),
        "nothing deleted, same CA"
    );
    assert!(
        machines(&client, "q1").await.iter().all(|m| m
            .annotations()
            .contains_key("pre-terminate.delete.hook.machine.cluster.x-k8s.io/etcdadm-cluster")
            && m.metadata.deletion_timestamp.is_none()),
        "every Machine kept, with its hook"
    );

    // Removed by the user: the answer goes with it, and quorum loss is reported as before.
    annotate(&client, None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let etcd = etcd_api(&client).get("q1-etcd").await.unwrap();
        let gone = etcd
            .status
            .as_ref()
            .is_some_and(|s| !s.conditions.iter().any(|c| c.type_ == "Recovery"));
        if gone && condition(&etcd, "Ready").1 == "QuorumLost" {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", etcd.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    save_logs(&work, "recovery-refusals");
}
