#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A network partition between the management side and etcd (issue 33): every member cut off
//! from the controller (machines that run the real etcdadm, each in a network namespace on a
//! bridge; the host's routes to them prohibited) while the members keep serving one another.
//! Nothing may be deleted: the condition names what is seen, an automatic recovery due by its
//! clock waits for evidence of a lost majority, and once the way is back the cluster is Ready on
//! the same Machines with the same members.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use etcdadm_shared::api::cluster::condition::ENDPOINTS_AVAILABLE;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::demo;
use etcdadm_sim_machines::network;
use kube::api::{Patch, PatchParams};
use lifecycle_support::real_etcdadm::{config, start_plane};
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(240);
const BUCKET: &str = "etcd-backups";
/// `fast_health`'s: a member unhealthy this long is remediated.
const UNHEALTHY_AFTER: Duration = Duration::from_secs(5);

/// Member IDs in status, by Machine.
fn member_ids(etcd: &etcdadm_shared::api::EtcdadmCluster) -> BTreeSet<(String, String)> {
    etcd.status
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| (m.name.clone(), m.member_id.clone().unwrap_or_default()))
        .collect()
}

/// Poll until the Ready condition's reason is `reason` (or fail with the status and logs).
async fn wait_ready_reason(client: &kube::Client, reason: &str, work: &TempDir) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let etcd = etcd_api(client).get("p1-etcd").await.unwrap();
        let (_, seen, message) = condition(&etcd, "Ready");
        if seen == reason {
            return message;
        }
        assert!(
            Instant::now() < deadline,
            "Ready never said {reason}: {:?}\n{}",
            etcd.status,
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_the_controller_deletes_nothing_and_is_named() {
    let work = TempDir::new("sim-partition");
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let plane = start_plane(70, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        "p1",
        3,
        false,
        config(json!({})),
        json!({
            "backup": {"store": {"s3": store}},
            "recovery": {"automatic": true, "after": "10m"},
        }),
    )
    .await;
    let etcd = wait_settled(&client, "p1", 3, TIMEOUT, &work).await;
    let machines_before = machine_names(&client, "p1").await;
    let members_before = member_ids(&etcd);
    let endpoints: Vec<String> = etcd
        .status
        .unwrap()
        .endpoints
        .split(',')
        .map(String::from)
        .collect();
    let tls = demo::etcd_tls(&client, client.default_namespace(), "p1")
        .await
        .unwrap()
        .unwrap();

    // Cut the management side off.
    let lab = plane.lab.as_ref().unwrap();
    lab.cut_off_host().unwrap();
    let cut = Instant::now();
    let message = wait_ready_reason(&client, "MembersUnreachable", &work).await;
    println!(
        "{:.1}s after the cut: MembersUnreachable: {message}",
        cut.elapsed().as_secs_f64()
    );
    assert!(message.contains("cut off"), "{message}");

    // The automatic recovery's clock: as if no member had served clients for an hour. A status
    // the controller applies from an earlier read puts its own time back: set again until seen.
    let an_hour_ago = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
    let an_hour_ago = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        an_hour_ago.round(k8s_openapi::jiff::Unit::Second).unwrap(),
    );
    let deadline = Instant::now() + TIMEOUT;
    let waiting = loop {
        let etcd = etcd_api(&client).get("p1-etcd").await.unwrap();
        let (_, reason, message) = condition(&etcd, "Recovery");
        if reason == "WaitingForEvidenceOfQuorumLoss" {
            break message;
        }
        let mut conditions = etcd.status.clone().unwrap().conditions;
        let endpoints = conditions
            .iter_mut()
            .find(|c| c.type_ == ENDPOINTS_AVAILABLE)
            .unwrap();
        assert_eq!(
            endpoints.status,
            etcdadm_shared::api::ConditionStatus::False,
            "{endpoints:?}"
        );
        if endpoints.last_transition_time != an_hour_ago {
            endpoints.last_transition_time = an_hour_ago.clone();
            etcd_api(&client)
                .patch_status(
                    "p1-etcd",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": conditions}})),
                )
                .await
                .unwrap();
        }
        assert!(Instant::now() < deadline, "{:?}\n{}", etcd.status, logs(&work));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(waiting.contains("network partition"), "{waiting}");

    // Meanwhile the members serve one another: seen from inside the first member's namespace.
    let certs = work.path().join("client");
    std::fs::create_dir_all(&certs).unwrap();
    for (file, pem) in [
        ("ca.crt", &tls.ca_pem),
        ("client.crt", &tls.cert_pem),
        ("client.key", &tls.key_pem),
    ] {
        std::fs::write(certs.join(file), pem).unwrap();
    }
    let first = machines_before.iter().next().unwrap();
    let netns = format!("/run/netns/{}", network::netns_name(70, first));
    let health = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["--", "etcdctl", "endpoint", "health"])
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg(format!("--cacert={}", certs.join("ca.crt").display()))
        .arg(format!("--cert={}", certs.join("client.crt").display()))
        .arg(format!("--key={}", certs.join("client.key").display()))
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl (Debian package etcd-client, installed by .ci/setup)");
    let said = String::from_utf8_lossy(&health.stdout).to_string() + &String::from_utf8_lossy(&health.stderr);
    assert!(
        health.status.success(),
        "members do not serve one another: {said}"
    );
    assert_eq!(said.matches("is healthy").count(), 3, "{said}");

    // Well past remediation's delay: nothing deleted, no recovery begun.
    let hold_until = cut + UNHEALTHY_AFTER * 6;
    while Instant::now() < hold_until {
        let machines = machines(&client, "p1").await;
        assert!(
            machines.iter().all(|m| !m.is_deleting()),
            "a Machine deleted during the partition"
        );
        let etcd = etcd_api(&client).get("p1-etcd").await.unwrap();
        assert!(
            etcd.status.as_ref().unwrap().recovery.is_none(),
            "a recovery began: {:?}",
            etcd.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(machine_names(&client, "p1").await, machines_before);

    // The way back: Ready on the same Machines, the same members.
    lab.reconnect_host();
    let etcd = wait_settled(&client, "p1", 3, TIMEOUT, &work).await;
    assert_eq!(machine_names(&client, "p1").await, machines_before);
    assert_eq!(member_ids(&etcd), members_before);
    let reasons: Vec<String> = events(&client, "p1").await.into_iter().map(|(r, _)| r).collect();
    assert!(reasons.iter().any(|r| r == "MembersUnreachable"), "{reasons:?}");
    assert!(
        !reasons
            .iter()
            .any(|r| r == "MemberRemediation" || r == "MachineDeleted"),
        "{reasons:?}"
    );
    save_logs(&work, "partition");
}
