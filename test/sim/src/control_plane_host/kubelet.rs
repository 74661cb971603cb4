//! What `kubeadm init` and the kubelet leave in the workload cluster once a control plane host's
//! API server answers, and only what KubeadmControlPlane and the Machine controller read:
//! the `kube-system/kubeadm-config` ConfigMap (init), the Node (its providerID, Ready, the
//! control plane label and taint, its kubelet's address and version) and the mirror pods of the
//! static control plane pods, Running and Ready.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::control_plane_host::kubeadm::API_SERVER_PORT;
use crate::control_plane_host::port_forward::KUBELET_PORT;
use crate::error::SimError;

const KUBE_SYSTEM: &str = "kube-system";
const KUBEADM_CONFIG: &str = "kubeadm-config";
const CLUSTER_CONFIGURATION_KEY: &str = "ClusterConfiguration";
const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";
/// The static pods kubeadm writes for a control plane with external etcd.
const COMPONENTS: [&str; 3] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler"];
const MANAGER: &str = "sim-kubelet";

/// The host as its kubelet describes it.
pub struct NodeFacts<'a> {
    pub name: &'a str,
    pub provider_id: &'a str,
    pub address: IpAddr,
    /// The Machine's Kubernetes version, which its kubelet would run.
    pub kubelet_version: &'a str,
    /// `nodeRegistration` of the kubeadm configuration (its `taints`, when set).
    pub node_registration: &'a Value,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Create `object` unless it exists; either way return what is stored.
async fn create_or_get<K>(api: &Api<K>, object: &K) -> Result<K, SimError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(api.get(&object.name_any()).await?),
        Err(e) => Err(e.into()),
    }
}

/// `kubeadm init`'s upload-config phase: the ClusterConfiguration as `kube-system/kubeadm-config`
/// (left alone when it exists: KCP keeps it current from then on).
pub async fn upload_kubeadm_config(client: &Client, cluster_configuration: &str) -> Result<(), SimError> {
    let config_map: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": KUBEADM_CONFIG, "namespace": KUBE_SYSTEM},
        "data": {CLUSTER_CONFIGURATION_KEY: cluster_configuration},
    }))?;
    create_or_get(&Api::namespaced(client.clone(), KUBE_SYSTEM), &config_map).await?;
    Ok(())
}

/// What `kubeadm join` reads: the cluster's ClusterConfiguration, once `kubeadm-config` exists.
pub async fn cluster_configuration(client: &Client) -> Result<Option<String>, SimError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), KUBE_SYSTEM);
    Ok(api
        .get_opt(KUBEADM_CONFIG)
        .await?
        .and_then(|c| c.data?.get(CLUSTER_CONFIGURATION_KEY).cloned()))
}

/// The kubelet's registration and first status, and kubeadm's mark-control-plane phase.
pub async fn register_node(client: &Client, facts: &NodeFacts<'_>) -> Result<Node, SimError> {
    let taints = match facts.node_registration.get("taints") {
        Some(Value::Array(taints)) => Value::Array(taints.clone()),
        _ => json!([{"key": CONTROL_PLANE_ROLE, "effect": "NoSchedule"}]),
    };
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": facts.name, "labels": {
            CONTROL_PLANE_ROLE: "",
            "node.kubernetes.io/exclude-from-external-load-balancers": "",
            "kubernetes.io/hostname": facts.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }},
        "spec": {"providerID": facts.provider_id, "taints": taints},
    }))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = create_or_get(&nodes, &node).await?;
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now(), "lastTransitionTime": now()})
    };
    let resources = json!({"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"});
    let status = json!({"status": {
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": facts.address.to_string()},
            {"type": "Hostname", "address": facts.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
        "capacity": resources, "allocatable": resources,
        "nodeInfo": {
            "machineID": facts.name, "systemUUID": facts.name, "bootID": facts.name,
            "kernelVersion": "sim", "osImage": "etcdadm sim control plane host",
            "containerRuntimeVersion": "sim://1", "kubeletVersion": facts.kubelet_version,
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }});
    Ok(nodes
        .patch_status(facts.name, &params(), &Patch::Merge(&status))
        .await
        .map(|_| node)?)
}

/// The mirror pods of the host's static control plane pods, bound to `node`, Running and Ready.
pub async fn mirror_pods(client: &Client, facts: &NodeFacts<'_>, node: &Node) -> Result<(), SimError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), KUBE_SYSTEM);
    let address = facts.address.to_string();
    for component in COMPONENTS {
        let name = format!("{component}-{}", facts.name);
        let image = format!("registry.k8s.io/{component}:{}", facts.kubelet_version);
        let hash = format!("sim-{name}");
        let mut annotations = json!({
            "kubernetes.io/config.mirror": hash, "kubernetes.io/config.hash": hash,
            "kubernetes.io/config.source": "file",
        });
        if component == "kube-apiserver" {
            annotations["kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"] =
                json!(format!("{address}:{API_SERVER_PORT}"));
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": KUBE_SYSTEM,
                "labels": {"component": component, "tier": "control-plane"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": facts.name,
                    "uid": node.uid().unwrap_or_default(), "controller": true}]},
            "spec": {"nodeName": facts.name, "hostNetwork": true,
                "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists", "effect": "NoExecute"}],
                "containers": [{"name": component, "image": image}]},
        }))?;
        create_or_get(&pods, &pod).await?;
        let since = now();
        let ready = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": since});
        let status = json!({"status": {
            "phase": "Running",
            "conditions": [ready("PodReadyToStartContainers"), ready("Initialized"), ready("Ready"),
                           ready("ContainersReady"), ready("PodScheduled")],
            "hostIP": address, "hostIPs": [{"ip": address}],
            "podIP": address, "podIPs": [{"ip": address}],
            "startTime": since,
            "containerStatuses": [{"name": component, "ready": true, "started": true,
                "restartCount": 0, "image": image, "imageID": image,
                "containerID": format!("sim://{name}"),
                "state": {"running": {"startedAt": since}}}],
        }});
        pods.patch_status(&name, &params(), &Patch::Merge(&status))
            .await?;
    }
    Ok(())
}
