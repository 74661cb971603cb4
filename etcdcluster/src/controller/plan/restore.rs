//! Restore (docs/day2.md, "Snapshots and restore"): a cluster created with `spec.restore` (or
//! a recovery's new cluster) gets its first member's data from the snapshot, and only while no
//! member ever existed. The download URL and the SHA-256 the member checks the file against are
//! written to a Secret before the first Machine (which names it), kept fresh until the Machine
//! exists, and deleted once the first member is healthy and `status.restoredFrom` is recorded.
//! The Secret is created, never taken over: one this EtcdadmCluster does not own (by UID) is
//! refused, neither renewed nor deleted.
//!
//! Revisions after a restore (docs/day2.md, "Revisions after a restore"): the Secret asks the
//! node to raise the restored revision by [`RESTORE_REVISION_BUMP`] and mark the older ones
//! compacted; the restored member's revision tells whether it could, which status and the
//! `RevisionsBumped` condition say. Once the restored cluster is Ready, the KubeadmControlPlane
//! is asked once to replace the Machines started before the restore, so its API servers drop
//! their watch caches.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tracing::debug;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::condition::REVISIONS_BUMPED;
use etcdadm_shared::api::conditions::{NewCondition, Severity};
use etcdadm_shared::api::snapshot::{ChecksumSource, DeltasRestored, RESTORE_REVISION_BUMP, RestoredFrom};
use etcdadm_shared::contract::{bytes, controller_reference};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::validation::major_minor;

pub mod view;

use self::view::RestoreFrom;
use super::machines::{self, Growth, MachineStep};
use super::placement;
use crate::controller::decision::reason::RESTORING;
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, Hold, Outputs, StatusPart,
};
use crate::controller::observation::{
    Checksum, DeltasPlan, KcpView, Observation, RestoreDownload, RestoreView, is_ready, member_client_url,
};
use crate::snapshot::Checksum as ComputedChecksum;
use crate::snapshot::{Replay, ReplayJob};

/// Condition reasons of a restore.
pub mod reason {
    pub const RESTORE_SOURCE_UNUSABLE: &str = "RestoreSourceUnusable";
    pub const RESTORE_VERSION_MISMATCH: &str = "RestoreVersionMismatch";
    pub const RESTORE_SECRET_NOT_OURS: &str = "RestoreSecretNotOurs";
    pub const RESTORE_DELTAS_UNUSABLE: &str = "RestoreDeltasUnusable";
}

/// How long deltas found unusable (a gap, a damaged object) stop a restore before they are read
/// again: a store repaired meanwhile is picked up, one that is not is not read at every turn.
pub const DELTAS_RECHECK_AFTER: Duration = Duration::from_secs(120);

/// How long the presigned download URL is valid. The URL ends up in the first Machine's
/// bootstrap data Secret too, kept as long as the Machine: past this it grants nothing. A boot
/// needs seconds after its infrastructure is up (BENCHMARKS.md, "Restore download"); this
/// leaves a virtual machine's provisioning the rest. A Machine that downloads later is refused
/// by the store and never starts etcd (docs/day2.md).
pub const RESTORE_URL_TTL: Duration = Duration::from_secs(20 * 60);

/// While no Machine exists, a URL older than this is renewed before the Machine is created, so
/// a boot always gets at least three quarters of [`RESTORE_URL_TTL`].
pub const RESTORE_URL_RENEW_AFTER: Duration = Duration::from_secs(5 * 60);

/// The field manager of the restore Secret's writes.
const RESTORE_MANAGER: &str = "etcdadm-controller/restore";
/// The apply site of the control plane rollout after a restore.
const ROLLOUT_MANAGER: &str = "etcdadm-controller/restore-rollout";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreStep {
    /// Write the restore Secret: a fresh download URL of the snapshot and its SHA-256. Created
    /// when `existing` is None; else our own Secret of that resourceVersion is renewed.
    WriteRestoreSecret {
        download: Box<RestoreDownload>,
        checksum: ChecksumPlan,
        existing: Option<String>,
    },
    /// The restored first member (`member`, at `url`) is healthy: continuous backup's deltas
    /// are replayed onto it, checked whole first, before any other member joins.
    ReplayDeltas { member: String, url: String },
    /// The restored first member is healthy: its download URL is not kept. Deleted only if it
    /// is still the Secret of this UID (the one found to be ours).
    DeleteRestoreSecret { uid: String },
    /// The restored cluster is Ready: ask KubeadmControlPlane `kcp` to replace its Machines
    /// started before `after` (the restore, or the recovery's start), once.
    RollControlPlane { kcp: String, after: Timestamp },
}

