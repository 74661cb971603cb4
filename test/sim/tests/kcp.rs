#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The KubeadmControlPlane stand-in: the Cluster's owner reference awaited, pause, refusal
//! without etcd Secrets (then their control), endpoint recording and the rollout it simulates
//! when the endpoints change.

use std::time::Duration;

use etcdadm_shared::api::capi::KubeadmControlPlane;
use etcdadm_shared::names;
use etcdadm_sim::kcp::KcpStandIn;
use etcdadm_sim_apiserver::fake_client;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn status(kcp: &KubeadmControlPlane) -> Value {
    serde_json::to_value(&kcp.status).unwrap()
}

#[tokio::test]
async fn kcp_waits_for_unpause_and_secrets_then_rolls_on_endpoint_change() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<KubeadmControlPlane> = Api::namespaced(client.clone(), "default");
    let kcp: KubeadmControlPlane = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": "c1-cp", "labels": {names::CLUSTER_NAME_LABEL: "c1"},
                     "annotations": {names::PAUSED_ANNOTATION: ""}},
        "spec": {"replicas": 3, "version": "v1.33.0",
                 "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"external": {"endpoints": ["https://placeholder:2379"]}}}}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &kcp).await.unwrap();
    let standin = KcpStandIn::new(client.clone(), "default", Duration::ZERO);

    let unpause = json!({"metadata": {"annotations": {names::PAUSED_ANNOTATION: null}}});
    api.patch("c1-cp", &PatchParams::default(), &Patch::Merge(&unpause))
        .await
        .unwrap();
    standin.tick().await.unwrap();
    assert_eq!(
        api.get("c1-cp").await.unwrap().status,
        None,
        "a KCP without the Cluster's owner reference is left alone, as the real one"
    );
    let owned = json!({"metadata": {
        "annotations": {names::PAUSED_ANNOTATION: ""},
        "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c1", "uid": "c1-uid"}]}});
    api.patch("c1-cp", &PatchParams::default(), &Patch::Merge(&owned))
        .await
        .unwrap();
    standin.tick().await.unwrap();
    assert_eq!(
        api.get("c1-cp").await.unwrap().status,
        None,
        "a paused KCP is left alone"
    );

    api.patch("c1-cp", &PatchParams::default(), &Patch::Merge(&unpause))
        .await
        .unwrap();
    standin.tick().await.unwrap();
    let s = status(&api.get("c1-cp").await.unwrap());
    assert_eq!(s["replicas"], 0);
    assert_eq!(s["conditions"][0]["type"], "CertificatesAvailable");
    assert_eq!(s["conditions"][0]["status"], "False");
    assert!(
        s["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("c1-apiserver-etcd-client")
    );

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    for name in [
        names::kcp_etcd_ca_secret_name("c1"),
        names::apiserver_client_secret_name("c1"),
    ] {
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name,
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c1", "uid": "c1-uid"}]},
            "type": names::CLUSTER_SECRET_TYPE}))
        .unwrap();
        secrets.create(&PostParams::default(), &secret).await.unwrap();
    }
    standin.tick().await.unwrap();
    let kcp = api.get("c1-cp").await.unwrap();
    assert_eq!(status(&kcp)["replicas"], 3);
    assert!(kcp.rollout_complete(), "{:?}", kcp.status);
    // As the real KCP: the controller of the Secrets it reads, the Cluster still an owner.
    for name in [
        names::kcp_etcd_ca_secret_name("c1"),
        names::apiserver_client_secret_name("c1"),
    ] {
        let owners: Vec<(String, Option<bool>)> = secrets
            .get(&name)
            .await
            .unwrap()
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| (o.kind, o.controller))
            .collect();
        assert_eq!(
            owners,
            [
                ("Cluster".to_string(), None),
                ("KubeadmControlPlane".to_string(), Some(true))
            ]
        );
    }

    let endpoints = json!({"spec": {"kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"external": {"endpoints": ["https://127.0.1.2:2379"]}}}}}});
    api.patch("c1-cp", &PatchParams::default(), &Patch::Merge(&endpoints))
        .await
        .unwrap();
    let mut seen = vec![];
    for _ in 0..5 {
        standin.tick().await.unwrap();
        let kcp = api.get("c1-cp").await.unwrap();
        seen.push((
            status(&kcp)["upToDateReplicas"].as_i64().unwrap(),
            kcp.rollout_complete(),
        ));
    }
    assert_eq!(seen, [(1, false), (2, false), (3, true), (3, true), (3, true)]);
    let record = standin.record.lock().unwrap().clone();
    assert_eq!(record.rollouts, 1);
    let lists: Vec<Vec<String>> = record
        .endpoint_changes
        .iter()
        .map(|c| c.endpoints.clone())
        .collect();
    assert_eq!(
        lists,
        [
            vec!["https://placeholder:2379".to_string()],
            vec!["https://127.0.1.2:2379".to_string()]
        ]
    );
}
