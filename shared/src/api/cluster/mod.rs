//! `etcdcluster.cluster.x-k8s.io/v1beta1`: EtcdadmCluster, wire-compatible with the reference
//! (aws/etcdadm-controller) plus the fields this project adds (docs/safety.md, docs/day2.md).
//! One file per section of the spec, each with its types, defaults and checks: the members
//! (`members`), rollouts and provisioning (`rollout`), health checks (`health`), recovery
//! (`recovery`), maintenance (`maintenance`); the status (`status`); a CA rotation request
//! (`ca_rotation`). `validate_spec` and
//! `validate_update` run every section's checks, for admission and the controller alike.
// kube's `printcolumn(...)` attributes repeat the same keys by design.
#![allow(clippy::duplicated_attributes)]
mod ca_rotation;
mod health;
mod maintenance;
mod members;
mod recovery;
mod rollout;
mod status;

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::config::{EtcdadmConfigSpec, Format};
use super::snapshot::{Backup, Restore};
use crate::validation::field::FieldError;
use crate::validation::version::version_change_problem;
use crate::validation::{etcd_version, validate_backup, validate_config_spec, validate_restore};

pub use self::ca_rotation::*;
pub use self::health::*;
pub use self::maintenance::*;
pub use self::members::{DEFAULT_REPLICAS, MachineTemplate, infrastructure_group_problem};
pub use self::recovery::*;
pub use self::rollout::*;
pub use self::status::*;

/// Desired state of an external etcd cluster made of CAPI Machines.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "etcdcluster.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "EtcdadmCluster",
    namespaced,
    status = "EtcdadmClusterStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "etcdc",
    category = "cluster-api",
    doc = "EtcdadmCluster is an external etcd cluster whose members are CAPI Machines bootstrapped by etcdadm.",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("cluster.x-k8s.io/provider", "bootstrap-etcdadm"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.readyReplicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this etcd serves"
    ),
    printcolumn(
        name = "Ready",
        type_ = "boolean",
        json_path = ".status.ready",
        description = "Every desired member is a healthy voting member"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired members"
    ),
    printcolumn(
        name = "Ready Replicas",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Healthy voting members"
    ),
    printcolumn(
        name = "Endpoints",
        type_ = "string",
        json_path = ".status.endpoints",
        description = "Client URLs of the voting members"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Certificates Expire",
        type_ = "string",
        json_path = ".status.certificates.nextExpiry",
        description = "When the first of the CA, member and API server client certificates expires",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.restore) == has(oldSelf.restore)").message("restore can only be set when the EtcdadmCluster is created").field_path(".restore"))]
#[x_kube(validation = Rule::new("!has(self.restore) || !has(self.etcdadmConfigSpec) || !has(self.etcdadmConfigSpec.format) || self.etcdadmConfigSpec.format != 'bottlerocket'").message("restore needs etcdadmConfigSpec.format cloud-config: the Bottlerocket bootstrap image cannot restore a snapshot").field_path(".restore").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.recovery) || !has(self.recovery.automatic) || !self.recovery.automatic || has(self.backup)").message("recovery.automatic needs spec.backup.store: an automatic recovery snapshots the surviving member into it").field_path(".recovery.automatic").reason(Reason::FieldValueInvalid))]
pub struct EtcdadmClusterSpec {
    /// Number of members: odd and at least 1 (3 or 5 for HA). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self % 2 == 1").message("replicas must be odd and at least 1").reason(Reason::FieldValueInvalid))]
    pub replicas: Option<i32>,