/// The SHA-256 the first member checks its download against.
#[derive(Clone, Debug, PartialEq)]
pub enum ChecksumPlan {
    /// Given by the source (or computed before and kept).
    Known(Checksum),
    /// Nobody recorded one: read the object (`size` bytes) once and compute it.
    Compute { size: u64 },
}

impl ConcernStep for RestoreStep {
    type View = RestoreFrom;
    type Metrics = ();

    /// The control plane rollout a step asks for in the record it follows, `status.restoredFrom`
    /// with its Event once the restored member is healthy, and `RevisionsBumped`.
    fn status(part: &mut StatusPart<'_>, step: Option<&Self>) {
        if let Some(RestoreStep::RollControlPlane { after, .. }) = step {
            record_rollout(part.status, after);
        }
        let initialized = part.status.initialized;
        if let Some(note) = record_status(part.status, part.o, initialized, part.now) {
            part.event(note);
        }
        if let Some(revisions) = revisions_condition(part.status) {
            part.set_condition(revisions);
        }
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            RestoreStep::WriteRestoreSecret {
                checksum: ChecksumPlan::Compute { .. },
                ..
            } => (
                RESTORING,
                "computing the snapshot's SHA-256 in a snapshot slot (no source records one), \
                 then writing its download URL for the first member"
                    .into(),
            ),
            RestoreStep::WriteRestoreSecret { .. } => (
                RESTORING,
                "writing the snapshot's download URL for the first member".into(),
            ),
            RestoreStep::ReplayDeltas { member, .. } => (
                RESTORING,
                format!(
                    "replaying continuous backup's deltas onto the restored member {member} (every one read and \
                     checked before the first is written); no other member joins until they are"
                ),
            ),
            RestoreStep::DeleteRestoreSecret { .. } => (
                RESTORING,
                "the restored member is healthy: deleting the snapshot's download URL".into(),
            ),
            RestoreStep::RollControlPlane { kcp, .. } => (
                RESTORING,
                format!("asking KubeadmControlPlane {kcp} to restart its API servers on the restored etcd"),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, o: &Observation) -> Option<EventNote> {
        let secret = names::restore_secret_name(&o.name);
        Some(match self {
            RestoreStep::WriteRestoreSecret { checksum, .. } => EventNote::normal(
                "RestoreSecretWritten",
                format!(
                    "wrote Secret {secret} with a download URL of {} for the first member, valid \
                     {}; the member checks the file's SHA-256 {} before etcd starts",
                    o.view::<RestoreFrom>()
                        .view
                        .clone()
                        .unwrap_or_default()
                        .describe(),
                    etcdadm_shared::duration::format(RESTORE_URL_TTL),
                    match checksum {
                        ChecksumPlan::Known(known) => known.describe(),
                        ChecksumPlan::Compute { .. } => "(computed by reading the object)".into(),
                    }
                ),
            ),
            RestoreStep::ReplayDeltas { member, .. } => {
                let from = o.view::<RestoreFrom>();
                let restore = from.view.clone().unwrap_or_default();
                let to = restore.deltas.as_ref().map(DeltasPlan::to).unwrap_or_default();
                EventNote::normal(
                    "Restored",
                    format!(
                        "member {member} is healthy on the data of {}, with continuous backup's deltas replayed \
                         after it to {to} (status says how many)",
                        restore.describe()
                    ),
                )
            }
            RestoreStep::DeleteRestoreSecret { .. } => EventNote::normal(
                "RestoreSecretDeleted",
                format!(
                    "the restored first member is healthy: deleted Secret {secret} and the download URL in it"
                ),
            ),
            RestoreStep::RollControlPlane { kcp, after } => EventNote::normal(
                "ControlPlaneRolloutRequested",
                format!(
                    "asked KubeadmControlPlane {kcp} to replace its Machines started before {after}: its API servers \
                     drop the watch caches they held of the etcd before the restore"
                ),
            ),
        })
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            RestoreStep::WriteRestoreSecret {
                download,
                checksum,
                existing,
            } => write_secret(out, o, download, checksum, existing.as_deref()).await,
            RestoreStep::ReplayDeltas { url, .. } => replay_deltas(out, o, url).await,
            RestoreStep::DeleteRestoreSecret { uid } => delete_secret(out, o, uid).await,
            RestoreStep::RollControlPlane { kcp, after } => {
                super::control_plane::request_rollout(out, o, kcp, after, ROLLOUT_MANAGER).await
            }
        }
    }

