//! `etcdcluster.cluster.x-k8s.io/v1beta1`: EtcdadmCluster, wire-compatible with the reference
//! (aws/etcdadm-controller) plus the fields this project adds (docs/safety.md, docs/day2.md).
// kube's `printcolumn(...)` attributes repeat the same keys by design.
#![allow(clippy::duplicated_attributes)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::config::{EtcdadmConfigSpec, ObjectMetaTemplate};
use super::quantity::ByteQuantity;
use super::snapshot::{Backup, Restore, RestoredFrom};
use crate::duration;

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
pub struct EtcdadmClusterSpec {
    /// Number of members: odd and at least 1 (3 or 5 for HA). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self % 2 == 1").message("replicas must be odd and at least 1").reason(Reason::FieldValueInvalid))]
    pub replicas: Option<i32>,

    /// Infrastructure machine template cloned for each member: a kind of an infrastructure
    /// provider (apiVersion `infrastructure.cluster.x-k8s.io/<version>`), in our namespace.
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

/// etcd's own health, kept by the controller.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Maintenance {
    /// `Automatic` (default): a NOSPACE alarm is repaired (history compacted, members
    /// defragmented one at a time, the alarm disarmed once every member is below 90% of its
    /// quota); a CORRUPT alarm's member is replaced, then the alarm disarmed. `Manual`: alarms
    /// are reported, and the repair is left to a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarms: Option<AlarmRepair>,
    /// Routine defragmentation: a member whose database is mostly free space gets it back,
    /// one member at a time, only while the cluster is Ready and nothing else is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defragmentation: Option<DefragmentationPolicy>,
}

/// When members are defragmented without an alarm. A member qualifies when its database is at
/// least `fragmentedPercent` free space and at least `minimumSize`, or at least `quotaPercent`
/// of its quota with at least `minimumReclaimable` free.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationPolicy {
    /// `Automatic` or `Off`. Default: Automatic with 3 or more replicas, Off with 1 (defragmenting
    /// the only member stops every client while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DefragmentationMode>,
    /// Free space, in percent of the database, that makes a member fragmented: 1 to 99, default
    /// 45.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 99))]
    pub fragmented_percent: Option<i32>,
    /// The smallest database defragmented for fragmentation alone (default 100Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_size: Option<ByteQuantity>,
    /// Share of its quota, in percent, at which a member is defragmented whatever its
    /// fragmentation, if `minimumReclaimable` is free: 1 to 100, default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub quota_percent: Option<i32>,
    /// Free space worth a defragmentation near the quota (default 100Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_reclaimable: Option<ByteQuantity>,
    /// Least time between two defragmentations of one member: a duration of at least 1m,
    /// default 10m. At most 64 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub interval: Option<String>,
    /// Only inside this window (default: at any time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<MaintenanceWindow>,
}

/// Whether members are defragmented on the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum DefragmentationMode {
    Automatic,
    Off,
}

/// A recurring time window: it opens at each time of `start` and stays open for `duration`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When it opens: a 5-field cron expression, UTC (`0 2 * * *`: at 02:00 every day). At most
    /// 128 characters.
    #[schemars(length(max = 128))]
    pub start: String,
    /// How long it stays open: a duration of at least 1m (`2h`). At most 64 characters.
    #[schemars(length(max = 64))]
    pub duration: String,
}

/// Defaults of the defragmentation policy (OpenShift's etcd operator's thresholds).
pub const DEFAULT_FRAGMENTED_PERCENT: u64 = 45;
pub const DEFAULT_DEFRAGMENT_MINIMUM_SIZE: u64 = 100 << 20;
pub const DEFAULT_DEFRAGMENT_QUOTA_PERCENT: u64 = 80;
pub const DEFAULT_DEFRAGMENT_MINIMUM_RECLAIMABLE: u64 = 100 << 20;
pub const DEFAULT_DEFRAGMENT_INTERVAL: Duration = Duration::from_secs(600);
/// The shortest interval and window accepted.
pub const MIN_DEFRAGMENT_INTERVAL: Duration = Duration::from_secs(60);

