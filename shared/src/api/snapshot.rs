//! `etcdcluster.cluster.x-k8s.io/v1beta1` EtcdadmSnapshot, and the object store settings an
//! EtcdadmCluster's `spec.backup` and `spec.restore` share with it (docs/day2.md, "Snapshots and restore").
// kube's `printcolumn(...)` attributes repeat the same keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::conditions::Condition;

/// A copy of one EtcdadmCluster's etcd data, taken from one member and kept in the cluster's
/// object store. Created by `kubectl create` (on demand) or by `spec.backup.schedule`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "etcdcluster.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "EtcdadmSnapshot",
    namespaced,
    status = "EtcdadmSnapshotStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "etcdsnap",
    category = "cluster-api",
    doc = "EtcdadmSnapshot is a snapshot of an EtcdadmCluster's etcd data in the cluster's object store.",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("cluster.x-k8s.io/provider", "bootstrap-etcdadm"),
    // Nothing owns a snapshot (it outlives its cluster): `clusterctl move` carries every one of
    // the namespace it moves.
    label("clusterctl.cluster.x-k8s.io/move", ""),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.clusterName",
        description = "EtcdadmCluster the snapshot is of"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Running, Succeeded or Failed"
    ),
    printcolumn(
        name = "Revision",
        type_ = "integer",
        json_path = ".status.revision",
        description = "etcd revision the snapshot holds"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.size",
        description = "Bytes of the snapshot file in the store"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmSnapshotSpec {
    /// The EtcdadmCluster (in this namespace) to take the snapshot of; immutable. At most 253
    /// characters (an object name).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterName is immutable"))]
    pub cluster_name: String,
    /// Read from this member Machine's member, whatever the cluster's health; immutable. A
    /// quorum-loss recovery sets it to snapshot a survivor, which answers from its own backend
    /// without quorum. Unset: a healthy voting member is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("member is immutable"))]
    pub member: Option<String>,
}

/// Where a snapshot is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum SnapshotPhase {
    /// Waiting for its turn or for a healthy member.
    #[default]
    Pending,
    /// Being streamed from a member into the store.
    Running,
    /// In the store, its SHA-256 checked.
    Succeeded,
    /// Not taken; the `Ready` condition says why.
    Failed,
}

impl SnapshotPhase {
    /// Succeeded and Failed never change again.
    pub fn is_finished(self) -> bool {
        matches!(self, SnapshotPhase::Succeeded | SnapshotPhase::Failed)
    }
}

/// What happened to the snapshot.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmSnapshotStatus {
    /// Pending (absent counts as Pending), Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,
    /// `<bucket>/<key>` of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The store the object is in (the cluster's `spec.backup.store` when it was taken), so the
    /// snapshot can be found without its cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<SnapshotStore>,
    /// Bytes of the object: the database, then etcd's 32-byte SHA-256 of it (the file `etcdctl
    /// snapshot save` writes, which `snapshot restore` checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// The etcd revision the snapshot holds: every write up to it is in the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// SHA-256 of the object (hex; what `sha256sum` of the downloaded file prints). etcd's own
    /// checksum of the database was checked before the object was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The member (Machine) it was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// etcd version of that member: a restore needs the same minor version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// When the current attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The multipart upload of the running attempt, aborted if the controller stops during it.
    #[serde(rename = "uploadID", default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    /// Attempts started (a controller restart during an attempt starts another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Continuous backup after this snapshot: the delta objects uploaded beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltas: Option<DeltasStatus>,
    /// The last restore drill of this snapshot (`spec.backup.verify` of its cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drill: Option<DrillStatus>,
    /// `Ready`: True once Succeeded; otherwise why not (what it waits for, or why it failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The delta objects uploaded after a snapshot (`<key>.deltas/`), as last recorded: a restore
/// to the latest write refuses a chain that ends before `lastRevision`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltasStatus {
    /// Delta objects uploaded.
    #[serde(default)]
    pub count: i64,
    /// The last revision they hold (the snapshot's own while there are none).
    #[serde(default)]
    pub last_revision: i64,
    /// When the watch delivered that revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<Time>,
    /// Set once no more deltas follow this snapshot, and why: `Superseded` (a newer snapshot
    /// took over), `Compacted` (etcd compacted revisions before they were read: a new snapshot
    /// is taken), `Stopped` (continuous backup turned off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// What a restore drill found (docs/day2.md, "Restore drills").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum DrillResult {
    /// The restored copy held the source's key count and every sampled key's value.
    Passed,
    /// The backup did not restore, or the restored copy differs from the source: `message` says
    /// what (the object, or the key).
    #[default]
    Failed,
    /// Nothing could be concluded about the backup (the source compacted the revision restored,
    /// or the drill could not run); `message` says why.
    Inconclusive,
}

