//! Manifests written for the reference implementation deserialize into our types without loss.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig, EtcdadmConfigTemplate};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn documents(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// Deserialize into `T`, serialize back, and require the same JSON document.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(&back, doc, "lost or changed fields in {}", doc["kind"]);
    typed
}

fn as_version(doc: &Value, api_version: &str) -> Value {
    let mut doc = doc.clone();
    doc["apiVersion"] = Value::from(api_version);
    doc
}

#[test]
fn v1beta2_cluster_reference_shape_round_trips() {
    let doc = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"managedExternalEtcdRef": {"apiGroup": "etcdcluster.cluster.x-k8s.io", "kind": "EtcdadmCluster", "name": "c-etcd"},
                 "topology": {"classRef": {"name": "x"}}},
        "status": {"initialization": {"infrastructureProvisioned": true}, "phase": "Provisioned"}
    });
    let cluster: Cluster = round_trip(&doc);
    assert!(cluster.infrastructure_ready());
    assert!(cluster.spec.managed_external_etcd_ref.unwrap().points_to(
        "etcdcluster.cluster.x-k8s.io",
        "EtcdadmCluster",
        "c-etcd"
    ));
}

#[test]
fn reference_external_etcd_manifests_round_trip() {
    let docs = documents("reference-external-etcd.yaml");
    let etcd: EtcdadmCluster = round_trip(&docs[0]);
    assert_eq!(etcd.spec.replicas(), 3);
    let spec = &etcd.spec.etcdadm_config_spec;
    assert_eq!(
        spec.cloud_init_config.as_ref().map(|c| c.version.as_deref()),
        Some(Some("3.5.9"))
    );
    assert!(spec.pre_etcdadm_commands[0].contains("{{ ds.meta_data.hostname }}"));

    // The fork's v1beta1 Cluster and KCP read through our v1beta2 views: only the apiVersion we
    // serialize differs (the API server converts between served versions); every field survives,
    // including the v1beta1 ObjectReference shape of managedExternalEtcdRef.
    let cluster: Cluster = round_trip(&as_version(&docs[1], "cluster.x-k8s.io/v1beta2"));
    let etcd_ref = cluster.spec.managed_external_etcd_ref.as_ref().unwrap();
    assert!(etcd_ref.points_to("etcdcluster.cluster.x-k8s.io", "EtcdadmCluster", "prod-etcd"));
    assert_eq!(
        cluster.spec.control_plane_ref.as_ref().unwrap().group(),
        "controlplane.cluster.x-k8s.io"
    );
    round_trip::<KubeadmControlPlane>(&as_version(&docs[2], "controlplane.cluster.x-k8s.io/v1beta2"));
}

#[test]
fn reference_etcdadm_configs_round_trip() {
    let docs = documents("reference-etcdadmconfig.yaml");
    let config: EtcdadmConfig = round_trip(&docs[0]);
    assert_eq!(config.spec.users.len(), 2);
    assert_eq!(config.spec.files.len(), 2);
    assert_eq!(config.spec.ntp.as_ref().and_then(|n| n.enabled), Some(false));
    let status = config.status.unwrap();
    assert!(status.ready);
    assert_eq!(status.data_secret_name.as_deref(), Some("prod-etcd-7xk2p"));
    round_trip::<EtcdadmConfig>(&docs[1]);
    round_trip::<EtcdadmConfigTemplate>(&docs[2]);
}
