//! Continuous backup (docs/day2.md, "Continuous backup"): what should be recording a cluster's
//! writes, decided from the cluster and its snapshots alone. Deltas follow the newest Succeeded
//! snapshot, read from the member a snapshot would be read from; a cluster with none yet, or
//! whose newest snapshot's deltas ended at a compaction, gets a new full snapshot (at most one
//! such every [`FULL_SNAPSHOT_BACKOFF`], so a store that fails them is not flooded). The
//! recorders themselves run in `recorders`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, S3Store, SnapshotPhase};

use super::plan::{Target, is_paused, named_after, object_of, pick_member};

pub mod recorders;

/// Annotation of a snapshot created for continuous backup: when (RFC 3339).
pub const FOR_CONTINUOUS_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/continuous-backup";
/// The least time between two full snapshots continuous backup creates.
pub const FULL_SNAPSHOT_BACKOFF: Duration = Duration::from_secs(600);

/// Why a snapshot's deltas ended (`status.deltas.ended`).
pub mod ended {
    pub const SUPERSEDED: &str = "Superseded";
    pub const COMPACTED: &str = "Compacted";
    pub const STOPPED: &str = "Stopped";
}

/// Recording a cluster's writes after one snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Recording {
    pub snapshot: String,
    /// The snapshot's object key, which its deltas are named after.
    pub key: String,
    pub store: S3Store,
    /// The snapshot's revision.
    pub base: i64,
    pub member: Target,
    pub interval: Duration,
}

/// What should record `cluster`'s writes now (none: nothing should).
pub fn recording(cluster: &EtcdadmCluster, snapshots: &[EtcdadmSnapshot]) -> Option<Recording> {
    let continuous = cluster.spec.backup.as_ref()?.continuous.as_ref()?;
    if cluster.metadata.deletion_timestamp.is_some() || is_paused(cluster) {
        return None;
    }
    let newest = newest_succeeded(snapshots)?;
    let status = newest.status.as_ref()?;
    if status.deltas.as_ref().is_some_and(|d| d.ended.is_some()) {
        return None;
    }
    let (store, key) = object_of(newest)?;
    Some(Recording {
        snapshot: newest.name_any(),
        key,
        store,
        base: status.revision?,
        member: pick_member(cluster)?,
        interval: continuous.interval(),
    })
}

/// The name of a full snapshot continuous backup needs now: the cluster has none to follow, or
/// its newest one's deltas ended at a compaction. None while any snapshot is unfinished, or one
/// was created for continuous backup within [`FULL_SNAPSHOT_BACKOFF`].
pub fn full_snapshot_wanted(
    cluster: &EtcdadmCluster,
    snapshots: &[EtcdadmSnapshot],
    now: Timestamp,
) -> Option<String> {
    cluster.spec.backup.as_ref()?.continuous.as_ref()?;
    if cluster.metadata.deletion_timestamp.is_some()
        || is_paused(cluster)
        || snapshots.iter().any(|s| !s.phase().is_finished())
    {
        return None;
    }
    let recent = snapshots.iter().any(|s| {
        s.annotations()
            .get(FOR_CONTINUOUS_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|t| now.duration_since(t).unsigned_abs() < FULL_SNAPSHOT_BACKOFF)
    });
    let followed = newest_succeeded(snapshots).is_some_and(|s| {
        s.status
            .as_ref()
            .and_then(|st| st.deltas.as_ref())
            .and_then(|d| d.ended.as_deref())
            != Some(ended::COMPACTED)
    });
    (!recent && !followed).then(|| full_snapshot_name(&cluster.name_any(), now))
}

/// `<cluster>-continuous-<yyyymmddhhmmss>`.
fn full_snapshot_name(cluster: &str, now: Timestamp) -> String {
    named_after(cluster, &format!("-continuous-{}", now.strftime("%Y%m%d%H%M%S")))
}

/// The Succeeded snapshot holding the highest revision (the newest), by name among equals.
pub fn newest_succeeded(snapshots: &[EtcdadmSnapshot]) -> Option<&EtcdadmSnapshot> {
    snapshots
        .iter()
        .filter(|s| s.phase() == SnapshotPhase::Succeeded)
        .filter_map(|s| Some((s.status.as_ref()?.revision?, s)))
        .max_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name_any().cmp(&y.name_any())))
        .map(|(_, s)| s)
}

#[cfg(test)]
mod tests;
