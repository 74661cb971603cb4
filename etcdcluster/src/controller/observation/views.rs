//! The parts of an observation: each object around the EtcdadmCluster as far as the plan needs
//! it, and what the health check learned of each etcd member. Rules cited are those of
//! docs/safety.md.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::api::cluster::{Defragmentation, RecoveryPhase};
use etcdadm_shared::api::config::DEFAULT_QUOTA_BACKEND_BYTES;
use etcdadm_shared::api::snapshot::{ChecksumSource, SnapshotPhase};
pub use etcdadm_shared::contract::ClusterRef;
pub use etcdadm_shared::contract::ca::{Ca, CaView};
pub use etcdadm_shared::contract::init_secret::InitSecret;
use etcdadm_shared::etcd::HashKv;
use etcdadm_shared::etcd::MemberStatus;
pub use etcdadm_shared::etcd::{Alarm, AlarmKind};
use etcdadm_shared::store::StoreClient;

/// The Cluster this etcd serves, as far as the plan needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterView {
    Missing,
    Found {
        /// Name, namespace and owner reference: what the contract objects are made with.
        reference: ClusterRef,
        paused: bool,
        deleting: bool,
        infrastructure_ready: bool,
        /// Failure domains the infrastructure offers, sorted.
        failure_domains: Vec<String>,
        /// The Cluster names this EtcdadmCluster in `spec.managedExternalEtcdRef` (EKS
        /// Anywhere's fork of CAPI, whose Cluster controller deletes etcd after the control
        /// plane); upstream CAPI deletes etcd Machines as workers, before the control plane.
        deletes_etcd_last: bool,
    },
}

impl ClusterView {
    /// The Cluster's name, when it exists.
    pub fn name(&self) -> Option<&str> {
        match self {
            ClusterView::Found { reference, .. } => Some(&reference.name),
            ClusterView::Missing => None,
        }
    }
}

/// One member Machine of this EtcdadmCluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineView {
    pub name: String,
    pub failure_domain: Option<String>,
    /// Address used for the member's URLs (`Machine::etcd_address`).
    pub address: Option<String>,
    pub deleting: bool,
    /// Carries our pre-terminate hook annotation.
    pub has_hook: bool,
    /// Labelled for us but controlled by nobody: adopted.
    pub orphan: bool,
    /// Carries `cluster.x-k8s.io/delete-machine`: the first scale-down victim.
    pub delete_requested: bool,
    /// Why it no longer matches the spec (a rolling replacement is due), if it does not.
    pub outdated: Option<String>,
    /// Status recorded an etcd member for it, a voter (a learner has not joined yet): it joined
    /// once.
    pub was_member: bool,
    /// How long it has been without a healthy member, by the remediation clock (time while
    /// the cluster had no quorum does not count).
    pub unhealthy_for: Duration,
    /// Time since the Machine was created.
    pub age: Duration,
    /// The remediation this Machine was created to replace (its `remediation-for` record).
    pub replaces: Option<LastRemediation>,
    /// Its EtcdadmConfig asks for a learner join (`EtcdadmConfig::joins_as_learner`): unless it
    /// is the first member, its member is pre-added as a learner and promoted by us.
    pub learner_join: bool,
    /// The backend quota its EtcdadmConfig gave etcd, when the config was read.
    pub quota_backend_bytes: Option<u64>,
    /// The infrastructure reports it lost for good (`Machine::infrastructure_failed`: phase
    /// `Failed`, or its infrastructure machine deleted).
    pub failed: bool,
    /// Time since its turn to join came (its `join-started` annotation, written just before its
    /// learner is added): its join deadline runs from then. `None` while its turn has not come,
    /// and for a Machine that joins as a voter.
    pub join_started: Option<Duration>,
    /// How long its user data waits for its member to be listed
    /// (`EtcdadmConfig::learner_listed_wait`), for a learner join.
    pub listed_wait: Option<Duration>,
    /// Its `UpToDate` condition as the Machine reports it (v1beta2 leaves it to the Machine's
    /// owner: us): `None` when it has none.
    pub up_to_date: Option<ReportedCondition>,
}

