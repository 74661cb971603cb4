//! The EtcdadmCluster's status: the summary the contract and `kubectl get` read, one entry per
//! member, the condition types, and the records of certificates and of a change's before-change
//! snapshot. The records of a recovery and a defragmentation are in their sections' files.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::maintenance::{Defragmentation, UnconfirmedCorrupt};
use super::recovery::{LastRecovery, RecoveryStatus};
use crate::api::conditions::Condition;
use crate::api::snapshot::RestoredFrom;

/// The condition types of an EtcdadmCluster's status: what its controller sets, and what the
/// snapshot controller reads (a resize in flight, a pause).
pub mod condition {
    pub use crate::api::conditions::READY;
    pub const CERTIFICATES_AVAILABLE: &str = "CertificatesAvailable";
    pub const INITIALIZED: &str = "Initialized";
    pub const MACHINES_READY: &str = "MachinesReady";
    pub const MEMBERS_HEALTHY: &str = "MembersHealthy";
    /// Whether a voting member serves clients; its last transition to True marks when the
    /// cluster last (re)gained quorum (the remediation clock reads it).
    pub const ENDPOINTS_AVAILABLE: &str = "EndpointsAvailable";
    pub const CONTROL_PLANE_ENDPOINTS_UPDATED: &str = "ControlPlaneEndpointsUpdated";
    pub const PAUSED: &str = "Paused";
    pub const RESIZE_COMPLETED: &str = "ResizeCompleted";
    pub const MACHINES_SPEC_UP_TO_DATE: &str = "MachinesSpecUpToDate";
    /// While the `recover` annotation is set: the answer to it (shown even when Ready).
    pub const RECOVERY: &str = "Recovery";
    /// After a restore or recovery: whether the restored revision was raised above the old
    /// cluster's (False, severity Warning, when the node's etcd tooling could not).
    pub const REVISIONS_BUMPED: &str = "RevisionsBumped";
    /// Negative polarity, like `Paused`: True (severity Warning) while a certificate is inside
    /// its window.
    pub const CERTIFICATES_EXPIRING: &str = "CertificatesExpiring";
    /// Whether the spec is one admission would accept: False (reason `InvalidSpec`, naming each
    /// field and its problem) whatever the plan does, shown even when Ready.
    pub const SPEC_VALID: &str = "SpecValid";
}

/// Observed state. The first five fields keep the reference's meaning so the EKS-A fork of CAPI
/// can read us.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmClusterStatus {
    /// Every desired member is a healthy voting member and membership equals the Machines.
    #[serde(default)]
    pub ready: bool,
    /// The first member has passed a health check.
    #[serde(default)]
    pub initialized: bool,
    /// Comma-joined sorted client URLs of the voting members.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoints: String,
    /// Name of the `<cluster>-etcd-init` Secret, once published (the reference's meaning).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub init_machine_address: String,
    /// Set once the cluster first became ready; never unset.
    #[serde(default)]
    pub creation_complete: bool,
    /// Ready members (the reference's JSON name for the ready count).
    #[serde(rename = "replicas", default, skip_serializing_if = "Option::is_none")]
    pub ready_count: Option<i32>,
    /// Healthy voting members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Members whose Machine matches the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// Label selector of the member Machines (scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Generation the status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The etcd cluster version (`3.5.0`): the lowest minor version the voting members report in
    /// their Status responses, as etcd itself decides it once every member answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_version: Option<String>,
    /// One entry per etcd member or member Machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Expiry of the certificates this controller manages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<CertificatesStatus>,
    /// The snapshot the cluster's data was restored from (`spec.restore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoredFrom>,
    /// The quorum-loss recovery under way (the `etcdcluster.cluster.x-k8s.io/recover`
    /// annotation): each step is recorded here before it is taken, so a restarted controller
    /// resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryStatus>,
    /// The last quorum-loss recovery that finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recovery: Option<LastRecovery>,
    /// The disruptive change under way (a rolling replacement or a scale-down) and the snapshot
    /// taken before its first removal: recorded when the change is decided, so a restarted
    /// controller waits for the same snapshot; cleared when the change is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_change: Option<BeforeChangeStatus>,
    /// CORRUPT alarms the controller disarmed because every member's hash agreed (etcd's own
    /// evidence said no member's data differs): how many, and the last. Raised again and again,
    /// the alarm is left to a person (docs/day2.md, "Alarms").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed_corrupt: Option<UnconfirmedCorrupt>,
    /// The etcd CA rotation under way (the `etcdcluster.cluster.x-k8s.io/rotate-ca`
    /// annotation, docs/security.md, "Rotating the etcd CA"): its phase, which CA signed each
    /// member, and the phases left. Absent when no rotation is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<CaRotationStatus>,
    /// `Ready` summary and the detailed conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where an etcd CA rotation stands.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaRotationStatus {
    /// `Generating`, `Trusting`, `ControlPlane`, `Signing`, `Dropping` or `Finishing`.
    pub phase: String,
    /// The `rotate-ca` value the rotation serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Per member Machine, the CA that signed the certificate it presented last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<CaRotationMember>,
    /// The phases after this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaining: Vec<String>,
}

