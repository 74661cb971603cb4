//! Quorum-loss recovery: `spec.recovery` with its minimum and check, and the recovery's status
//! (`status.recovery`, `status.lastRecovery`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::duration;
use crate::validation::field::{FieldError, quoted};

/// Least time quorum must have been lost before an automatic recovery.
pub const MIN_AUTOMATIC_RECOVERY_AFTER: Duration = Duration::from_secs(600);

/// When the cluster recovers from a lost quorum by itself.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Recover from `latest` (the surviving member with the highest revision, else the newest
    /// Succeeded snapshot) once quorum has been lost for `after` and the infrastructure reports
    /// the Machines of a majority of the voting members gone or failed, as the
    /// `etcdcluster.cluster.x-k8s.io/recover` annotation would. Needs `spec.backup.store`.
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automatic: Option<bool>,
    /// How long no member may have served clients, with quorum lost, before an automatic
    /// recovery: a duration of at least 10m (the default). At most 64 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = crate::api::schema_rules::duration_at_least("after", "10m"))]
    pub after: Option<String>,
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
    /// Continuous backup's deltas replayed onto the restored member, once they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltas: Option<crate::api::snapshot::DeltasRestored>,
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
    /// The revision restored (the snapshot's, or the one its deltas reached).
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
    /// Continuous backup's deltas replayed onto the snapshot (every one recorded after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltas: Option<crate::api::snapshot::DeltasRestored>,
}

/// How long quorum must have been lost before the cluster recovers by itself, when
/// `recovery.automatic` is set (an `after` that does not parse, or is shorter than the minimum
/// admission enforces, counts as the minimum).
pub(super) fn automatic_after(recovery: Option<&RecoverySpec>) -> Option<Duration> {
    let recovery = recovery.filter(|r| r.automatic == Some(true))?;
    let after = recovery
        .after
        .as_deref()
        .and_then(|s| duration::parse(s).ok())
        .unwrap_or(MIN_AUTOMATIC_RECOVERY_AFTER);
    Some(after.max(MIN_AUTOMATIC_RECOVERY_AFTER))
}

/// An automatic recovery waits at least the minimum, and has a store for the survivor's snapshot.
pub(super) fn problems(recovery: Option<&RecoverySpec>, has_backup: bool) -> Vec<FieldError> {
    let Some(recovery) = recovery else {
        return vec![];
    };
    let mut errors = vec![];
    if let Some(after) = &recovery.after {
        let minimum = duration::format(MIN_AUTOMATIC_RECOVERY_AFTER);
        match duration::parse(after) {
            Ok(d) if d >= MIN_AUTOMATIC_RECOVERY_AFTER => {}
            Ok(_) => errors.push(FieldError::new(
                "spec.recovery.after",
                format!("{}: must be at least {minimum}", quoted(after)),
            )),
            Err(e) => errors.push(FieldError::new(
                "spec.recovery.after",
                format!("{}: {e}", quoted(after)),
            )),
        }
    }
    if recovery.automatic == Some(true) && !has_backup {
        errors.push(FieldError::new(
            "spec.recovery.automatic",
            "needs spec.backup.store: an automatic recovery snapshots the surviving member into it",
        ));
    }
    errors
}
