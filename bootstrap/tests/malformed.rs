#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One EtcdadmConfig this version cannot read must not stop the others: the full controller,
//! run by the manager runtime against the in-memory API server, renders the valid config and
//! reports the invalid one with a condition.

use std::time::{Duration, Instant};

use clap::Parser;
use etcdadm_bootstrap::metrics::BootstrapMetrics;
use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::manager::{Manager, ManagerArgs, Shutdown};
use etcdadm_sim_apiserver::fake_client;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

#[tokio::test]
async fn an_unreadable_config_gets_a_condition_and_the_others_are_still_rendered() {
    let (_server, client) = fake_client().unwrap();
    let pp = PostParams::default();
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c1"}, "spec": {}
    }))
    .unwrap();
    Api::<Cluster>::namespaced(client.clone(), "default")
        .create(&pp, &cluster)
        .await
        .unwrap();
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m1", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {"clusterName": "c1",
                 "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": "m1"}},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachine", "name": "m1"}},
    }))
    .unwrap();
    let machine = Api::<Machine>::namespaced(client.clone(), "default")
        .create(&pp, &machine)
        .await
        .unwrap();

    // The unreadable one first, so the controller meets it before the good one.
    let resource = ApiResource::erase::<EtcdadmConfig>(&());
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": EtcdadmConfig::api_version(&()), "kind": "EtcdadmConfig",
        "metadata": {"name": "bad"}, "spec": {"format": "ignition"},
    }))
    .unwrap();
    configs.create(&pp, &bad).await.unwrap();
    let good: DynamicObject = serde_json::from_value(json!({
        "apiVersion": EtcdadmConfig::api_version(&()), "kind": "EtcdadmConfig",
        "metadata": {"name": "m1", "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "name": "m1", "uid": machine.uid().unwrap(), "controller": true}]},
        "spec": {},
    }))
    .unwrap();
    configs.create(&pp, &good).await.unwrap();

    let shutdown = Shutdown::new();
    let args = Cli::parse_from([
        "test",
        "--health-addr=0",
        "--diagnostics-address=0",
        "--webhook-port=0",
    ])
    .args;
    let manager = Manager::new(args, "etcdadm-bootstrap", "test-election")
        .client(client.clone())
        .shutdown(shutdown.clone());
    let metrics = BootstrapMetrics::register(manager.metrics());
    let task = tokio::spawn(manager.run(move |ctx| etcdadm_bootstrap::controller::run(ctx, metrics)));

    let deadline = Instant::now() + Duration::from_secs(20);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let (rendered, reported) = loop {
        let rendered = secrets.get_opt("m1").await.unwrap().is_some();
        let bad = configs.get("bad").await.unwrap();
        let reason = bad
            .data
            .pointer("/status/conditions/0/reason")
            .and_then(Value::as_str)
            .map(String::from);
        if rendered && reason.is_some() || Instant::now() > deadline {
            break (
                rendered,
                (reason, bad.data.pointer("/status/conditions/0/message").cloned()),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    shutdown.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(rendered, "the valid config was not rendered");
    assert_eq!(reported.0.as_deref(), Some("InvalidObject"), "{reported:?}");
    let message = reported.1.unwrap().as_str().unwrap().to_string();
    assert!(
        message.contains("default/bad") && message.contains("ignition"),
        "{message}"
    );
}
