//! The few parts of CAPI v1beta2 (Cluster, Machine, KubeadmControlPlane) these controllers read.
//!
//! Each struct keeps every field it does not model in `rest`, so an object read and serialized
//! again is unchanged. Writes still go through patches only: a `replace` of a partial view is
//! how fields get lost.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::conditions::Condition;

/// Fields a struct does not model, kept verbatim.
pub type Rest = BTreeMap<String, Value>;

/// CAPI v1beta2 reference to an object whose version follows CAPI's contract.
///
/// v1beta1 manifests carry an ObjectReference (`apiVersion`, `namespace`, ...) in the same place;
/// those fields are kept in `rest`, and [`Self::group`] reads the group from either shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// API group, e.g. `controlplane.cluster.x-k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Name, in the referrer's namespace.
    #[serde(default)]
    pub name: String,
    #[serde(flatten)]
    pub rest: Rest,
}

impl ContractVersionedObjectReference {
    /// A v1beta2 reference.
    pub fn new(api_group: &str, kind: &str, name: &str) -> Self {
        ContractVersionedObjectReference {
            api_group: Some(api_group.into()),
            kind: kind.into(),
            name: name.into(),
            rest: Rest::new(),
        }
    }

    /// The API group: `apiGroup`, or the group part of a v1beta1 `apiVersion`.
    pub fn group(&self) -> &str {
        if let Some(group) = &self.api_group {
            return group;
        }
        match self.rest.get("apiVersion").and_then(Value::as_str) {
            Some(api_version) => api_version.rsplit_once('/').map_or("", |(group, _)| group),
            None => "",
        }
    }

    /// Whether this reference names `kind`/`name` in `group`.
    pub fn points_to(&self, group: &str, kind: &str, name: &str) -> bool {
        self.group() == group && self.kind == kind && self.name == name
    }
}

/// `cluster.x-k8s.io/v1beta2` Cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Pauses every controller of this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The control plane object (a KubeadmControlPlane here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
    /// The infrastructure cluster object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    /// EKS-A fork only: the EtcdadmCluster serving this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_external_etcd_ref: Option<ContractVersionedObjectReference>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// Observed state of a Cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// v1beta2 provisioning milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Failure domains offered by the infrastructure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    /// v1beta2 conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Value>,
    /// v1beta1 leftovers, including the fork's v1beta1 conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<Deprecated>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// `status.initialization` of a v1beta2 Cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// The infrastructure cluster is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The control plane has been initialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// One failure domain of a Cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name.
    pub name: String,
    /// Whether control plane machines may go here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// `status.deprecated` of v1beta2 objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deprecated {
    /// The v1beta1 fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<DeprecatedV1Beta1>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// v1beta1 status fields kept by v1beta2 objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeprecatedV1Beta1 {
    /// v1beta1 conditions (with severity).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// KubeadmControlPlane: machines with the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    #[serde(flatten)]
    pub rest: Rest,
}

impl Cluster {
    /// `spec.paused`.
    pub fn is_paused(&self) -> bool {
        self.spec.paused.unwrap_or(false)
    }