/// A condition as an object reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportedCondition {
    pub status: String,
    pub message: String,
    pub last_transition_time: String,
}

impl MachineView {
    /// How long its join has been under way, for the join deadline: since its turn came, else
    /// since it was created (a voter join starts at boot).
    pub fn join_age(&self) -> Duration {
        self.join_started.unwrap_or(self.age)
    }
}

/// One etcd member from the member list, with what the health check found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemberView {
    pub id: u64,
    /// Empty until the member's process started and published itself.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    /// Passed this round's health check: it serves (`/health` 200 + true with alarms excluded,
    /// Status answered). A member serving with an alarm raised is healthy; the alarm is in
    /// `alarms`.
    pub healthy: bool,
    /// Was healthy at some check, this one or an earlier one. A started member that never was
    /// is still catching up after its join.
    pub ever_healthy: bool,
    pub is_leader: bool,
    /// Why it is unhealthy.
    pub message: Option<String>,
    /// The Machine this member runs on (rule 5: by name and peer URL).
    pub machine: Option<String>,
    pub etcd_version: Option<String>,
    pub db_size: Option<i64>,
    /// Bytes of the database in use (the rest is free pages a defragmentation returns).
    pub db_size_in_use: Option<i64>,
    /// The backend quota it runs with: as it reports it (etcd ≥ 3.6), else as its Machine's
    /// EtcdadmConfig set it; `None` for etcd's default.
    pub quota_backend_bytes: Option<u64>,
    /// Alarms raised on it (`NOSPACE`, `CORRUPT`).
    pub alarms: Vec<String>,
    /// It answered Status this round and follows no leader: its own view shows no quorum.
    pub no_leader: bool,
    /// Its history before its current revision is compacted away (asked only while NOSPACE is
    /// raised).
    pub history_compacted: Option<bool>,
    /// The revision it was last defragmented at, as status recorded it.
    pub defragmented_at: Option<i64>,
    /// Its last defragmentation as status recorded it (sizes, and whether a NOSPACE disarm
    /// spent it).
    pub last_defragmentation: Option<Defragmentation>,
    /// The backend quota it runs with came from the member itself (Status from etcd 3.6, its
    /// `/metrics` before), not from its EtcdadmConfig.
    pub quota_reported: bool,
    /// How long it has been unhealthy, by the remediation clock.
    pub unhealthy_for: Duration,
    /// `notAfter` of the server certificate it presented in this round's handshake.
    pub certificate_expiry: Option<Timestamp>,
    /// The server certificate (DER) it presented in this round's handshake: which CA signed it
    /// tells a CA rotation where the member is.
    pub server_certificate: Option<Vec<u8>>,
    /// The revision of its own store, when it answered Status this round (no quorum needed).
    pub revision: Option<i64>,
    /// etcd's hash of its store at the revision common to the healthy members, asked only
    /// while CORRUPT is raised.
    pub hash: Option<HashKv>,
}

impl MemberView {
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    /// Added and not started yet, or started and never healthy: still catching up.
    pub fn is_joining(&self) -> bool {
        !self.is_started() || (!self.healthy && !self.ever_healthy)
    }

    /// What the member said of itself in this round's Status answer.
    pub fn read_status(&mut self, status: &MemberStatus) {
        self.etcd_version = Some(status.version.clone());
        self.db_size = i64::try_from(status.db_size).ok();
        self.db_size_in_use = i64::try_from(status.db_size_in_use).ok();
        self.revision = Some(status.revision).filter(|r| *r > 0);
        self.no_leader = status.leader_id.is_none();
        if status.db_size_quota.is_some() {
            self.quota_backend_bytes = status.db_size_quota;
            self.quota_reported = true;
        }
    }

    /// The backend quota that applies to it.
    pub fn quota(&self) -> u64 {
        self.quota_backend_bytes.unwrap_or(DEFAULT_QUOTA_BACKEND_BYTES)
    }

    /// Whether alarm `kind` is raised on it.
    pub fn has_alarm(&self, kind: AlarmKind) -> bool {
        self.alarms.iter().any(|a| a == kind.as_str())
    }