impl DrillResult {
    pub fn as_str(self) -> &'static str {
        match self {
            DrillResult::Passed => "Passed",
            DrillResult::Failed => "Failed",
            DrillResult::Inconclusive => "Inconclusive",
        }
    }
}

/// One restore drill: the snapshot and its deltas restored into a throwaway etcd and compared
/// with the source cluster at the revision restored.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillStatus {
    /// When the drill started.
    pub time: Time,
    /// Passed, Failed or Inconclusive.
    pub result: DrillResult,
    /// The source's revision the restored copy reached (the snapshot's, plus its deltas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Delta objects replayed onto the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltas: Option<i64>,
    /// Keys the restored copy holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// Keys whose value was compared with the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<i64>,
    /// What was found: on failure, what failed (the delta object's key, the mismatched key).
    #[serde(default)]
    pub message: String,
    /// The `etcdcluster.cluster.x-k8s.io/drill-now` value this drill answered, when asked for
    /// one rather than run on the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<String>,
}

impl EtcdadmSnapshot {
    /// The phase, Pending when not set yet.
    pub fn phase(&self) -> SnapshotPhase {
        self.status.as_ref().and_then(|s| s.phase).unwrap_or_default()
    }
}

/// An object store for snapshots. S3-compatible stores only, for now.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotStore {
    /// An S3-compatible store (AWS S3, MinIO, SeaweedFS, Ceph RGW, ...).
    pub s3: S3Store,
}

/// An S3-compatible bucket, and the Secrets holding what the controller needs to reach it.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.endpoint.startsWith('https://') || (has(self.insecure) && self.insecure)").message("endpoint must be an https:// URL; a plain http:// store needs insecure: true").field_path(".endpoint"))]
#[x_kube(validation = Rule::new("!has(self.sseKMSKeyID) || (has(self.sse) && self.sse == 'aws:kms')").message("sseKMSKeyID needs sse: aws:kms").field_path(".sseKMSKeyID"))]
pub struct S3Store {
    /// Base URL of the S3 API, `https://s3.eu-west-1.amazonaws.com`; `http://` only with
    /// `insecure: true`. At most 2048 characters.
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^/@?#[:space:]]+(/[^?#[:space:]]*)?$')").message("endpoint must be an http:// or https:// URL with a host and without credentials, query or fragment"))]
    pub endpoint: String,
    /// Allow a plain `http://` endpoint: snapshots (every Secret of the workload cluster) and
    /// the restore download then travel unencrypted. For a store on a trusted local network or
    /// a test; admission warns. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// Server-side encryption asked for on every upload: `AES256` (keys the store manages) or
    /// `aws:kms` (a KMS key, `sseKMSKeyID` or the store's default). Recommended; unset: the
    /// bucket's own default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sse: Option<ServerSideEncryption>,
    /// The KMS key (ID or ARN) for `sse: aws:kms`; at most 2048 characters.
    #[serde(rename = "sseKMSKeyID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub sse_kms_key_id: Option<String>,
    /// Bucket name (3 to 63 characters); it must exist.
    #[schemars(length(min = 3, max = 63), regex(pattern = "^[a-z0-9][a-z0-9.-]*[a-z0-9]$"))]
    pub bucket: String,
    /// Key prefix of this cluster's snapshots (`backups/prod/`); at most 512 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('/')").message("prefix must not start with '/': keys are relative to the bucket"))]
    pub prefix: Option<String>,
    /// Region requests are signed for (default `us-east-1`); at most 64 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Address the bucket in the path (`<endpoint>/<bucket>/<key>`) instead of the host name
    /// (`<bucket>.<endpoint host>`); most stores other than AWS need it. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
    /// Secret (in this namespace) with the keys `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    pub credentials_secret_ref: SecretReference,
    /// Secret (in this namespace) whose `ca.crt` is the CA bundle the endpoint's certificate
    /// is checked against, instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretReference>,
}

/// Server-side encryption of the objects a store holds (S3's `x-amz-server-side-encryption`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ServerSideEncryption {
    /// SSE-S3: the store encrypts with keys it manages.
    #[serde(rename = "AES256")]
    Aes256,
    /// SSE-KMS: the store encrypts with a key of its key management service.
    #[serde(rename = "aws:kms")]
    AwsKms,
}

impl ServerSideEncryption {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerSideEncryption::Aes256 => "AES256",
            ServerSideEncryption::AwsKms => "aws:kms",
        }
    }
}

