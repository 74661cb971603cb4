#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! End to end with both real controller binaries: an EtcdadmCluster of three over three failure
//! domains gates a KubeadmControlPlane, then survives `kubectl delete machine` of its leader.
//! The membership history recorded from etcd must follow the safety rules throughout.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::names;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo;
use etcdadm_sim::history::{RECORD_EVERY, Recorder};
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim::plane::{DEFAULT_KCP_ROLLOUT_STEP, Plane, PlaneOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);

mod lifecycle_support;
use lifecycle_support::real_apiserver::{self, RealApiServer};

/// The controllers' refusals by the API server (a missing RBAC verb) and their last lines.
fn logs(work: &TempDir) -> String {
    ["etcdadm-controller.log", "etcdadm-bootstrap.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(work.path().join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let forbidden = real_apiserver::forbidden_lines(&text);
            format!(
                "--- {f}: refused by the API server\n{forbidden}\n--- {f} (last 40 lines, newest first)\n{}",
                tail.join("\n")
            )
        })
        .collect()
}

/// Every Event the controllers published, oldest first: who did what to which object.
async fn events(client: &Client) -> String {
    let mut events = Api::<k8s_openapi::api::events::v1::Event>::default_namespaced(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    events.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
    events
        .iter()
        .map(|e| {
            let regarding = e
                .regarding
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            format!(
                "{} {regarding}: {}",
                e.reason.as_deref().unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn machines(client: &Client) -> Vec<Machine> {
    Api::<Machine>::default_namespaced(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

/// One scenario at a time in this binary: both share the machine's two cores with real etcd.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_over_three_zones_gate_the_control_plane_and_replace_a_deleted_leader() {
    let _turn = ONE_AT_A_TIME.lock().await;
    managed(None, 3).await;
}

/// The same on a real kube-apiserver (CRD schemas, CEL, admission, watches as Kubernetes does
/// them), each controller acting as its own ServiceAccount with what config/rbac grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managed_scenario_passes_on_a_real_api_server_under_the_controllers_own_rbac() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = real_apiserver::start().await;
    let started = std::time::Instant::now();
    managed(Some(&real), 11).await;
    println!(
        "managed scenario on a real kube-apiserver: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

async fn managed(real: Option<&RealApiServer>, prefix: u8) {
    let work = TempDir::new("sim-managed");
    let options = PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, prefix],
        kubeconfig: std::env::var_os("SIM_KUBECONFIG").map(Into::into),
        machine_runtime: None,
        controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        namespace: format!("sim-managed-{prefix}-{}", std::process::id()),
        ..Default::default()
    };
    let options = match real {
        Some(real) => real.plane_options(options),
        None => options,
    };
    let plane = Plane::start(options).await.unwrap();
    let client = plane.client.clone();
    let spec = ManagedCluster {
        name: "c1",
        replicas: 3,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        health_check: json!({"interval": "1s", "timeout": "1s"}),
        with_kcp: true,
        extra_spec: json!({}),
    };
    create_managed_cluster(&client, client.default_namespace(), &spec)
        .await
        .unwrap();

    // Membership straight from etcd, through whichever machine answers.
    let tls = demo::eventually("etcd CA", TIMEOUT, || async {
        Ok(demo::etcd_tls(&client, client.default_namespace(), "c1")
            .await?
            .ok_or_else(|| "no CA yet".to_string()))
    })
    .await
    .unwrap();
    let urls = Arc::new(Mutex::new(Vec::<String>::new()));
    let polled = urls.clone();
    let recorder = Recorder::start(tls.clone(), move || polled.lock().unwrap().clone(), RECORD_EVERY);
    let refresh = |client: Client, urls: Arc<Mutex<Vec<String>>>| async move {
        let found = demo::machine_urls(&client, client.default_namespace(), "c1")
            .await
            .unwrap();
        let mut urls = urls.lock().unwrap();
        for url in found {
            if !urls.contains(&url) {
                urls.push(url);
            }
        }
    };

    let started = std::time::Instant::now();
    let etcd = loop {
        refresh(client.clone(), urls.clone()).await;
        let etcd = Api::<EtcdadmCluster>::default_namespaced(client.clone())
            .get("c1-etcd")
            .await
            .unwrap();
        if etcd.status.as_ref().is_some_and(|s| s.ready) {
            break etcd;
        }
        if started.elapsed() > TIMEOUT {
            panic!(
                "EtcdadmCluster never became Ready: {:?}\n{}",
                etcd.status,
                logs(&work)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let status = etcd.status.clone().unwrap();
    assert!(status.initialized && status.creation_complete);
    assert_eq!(status.members.len(), 3);
    assert_eq!(
        status.members.iter().filter(|m| m.is_leader).count(),
        1,
        "{:?}",
        status.members
    );
    assert_eq!(status.init_machine_address, names::init_secret_name("c1"));

    // Zone spread: one Machine per failure domain.
    let zones: BTreeSet<String> = machines(&client)
        .await
        .iter()
        .filter_map(|m| m.spec.failure_domain.clone())
        .collect();
    assert_eq!(
        zones,
        BTreeSet::from(["zone-a".into(), "zone-b".into(), "zone-c".into()])
    );

    // The control plane gate: endpoints written, certificate Secrets created, pause removed.
    let endpoints = demo::wait_for_kcp_unpaused(&client, "c1-control-plane", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(endpoints.join(","), status.endpoints);
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    assert!(
        secrets
            .get_opt(&names::kcp_etcd_ca_secret_name("c1"))
            .await
            .unwrap()
            .is_some()
    );
    let client_cert = secrets
        .get(&names::apiserver_client_secret_name("c1"))
        .await
        .unwrap();
    assert!(client_cert.data.unwrap().contains_key(names::TLS_KEY_KEY));
    // The stand-in records what it sees on its next pass after the unpause.
    let record = plane.kcp_record.clone();
    let real = demo::eventually("the KCP stand-in saw the endpoints", TIMEOUT, || {
        let record = record.clone();
        async move {
            let record = record.lock().unwrap();
            let real: Vec<Vec<String>> = record
                .endpoint_changes
                .iter()
                .map(|c| c.endpoints.clone())
                .filter(|e| !e[0].contains("placeholder"))
                .collect();
            Ok(if real.is_empty() {
                Err(format!("{:?}", record.endpoint_changes))
            } else {
                Ok(real)
            })
        }
    })
    .await
    .unwrap();
    assert_eq!(
        real.len(),
        1,
        "the control plane saw one real endpoint list: {real:?}"
    );

    // `kubectl delete machine` of the leader: its member goes first (leadership moved), then a
    // replacement joins; etcd never holds more than three members.
    let leader = status.members.iter().find(|m| m.is_leader).unwrap().name.clone();
    Api::<Machine>::default_namespaced(client.clone())
        .delete(&leader, &DeleteParams::default())
        .await
        .unwrap();
    let replaced = demo::eventually("leader Machine replaced", TIMEOUT, || {
        let client = client.clone();
        let urls = urls.clone();
        let leader = leader.clone();
        async move {
            refresh(client.clone(), urls).await;
            let etcd = Api::<EtcdadmCluster>::default_namespaced(client.clone())
                .get("c1-etcd")
                .await?;
            let status = etcd.status.unwrap_or_default();
            let names: Vec<String> = status.members.iter().map(|m| m.name.clone()).collect();
            let done = status.ready && names.len() == 3 && !names.contains(&leader);
            Ok(if done {
                Ok(status)
            } else {
                Err(format!("ready={} members={names:?}", status.ready))
            })
        }
    })
    .await;
    let history = recorder.finish();
    let replaced = replaced.unwrap_or_else(|e| panic!("{e}\n{history:?}\n{}", logs(&work)));
    assert!(replaced.members.iter().all(|m| m.healthy));
    assert_eq!(machines(&client).await.len(), 3);

    // What the kubelet's readiness probe sees from both binaries.
    for name in ["etcdadm-controller", "etcdadm-bootstrap"] {
        let (code, body) = plane.readyz(name).await.unwrap();
        assert_eq!(code, 200, "{name} /readyz: {body}");
    }

    // What an operator's Prometheus sees from the real binary after all this.
    let metrics = plane.scrape_metrics("etcdadm-controller").await.unwrap();
    let labels = format!(r#"namespace="{}",name="c1-etcd""#, client.default_namespace());
    let mut expected = vec![
        format!("etcdadm_cluster_desired_members{{{labels}}} 3"),
        format!("etcdadm_cluster_ready_members{{{labels}}} 3"),
        format!("etcdadm_cluster_voting_members{{{labels}}} 3"),
        format!(r#"etcdadm_membership_operations_total{{{labels},kind="remove",outcome="done"}}"#),
        format!("etcdadm_health_check_duration_seconds_count{{{labels}}}"),
        r#"etcdadm_reconcile_total{controller="etcdadmcluster""#.to_string(),
    ];
    // The member the test deleted was the leader when status said so; under load an election
    // may have moved leadership before the controller acted, and then there was none to move.
    let leadership_moved = Api::<k8s_openapi::api::events::v1::Event>::default_namespaced(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("LeadershipMoved"));
    if leadership_moved {
        expected.push(format!(
            r#"etcdadm_membership_operations_total{{{labels},kind="move-leader",outcome="done"}}"#
        ));
    }
    // Gauges tell the moment of the scrape: a health check that timed out under load since
    // the status above was read counts a member out until the next one passes.
    let mut metrics = metrics;
    let scraped = std::time::Instant::now();
    while let Some(missing) = expected.iter().find(|series| !metrics.contains(series.as_str())) {
        assert!(
            scraped.elapsed() < Duration::from_secs(60),
            "no {missing} in the controller's metrics:\n{metrics}\n{}",
            logs(&work)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        metrics = plane.scrape_metrics("etcdadm-controller").await.unwrap();
    }
    let bootstrap_metrics = plane.scrape_metrics("etcdadm-bootstrap").await.unwrap();
    assert!(
        bootstrap_metrics
            .contains(r#"etcdadm_bootstrap_data_secrets_total{format="cloud-config",outcome="created"} 4"#),
        "four data Secrets (three members and the replacement):\n{bootstrap_metrics}\n{}\n{}",
        events(&client).await,
        logs(&work)
    );

    // The safety rules, on what etcd itself recorded.
    assert!(
        history.max_pending_joins() <= 1,
        "two joins in flight: {history:?}"
    );
    assert!(
        history.max_changes_per_step() <= 1,
        "two membership changes at once: {history:?}"
    );
    assert_eq!(
        history.max_size(),
        3,
        "never more than three members: {history:?}"
    );
    let last: BTreeSet<String> = history.last().unwrap().names();
    let expected: BTreeSet<String> = replaced.members.iter().map(|m| m.name.clone()).collect();
    assert_eq!(last, expected);
    assert!(!last.contains(&leader));
    drop(plane);
}