    pub fn describe(&self) -> String {
        match (&self.machine, self.is_started()) {
            (Some(machine), _) => format!("member of Machine {machine}"),
            (None, true) => format!("member {}", self.name),
            (None, false) => format!(
                "member {} ({})",
                etcdadm_shared::etcd::member_id_hex(self.id),
                self.peer_urls.join(",")
            ),
        }
    }
}

/// What one health check learned: the members, and every alarm raised in the cluster (also
/// those of members no longer listed).
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub view: EtcdView,
    pub alarms: Vec<Alarm>,
}

impl Checked {
    /// A check that learned no members, and so no alarms.
    pub fn nothing(view: EtcdView) -> Checked {
        Checked {
            view,
            alarms: Vec::new(),
        }
    }
}

/// What the health check learned about the etcd cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum EtcdView {
    /// Nothing was asked: no usable CA, or no Machine with an address.
    NotChecked,
    /// Members were probed, but none answered a member list.
    Unreachable {
        message: String,
    },
    Members(Vec<MemberView>),
}

/// What the plan and the renewal need of `<cluster>-apiserver-etcd-client`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientSecret {
    /// `notAfter` of its certificate, when it parses.
    pub expiry: Option<Timestamp>,
    /// When the controller last re-issued it (`names::APISERVER_CLIENT_RENEWED_ANNOTATION`).
    pub renewed: Option<Timestamp>,
    /// The version read: a renewal writes over exactly this one.
    pub resource_version: Option<String>,
}

/// The KubeadmControlPlane of the Cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum KcpView {
    /// The Cluster names no KubeadmControlPlane: etcd serves something else.
    None,
    /// Named by the Cluster but not found (yet).
    Missing { name: String },
    Found {
        name: String,
        /// Declares local (stacked) etcd or no `etcd.external`: never touched.
        local_etcd: bool,
        endpoints: Vec<String>,
        paused: bool,
        skip_pause: bool,
        /// `<cluster>-etcd` and `<cluster>-apiserver-etcd-client` both exist.
        secrets_present: bool,
        /// Every control plane Machine runs the current spec (`rollout_complete()`).
        rollout_complete: bool,
        /// `spec.rollout.after`: Machines created before it are replaced.
        rollout_after: Option<Timestamp>,
    },
}

/// Remediation settings after defaults and the reference annotation (see
/// [`remediation_policy`](super::clock::remediation_policy)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemediationPolicy {
    pub enabled: bool,
    pub unhealthy_after: Duration,
    /// How long a new Machine may take to become a healthy member before it is replaced (see
    /// [`join_deadline`](super::clock::join_deadline)).
    pub join_deadline: Duration,
}

impl Default for RemediationPolicy {
    fn default() -> Self {
        RemediationPolicy {
            enabled: true,
            unhealthy_after: etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER,
            join_deadline: etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER,
        }
    }
}

/// A remediation, as recorded on the EtcdadmCluster (the last one) or on the Machine created to
/// replace the remediated one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastRemediation {
    pub machine: String,
    /// How long ago it started.
    pub ago: Duration,
    /// Replacements that failed in a row before it.
    pub retries: u32,
}

/// What is known of the certificates' expiry, and the time it is judged at.
#[derive(Clone, Debug, PartialEq)]
pub struct CertificateView {
    pub now: Timestamp,
    /// `rolloutBefore.certificatesExpiryDays`, defaulted.
    pub renew_before: Duration,
    /// `notAfter` of the CA in `<cluster>-managed-etcd`.
    pub ca_expiry: Option<Timestamp>,
    /// `notAfter` of the certificate in `<cluster>-apiserver-etcd-client`.
    pub apiserver_client_expiry: Option<Timestamp>,
    /// When this controller last re-issued it (the Secret's annotation).
    pub apiserver_client_renewed: Option<Timestamp>,
    /// The version of that Secret read: a renewal writes over exactly this one.
    pub apiserver_client_version: Option<String>,
}

impl Default for CertificateView {
    fn default() -> Self {
        CertificateView {
            now: Timestamp::UNIX_EPOCH,
            renew_before: etcdadm_shared::api::EtcdadmClusterSpec::default().certificates_renew_before(),
            ca_expiry: None,
            apiserver_client_expiry: None,
            apiserver_client_renewed: None,
            apiserver_client_version: None,
        }
    }
}