    /// What comes after: the next step may follow at once.
    fn after(&self, _: &Observation) -> After {
        match self {
            RestoreStep::WriteRestoreSecret { .. }
            | RestoreStep::ReplayDeltas { .. }
            | RestoreStep::DeleteRestoreSecret { .. }
            | RestoreStep::RollControlPlane { .. } => After::Again,
        }
    }
}

// Decisions.

/// The restore Secret's next step, if the restore has one: deleted once the first member is
/// healthy; otherwise, while nothing was created yet, the source checked and the URL kept fresh.
/// A Secret of that name that is not ours is never touched.
pub fn secret(o: &Observation) -> Option<Decision<RestoreStep>> {
    let from = o.view::<RestoreFrom>();
    let restore = from.view.as_ref()?;
    if o.initialized_now() {
        if let Some(replay) = deltas(o, restore) {
            return Some(replay);
        }
        // Status (written before every step) records `restoredFrom` first.
        return restore
            .secret
            .as_ref()
            .filter(|s| s.ours)
            .map(|s| Decision::Do(RestoreStep::DeleteRestoreSecret { uid: s.uid.clone() }));
    }
    let restore = &creating(o)?;
    if restore.secret.as_ref().is_some_and(|s| !s.ours) {
        return Some(Decision::Hold(Hold::refuse(
            reason::RESTORE_SECRET_NOT_OURS,
            format!(
                "Secret {} exists and is not owned by this EtcdadmCluster (no controller \
                 reference with its UID): it is neither used nor replaced; delete it; no member \
                 Machine is created until then",
                names::restore_secret_name(&o.name)
            ),
        )));
    }
    if let Some(problem) = &restore.problem {
        return Some(Decision::Hold(Hold::refuse(
            reason::RESTORE_SOURCE_UNUSABLE,
            format!(
                "spec.restore.snapshot: {problem}; no member Machine is created until it can be restored from"
            ),
        )));
    }
    if let Some(refusal) = version_refusal(o, restore) {
        return Some(Decision::Hold(refusal));
    }
    if restore.secret_age.is_none_or(|age| age > RESTORE_URL_RENEW_AFTER) {
        let Some(download) = restore.download.clone() else {
            return Some(Decision::Hold(Hold::refuse(
                reason::RESTORE_SOURCE_UNUSABLE,
                "spec.restore.snapshot: no download of the snapshot is known; no member Machine is created",
            )));
        };
        let checksum = match (&download.checksum, download.size) {
            (Some(known), _) => ChecksumPlan::Known(known.clone()),
            (None, Some(size)) => ChecksumPlan::Compute { size },
            (None, None) => {
                return Some(Decision::Hold(Hold::refuse(
                    reason::RESTORE_SOURCE_UNUSABLE,
                    "spec.restore.snapshot: neither the snapshot's SHA-256 nor its size is known; \
                     no member Machine is created",
                )));
            }
        };
        return Some(Decision::Do(RestoreStep::WriteRestoreSecret {
            download: Box::new(download),
            checksum,
            existing: restore.secret.as_ref().map(|s| s.resource_version.clone()),
        }));
    }
    None
}

/// Continuous backup's deltas, while a restore that wants them has not recorded them replayed:
/// replayed onto the restored member once it answers, through the store the snapshot came from.
fn deltas(o: &Observation, restore: &RestoreView) -> Option<Decision<RestoreStep>> {
    if restore.deltas.is_none() || deltas_recorded(o) {
        return None;
    }
    if let Some(problem) = &restore.problem {
        return Some(Decision::Hold(Hold::refuse(
            reason::RESTORE_SOURCE_UNUSABLE,
            format!(
                "the deltas after {}: {problem}; no other member joins until they are replayed",
                restore.describe()
            ),
        )));
    }
    if let Some((why, _)) = restore
        .secret
        .as_ref()
        .and_then(|s| s.deltas_unusable.as_ref())
        .filter(|_| {
            restore
                .deltas_unusable_age
                .is_some_and(|age| age < DELTAS_RECHECK_AFTER)
        })
    {
        return Some(Decision::Hold(Hold::refuse(
            reason::RESTORE_DELTAS_UNUSABLE,
            format!(
                "{why}; nothing of them was written: the first member holds the snapshot alone, no other \
                 member joins and the cluster is not Ready until the chain is whole (read again every {})",
                etcdadm_shared::duration::format(DELTAS_RECHECK_AFTER)
            ),
        )));
    }
    let restored = o
        .members()
        .iter()
        .find(|m| m.healthy)
        .and_then(|m| Some((m, member_client_url(o, m)?)));
    Some(match restored {
        Some((member, url)) => Decision::Do(RestoreStep::ReplayDeltas {
            member: member.name.clone(),
            url,
        }),
        None => Decision::Hold(Hold::wait(
            RESTORING,
            "waiting for the restored member to answer before its deltas are replayed",
        )),
    })
}

