#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Certificate renewal with both real controller binaries, real etcd and a real kube-apiserver
//! (printer columns, the CRD's `minimum`): members whose certificates expire in 20 days are left
//! alone under a 7-day `rolloutBefore.certificatesExpiryDays`, and rolled, surge-then-switch
//! with one control plane endpoint update, once the window grows to 30 days, while a client
//! writes every 50 ms and loses nothing; their replacements carry fresh 365-day certificates.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::testing::TempDir;
use k8s_openapi::jiff::Timestamp;
use lifecycle_support::*;
use serde_json::json;

const DAY: i64 = 86_400;
const TIMEOUT: Duration = Duration::from_secs(180);
/// What the stand-in's etcdadm issues the first members.
const SHORT_VALIDITY: Duration = Duration::from_secs(20 * 86_400);

fn days_left(etcd: &EtcdadmCluster) -> Vec<i64> {
    let now = Timestamp::now().as_second();
    etcd.status
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| {
            let expiry = m
                .certificate_expiry
                .as_ref()
                .unwrap_or_else(|| panic!("member {} has no certificateExpiry: {m:?}", m.name));
            (expiry.0.as_second() - now) / DAY
        })
        .collect()
}

/// `kubectl <args>` against the plane's API server, in the scenario's namespace.
fn kubectl(real: &real_apiserver::RealApiServer, namespace: &str, args: &[&str]) -> String {
    let output = real
        .server
        .kubectl()
        .args(["-n", namespace])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_near_expiry_are_rolled_onto_fresh_certificates_without_losing_writes() {
    let real = real_apiserver::RealApiServer::start().await;
    let work = TempDir::new("sim-certificates");
    let plane = start_plane_on(Some(&real), 31, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    let namespace = client.default_namespace().to_string();

    // The API server itself refuses a window under 7 days, naming the field.
    let refused = etcd_api(&client)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": "too-short"},
                "spec": {"infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"},
                         "rolloutBefore": {"certificatesExpiryDays": 6}}
            }))
            .unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("spec.rolloutBefore.certificatesExpiryDays"),
        "{refused}"
    );

    plane.set_member_certificate_validity(Some(SHORT_VALIDITY));
    create(
        &client,
        "c1",
        3,
        true,
        json!({}),
        json!({"rolloutBefore": {"certificatesExpiryDays": 7}}),
    )
    .await;
    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let left = days_left(&etcd);
    assert!(left.iter().all(|d| (18..20).contains(d)), "{left:?}");
    assert_eq!(condition(&etcd, "CertificatesExpiring").0, "False");
    let before = kubectl(&real, &namespace, &["get", "etcdc", "-o", "wide"]);
    assert!(before.contains("CERTIFICATES EXPIRE"), "{before}");
    println!("before the window grows:\n{before}");

    // Replacements get etcdadm's 365 days again.
    plane.set_member_certificate_validity(None);
    let watchers = Watchers::start(&client, "c1").await;
    let describe = {
        let client = client.clone();
        let kubeconfig = real.server.kubeconfig().to_path_buf();
        let namespace = namespace.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(etcd) = etcd_api(&client).get("c1-etcd").await
                    && condition(&etcd, "CertificatesExpiring").0 == "True"
                {
                    let output = std::process::Command::new("kubectl")
                        .arg(format!("--kubeconfig={}", kubeconfig.display()))
                        .args(["-n", &namespace, "describe", "etcdc", "c1-etcd"])
                        .output()
                        .unwrap();
                    return String::from_utf8(output.stdout).unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            String::new()
        })
    };
    let outcome = roll(
        &plane,
        &work,
        &watchers,
        "c1",
        true,
        json!({"rolloutBefore": {"certificatesExpiryDays": 30}}),
    )
    .await;
    assert_eq!(
        outcome.peak_members, 6,
        "surge-then-switch adds every new member first"
    );
    assert_eq!(outcome.kcp_writes, 1, "{:?}", plane.kcp_record.lock().unwrap());
    let (history, machine_log) = watchers.finish();
    assert_safe(&history, &machine_log);

    let during = describe.await.unwrap();
    assert!(during.contains("CertificatesExpiring"), "{during}");
    assert!(during.contains("certificate expires"), "{during}");
    println!("while renewing:\n{during}");

    let etcd = wait_settled(&client, "c1", 3, TIMEOUT, &work).await;
    let left = days_left(&etcd);
    assert!(left.iter().all(|d| (363..366).contains(d)), "{left:?}");
    assert_eq!(condition(&etcd, "CertificatesExpiring").0, "False");
    let events = events(&client, "c1").await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "CertificatesExpiring" && note.contains("expires")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "RollingUpdate" && note.contains("certificate expires")),
        "{events:?}"
    );
    let after = kubectl(&real, &namespace, &["get", "etcdc", "-o", "wide"]);
    println!("after:\n{after}");
    println!(
        "renewed 3 members in {:.1}s; longest client write gap {:?}",
        outcome.wall.as_secs_f64(),
        outcome.max_gap
    );
    save_logs(&work, "certificates");
    drop(plane);
}
