//! The bootstrap provider's metrics: rendering a data Secret counts
//! `etcdadm_bootstrap_data_secrets_total{format, outcome}` in the manager's registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use etcdadm_bootstrap::controller::{Context, reconcile};
use etcdadm_bootstrap::metrics::BootstrapMetrics;
use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::manager::Metrics;
use etcdadm_shared::names;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

async fn create<K>(client: &Client, value: Value) -> K
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(value).unwrap();
    Api::<K>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

/// A Machine `name` of cluster `cluster` owning an EtcdadmConfig `name` with `spec`.
async fn machine_with_config(client: &Client, cluster: &str, name: &str, spec: Value) -> EtcdadmConfig {
    let machine: Machine = create(
        client,
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "labels": {names::CLUSTER_NAME_LABEL: cluster}},
            "spec": {
                "clusterName": cluster,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": name}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachine", "name": name},
            },
        }),
    )
    .await;
    create(
        client,
        json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "name": machine.name_any(), "uid": machine.uid().unwrap(), "controller": true,
            }]},
            "spec": spec,
        }),
    )
    .await
}

#[tokio::test]
async fn rendered_and_refused_data_secrets_are_counted_by_format_and_outcome() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let metrics = Metrics::new();
    let ctx = Arc::new(Context::with_metrics(
        client.clone(),
        BootstrapMetrics::register(&metrics),
    ));
    // One cluster each, so that both configs are their cluster's first member and render.
    for cluster in ["c1", "c2"] {
        let _: Cluster = create(
            &client,
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": cluster}, "spec": {}}),
        )
        .await;
    }

    let config = machine_with_config(&client, "c1", "m1", json!({})).await;
    reconcile(Arc::new(config), ctx.clone()).await.unwrap();
    let config = machine_with_config(&client, "c2", "m2", json!({"format": "bottlerocket"})).await;
    reconcile(Arc::new(config), ctx.clone()).await.unwrap();

    let text = metrics.encode().unwrap();
    for line in [
        r#"etcdadm_bootstrap_data_secrets_total{format="cloud-config",outcome="created"} 1"#,
        r#"etcdadm_bootstrap_data_secrets_total{format="bottlerocket",outcome="invalid-spec"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}