/// A restore's deltas are still to be replayed: the cluster does not hold the data asked for
/// yet, so it is not Ready (nor handed to the control plane), whatever its members say.
pub fn deltas_pending(o: &Observation) -> bool {
    o.view::<RestoreFrom>()
        .view
        .as_ref()
        .is_some_and(|r| r.deltas.is_some())
        && !deltas_recorded(o)
}

/// Whether the deltas a restore or recovery wants are recorded as replayed.
fn deltas_recorded(o: &Observation) -> bool {
    let Some(status) = o.etcd_cluster.status.as_ref() else {
        return false;
    };
    match &status.recovery {
        Some(recovery) => recovery.deltas.is_some(),
        None => status.restored_from.as_ref().is_some_and(|r| r.deltas.is_some()),
    }
}

/// The first member, restored from the snapshot, once its fresh download URL is written.
pub fn first_member(o: &Observation) -> Option<Decision<MachineStep>> {
    if o.initialized_now() || secret(o).is_some() {
        return None;
    }
    creating(o)?;
    Some(match placement::allowed_domains(o) {
        Ok(allowed) => machines::create_machine(o, &allowed, Growth::Restore),
        Err(refusal) => Decision::Hold(refusal),
    })
}

/// The restore, while its first Machine is still to be made (nothing initialized, nothing
/// recorded, no Machine yet).
fn creating(o: &Observation) -> Option<RestoreView> {
    let restore = o.view::<RestoreFrom>().into_owned().view?;
    // Once the first Machine is on its way, its join is waited for like any first member's.
    (!o.initialized_now() && !restore.recorded && o.machines.is_empty()).then_some(restore)
}

/// Once a restore or recovery is done and the cluster Ready with the control plane handed its
/// endpoints: the KubeadmControlPlane's Machines started before it are replaced, once (its
/// `spec.rollout.after` is then that time). Only for restores this version recorded (they say
/// whether revisions were bumped), never for one the control plane has already rolled for.
pub fn control_plane_rollout(o: &Observation) -> Option<Decision<RestoreStep>> {
    let KcpView::Found {
        name,
        local_etcd: false,
        secrets_present: true,
        rollout_after,
        ..
    } = &o.kcp
    else {
        return None;
    };
    if !is_ready(o) {
        return None;
    }
    let status = o.etcd_cluster.status.as_ref()?;
    let restored = status
        .restored_from
        .as_ref()
        .filter(|r| r.revision_bumped.is_some() && r.control_plane_rollout.is_none())
        .and_then(|r| r.time.as_ref());
    let recovered = status
        .last_recovery
        .as_ref()
        .filter(|r| r.revision_bumped.is_some() && r.control_plane_rollout.is_none())
        .and_then(|r| r.started.as_ref());
    let after = restored.or(recovered)?.0;
    rollout_after.is_none_or(|current| current < after).then(|| {
        Decision::Do(RestoreStep::RollControlPlane {
            kcp: name.clone(),
            after,
        })
    })
}

/// Whether the restored cluster's revision now is above `restored` by the bump: the node could
/// raise it.
pub fn revision_bumped(o: &Observation, restored: Option<i64>) -> bool {
    o.revision()
        .is_some_and(|now| now >= restored.unwrap_or(0).saturating_add(RESTORE_REVISION_BUMP))
}