    /// The infrastructure cluster is provisioned.
    pub fn infrastructure_ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.infrastructure_provisioned)
            .unwrap_or(false)
    }

    /// Names of the failure domains the infrastructure offers, sorted.
    pub fn failure_domain_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .status
            .as_ref()
            .map(|s| s.failure_domains.iter().map(|d| d.name.clone()).collect())
            .unwrap_or_default();
        names.sort();
        names.dedup();
        names
    }

    /// The fork's `ManagedEtcdInitialized` condition is true (v1beta1 conditions).
    pub fn managed_etcd_initialized(&self) -> bool {
        let v1beta1 = self
            .status
            .as_ref()
            .and_then(|s| s.deprecated.as_ref())
            .and_then(|d| d.v1beta1.as_ref())
            .map(|v| v.conditions.as_slice())
            .unwrap_or_default();
        let v1beta2 = self
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        super::conditions::is_true(v1beta1, crate::names::MANAGED_ETCD_INITIALIZED_CONDITION)
            || v1beta2.iter().any(|c| {
                c.get("type").and_then(Value::as_str)
                    == Some(crate::names::MANAGED_ETCD_INITIALIZED_CONDITION)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
    }
}

/// `cluster.x-k8s.io/v1beta2` Machine.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The Cluster this Machine belongs to.
    #[serde(default)]
    pub cluster_name: String,
    /// Bootstrap configuration.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// The infrastructure machine.
    #[serde(default)]
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// Kubernetes version of the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Failure domain the machine is placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// `Machine.spec.bootstrap`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    /// The bootstrap config object (an EtcdadmConfig here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    /// Name of the Secret holding the user data, copied from the config's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// Observed state of a Machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Addresses reported by the infrastructure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// v1beta2 provisioning milestones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// `Machine.status.initialization`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The bootstrap data Secret exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_secret_created: Option<bool>,
    /// The infrastructure machine is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// One address of a Machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineAddress {
    /// `InternalIP`, `ExternalIP`, `InternalDNS`, `ExternalDNS` or `Hostname`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// Order in which address types are preferred for etcd URLs, everywhere.
pub const ADDRESS_PREFERENCE: [&str; 4] = ["InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS"];

impl Machine {
    /// The address used for this member's etcd URLs: InternalIP, then ExternalIP, then
    /// InternalDNS, then ExternalDNS (first of each type as reported).
    pub fn etcd_address(&self) -> Option<&str> {
        let addresses = self
            .status
            .as_ref()
            .map(|s| s.addresses.as_slice())
            .unwrap_or_default();
        ADDRESS_PREFERENCE.iter().find_map(|wanted| {
            addresses
                .iter()
                .find(|a| a.type_ == *wanted && !a.address.is_empty())
                .map(|a| a.address.as_str())
        })
    }

    /// The Machine is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The infrastructure says this Machine is lost for good (docs/day2.md, "Quorum loss"):
    /// its phase is `Failed`, which CAPI still derives in v1beta2 from the deprecated
    /// `failureReason`/`failureMessage` that providers on the v1beta1 contract report; or its
    /// v1beta2 condition `InfrastructureReady` is False with reason `ObjectDeleted`, CAPI's word
    /// for an infrastructure machine deleted after it was provisioned (the VM is gone). Nothing
    /// else counts: `InfrastructureReady` False for another reason (a provider's own, e.g. a VM
    /// stopped or its cloud API unreachable), `Ready`/`Available` False (summaries; etcd
    /// Machines have no Node) and a MachineHealthCheck's verdict are not a loss.
    pub fn infrastructure_failed(&self) -> bool {
        let Some(status) = self.status.as_ref() else {
            return false;
        };
        let deleted = status
            .rest
            .get("conditions")
            .and_then(Value::as_array)
            .is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    let field = |name: &str| c.get(name).and_then(Value::as_str);
                    field("type") == Some(MACHINE_INFRASTRUCTURE_READY)
                        && field("status") == Some("False")
                        && field("reason") == Some(INFRASTRUCTURE_DELETED_REASON)
                })
            });
        status.phase.as_deref() == Some("Failed") || deleted
    }
}

/// The v1beta2 Machine condition mirroring its infrastructure machine's readiness.
pub const MACHINE_INFRASTRUCTURE_READY: &str = "InfrastructureReady";
/// CAPI's reason (`ObjectDeletedReason`) on `InfrastructureReady` when the infrastructure machine
/// was deleted after it was provisioned.
pub const INFRASTRUCTURE_DELETED_REASON: &str = "ObjectDeleted";

/// `controlplane.cluster.x-k8s.io/v1beta2` KubeadmControlPlane.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "KubeadmControlPlane",
    namespaced,
    status = "KubeadmControlPlaneStatus",
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneSpec {
    /// Desired control plane machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// kubeadm configuration; only the etcd part is modelled.
    #[serde(default)]
    pub kubeadm_config_spec: KubeadmConfigSpec,
    #[serde(flatten)]
    pub rest: Rest,
}