/// Default region requests are signed for.
pub const DEFAULT_REGION: &str = "us-east-1";
/// Key of the access key ID in the credentials Secret.
pub const ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
/// Key of the secret access key in the credentials Secret.
pub const SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";
/// Key of the CA bundle in the CA Secret.
pub const CA_BUNDLE_KEY: &str = "ca.crt";

impl S3Store {
    /// Whether a plain `http://` endpoint is allowed.
    pub fn allows_insecure(&self) -> bool {
        self.insecure.unwrap_or(false)
    }

    /// The region, with the default applied.
    pub fn region(&self) -> &str {
        self.region
            .as_deref()
            .filter(|r| !r.is_empty())
            .unwrap_or(DEFAULT_REGION)
    }

    /// The object key of `name` under the prefix (a `/` is put between them when the prefix
    /// does not end with one).
    pub fn key(&self, name: &str) -> String {
        match self.prefix.as_deref().unwrap_or_default() {
            "" => name.to_string(),
            prefix if prefix.ends_with('/') => format!("{prefix}{name}"),
            prefix => format!("{prefix}/{name}"),
        }
    }
}

/// A Secret in the same namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecretReference {
    /// Secret name (at most 253 characters).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Snapshots of an EtcdadmCluster: where they go, when they are taken, how many are kept.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    /// The object store every snapshot of this cluster goes to.
    pub store: SnapshotStore,
    /// When to take snapshots: a 5-field cron expression (minute hour day-of-month month
    /// day-of-week, UTC; `*/15 * * * *`, `0 3 * * 1-5`, `@daily`). None: on demand only. At most
    /// 128 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub schedule: Option<String>,
    /// Which snapshots are kept. None: all of them (before-change snapshots aside, see
    /// `beforeChange.keep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Snapshots taken before a rolling replacement or a scale-down removes a member (always,
    /// while a store is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_change: Option<BeforeChange>,
    /// Continuous backup: after the newest Succeeded snapshot, every write since is uploaded
    /// beside it in delta objects, at most `interval` behind (docs/day2.md, "Continuous
    /// backup"). `spec.restore.to` replays them; a recovery from a snapshot replays all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous: Option<Continuous>,
    /// Restore drills: on this schedule the newest Succeeded snapshot and its deltas are
    /// restored into a throwaway etcd beside the controller and compared with the cluster at
    /// the revision restored (docs/day2.md, "Restore drills").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
}

/// When restore drills run, and how much of the restored copy they compare.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verify {
    /// When to drill: a 5-field cron expression like `schedule` (UTC; `0 4 * * *`, `@daily`). At
    /// most 128 characters.
    #[schemars(length(min = 1, max = 128))]
    pub schedule: String,
    /// Keys whose value is compared with the source's (1 to 1000, default 100), spread evenly
    /// over the restored key space; the key count is always compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub sample_keys: Option<i32>,
}

/// Default `verify.sampleKeys`.
pub const DEFAULT_SAMPLE_KEYS: usize = 100;
/// The most `verify.sampleKeys` may ask for.
pub const MAX_SAMPLE_KEYS: i32 = 1000;

impl Verify {
    /// `sampleKeys`, defaulted and held within 1 to [`MAX_SAMPLE_KEYS`] (admission refuses
    /// others).
    pub fn sample_keys(&self) -> usize {
        self.sample_keys
            .map(|n| n.clamp(1, MAX_SAMPLE_KEYS))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(DEFAULT_SAMPLE_KEYS)
    }
}

/// How often continuous backup uploads the writes since its last upload.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Continuous {
    /// A duration from 5s to 10m (default 20s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::api::schema_rules::duration_within("interval", "5s", "10m"))]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub interval: Option<String>,
}

/// Default `continuous.interval`.
pub const DEFAULT_CONTINUOUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);
/// The bounds of `continuous.interval`: more often is a write per cluster every few seconds to
/// the store, less often is not continuous.
pub const CONTINUOUS_INTERVAL_RANGE: std::ops::RangeInclusive<std::time::Duration> =
    std::time::Duration::from_secs(5)..=std::time::Duration::from_secs(600);

impl Continuous {
    /// The interval, defaulted (an unreadable one is refused by admission and reported).
    pub fn interval(&self) -> std::time::Duration {
        self.interval
            .as_deref()
            .and_then(|text| crate::duration::parse(text).ok())
            .map_or(DEFAULT_CONTINUOUS_INTERVAL, |d| {
                d.clamp(
                    *CONTINUOUS_INTERVAL_RANGE.start(),
                    *CONTINUOUS_INTERVAL_RANGE.end(),
                )
            })
    }
}