/// `RevisionsBumped`, once a restore or recovery recorded whether its revision was raised.
pub fn revisions_condition(status: &EtcdadmClusterStatus) -> Option<NewCondition> {
    let restore = status
        .restored_from
        .as_ref()
        .and_then(|r| r.revision_bumped.map(|b| (b, r.revision)));
    let recovery = status
        .last_recovery
        .as_ref()
        .and_then(|r| r.revision_bumped.map(|b| (b, r.revision)));
    let (bumped, revision) = recovery.or(restore)?;
    let at = revision.map(|r| format!(" at revision {r}")).unwrap_or_default();
    Some(if bumped {
        NewCondition::true_(REVISIONS_BUMPED, "RevisionsBumped").with_message(format!(
            "restored{at}, raised by {RESTORE_REVISION_BUMP} with every older revision compacted: watches from \
             the old cluster's resourceVersions are told to relist"
        ))
    } else {
        NewCondition::false_(
            REVISIONS_BUMPED,
            Severity::Warning,
            "RevisionsNotBumped",
            format!(
                "restored{at} without raising the revision: the node had no etcdutl that can --bump-revision \
                 (etcd 3.5.10 or later); the control plane's API servers are restarted, but clients holding \
                 resourceVersions newer than the snapshot may miss changes until they relist"
            ),
        )
    })
}

/// A snapshot restores into the etcd minor version it was taken from.
fn version_refusal(o: &Observation, restore: &RestoreView) -> Option<Hold> {
    let mismatch = minor_mismatch(o, restore.etcd_version.as_deref())?;
    Some(Hold::refuse(
        reason::RESTORE_VERSION_MISMATCH,
        format!(
            "spec.restore.snapshot: {} {mismatch}; no member Machine is created until they match",
            restore.snapshot.as_deref().map_or_else(
                || "the snapshot".to_string(),
                |name| format!("EtcdadmSnapshot {name}")
            )
        ),
    ))
}

/// Why a snapshot taken from etcd `taken` cannot be restored into the spec's version, when its
/// minor version differs (unknown versions are not judged).
pub fn minor_mismatch(o: &Observation, taken: Option<&str>) -> Option<String> {
    let (field, wanted) = o.spec_version.as_ref()?;
    let taken = taken?;
    let (Some(wanted_mm), Some(taken_mm)) = (major_minor(wanted), major_minor(taken)) else {
        return None;
    };
    (wanted_mm != taken_mm).then(|| {
        format!(
            "was taken from etcd {taken}, and {field} is {wanted}: a restore needs the same minor version"
        )
    })
}

// Status.

/// `status.restoredFrom`, once the restored first member is healthy (`initialized`): the
/// snapshot, its location and revision, and the Event that says so. A cluster with no
/// `spec.restore` (a recovery's restore) records its own in `status.lastRecovery`.
pub fn record_status(
    status: &mut EtcdadmClusterStatus,
    o: &Observation,
    initialized: bool,
    now: &Time,
) -> Option<EventNote> {
    let from = o.view::<RestoreFrom>();
    let restore = from.view.as_ref()?;
    // With deltas to replay, the replay records it (`replay_deltas`).
    if o.etcd_cluster.spec.restore.is_none()
        || !initialized
        || status.restored_from.is_some()
        || restore.deltas.is_some()
    {
        return None;
    }
    status.restored_from = Some(restored_from(o, restore, now));
    let revision = restore
        .revision
        .map(|r| format!(" at revision {r}"))
        .unwrap_or_default();
    Some(EventNote::normal(
        "Restored",
        format!(
            "the first member is healthy on the data of {}{revision}",
            restore.describe()
        ),
    ))
}

/// The record of a restore done: the snapshot, its location and revision, the SHA-256 the
/// member checked (the one its Secret carried), and whether the revision was raised.
fn restored_from(o: &Observation, restore: &RestoreView, now: &Time) -> RestoredFrom {
    let checksum = restore.secret.as_ref().and_then(|s| s.checksum.clone());
    RestoredFrom {
        snapshot: restore.snapshot.clone(),
        location: restore.location.clone(),
        revision: restore.revision,
        time: Some(now.clone()),
        revision_bumped: Some(revision_bumped(o, restore.revision)),
        control_plane_rollout: None,
        sha256: checksum.as_ref().map(|c| c.sha256.clone()),
        sha256_source: checksum.as_ref().map(|c| c.source),
        deltas: None,
    }
}