/// The parts of a kubeadm config spec that concern etcd.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmConfigSpec {
    /// kubeadm ClusterConfiguration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_configuration: Option<ClusterConfiguration>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// kubeadm ClusterConfiguration (etcd only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfiguration {
    /// etcd settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdConfiguration>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// kubeadm etcd settings: local or external.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdConfiguration {
    /// Stacked etcd run by kubeadm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<Value>,
    /// An external etcd cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalEtcd>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// kubeadm external etcd settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalEtcd {
    /// Client URLs of the etcd members.
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// Observed state of a KubeadmControlPlane.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmControlPlaneStatus {
    /// Machines of the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Machines whose spec is current (v1beta2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// Machines with the current spec (v1beta1 name, still written by some versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// Generation the status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// v1beta1 leftovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<Deprecated>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// How a control plane uses etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlPlaneEtcd {
    /// `etcd.external` with these endpoints.
    External(Vec<String>),
    /// Local (stacked) etcd, or no etcd section: not ours to touch.
    Local,
}

impl KubeadmControlPlane {
    /// When the control plane was last asked to replace every Machine created before:
    /// `spec.rollout.after` (v1beta2), or `spec.rolloutAfter` as v1beta1 names it.
    pub fn rollout_after(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let rest = &self.spec.rest;
        let v1beta2 = rest.get("rollout").and_then(|r| r.get("after"));
        v1beta2
            .or_else(|| rest.get("rolloutAfter"))
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok())
    }

    /// Whether this control plane uses external etcd, and the endpoints it lists.
    pub fn etcd(&self) -> ControlPlaneEtcd {
        let etcd = self
            .spec
            .kubeadm_config_spec
            .cluster_configuration
            .as_ref()
            .and_then(|c| c.etcd.as_ref());
        match etcd.and_then(|e| e.external.as_ref()) {
            Some(external) => ControlPlaneEtcd::External(external.endpoints.clone()),
            None => ControlPlaneEtcd::Local,
        }
    }

    /// Every control plane Machine runs the current spec (and the status is current).
    pub fn rollout_complete(&self) -> bool {
        let Some(status) = self.status.as_ref() else {
            return false;
        };
        let generation_seen = match (self.metadata.generation, status.observed_generation) {
            (Some(g), Some(o)) => o >= g,
            _ => false,
        };
        let desired = self.spec.replicas.unwrap_or(1);
        let up_to_date = status
            .up_to_date_replicas
            .or(status.updated_replicas)
            .or_else(|| status.deprecated.as_ref()?.v1beta1.as_ref()?.updated_replicas);
        generation_seen && up_to_date == Some(desired) && status.replicas == Some(desired)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn machine(status: Value) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m"},
            "spec": {"clusterName": "c", "bootstrap": {}, "infrastructureRef": {"apiGroup": "x", "kind": "K", "name": "m"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn only_a_failed_phase_or_a_deleted_infrastructure_machine_is_a_failure() {
        let condition = |status: &str, reason: &str| {
            json!({"conditions": [{"type": "InfrastructureReady", "status": status, "reason": reason,
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        };
        for (status, failed) in [
            (json!({"phase": "Failed"}), true),
            (condition("False", "ObjectDeleted"), true),
            (json!({"phase": "Provisioned"}), false),
            (json!({"phase": "Running"}), false),
            // A provider's own reason: the VM may be stopped or its cloud API unreachable.
            (condition("False", "InstanceStopped"), false),
            (condition("False", "ObjectDoesNotExist"), false),
            (condition("Unknown", "ObjectDeleted"), false),
            (condition("True", "Ready"), false),
            (json!({}), false),
        ] {
            assert_eq!(
                machine(status.clone()).infrastructure_failed(),
                failed,
                "{status}"
            );
        }
    }
}