/// Which scheduled and on-demand snapshots are kept: the newest `keep`, and the newest of each
/// of the last `hourly` hours, `daily` days and `weekly` weeks (UTC; weeks start on Monday). A
/// snapshot any of them keeps stays; the newest Succeeded one and one a restore or recovery
/// names always stay. Before-change snapshots are counted apart (`beforeChange.keep`).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("has(self.keep) || has(self.hourly) || has(self.daily) || has(self.weekly)").message("set keep or a tier (hourly, daily, weekly); to keep every snapshot, leave retention out"))]
pub struct Retention {
    /// Succeeded snapshots kept (1 to 10000): beyond it (and the tiers) the oldest are deleted
    /// with their objects. Failed ones beyond it are deleted too (they have no object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub keep: Option<i32>,
    /// Hours (1 to 1000) whose newest Succeeded snapshot is kept, counting the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub hourly: Option<i32>,
    /// Days (1 to 1000) whose newest Succeeded snapshot is kept, counting today.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub daily: Option<i32>,
    /// Weeks (1 to 1000) whose newest Succeeded snapshot is kept, counting this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub weekly: Option<i32>,
}

/// Failed snapshots kept when `retention.keep` does not say.
pub const DEFAULT_FAILED_KEPT: usize = 3;

/// The snapshot taken before a disruptive change (docs/day2.md, "Snapshots before changes").
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BeforeChange {
    /// A Succeeded snapshot of this cluster younger than this that holds every write up to the
    /// change's decision is used instead of a new one: a duration (default 10m, at most 64
    /// characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub max_age: Option<String>,
    /// Before-change snapshots kept (1 to 100, default 3), apart from `retention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub keep: Option<i32>,
}

/// Default `beforeChange.maxAge`.
pub const DEFAULT_BEFORE_CHANGE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);
/// Default `beforeChange.keep`.
pub const DEFAULT_BEFORE_CHANGE_KEEP: usize = 3;

impl Backup {
    /// `beforeChange.maxAge`, defaulted (one that does not parse counts as the default:
    /// admission refuses it).
    pub fn before_change_max_age(&self) -> std::time::Duration {
        self.before_change
            .as_ref()
            .and_then(|b| b.max_age.as_deref())
            .and_then(|text| crate::duration::parse(text).ok())
            .unwrap_or(DEFAULT_BEFORE_CHANGE_MAX_AGE)
    }

    /// `beforeChange.keep`, defaulted.
    pub fn before_change_keep(&self) -> usize {
        self.before_change
            .as_ref()
            .and_then(|b| b.keep)
            .and_then(|keep| usize::try_from(keep.max(1)).ok())
            .unwrap_or(DEFAULT_BEFORE_CHANGE_KEEP)
    }
}

/// Where a new cluster's data comes from.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("!has(self.to) || has(self.snapshot.name)").message("to needs snapshot.name: the EtcdadmSnapshot records the revision its deltas follow").field_path(".to"))]
pub struct Restore {
    /// The snapshot the first member is restored from.
    pub snapshot: RestoreSource,
    /// How far past the snapshot the restore goes with continuous backup's deltas (docs/day2.md,
    /// "Continuous backup"). Unset: the snapshot alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<RestorePoint>,
}

/// A point past a full snapshot, reached by replaying its deltas: set exactly one field.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("[has(self.latest), has(self.revision), has(self.time)].filter(x, x).size() == 1").message("set exactly one of latest, revision and time"))]
pub struct RestorePoint {
    /// Every write the deltas hold (must be true when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == true").message("latest: true, or leave it unset"))]
    pub latest: Option<bool>,
    /// Every write up to and including this etcd revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub revision: Option<i64>,
    /// Every write continuous backup received at or before this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

impl RestorePoint {
    /// The point as the deltas' chain plans it; `None` when not exactly one field is set.
    pub fn target(&self) -> Option<crate::backup::delta::chain::Target> {
        use crate::backup::delta::chain::Target;
        match (self.latest, self.revision, &self.time) {
            (Some(true), None, None) => Some(Target::Latest),
            (None, Some(revision), None) if revision >= 1 => Some(Target::Revision(revision)),
            (None, None, Some(time)) => Some(Target::Time(time.0.as_millisecond())),
            _ => None,
        }
    }
}

/// The deltas a restore replayed after its full snapshot.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltasRestored {
    /// The point asked for: `latest`, `revision <n>` or `time <RFC 3339>`.
    pub to: String,
    /// Delta objects read.
    pub objects: i64,
    /// Events written from them.
    pub events: i64,
    /// The revision of the source cluster the restored data reaches.
    pub revision: i64,
}