/// The control plane rollout the step asks for, in the record of the restore or recovery it
/// follows (written before the step).
pub fn record_rollout(status: &mut EtcdadmClusterStatus, after: &Timestamp) {
    let owed = |time: Option<&Time>| time.is_some_and(|t| t.0 == *after);
    if let Some(r) = status
        .restored_from
        .as_mut()
        .filter(|r| r.control_plane_rollout.is_none() && owed(r.time.as_ref()))
    {
        r.control_plane_rollout = Some(Time(*after));
    } else if let Some(r) = status
        .last_recovery
        .as_mut()
        .filter(|r| r.control_plane_rollout.is_none() && owed(r.started.as_ref()))
    {
        r.control_plane_rollout = Some(Time(*after));
    }
}

// Effects.

/// The SHA-256 the restore Secret carries: the one known, or the one computed in a snapshot
/// slot on a task of its own, never in this reconcile's turn (`None` until it is there: asked
/// again).
fn checksum_to_write(
    out: &Outputs<'_>,
    o: &Observation,
    download: &RestoreDownload,
    checksum: &ChecksumPlan,
) -> Result<Option<Checksum>, Error> {
    let size = match checksum {
        ChecksumPlan::Known(known) => return Ok(Some(known.clone())),
        ChecksumPlan::Compute { size } => *size,
    };
    match out
        .checksums
        .ask(&o.namespace, &o.cache_key(), &download.store, &download.key, size)
    {
        ComputedChecksum::Ready(sha256) => Ok(Some(Checksum {
            sha256,
            source: ChecksumSource::Computed,
        })),
        ComputedChecksum::Computing => Ok(None),
        ComputedChecksum::WaitingForSlot(why) => {
            debug!(%why, "the restore checksum waits for a snapshot slot");
            Ok(None)
        }
        ComputedChecksum::Failed(e) => Err(e.into()),
    }
}

/// Compute the SHA-256 if asked, presign a GET of the snapshot and create
/// `<etcdadmcluster>-restore` with both, or renew our own (only at the resourceVersion seen).
/// The URL is never logged.
async fn write_secret(
    out: &Outputs<'_>,
    o: &Observation,
    download: &RestoreDownload,
    checksum: &ChecksumPlan,
    existing: Option<&str>,
) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    let Some(checksum) = checksum_to_write(out, o, download, checksum)? else {
        return Ok(Applied::NotYet);
    };
    let url = download.store.presigned_get(&download.key, RESTORE_URL_TTL);
    let mut data = BTreeMap::from([
        (names::RESTORE_URL_KEY.to_string(), bytes(url.as_str())),
        (names::RESTORE_SHA256_KEY.to_string(), bytes(&checksum.sha256)),
        (
            names::RESTORE_BUMP_REVISION_KEY.to_string(),
            bytes(&RESTORE_REVISION_BUMP.to_string()),
        ),
    ]);
    if let Some(ca_pem) = &download.ca_pem {
        data.insert(names::RESTORE_CA_KEY.to_string(), bytes(ca_pem));
    }
    if download.insecure {
        data.insert(names::RESTORE_INSECURE_KEY.to_string(), bytes("true"));
    }
    // The node downloads no more than this, within a deadline from it.
    if let Some(size) = download.size {
        data.insert(names::RESTORE_SIZE_KEY.to_string(), bytes(&size.to_string()));
    }
    let name = names::restore_secret_name(&etcd.name_any());
    let mut metadata = json!({
        "name": name,
        "namespace": o.namespace,
        "labels": { names::ETCD_CLUSTER_LABEL: etcd.name_any() },
        "annotations": {
            names::RESTORE_URL_WRITTEN_ANNOTATION: Timestamp::now().to_string(),
            names::RESTORE_SHA256_SOURCE_ANNOTATION: checksum.source.as_str(),
        },
        "ownerReferences": [controller_reference(etcd)?],
    });
    let secrets = Api::<Secret>::namespaced(out.client.clone(), &o.namespace);
    match existing {
        None => {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": metadata, "type": "Opaque", "data": data,
            }))?;
            let params = PostParams {
                field_manager: Some(RESTORE_MANAGER.into()),
                ..Default::default()
            };
            match secrets.create(&params, &secret).await {
                Ok(_) => Ok(Applied::Done),
                // Made meanwhile: the next observation says whose it is.
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Applied::AlreadyDone),
                Err(e) => Err(e.into()),
            }
        }
        Some(resource_version) => {
            metadata["resourceVersion"] = json!(resource_version);
            let patch = json!({ "metadata": metadata, "data": data });
            let params = PatchParams {
                field_manager: Some(RESTORE_MANAGER.into()),
                ..Default::default()
            };
            secrets.patch(&name, &params, &Patch::Merge(&patch)).await?;
            Ok(Applied::Done)
        }
    }
}

