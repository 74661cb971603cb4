//! Restore (docs/day2.md, "Snapshots and restore"): a cluster created with `spec.restore` (or
//! a recovery's new cluster) gets its first member's data from the snapshot, and only while no
//! member ever existed. The download URL is written to a Secret before the first Machine (which
//! names it), kept fresh until the Machine exists, and deleted once the first member is healthy
//! and `status.restoredFrom` is recorded.
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
use kube::api::{Api, DeleteParams, Patch};
use serde_json::json;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::capi::KubeadmControlPlane;
use etcdadm_shared::api::cluster::condition::REVISIONS_BUMPED;
use etcdadm_shared::api::conditions::{NewCondition, Severity};
use etcdadm_shared::api::snapshot::{RESTORE_REVISION_BUMP, RestoredFrom};
use etcdadm_shared::contract::{bytes, controller_reference};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::ssa;
use etcdadm_shared::validation::major_minor;

use super::machines::{self, Growth, MachineStep};
use super::placement;
use crate::controller::decision::reason::RESTORING;
use crate::controller::decision::{After, Applied, ConcernStep, Decision, EventNote, Hold, Outputs};
use crate::controller::observation::{KcpView, Observation, RestoreDownload, RestoreView, is_ready};

/// Condition reasons of a restore.
pub mod reason {
    pub const RESTORE_SOURCE_UNUSABLE: &str = "RestoreSourceUnusable";
    pub const RESTORE_VERSION_MISMATCH: &str = "RestoreVersionMismatch";
}

/// How long the presigned download URL is valid: the first Machine has this long from the
/// Secret's write to its download (its user data is rendered with the URL at once).
pub const RESTORE_URL_TTL: Duration = Duration::from_secs(3600);

/// The apply site of the restore Secret.
const RESTORE_MANAGER: &str = "etcdadm-controller/restore";
/// The apply site of the control plane rollout after a restore.
const ROLLOUT_MANAGER: &str = "etcdadm-controller/restore-rollout";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreStep {
    /// Write the restore Secret: a fresh download URL of the snapshot.
    WriteRestoreSecret { download: RestoreDownload },
    /// The restored first member is healthy: its download URL is not kept.
    DeleteRestoreSecret,
    /// The restored cluster is Ready: ask KubeadmControlPlane `kcp` to replace its Machines
    /// started before `after` (the restore, or the recovery's start), once.
    RollControlPlane { kcp: String, after: Timestamp },
}

impl ConcernStep for RestoreStep {
    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            RestoreStep::WriteRestoreSecret { .. } => (
                RESTORING,
                "writing the snapshot's download URL for the first member".into(),
            ),
            RestoreStep::DeleteRestoreSecret => (
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
            RestoreStep::WriteRestoreSecret { .. } => EventNote::normal(
                "RestoreSecretWritten",
                format!(
                    "wrote Secret {secret} with a download URL of {} for the first member",
                    o.restore.clone().unwrap_or_default().describe()
                ),
            ),
            RestoreStep::DeleteRestoreSecret => EventNote::normal(
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
            RestoreStep::WriteRestoreSecret { download } => write_secret(out, o, download).await,
            RestoreStep::DeleteRestoreSecret => delete_secret(out, o).await,
            RestoreStep::RollControlPlane { kcp, after } => {
                // Forced, as for a certificate renewal's rollout: whatever is there is earlier.
                let spec = json!({ "spec": { "rollout": { "after": after.to_string() } } });
                let body = ssa::configuration::<KubeadmControlPlane>(kcp, json!({}), spec);
                Api::<KubeadmControlPlane>::namespaced(out.client.clone(), &o.namespace)
                    .patch(kcp, &ssa::params(ROLLOUT_MANAGER, true), &Patch::Apply(body))
                    .await?;
                Ok(Applied::Done)
            }
        }
    }

    /// What comes after: the next step may follow at once.
    fn after(&self, _: &Observation) -> After {
        match self {
            RestoreStep::WriteRestoreSecret { .. }
            | RestoreStep::DeleteRestoreSecret
            | RestoreStep::RollControlPlane { .. } => After::Again,
        }
    }
}

// Decisions.