    /// Infrastructure machine template cloned for each member: a kind of an infrastructure
    /// provider (apiVersion `infrastructure.cluster.x-k8s.io/<version>`), in our namespace.
    #[x_kube(validation = Rule::new("has(self.kind) && self.kind != ''").message("kind is required").field_path(".kind").reason(Reason::FieldValueRequired))]
    #[x_kube(validation = Rule::new("has(self.name) && self.name != ''").message("name is required").field_path(".name").reason(Reason::FieldValueRequired))]
    #[x_kube(validation = Rule::new("!has(self.apiVersion) || self.apiVersion.matches('^infrastructure[.]cluster[.]x-k8s[.]io/.+$')").message("apiVersion must be infrastructure.cluster.x-k8s.io/<version> (the template of an infrastructure provider)").field_path(".apiVersion").reason(Reason::FieldValueInvalid))]
    pub infrastructure_template: ObjectReference,

    /// Copied into each member's EtcdadmConfig.
    #[serde(default)]
    pub etcdadm_config_spec: EtcdadmConfigSpec,

    /// How members are replaced when they are outdated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,

    /// How new member Machines are brought up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<Provisioning>,

    /// Replace every member created before this time (certificate renewal, image refresh).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "time_up_to_year_9999"
    )]
    pub rollout_after: Option<Time>,

    /// When members are replaced before something forces it (KubeadmControlPlane's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_before: Option<RolloutBefore>,

    /// Health checking and remediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,

    /// Failure domains of the Cluster to spread members over (default: all of them): unique,
    /// non-empty names of at most 253 characters; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub failure_domains: Vec<String>,

    /// Metadata and version for the member Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_template: Option<MachineTemplate>,

    /// Snapshots to an object store: on demand (EtcdadmSnapshot objects), on a schedule, and how
    /// many are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Backup>,

    /// Create the cluster from a snapshot: the first member's data is restored from it, the
    /// others join as usual. Only when the cluster is created; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("restore is immutable"))]
    pub restore: Option<Restore>,

    /// Quorum-loss recovery without a human: off unless `automatic` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,

    /// What the controller does for etcd's own health: repairing alarms, defragmenting members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Maintenance>,
}

/// Each section's settings with its defaults applied, read through the spec.
impl EtcdadmClusterSpec {
    /// Desired members, with the default applied.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// The version Machines get (`machineTemplate.version`), if set.
    pub fn machine_version(&self) -> Option<&str> {
        self.machine_template.as_ref().and_then(|t| t.version.as_deref())
    }

    /// `maxSurge`, with the default (1) applied.
    pub fn max_surge(&self) -> i32 {
        rollout::max_surge(self.rollout_strategy.as_ref())
    }

    /// `provisioning.parallelMachines` when set (a value below 1 counts as 1).
    pub fn parallel_machines(&self) -> Option<usize> {
        rollout::parallel_machines(self.provisioning.as_ref())
    }

    /// How long before a certificate expires it is renewed.
    pub fn certificates_renew_before(&self) -> Duration {
        rollout::certificates_renew_before(self.rollout_before.as_ref())
    }

    /// Health-check settings with defaults applied.
    pub fn health_settings(&self) -> HealthSettings {
        health::settings(self.health_check.as_ref())
    }

    /// How long quorum must have been lost before the cluster recovers by itself, when it does.
    pub fn automatic_recovery_after(&self) -> Option<Duration> {
        recovery::automatic_after(self.recovery.as_ref())
    }

    /// Who repairs etcd alarms, with the default applied.
    pub fn alarm_repair(&self) -> AlarmRepair {
        maintenance::alarm_repair(self.maintenance.as_ref())
    }

    /// The defragmentation policy with defaults applied (on by default with 3 or more members).
    pub fn defragmentation_settings(&self) -> DefragmentationSettings {
        maintenance::defragmentation_settings(self.maintenance.as_ref(), self.replicas())
    }
}