/// Replay the deltas onto the restored member at `url` in a snapshot slot (asked again until
/// done), then record them: in `status.recovery` during a recovery (its record at the end
/// copies them), else with `status.restoredFrom`. A chain that cannot be restored fails the
/// step with its reason and nothing recorded, so no other member joins.
async fn replay_deltas(out: &Outputs<'_>, o: &Observation, url: &str) -> Result<Applied, Error> {
    let from = o.view::<RestoreFrom>();
    let (Some(restore), Some(plan)) = (
        from.view.as_ref(),
        from.view.as_ref().and_then(|r| r.deltas.as_ref()),
    ) else {
        return Err(Error::Internal(
            "deltas to replay, and no restore that wants them".into(),
        ));
    };
    let Some(download) = &restore.download else {
        return Err(Error::Deltas(format!(
            "the deltas after {}: no client of its store; nothing of them was written",
            restore.describe()
        )));
    };
    let member =
        out.etcd_clients
            .client(&o.cache_key(), url, o.etcd_cluster.spec.health_settings().timeout)?;
    let job = ReplayJob {
        store: &download.store,
        key: &plan.key,
        base: plan.base,
        recorded: plan.recorded,
        target: plan.target,
        member,
    };
    match out.replays.ask(&o.namespace, &o.cache_key(), job) {
        Replay::Done { verified, replayed } => {
            let deltas = DeltasRestored {
                to: plan.to(),
                objects: i64::try_from(verified.chain.deltas.len()).unwrap_or(i64::MAX),
                events: i64::try_from(replayed.events).unwrap_or(i64::MAX),
                revision: verified.revision,
            };
            let record = restored_from(o, restore, &Time(Timestamp::now()));
            Ok(Applied::Recorded(Box::new(move |status| {
                match status.recovery.as_mut() {
                    Some(recovery) => recovery.deltas = Some(deltas),
                    None => {
                        status.restored_from = Some(RestoredFrom {
                            deltas: Some(deltas),
                            ..record
                        })
                    }
                }
            })))
        }
        Replay::Working => Ok(Applied::NotYet),
        Replay::WaitingForSlot(why) => {
            debug!(%why, "the deltas' replay waits for a snapshot slot");
            Ok(Applied::NotYet)
        }
        Replay::Failed {
            error,
            transient: true,
        } => Err(Error::Deltas(format!(
            "continuous backup's deltas after {} were not replayed to {}: {error}; asked again shortly \
             (a replay writes the same keys again)",
            restore.describe(),
            plan.to(),
        ))),
        Replay::Failed { error, .. } => {
            let why = format!(
                "continuous backup's deltas after {} cannot be restored to {}: {error}",
                restore.describe(),
                plan.to()
            );
            mark_deltas_unusable(out, o, restore, &why).await
        }
    }
}

/// Say on our restore Secret why the deltas cannot be restored, and when: the plan holds the
/// restore saying so (a Warning Event, `Ready`) until they are read again.
async fn mark_deltas_unusable(
    out: &Outputs<'_>,
    o: &Observation,
    restore: &RestoreView,
    why: &str,
) -> Result<Applied, Error> {
    let Some(secret) = restore.secret.as_ref().filter(|s| s.ours) else {
        return Err(Error::Deltas(format!(
            "{why}; the restore Secret to record it on is gone"
        )));
    };
    // A store's answer can be long: the annotation keeps its first KiB.
    let why: String = why.chars().take(1024).collect();
    let patch = json!({"metadata": {
        "uid": secret.uid,
        "annotations": {
            names::RESTORE_DELTAS_UNUSABLE_ANNOTATION: why,
            names::RESTORE_DELTAS_CHECKED_ANNOTATION: Timestamp::now().to_string(),
        },
    }});
    let params = PatchParams {
        field_manager: Some(RESTORE_MANAGER.into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .patch(
            &names::restore_secret_name(&o.name),
            &params,
            &Patch::Merge(&patch),
        )
        .await?;
    // No Event of the step's: the refusal that follows says it.
    Ok(Applied::AlreadyDone)
}

/// Delete the restore Secret if it is still the one of `uid` (ours, as observed).
async fn delete_secret(out: &Outputs<'_>, o: &Observation, uid: &str) -> Result<Applied, Error> {
    let name = names::restore_secret_name(&o.name);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .delete(&name, &params)
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Applied::AlreadyDone),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
