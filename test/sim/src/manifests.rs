//! The objects a user would apply for an external etcd cluster on the sim infrastructure, built
//! in one place so the demo, the scenarios and the benchmarks apply the same thing.

use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane};
use etcdadm_shared::names;
use etcdadm_shared::testing::{CA_SECRET, CREDENTIALS_SECRET, SeaweedFs};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use crate::capi::{sim_cluster_resource, sim_machine_template_resource};
use crate::error::SimError;

/// What to create for one managed etcd cluster.
pub struct ManagedCluster<'a> {
    pub name: &'a str,
    pub replicas: i32,
    /// Failure domains of the SimCluster (empty: none).
    pub zones: &'a [&'a str],
    /// Extra `etcdadmConfigSpec` fields merged over the defaults.
    pub config_spec: Value,
    /// `healthCheck` of the EtcdadmCluster (null: defaults).
    pub health_check: Value,
    /// The Cluster's control plane is a KubeadmControlPlane using this etcd (else it has none).
    pub with_kcp: bool,
    /// Extra EtcdadmCluster spec fields (`rolloutStrategy`, ...) merged over the defaults.
    pub extra_spec: Value,
}

/// The members' config: the machines carry the etcdadm stand-in, so nothing is downloaded.
fn config_spec(extra: &Value) -> Value {
    let mut spec = json!({"etcdadmBuiltin": true});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

/// SimCluster, Cluster (control plane: a KubeadmControlPlane using external etcd, when
/// `with_kcp`), the SimMachineTemplate and the EtcdadmCluster.
pub async fn create_managed_cluster(
    client: &Client,
    ns: &str,
    cluster: &ManagedCluster<'_>,
) -> Result<(), SimError> {
    let pp = PostParams::default();
    let name = cluster.name;
    let label = json!({names::CLUSTER_NAME_LABEL: name});
    let sim_clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &sim_cluster_resource());
    let sim_cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"failureDomains": cluster.zones},
    }))?;
    sim_clusters.create(&pp, &sim_cluster).await?;
    let kcp_name = format!("{name}-control-plane");
    let mut cluster_spec = json!({
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimCluster", "name": name},
    });
    if cluster.with_kcp {
        cluster_spec["controlPlaneRef"] = json!({"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": kcp_name});
    }
    let cluster_obj: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": cluster_spec,
    }))?;
    Api::<Cluster>::namespaced(client.clone(), ns)
        .create(&pp, &cluster_obj)
        .await?;
    let templates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &sim_machine_template_resource());
    let template_name = format!("{name}-etcd");
    let mut template_names = vec![template_name.clone()];
    if cluster.with_kcp {
        template_names.push(kcp_name.clone());
    }
    for template_name in &template_names {
        let template: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate",
            "metadata": {"name": template_name, "namespace": ns},
            "spec": {"template": {"spec": {}}},
        }))?;
        templates.create(&pp, &template).await?;
    }
    if cluster.with_kcp {
        create_kcp(client, ns, name, &kcp_name).await?;
    }
    let mut spec = json!({
        "replicas": cluster.replicas,
        "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                                   "kind": "SimMachineTemplate", "name": template_name, "namespace": ns},
        "etcdadmConfigSpec": config_spec(&cluster.config_spec),
        "machineTemplate": {"version": "v1.33.0"},
    });
    if !cluster.health_check.is_null() {
        spec["healthCheck"] = cluster.health_check.clone();
    }
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), cluster.extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    let etcd: EtcdadmCluster = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": template_name, "namespace": ns, "labels": label},
        "spec": spec,
    }))?;
    Api::<EtcdadmCluster>::namespaced(client.clone(), ns)
        .create(&pp, &etcd)
        .await?;
    Ok(())
}

/// The KubeadmControlPlane `kcp_name` of cluster `name`: 3 replicas on the SimMachineTemplate
/// of the same name, external etcd with a placeholder endpoint (the EtcdadmCluster writes the
/// real ones) and the files kubeadm reads its certificates from.
async fn create_kcp(client: &Client, ns: &str, name: &str, kcp_name: &str) -> Result<(), SimError> {
    let pp = PostParams::default();
    let label = json!({names::CLUSTER_NAME_LABEL: name});
    let kcp: KubeadmControlPlane = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": kcp_name, "namespace": ns, "labels": label},
        "spec": {"replicas": 3, "version": "v1.33.0",
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachineTemplate", "name": kcp_name}}},
            "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"external": {
            "endpoints": ["https://placeholder.invalid:2379"],
            "caFile": "/etc/kubernetes/pki/etcd/ca.crt",
            "certFile": "/etc/kubernetes/pki/apiserver-etcd-client.crt",
            "keyFile": "/etc/kubernetes/pki/apiserver-etcd-client.key",
        }}}}},
    }))?;
    Api::<KubeadmControlPlane>::namespaced(client.clone(), ns)
        .create(&pp, &kcp)
        .await?;
    Ok(())
}

/// The Secret `CREDENTIALS_SECRET` with `s3`'s access key, which a `spec.backup.store` names,
/// and for an https server the Secret `CA_SECRET` with its CA, in the client's namespace.
pub async fn create_store_secrets(client: &Client, s3: &SeaweedFs) -> Result<(), kube::Error> {
    let mut secrets = vec![(CREDENTIALS_SECRET, s3.credentials_secret_data())];
    if s3.ca_pem().is_some() {
        secrets.push((CA_SECRET, s3.ca_secret_data()));
    }
    for (name, data) in secrets {
        let data = data
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        Api::<Secret>::default_namespaced(client.clone())
            .create(&PostParams::default(), &secret)
            .await?;
    }
    Ok(())
}