/// The API server accepts any RFC 3339 time up to 9999-12-31T23:59:59Z, but a timestamp ends on
/// 9999-12-30 (jiff keeps every UTC offset of a civil date in range). A later time reads as the
/// latest timestamp, which means "never" just the same, instead of making the object unreadable.
fn time_up_to_year_9999<'de, D>(deserializer: D) -> Result<Option<Time>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    match text.parse::<k8s_openapi::jiff::Timestamp>() {
        Ok(time) => Ok(Some(Time(time))),
        Err(_) if text.starts_with("9999-12-3") => Ok(Some(Time(k8s_openapi::jiff::Timestamp::MAX))),
        Err(e) => Err(serde::de::Error::custom(format!(
            "{text:?} is not an RFC 3339 time: {e}"
        ))),
    }
}

/// The first member of a cluster created from a snapshot downloads and restores it in its
/// cloud-config user data; the Bottlerocket bootstrap image cannot.
pub fn restore_needs_cloud_config(spec: &EtcdadmClusterSpec) -> Option<FieldError> {
    (spec.restore.is_some() && spec.etcdadm_config_spec.format() == Format::Bottlerocket).then(|| {
        FieldError::new(
            "spec.restore",
            "a cluster created from a snapshot needs spec.etcdadmConfigSpec.format cloud-config: the \
             Bottlerocket bootstrap image cannot restore one",
        )
    })
}

/// Every rule on a spec on its own, section by section.
pub fn validate_spec(spec: &EtcdadmClusterSpec, namespace: Option<&str>) -> Vec<FieldError> {
    let mut errors = members::replicas_problems(spec.replicas);
    errors.extend(members::template_problems(
        &spec.infrastructure_template,
        namespace,
    ));
    errors.extend(members::failure_domain_problems(&spec.failure_domains));
    errors.extend(rollout::problems(
        spec.rollout_strategy.as_ref(),
        spec.provisioning.as_ref(),
        spec.rollout_before.as_ref(),
    ));
    errors.extend(health::problems(spec.health_check.as_ref()));
    if let Some(backup) = &spec.backup {
        errors.extend(validate_backup(backup, "spec.backup"));
    }
    if let Some(restore) = &spec.restore {
        errors.extend(validate_restore(restore, "spec.restore"));
    }
    errors.extend(recovery::problems(spec.recovery.as_ref(), spec.backup.is_some()));
    errors.extend(maintenance::problems(spec.maintenance.as_ref()));
    errors.extend(validate_config_spec(
        &spec.etcdadm_config_spec,
        "spec.etcdadmConfigSpec",
    ));
    errors
}

impl EtcdadmCluster {
    /// What a CA rotation request on it is judged by.
    pub fn rotation_facts(&self) -> RotationFacts<'_> {
        static NONE: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
        RotationFacts {
            annotations: self.metadata.annotations.as_ref().unwrap_or(&NONE),
            status: self.status.as_ref(),
            bottlerocket: self.spec.etcdadm_config_spec.format() == Format::Bottlerocket,
            restore: self.spec.restore.is_some(),
        }
    }
}

/// Changes that would strand the running members.
pub fn validate_update(old: &EtcdadmClusterSpec, new: &EtcdadmClusterSpec) -> Vec<FieldError> {
    let mut errors = vec![];
    if let (Some((_, old_version)), Some((field, new_version))) = (
        etcd_version(&old.etcdadm_config_spec),
        etcd_version(&new.etcdadm_config_spec),
    ) && let Some(problem) = version_change_problem(old_version, new_version)
    {
        errors.push(FieldError::new(
            format!("spec.etcdadmConfigSpec.{field}"),
            problem,
        ));
    }
    errors.extend(members::template_update_problems(
        &old.infrastructure_template,
        &new.infrastructure_template,
    ));
    match (&old.restore, &new.restore) {
        (None, Some(_)) => errors.push(FieldError::new(
            "spec.restore",
            "can only be set when the EtcdadmCluster is created: a running cluster's data is \
             never replaced (create a new EtcdadmCluster restored from the snapshot)",
        )),
        (Some(old), new) if new.as_ref() != Some(old) => {
            errors.push(FieldError::new("spec.restore", "is immutable"))
        }
        _ => {}
    }
    errors
}

#[cfg(test)]
mod tests;