/// The defragmentation policy after defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefragmentationSettings {
    pub enabled: bool,
    pub fragmented_percent: u64,
    pub minimum_size: u64,
    pub quota_percent: u64,
    pub minimum_reclaimable: u64,
    pub interval: Duration,
    pub window: DefragmentationWindow,
}

/// When defragmentation may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefragmentationWindow {
    /// At any time.
    Always,
    /// From each time of the schedule, for the duration.
    Recurring(crate::cron::Schedule, Duration),
    /// A window that does not parse (admission refuses it): never.
    Unreadable,
}

impl DefragmentationWindow {
    /// Whether the window is open at `now`.
    pub fn is_open(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        match self {
            DefragmentationWindow::Always => true,
            DefragmentationWindow::Unreadable => false,
            DefragmentationWindow::Recurring(start, open) => start
                .last_at_or_before(now)
                .and_then(|opened| now.duration_since(opened).try_into().ok())
                .is_some_and(|since: Duration| since < *open),
        }
    }
}

/// Who repairs an etcd alarm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AlarmRepair {
    #[default]
    Automatic,
    Manual,
}

/// Least time quorum must have been lost before an automatic recovery.
pub const MIN_AUTOMATIC_RECOVERY_AFTER: Duration = Duration::from_secs(600);

/// When the cluster recovers from a lost quorum by itself.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Recover from `latest` (the surviving member with the highest revision, else the newest
    /// Succeeded snapshot) once quorum has been lost for `after`, as the
    /// `etcdcluster.cluster.x-k8s.io/recover` annotation would. Needs `spec.backup.store`.
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automatic: Option<bool>,
    /// How long no member may have served clients, with quorum lost, before an automatic
    /// recovery: a duration of at least 10m (the default). At most 64 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub after: Option<String>,
}

/// Default number of members.
pub const DEFAULT_REPLICAS: i32 = 1;

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
}
/// Default health-check interval.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(10);
/// Default timeout of one health check.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a member may be unhealthy before it is remediated.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(300);
/// Default `rolloutBefore.certificatesExpiryDays`: renewal is on unless asked otherwise, because
/// the alternative is an outage a year after creation.
pub const DEFAULT_CERTIFICATES_EXPIRY_DAYS: i32 = 30;
/// The smallest `rolloutBefore.certificatesExpiryDays` (KubeadmControlPlane's minimum too).
pub const MIN_CERTIFICATES_EXPIRY_DAYS: i32 = 7;
/// The largest: half of etcdadm's 365-day validity, so a fresh certificate stays outside the
/// window for months (one of a year or more would replace every member again at once, forever).
pub const MAX_CERTIFICATES_EXPIRY_DAYS: i32 = 180;

