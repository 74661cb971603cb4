#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Certificate renewal with both real controller binaries, real etcd and a real kube-apiserver
//! (printer columns, the CRD's `minimum`): members whose certificates expire in 20 days are left
//! alone under a 7-day `rolloutBefore.certificatesExpiryDays`, and rolled, surge-then-switch
//! with one control plane endpoint update, once the window grows to 30 days, while a client
//! writes every 50 ms and loses nothing; their replacements carry fresh 365-day certificates.
//! And the API server client certificate: one the scenario issued with 20 days left is
//! re-issued once the cluster is Ready, the controller crashes right after that write, and the
//! restarted one asks the KubeadmControlPlane for exactly one rollout.

mod lifecycle_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::contract::{bytes, secret_text};
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest, cert_matches_key, cert_not_after};
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::{Plane, PlaneOptions};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
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

/// One scenario at a time in this binary: both share the machine's two cores with real etcd,
/// and the rollout one measures the client's longest wait.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_near_expiry_are_rolled_onto_fresh_certificates_without_losing_writes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = real_apiserver::start().await;
    let work = TempDir::new("sim-certificates");
    let plane = start_plane_on(Some(&real), 34, &work, Duration::from_secs(1)).await;
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

/// A Secret of CAPI's type for cluster `cluster`, as its creator would write it.
fn cluster_secret(name: String, cluster: &str, data: &[(&str, &str)]) -> Secret {
    let mut secret = Secret {
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(data.iter().map(|(k, v)| (k.to_string(), bytes(v))).collect()),
        ..Default::default()
    };
    secret.metadata.name = Some(name);
    secret.metadata.labels = Some(BTreeMap::from([(
        names::CLUSTER_NAME_LABEL.to_string(),
        cluster.to_string(),
    )]));
    secret
}

fn days_until(pem: &str) -> i64 {
    let expiry = Timestamp::try_from(cert_not_after(pem).unwrap()).unwrap();
    (expiry.as_second() - Timestamp::now().as_second()) / DAY
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_certificate_is_reissued_once_and_one_control_plane_rollout_survives_a_crash() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let work = TempDir::new("sim-certificates-client");
    let plane = Plane::start(PlaneOptions {
        controller_env: vec![(names::EXIT_AFTER_CLIENT_RENEWAL_ENV.into(), "1".into())],
        ..plane_options(35, &work, Duration::from_millis(300))
    })
    .await
    .unwrap();
    let mut plane = plane;
    let client = plane.client.clone();
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());

    // The cluster's CA and a client certificate with 20 days left, there before the cluster.
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let short = ca
        .issue(&LeafRequest {
            validity: SHORT_VALIDITY,
            ..LeafRequest::apiserver_etcd_client("c2")
        })
        .unwrap();
    let client_secret = names::apiserver_client_secret_name("c2");
    for secret in [
        cluster_secret(
            names::ca_secret_name("c2"),
            "c2",
            &[
                (names::TLS_CERT_KEY, ca.cert_pem()),
                (names::TLS_KEY_KEY, ca.key_pem()),
            ],
        ),
        cluster_secret(
            client_secret.clone(),
            "c2",
            &[
                (names::TLS_CERT_KEY, &short.cert_pem),
                (names::TLS_KEY_KEY, &short.key_pem),
            ],
        ),
    ] {
        secrets.create(&Default::default(), &secret).await.unwrap();
    }
    // Every certificate the Secret ever holds, in order.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let watcher = {
        let (secrets, name, seen) = (secrets.clone(), client_secret.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(secret) = secrets.get(&name).await
                    && let Some(cert) = secret_text(&secret, names::TLS_CERT_KEY)
                {
                    let mut seen = seen.lock().unwrap();
                    if seen.last() != Some(&cert) {
                        seen.push(cert);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    create(&client, "c2", 3, true, json!({}), json!({})).await;
    // Ready, then the re-issue, then the crash before anything else is written.
    let deadline = Instant::now() + TIMEOUT;
    while plane.controller_running(CONTROLLER) {
        assert!(
            Instant::now() < deadline,
            "the controller never re-issued the client certificate\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed = secrets.get(&client_secret).await.unwrap();
    let annotation = renewed
        .annotations()
        .get(names::APISERVER_CLIENT_RENEWED_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| panic!("the controller exited without re-issuing\n{}", logs(&work)));
    let cert = secret_text(&renewed, names::TLS_CERT_KEY).unwrap();
    let key = secret_text(&renewed, names::TLS_KEY_KEY).unwrap();
    assert!(cert_matches_key(&cert, &key).unwrap());
    assert!((363..366).contains(&days_until(&cert)), "{}", days_until(&cert));
    assert!(
        plane.kcp_record.lock().unwrap().rollout_requests.is_empty(),
        "the rollout was requested before the crash"
    );

    plane.restart_controller(CONTROLLER).unwrap();
    let kcp_api = Api::<etcdadm_shared::api::capi::KubeadmControlPlane>::default_namespaced(client.clone());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let requests = plane.kcp_record.lock().unwrap().rollout_requests.clone();
        if !requests.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no control plane rollout after the restart\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the restarted controller and the stand-in reconcile a while longer.
    let etcd = wait_settled(&client, "c2", 3, TIMEOUT, &work).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let requests = plane.kcp_record.lock().unwrap().rollout_requests.clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let kcp = kcp_api.get("c2-control-plane").await.unwrap();
    assert_eq!(
        kcp.rollout_after().map(|t| t.to_string()),
        Some(annotation.clone()),
        "the rollout is asked for from the re-issue time"
    );
    assert_eq!(requests[0].after, annotation);
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        2,
        "the Secret is re-issued once: {} certificates seen",
        seen.len()
    );
    assert_eq!(
        (seen[0].as_str(), seen[1].as_str()),
        (short.cert_pem.as_str(), cert.as_str())
    );
    let etcd_status = etcd.status.clone().unwrap();
    let client_expiry = etcd_status.certificates.unwrap().apiserver_client_expiry.unwrap();
    assert!((client_expiry.0.as_second() - Timestamp::now().as_second()) / DAY >= 363);
    assert_eq!(condition(&etcd, "CertificatesExpiring").0, "False");
    let events = events(&client, "c2").await;
    let rollouts = events
        .iter()
        .filter(|(reason, _)| reason == "ControlPlaneRolloutRequested")
        .count();
    assert_eq!(rollouts, 1, "{events:?}");
    save_logs(&work, "certificates-client");
    drop(plane);
}
