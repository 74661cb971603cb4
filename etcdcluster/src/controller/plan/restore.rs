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
use etcdadm_shared::api::snapshot::{ChecksumSource, RESTORE_REVISION_BUMP, RestoredFrom};
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
    Checksum, KcpView, Observation, RestoreDownload, RestoreView, is_ready,
};
use crate::snapshot::Checksum as ComputedChecksum;

/// Condition reasons of a restore.
pub mod reason {
    pub const RESTORE_SOURCE_UNUSABLE: &str = "RestoreSourceUnusable";
    pub const RESTORE_VERSION_MISMATCH: &str = "RestoreVersionMismatch";
    pub const RESTORE_SECRET_NOT_OURS: &str = "RestoreSecretNotOurs";
}

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
    if o.etcd_cluster.spec.restore.is_none() || !initialized || status.restored_from.is_some() {
        return None;
    }
    // The SHA-256 the member checked is the one its Secret carried.
    let checksum = restore.secret.as_ref().and_then(|s| s.checksum.clone());
    status.restored_from = Some(RestoredFrom {
        snapshot: restore.snapshot.clone(),
        location: restore.location.clone(),
        revision: restore.revision,
        time: Some(now.clone()),
        revision_bumped: Some(revision_bumped(o, restore.revision)),
        control_plane_rollout: None,
        sha256: checksum.as_ref().map(|c| c.sha256.clone()),
        sha256_source: checksum.as_ref().map(|c| c.source),
        deltas: None,
    });
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