impl EtcdadmClusterSpec {
    /// Desired members, with the default applied.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// `maxSurge`, with the default (1) applied.
    pub fn max_surge(&self) -> i32 {
        self.rollout_strategy
            .as_ref()
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.max_surge)
            .unwrap_or(1)
    }

    /// `provisioning.parallelMachines` when set: the most new Machines not yet voting members
    /// at once (a value below 1, which admission refuses, counts as 1).
    pub fn parallel_machines(&self) -> Option<usize> {
        self.provisioning
            .as_ref()
            .and_then(|p| p.parallel_machines)
            .map(|n| usize::try_from(n).unwrap_or(0).max(1))
    }

    /// Health-check settings with defaults applied. A duration that does not parse falls back to
    /// the default (admission rejects it; this keeps the controller safe if one slips through).
    pub fn health_settings(&self) -> HealthSettings {
        let hc = self.health_check.clone().unwrap_or_default();
        let pick = |v: &Option<String>, default: Duration| {
            v.as_deref()
                .and_then(|s| duration::parse(s).ok())
                .filter(|d| !d.is_zero())
                .unwrap_or(default)
        };
        HealthSettings {
            interval: pick(&hc.interval, DEFAULT_HEALTH_INTERVAL),
            timeout: pick(&hc.timeout, DEFAULT_HEALTH_TIMEOUT),
            unhealthy_after: pick(&hc.unhealthy_after, DEFAULT_UNHEALTHY_AFTER),
            remediation: hc.remediation.unwrap_or_default() == Remediation::Enabled,
        }
    }

    /// How long quorum must have been lost before the cluster recovers by itself, when
    /// `recovery.automatic` is set (an `after` that does not parse, or is shorter than the
    /// minimum admission enforces, counts as the minimum).
    pub fn automatic_recovery_after(&self) -> Option<Duration> {
        let recovery = self.recovery.as_ref().filter(|r| r.automatic == Some(true))?;
        let after = recovery
            .after
            .as_deref()
            .and_then(|s| duration::parse(s).ok())
            .unwrap_or(MIN_AUTOMATIC_RECOVERY_AFTER);
        Some(after.max(MIN_AUTOMATIC_RECOVERY_AFTER))
    }

    /// Who repairs etcd alarms, with the default applied.
    pub fn alarm_repair(&self) -> AlarmRepair {
        self.maintenance
            .as_ref()
            .and_then(|m| m.alarms)
            .unwrap_or_default()
    }

    /// The defragmentation policy with defaults applied. A value admission would refuse counts
    /// as its default, except a window that does not parse: that one never opens (nothing is
    /// defragmented at times nobody can read).
    pub fn defragmentation_settings(&self) -> DefragmentationSettings {
        let policy = self
            .maintenance
            .as_ref()
            .and_then(|m| m.defragmentation.clone())
            .unwrap_or_default();
        let percent = |value: Option<i32>, max: u64, default: u64| {
            value
                .and_then(|v| u64::try_from(v).ok())
                .filter(|v| (1..=max).contains(v))
                .unwrap_or(default)
        };
        let bytes = |value: &Option<ByteQuantity>, default: u64| {
            value.as_ref().and_then(|q| q.bytes().ok()).unwrap_or(default)
        };
        let window = match &policy.window {
            None => DefragmentationWindow::Always,
            Some(w) => match (
                crate::cron::Schedule::parse(&w.start),
                duration::parse(&w.duration),
            ) {
                (Ok(start), Ok(open)) => DefragmentationWindow::Recurring(start, open),
                _ => DefragmentationWindow::Unreadable,
            },
        };
        DefragmentationSettings {
            enabled: match policy.mode {
                Some(DefragmentationMode::Automatic) => true,
                Some(DefragmentationMode::Off) => false,
                None => self.replicas() >= 3,
            },
            fragmented_percent: percent(policy.fragmented_percent, 99, DEFAULT_FRAGMENTED_PERCENT),
            minimum_size: bytes(&policy.minimum_size, DEFAULT_DEFRAGMENT_MINIMUM_SIZE),
            quota_percent: percent(policy.quota_percent, 100, DEFAULT_DEFRAGMENT_QUOTA_PERCENT),
            minimum_reclaimable: bytes(
                &policy.minimum_reclaimable,
                DEFAULT_DEFRAGMENT_MINIMUM_RECLAIMABLE,
            ),
            interval: policy
                .interval
                .as_deref()
                .and_then(|i| duration::parse(i).ok())
                .unwrap_or(DEFAULT_DEFRAGMENT_INTERVAL)
                .max(MIN_DEFRAGMENT_INTERVAL),
            window,
        }
    }

    /// How long before a certificate expires it is renewed (`rolloutBefore.certificatesExpiryDays`,
    /// default 30 days; within the bounds admission enforces).
    pub fn certificates_renew_before(&self) -> Duration {
        let days = self
            .rollout_before
            .as_ref()
            .and_then(|r| r.certificates_expiry_days)
            .unwrap_or(DEFAULT_CERTIFICATES_EXPIRY_DAYS)
            .clamp(MIN_CERTIFICATES_EXPIRY_DAYS, MAX_CERTIFICATES_EXPIRY_DAYS);
        Duration::from_secs(u64::from(days.unsigned_abs()) * 86_400)
    }

    /// The version Machines get (`machineTemplate.version`), if set.
    pub fn machine_version(&self) -> Option<&str> {
        self.machine_template.as_ref().and_then(|t| t.version.as_deref())
    }
}