/// `spec.restore` (or a recovery's restore): the snapshot the first member's data comes from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreView {
    /// The EtcdadmSnapshot named by `spec.restore.snapshot.name`.
    pub snapshot: Option<String>,
    /// `<bucket>/<key>` of the object, when known.
    pub location: Option<String>,
    /// The revision the snapshot holds, when an EtcdadmSnapshot says.
    pub revision: Option<i64>,
    /// etcd version of the member it was taken from, when an EtcdadmSnapshot says.
    pub etcd_version: Option<String>,
    /// Why it cannot be restored from (missing, not Succeeded, no store, store unusable).
    pub problem: Option<String>,
    /// Age of the restore Secret holding its download URL, when it exists.
    pub secret_age: Option<Duration>,
    /// The restore Secret, when it exists: whose it is and what it records.
    pub secret: Option<RestoreSecretView>,
    /// `status.restoredFrom` is recorded: the restore is done.
    pub recorded: bool,
    /// How to download it, when the source is usable.
    pub download: Option<RestoreDownload>,
    /// Continuous backup's deltas to replay onto it (`spec.restore.to`, or every one after a
    /// recovery's snapshot).
    pub deltas: Option<DeltasPlan>,
    /// How long ago the deltas were found unusable (the restore Secret says), on the clock.
    pub deltas_unusable_age: Option<Duration>,
}

/// The deltas a restore replays after its full snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct DeltasPlan {
    /// The full snapshot's object key, which its deltas are named after.
    pub key: String,
    /// The full snapshot's revision.
    pub base: i64,
    /// The last revision its status records as uploaded.
    pub recorded: Option<i64>,
    pub target: etcdadm_shared::backup::delta::chain::Target,
}

impl DeltasPlan {
    /// The point, as status says it: `latest`, `revision <n>` or `time <RFC 3339>`.
    pub fn to(&self) -> String {
        use etcdadm_shared::backup::delta::chain::Target;
        match self.target {
            Target::Latest => "latest".into(),
            Target::Revision(r) => format!("revision {r}"),
            Target::Time(ms) => k8s_openapi::jiff::Timestamp::from_millisecond(ms)
                .map_or_else(|_| format!("time {ms} ms"), |t| format!("time {t}")),
        }
    }
}

impl RestoreView {
    /// `EtcdadmSnapshot <name> (<bucket>/<key>)`, or the object alone.
    pub fn describe(&self) -> String {
        let location = self.location.as_deref().unwrap_or("an unknown location");
        match &self.snapshot {
            Some(name) => format!("EtcdadmSnapshot {name} ({location})"),
            None => location.to_string(),
        }
    }
}

/// The restore Secret `<etcdadmcluster>-restore` as read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreSecretView {
    /// It carries a controller reference to this EtcdadmCluster (its UID): only then is it
    /// renewed or deleted.
    pub ours: bool,
    pub uid: String,
    pub resource_version: String,
    /// The SHA-256 it carries and where that came from.
    pub checksum: Option<Checksum>,
    /// Why the deltas were found unusable, and when.
    pub deltas_unusable: Option<(String, Timestamp)>,
}

/// A SHA-256 (hex) and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checksum {
    pub sha256: String,
    pub source: ChecksumSource,
}

impl Checksum {
    /// `<sha256> (from <where>)`, for messages.
    pub fn describe(&self) -> String {
        let from = match self.source {
            ChecksumSource::EtcdadmSnapshot => "from the EtcdadmSnapshot",
            ChecksumSource::Spec => "from spec.restore.snapshot.sha256",
            ChecksumSource::ObjectMetadata => "from the object's metadata",
            ChecksumSource::Computed => "computed by reading the object",
        };
        format!("{} ({from})", self.sha256)
    }
}

/// What presigning a snapshot's download needs.
#[derive(Clone, Debug)]
pub struct RestoreDownload {
    pub store: StoreClient,
    pub key: String,
    /// The SHA-256 the source gives (an EtcdadmSnapshot's, the spec's or the object's
    /// metadata); none: the controller computes it.
    pub checksum: Option<Checksum>,
    /// The object's size, when known (what computing its SHA-256 reads).
    pub size: Option<u64>,
    pub ca_pem: Option<String>,
    /// The store is `insecure: true`: its plain http URL may be downloaded.
    pub insecure: bool,
}