/// The restore Secret's next step, if the restore has one: deleted once the first member is
/// healthy; otherwise, while nothing was created yet, the source checked and the URL kept fresh.
pub fn secret(o: &Observation) -> Option<Decision<RestoreStep>> {
    let restore = o.restore.as_ref()?;
    if o.initialized_now() {
        // Status (written before every step) records `restoredFrom` first.
        return restore
            .secret_age
            .is_some()
            .then_some(Decision::Do(RestoreStep::DeleteRestoreSecret));
    }
    let restore = creating(o)?;
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
    if restore.secret_age.is_none_or(|age| age > RESTORE_URL_TTL / 2) {
        let Some(download) = restore.download.clone() else {
            return Some(Decision::Hold(Hold::refuse(
                reason::RESTORE_SOURCE_UNUSABLE,
                "spec.restore.snapshot: no download of the snapshot is known; no member Machine is created",
            )));
        };
        return Some(Decision::Do(RestoreStep::WriteRestoreSecret { download }));
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
fn creating(o: &Observation) -> Option<&RestoreView> {
    let restore = o.restore.as_ref()?;
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
    let restore = o.restore.as_ref()?;
    if o.etcd_cluster.spec.restore.is_none() || !initialized || status.restored_from.is_some() {
        return None;
    }
    status.restored_from = Some(RestoredFrom {
        snapshot: restore.snapshot.clone(),
        location: restore.location.clone(),
        revision: restore.revision,
        time: Some(now.clone()),
        revision_bumped: Some(revision_bumped(o, restore.revision)),
        control_plane_rollout: None,
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

/// Presign a GET of the snapshot and apply `<etcdadmcluster>-restore` with it (a renewal
/// replaces the URL). The URL is never logged.
async fn write_secret(
    out: &Outputs<'_>,
    o: &Observation,
    download: &RestoreDownload,
) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    let url = download.store.presigned_get(&download.key, RESTORE_URL_TTL);
    let mut data = BTreeMap::from([
        (names::RESTORE_URL_KEY.to_string(), bytes(url.as_str())),
        (
            names::RESTORE_BUMP_REVISION_KEY.to_string(),
            bytes(&RESTORE_REVISION_BUMP.to_string()),
        ),
    ]);
    if let Some(sha256) = &download.sha256 {
        data.insert(names::RESTORE_SHA256_KEY.to_string(), bytes(sha256));
    }
    if let Some(ca_pem) = &download.ca_pem {
        data.insert(names::RESTORE_CA_KEY.to_string(), bytes(ca_pem));
    }
    let name = names::restore_secret_name(&etcd.name_any());
    let metadata = json!({
        "namespace": o.namespace,
        "labels": { names::ETCD_CLUSTER_LABEL: etcd.name_any() },
        "annotations": { names::RESTORE_URL_WRITTEN_ANNOTATION: Timestamp::now().to_string() },
        "ownerReferences": [controller_reference(etcd)?],
    });
    let body = ssa::configuration::<Secret>(&name, metadata, json!({ "type": "Opaque", "data": data }));
    Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .patch(&name, &ssa::params(RESTORE_MANAGER, true), &Patch::Apply(body))
        .await?;
    Ok(Applied::Done)
}

async fn delete_secret(out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
    let name = names::restore_secret_name(&o.name);
    match Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Applied::AlreadyDone),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;
    use std::time::Duration;

    use super::RESTORE_URL_TTL;
    use crate::controller::plan::versions::VERSION_FIELD;

    fn restoring(secret_age: Option<Duration>) -> Observation {
        let mut o = base();
        o.restore = Some(RestoreView {
            snapshot: Some("c0-snap".into()),
            location: Some("backups/c0/s.db".into()),
            revision: Some(1042),
            etcd_version: Some("3.5.9".into()),
            problem: None,
            secret_age,
            recorded: false,
            download: Some(download()),
        });
        o
    }

    #[test]
    fn the_download_url_is_written_before_the_first_machine_which_restores() {
        assert_eq!(plan(&restoring(None)), write_restore_secret());
        // A Secret older than half the URL's life is written anew before the Machine needs it.
        assert_eq!(plan(&restoring(Some(RESTORE_URL_TTL))), write_restore_secret());
        let step = plan(&restoring(Some(Duration::from_secs(5))));
        assert_eq!(
            step,
            created_machine("c1-etcd-fresh", false, None, Growth::Restore)
        );
        let o = restoring(Some(Duration::from_secs(5)));
        let event = step.event(&o).unwrap();
        assert!(
            event
                .note
                .contains("restored from EtcdadmSnapshot c0-snap (backups/c0/s.db)"),
            "{}",
            event.note
        );
    }

    #[test]
    fn an_unusable_source_or_another_minor_version_is_refused_and_nothing_is_created() {
        let mut unusable = restoring(None);
        unusable.restore.as_mut().unwrap().problem =
            Some("EtcdadmSnapshot c0-snap is Failed, not Succeeded".into());
        let mut other_minor = restoring(None);
        other_minor.spec_version = Some((VERSION_FIELD.into(), "3.4.23".into()));
        for (o, why, says) in [
            (
                unusable,
                reason::RESTORE_SOURCE_UNUSABLE,
                "is Failed, not Succeeded",
            ),
            (
                other_minor,
                reason::RESTORE_VERSION_MISMATCH,
                "was taken from etcd 3.5.9",
            ),
        ] {
            let step = plan(&o);
            assert_eq!(wait_reason(&step), why, "{step:?}");
            assert!(step.is_refusal() && !step.writes());
            assert!(wait_message(&step).starts_with("spec.restore.snapshot: "));
            assert!(wait_message(&step).contains(says), "{step:?}");
        }
        let mut same_minor = restoring(Some(Duration::from_secs(5)));
        same_minor.spec_version = Some((VERSION_FIELD.into(), "3.5.17".into()));
        assert!(matches!(
            plan(&same_minor),
            Step::Machines(MachineStep::CreateMachine { .. })
        ));
    }

    #[test]
    fn once_a_machine_exists_the_first_member_is_waited_for_as_usual() {
        let mut o = restoring(Some(Duration::from_secs(5)));
        o.machines.push(machine("c1-etcd-a", None, None));
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
        // A problem with the source no longer matters: the Machine has its URL.
        o.restore.as_mut().unwrap().problem = Some("EtcdadmSnapshot c0-snap not found".into());
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
    }

    /// `running(3)` restored from `c0-snap` at revision 1042 (`bumped` or not), now at
    /// `revision`, Ready, with a KubeadmControlPlane using it last rolled for `rolled`.
    fn restored(bumped: bool, revision: i64, rolled: Option<&str>) -> Observation {
        let mut o = running(3);
        for m in members_mut(&mut o) {
            m.revision = Some(revision);
        }
        let urls = voting_endpoints(&o);
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        o.kcp = kcp(&refs, false, true);
        if let KcpView::Found { rollout_after, .. } = &mut o.kcp {
            *rollout_after = rolled.map(|t| t.parse().unwrap());
        }
        o.creation_complete = true;
        o.etcd_cluster.status = Some(EtcdadmClusterStatus {
            restored_from: Some(RestoredFrom {
                snapshot: Some("c0-snap".into()),
                revision: Some(1042),
                time: Some(Time("2026-11-25T10:00:00Z".parse().unwrap())),
                revision_bumped: Some(bumped),
                ..Default::default()
            }),
            ..Default::default()
        });
        o
    }

    #[test]
    fn the_restore_secret_asks_for_the_bump_and_the_member_tells_whether_it_happened() {
        let o = restored(true, 1042 + RESTORE_REVISION_BUMP + 7, None);
        assert!(revision_bumped(&o, Some(1042)));
        let not = restored(false, 1049, None);
        assert!(!revision_bumped(&not, Some(1042)));
        // An object with no known revision: bumped when above the bump itself.
        assert!(revision_bumped(&o, None) && !revision_bumped(&not, None));
        let bumped = revisions_condition(o.etcd_cluster.status.as_ref().unwrap()).unwrap();
        assert_eq!(bumped.status, etcdadm_shared::api::ConditionStatus::True);
        let fallback = revisions_condition(not.etcd_cluster.status.as_ref().unwrap()).unwrap();
        assert_eq!(
            (fallback.reason.as_str(), fallback.severity),
            ("RevisionsNotBumped", Some(Severity::Warning))
        );
        assert!(fallback.message.contains("etcd 3.5.10"), "{}", fallback.message);
        // Nothing restored: no condition.
        assert_eq!(revisions_condition(&EtcdadmClusterStatus::default()), None);
    }

    #[test]
    fn the_control_plane_is_rolled_once_after_a_restore_bumped_or_not() {
        for bumped in [true, false] {
            let o = restored(bumped, 2_000_000_000, None);
            let step = plan(&o);
            let Step::Restore(RestoreStep::RollControlPlane { kcp, after }) = &step else {
                panic!("{step:?}")
            };
            assert_eq!(
                (kcp.as_str(), after.to_string().as_str()),
                ("c1-cp", "2026-11-25T10:00:00Z")
            );
            assert!(step.event(&o).unwrap().note.contains("watch caches"));
            // Status records it before the step; the KCP then carries it: never again.
            let mut status = o.etcd_cluster.status.clone().unwrap();
            record_rollout(&mut status, after);
            assert_eq!(
                status.restored_from.as_ref().unwrap().control_plane_rollout,
                Some(Time(*after))
            );
            let mut recorded = o.clone();
            recorded.etcd_cluster.status = Some(status);
            assert_eq!(plan(&recorded), Step::Steady);
            assert_eq!(
                plan(&restored(bumped, 2_000_000_000, Some("2026-11-25T10:00:00Z"))),
                Step::Steady
            );
        }
        // Not before the cluster is Ready, and never for a restore an earlier version recorded.
        let mut sick = restored(true, 2_000_000_000, None);
        members_mut(&mut sick)[0].healthy = false;
        assert_eq!(control_plane_rollout(&sick), None);
        let mut older = restored(true, 2_000_000_000, None);
        if let Some(status) = older.etcd_cluster.status.as_mut() {
            status.restored_from.as_mut().unwrap().revision_bumped = None;
        }
        assert_eq!(plan(&older), Step::Steady);
    }

    #[test]
    fn never_on_a_cluster_that_had_a_member() {
        // Initialized: the Secret goes (status records restoredFrom first), nothing is restored.
        let mut o = running(3);
        o.restore = restoring(Some(Duration::from_secs(5))).restore;
        assert_eq!(plan(&o), Step::Restore(RestoreStep::DeleteRestoreSecret));
        o.restore.as_mut().unwrap().secret_age = None;
        assert_eq!(plan(&o), Step::Steady);
        // Every Machine deleted after the cluster ran: no restore, whatever the spec says.
        let mut gone = restoring(None);
        gone.initialized = true;
        gone.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(wait_reason(&plan(&gone)), reason::MEMBERS_UNREACHABLE);
    }
}