/// Health settings after defaulting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_after: Duration,
    pub remediation: bool,
}

/// How outdated members are replaced.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Only `RollingUpdate`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["RollingUpdate"]))]
    pub type_: Option<String>,
    /// Rolling update parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// Rolling update parameters.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Extra members allowed during a rollout: 1 (default, add before remove: at most N+1
    /// members and Machines; with a KubeadmControlPlane up to 2N, whose Machines boot together
    /// with learner joins) or 0 (remove first: never more than N Machines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 0 || self == 1").message("maxSurge must be 0 or 1"))]
    pub max_surge: Option<i32>,
}

/// How new member Machines are brought up (docs/safety.md, "Boot ahead").
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    /// The most new Machines not yet voting members at once: booting, booted and waiting for
    /// their turn to join, or joining. Default: as many as a creation or scale-up needs (a
    /// rolling update without a KubeadmControlPlane creates only its current step's Machine). Members still join
    /// one at a time, each as a learner added once every member is healthy; 1 creates each
    /// Machine only after the previous one joined. Machines are created ahead only with learner
    /// joins (the upstream etcdadm flavor with cloud-config); the eks-anywhere flavor and
    /// Bottlerocket create one Machine at a time whatever this says. At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("parallelMachines must be at least 1"))]
    pub parallel_machines: Option<i32>,
}

/// Replacements made ahead of time.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutBefore {
    /// Replace a member whose certificates expire within this many days, and re-issue the API
    /// server's etcd client certificate (one KubeadmControlPlane rollout) in the same window.
    /// At least 7, at most 180. Default 30 when unset: etcdadm's certificates are valid for a
    /// year and cannot be renewed in place, so without this the cluster stops a year after
    /// creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 7, max = 180))]
    pub certificates_expiry_days: Option<i32>,
}

/// Health checking and remediation settings (Go duration strings).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Time between checks of each member (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub interval: Option<String>,
    /// Timeout of one check (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub timeout: Option<String>,
    /// How long a member may be unhealthy before it is replaced (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub unhealthy_after: Option<String>,
    /// `Enabled` (default) or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<Remediation>,
}

/// Whether unhealthy members are replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Remediation {
    #[default]
    Enabled,
    Disabled,
}

/// Metadata and version for member Machines.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    /// Labels and annotations added to each member Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// `Machine.spec.version` (default: the KubeadmControlPlane's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
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
    /// `Ready` summary and the detailed conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where a quorum-loss recovery is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum RecoveryPhase {
    /// The surviving member's snapshot is being taken into the store.
    #[default]
    Snapshotting,
    /// The lost cluster's Machines are deleted (their members are not removed: the cluster they
    /// belong to is being replaced).
    Replacing,
    /// The first member is restored from the snapshot, the others join, the control plane gets
    /// the new endpoints.
    Restoring,
}

/// A quorum-loss recovery under way.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// The source as asked (`latest`, `member/<machine>`, `snapshot/<name>`), or `automatic`
    /// (`spec.recovery.automatic`, source `latest`).
    pub requested: String,
    /// The source chosen: `member/<machine>` or `snapshot/<name>`.
    pub source: String,
    pub phase: RecoveryPhase,
    /// The EtcdadmSnapshot the cluster is restored from.
    pub snapshot: String,
    /// The highest revision a surviving member reported when the recovery began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survivor_revision: Option<i64>,
    /// When the recovery began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
}

/// A quorum-loss recovery that finished.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastRecovery {
    /// The source as asked, or `automatic`.
    pub requested: String,
    /// The source chosen: `member/<machine>` or `snapshot/<name>`.
    pub source: String,
    /// The EtcdadmSnapshot restored.
    pub snapshot: String,
    /// The revision restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Revisions a survivor held beyond the one restored, where a survivor's revision was known
    /// (0 when the survivor itself was the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions_lost: Option<i64>,
    /// When the recovery began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// When the cluster was Ready again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Whether the restored revision was raised above every revision the lost cluster served,
    /// with the older ones marked compacted (see `restoredFrom.revisionBumped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_bumped: Option<bool>,
    /// The `spec.rollout.after` given to the KubeadmControlPlane once the cluster was Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_rollout: Option<Time>,
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