/// A snapshot to restore: an EtcdadmSnapshot by name, or an object in a store.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = Rule::new("has(self.name) != (has(self.store) && has(self.key))").message("set either name, or store and key"))]
#[x_kube(validation = Rule::new("has(self.store) == has(self.key)").message("store and key go together"))]
#[x_kube(validation = Rule::new("!has(self.sha256) || has(self.key)").message("sha256 goes with store and key (an EtcdadmSnapshot records its own)").field_path(".sha256"))]
pub struct RestoreSource {
    /// A Succeeded EtcdadmSnapshot in this namespace (at most 253 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
    /// The store holding `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<SnapshotStore>,
    /// Object key of an etcd snapshot file in `store` (at most 1024 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub key: Option<String>,
    /// SHA-256 (64 hex digits) the object must have, what `sha256sum` prints for the file.
    /// Unset: the one this controller recorded in the object's metadata when it uploaded it,
    /// else the controller computes it by reading the object once (docs/day2.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 64, max = 64), regex(pattern = "^[0-9a-fA-F]{64}$"))]
    pub sha256: Option<String>,
}

/// Where the SHA-256 a restore was checked against came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ChecksumSource {
    /// The EtcdadmSnapshot's `status.sha256`, recorded when it was taken.
    EtcdadmSnapshot,
    /// `spec.restore.snapshot.sha256`, given by the user.
    Spec,
    /// The object's `x-amz-meta-sha256`, recorded when this controller uploaded it.
    ObjectMetadata,
    /// Computed by the controller reading the object once, before the download URL was given
    /// to the first member: only a change after that read is caught.
    Computed,
}

impl ChecksumSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumSource::EtcdadmSnapshot => "EtcdadmSnapshot",
            ChecksumSource::Spec => "Spec",
            ChecksumSource::ObjectMetadata => "ObjectMetadata",
            ChecksumSource::Computed => "Computed",
        }
    }

    /// The source named by `text` (as [`ChecksumSource::as_str`] writes it).
    pub fn parse(text: &str) -> Option<Self> {
        [
            ChecksumSource::EtcdadmSnapshot,
            ChecksumSource::Spec,
            ChecksumSource::ObjectMetadata,
            ChecksumSource::Computed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// Where a restored cluster's data came from.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoredFrom {
    /// The EtcdadmSnapshot, when restored from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// `<bucket>/<key>` of the object restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The revision of the restored data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The SHA-256 the first member checked the downloaded file against before etcd started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Where that SHA-256 came from: EtcdadmSnapshot, Spec, ObjectMetadata or Computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256_source: Option<ChecksumSource>,
    /// When the first member was restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Whether the restored member's revision was raised by [`RESTORE_REVISION_BUMP`] with
    /// every older one marked compacted (the node had an etcdutl that can, etcd 3.5.10+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_bumped: Option<bool>,
    /// The `spec.rollout.after` given to the KubeadmControlPlane once the restored cluster was
    /// Ready, so its API servers restart and drop their watch caches (once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_rollout: Option<Time>,
    /// Continuous backup's deltas replayed onto the snapshot (`spec.restore.to`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltas: Option<DeltasRestored>,
}

/// How far a restore raises the revision (`etcdutl snapshot restore --bump-revision`): further
/// than any cluster writes between a snapshot and a restore (a billion revisions are eleven
/// days at a thousand writes a second, the upper end of a Kubernetes cluster's rate), the
/// margin etcd's and Kubernetes' restore documentation use; int64 leaves room for billions of
/// restores.
pub const RESTORE_REVISION_BUMP: i64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn store(prefix: Option<&str>) -> S3Store {
        S3Store {
            prefix: prefix.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn keys_join_the_prefix_with_one_slash() {
        assert_eq!(store(None).key("a/b.db"), "a/b.db");
        assert_eq!(store(Some("")).key("a.db"), "a.db");
        assert_eq!(store(Some("backups")).key("a.db"), "backups/a.db");
        assert_eq!(store(Some("backups/")).key("a.db"), "backups/a.db");
    }

    #[test]
    fn the_region_defaults_to_us_east_1() {
        assert_eq!(store(None).region(), "us-east-1");
        let eu = S3Store {
            region: Some("eu-west-1".into()),
            ..Default::default()
        };
        assert_eq!(eu.region(), "eu-west-1");
    }

    #[test]
    fn a_snapshot_without_status_is_pending() {
        let snapshot = EtcdadmSnapshot::new("s", EtcdadmSnapshotSpec::default());
        assert_eq!(snapshot.phase(), SnapshotPhase::Pending);
        assert!(!snapshot.phase().is_finished());
        assert!(SnapshotPhase::Failed.is_finished());
    }
}