impl PartialEq for RestoreDownload {
    /// The same object under the same checks (the client itself has no identity to compare).
    fn eq(&self, other: &Self) -> bool {
        (&self.key, &self.checksum, &self.size, &self.ca_pem, self.insecure)
            == (
                &other.key,
                &other.checksum,
                &other.size,
                &other.ca_pem,
                other.insecure,
            )
            && format!("{:?}", self.store) == format!("{:?}", other.store)
    }
}

/// Where a recovery's data comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RecoverySource {
    /// The surviving member with the highest revision, else the newest Succeeded snapshot.
    #[default]
    Latest,
    /// A snapshot of this member Machine's member (served from its own backend, without quorum).
    Member(String),
    /// This EtcdadmSnapshot.
    Snapshot(String),
}

impl RecoverySource {
    /// `latest`, `member/<machine>` or `snapshot/<name>`.
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        let named = |prefix: &str| {
            value
                .strip_prefix(prefix)
                .filter(|name| !name.is_empty() && !name.contains('/'))
                .map(str::to_string)
        };
        if value == "latest" {
            Ok(RecoverySource::Latest)
        } else if let Some(machine) = named("member/") {
            Ok(RecoverySource::Member(machine))
        } else if let Some(snapshot) = named("snapshot/") {
            Ok(RecoverySource::Snapshot(snapshot))
        } else {
            Err("is not a recovery source: use latest, member/<machine> or snapshot/<name>".into())
        }
    }

    /// The source as the annotation writes it.
    pub fn describe(&self) -> String {
        match self {
            RecoverySource::Latest => "latest".into(),
            RecoverySource::Member(machine) => format!("member/{machine}"),
            RecoverySource::Snapshot(name) => format!("snapshot/{name}"),
        }
    }
}

/// A snapshot a recovery would restore from (named, or the newest Succeeded one for `latest`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotCheck {
    pub name: String,
    /// Why it cannot be restored from, if it cannot.
    pub problem: Option<String>,
    /// The etcd version it was taken from, when it says.
    pub etcd_version: Option<String>,
}

/// What `status.recovery` records (its start time aside).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecoveryRecord {
    /// The annotation's value when the recovery began.
    pub requested: String,
    /// The source chosen.
    pub source: RecoverySource,
    pub phase: RecoveryPhase,
    pub snapshot: String,
    /// The highest revision a survivor reported when it began.
    pub survivor_revision: Option<i64>,
}

/// The recovery in `status.recovery`, and what its snapshot is now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnderWay {
    pub record: RecoveryRecord,
    /// The phase of its EtcdadmSnapshot; `None` while it does not exist.
    pub snapshot_phase: Option<SnapshotPhase>,
    /// Why it failed, when it did.
    pub snapshot_failure: Option<String>,
}

/// A recovery request or a recovery under way, as far as the plan needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecoveryView {
    /// The annotation's value, while it is set.
    pub requested: Option<String>,
    /// `spec.backup.store` is set: a survivor's snapshot has somewhere to go.
    pub store_configured: bool,
    /// For `snapshot/<name>`, that snapshot; for `latest`, the newest Succeeded one of this
    /// cluster, if any.
    pub snapshot: Option<SnapshotCheck>,
    /// `status.recovery`, when a recovery is under way.
    pub under_way: Option<UnderWay>,
    /// `spec.recovery.automatic`, when set.
    pub automatic: Option<Automatic>,
}

/// An automatic recovery's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Automatic {
    /// `spec.recovery.after`.
    pub after: Duration,
    /// How long no voting member has served clients (`EndpointsAvailable` False).
    pub unserved_for: Duration,
}

impl RecoveryView {
    /// The request in force: the annotation's, else `latest` once an automatic recovery is due.
    pub fn request(&self) -> Option<&str> {
        self.requested.as_deref().or_else(|| {
            self.automatic
                .filter(|a| a.unserved_for >= a.after)
                .map(|_| "latest")
        })
    }
}