/// One defragmentation of a member's database.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Defragmentation {
    /// When it finished.
    pub time: Time,
    /// The member's revision then: under NOSPACE it moves only by deletes, so a member
    /// defragmented at its current revision has nothing more to return.
    pub revision: i64,
    /// Database size before, in bytes.
    pub size_before: i64,
    /// Database size after, in bytes (the difference is what it returned to the file system).
    pub size_after: i64,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn spec_with_rollout_after(value: &str) -> Result<EtcdadmClusterSpec, serde_json::Error> {
        serde_json::from_value(serde_json::json!({"infrastructureTemplate": {}, "rolloutAfter": value}))
    }

    #[test]
    fn defragmentation_defaults_follow_the_member_count_and_openshifts_thresholds() {
        let spec = |value: serde_json::Value| -> EtcdadmClusterSpec {
            let mut base = serde_json::json!({"infrastructureTemplate": {}});
            base.as_object_mut()
                .unwrap()
                .extend(value.as_object().unwrap().clone());
            serde_json::from_value(base).unwrap()
        };
        let one = spec(serde_json::json!({})).defragmentation_settings();
        assert!(!one.enabled, "one member: off");
        let three = spec(serde_json::json!({"replicas": 3})).defragmentation_settings();
        assert_eq!(
            three,
            DefragmentationSettings {
                enabled: true,
                fragmented_percent: 45,
                minimum_size: 100 << 20,
                quota_percent: 80,
                minimum_reclaimable: 100 << 20,
                interval: Duration::from_secs(600),
                window: DefragmentationWindow::Always,
            }
        );
        let forced = spec(serde_json::json!({"maintenance": {"defragmentation": {"mode": "Automatic"}}}));
        assert!(forced.defragmentation_settings().enabled);
        let off =
            spec(serde_json::json!({"replicas": 5, "maintenance": {"defragmentation": {"mode": "Off"}}}));
        assert!(!off.defragmentation_settings().enabled);
    }

    #[test]
    fn a_window_is_open_from_each_start_for_its_duration() {
        let at = |text: &str| text.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
        let window = DefragmentationWindow::Recurring(
            crate::cron::Schedule::parse("0 2 * * *").unwrap(),
            Duration::from_secs(2 * 3600),
        );
        assert!(!window.is_open(at("2026-03-01T01:59:59Z")));
        assert!(window.is_open(at("2026-03-01T02:00:00Z")));
        assert!(window.is_open(at("2026-03-01T03:59:59Z")));
        assert!(!window.is_open(at("2026-03-01T04:00:00Z")));
        assert!(DefragmentationWindow::Always.is_open(at("2026-03-01T12:00:00Z")));
        assert!(!DefragmentationWindow::Unreadable.is_open(at("2026-03-01T02:30:00Z")));
    }

    #[test]
    fn every_rollout_after_the_api_server_accepts_is_readable() {
        let last = spec_with_rollout_after("9999-12-31T23:59:59Z").unwrap();
        assert_eq!(last.rollout_after, Some(Time(k8s_openapi::jiff::Timestamp::MAX)));
        let ordinary = spec_with_rollout_after("2026-11-24T10:00:00Z").unwrap();
        assert_eq!(
            ordinary.rollout_after.unwrap().0.to_string(),
            "2026-11-24T10:00:00Z"
        );
        let earliest = spec_with_rollout_after("0000-01-01T00:00:00Z").unwrap();
        assert!(earliest.rollout_after.is_some());
        let none: EtcdadmClusterSpec =
            serde_json::from_value(serde_json::json!({"infrastructureTemplate": {}})).unwrap();
        assert_eq!(none.rollout_after, None);
        let garbage = spec_with_rollout_after("tomorrow").unwrap_err();
        assert!(
            garbage
                .to_string()
                .contains("\"tomorrow\" is not an RFC 3339 time"),
            "{garbage}"
        );
    }
}