/// One member Machine in a CA rotation.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaRotationMember {
    pub machine: String,
    /// `current` (the CA of `<cluster>-managed-etcd`), `next` (of `<cluster>-managed-etcd-next`)
    /// or `unknown` (no handshake yet, or neither).
    pub signed_by: String,
}

/// A disruptive change and its before-change snapshot.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BeforeChangeStatus {
    /// `before-rollout` or `before-scale-down`.
    pub reason: String,
    /// The cluster's revision when the change was decided: the snapshot holds at least it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// When the change was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided: Option<Time>,
    /// The EtcdadmSnapshot the change waits for (created, or a fresh one reused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// An operator let this change go ahead without a snapshot
    /// (`etcdcluster.cluster.x-k8s.io/proceed-without-snapshot`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proceeded_without: bool,
}

/// What the controller last saw of one member.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Member name (= Machine name).
    pub name: String,
    /// The member's Machine, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<MachineReference>,
    /// etcd member ID, hex.
    #[serde(rename = "memberID", default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<String>,
    /// Peer URL.
    #[serde(rename = "peerURL", default, skip_serializing_if = "Option::is_none")]
    pub peer_url: Option<String>,
    /// Client URL.
    #[serde(rename = "clientURL", default, skip_serializing_if = "Option::is_none")]
    pub client_url: Option<String>,
    /// Passed the last health check.
    #[serde(default)]
    pub healthy: bool,
    /// Raft leader at the last check.
    #[serde(default)]
    pub is_leader: bool,
    /// Non-voting learner.
    #[serde(default)]
    pub is_learner: bool,
    /// Last time the member passed a health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_healthy_time: Option<Time>,
    /// Last time `healthy` changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// etcd server version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// Database size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size: Option<i64>,
    /// Bytes of the database in use; the rest is free space a defragmentation returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_in_use: Option<i64>,
    /// The backend quota the member runs with (from its EtcdadmConfig; etcd's default, 2Gi, when
    /// it sets none): at this database size etcd raises NOSPACE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_backend_bytes: Option<i64>,
    /// Active alarms (`NOSPACE`, `CORRUPT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<String>,
    /// The member's last defragmentation by this controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_defragmentation: Option<Defragmentation>,
    /// When the member's server certificate expires, as it presented it at the last health
    /// check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<Time>,
    /// Why the member is unhealthy, or what it is waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Reference to a member's Machine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineReference {
    /// Machine name (same namespace).
    pub name: String,
}

/// Certificate expiry dates.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificatesStatus {
    /// When the etcd CA expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_expiry: Option<Time>,
    /// When the kube-apiserver etcd client certificate expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver_client_expiry: Option<Time>,
    /// The soonest of the CA's, the client certificate's and every member's expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_expiry: Option<Time>,
}
