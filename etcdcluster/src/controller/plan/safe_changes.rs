//! Snapshots before disruptive changes (docs/day2.md, "Snapshots before changes"): while
//! `spec.backup` is set, the first removal of a rolling replacement and of a scale-down waits
//! until an EtcdadmSnapshot labelled with the change's reason has Succeeded holding at least
//! the cluster's revision when the change was decided. That revision and the snapshot are
//! recorded in `status.beforeChange` when the change is first seen, so a restarted controller
//! waits for the same snapshot; a Succeeded one younger than `beforeChange.maxAge` that holds
//! the revision is reused. A failed one holds the change with its reason, until it is deleted
//! (another is taken) or the `proceed-without-snapshot` annotation, naming this change
//! (`go_ahead`), lets it go ahead without it (the annotation is then removed). A dead member's
//! removal never waits.

mod go_ahead;

pub use self::go_ahead::change_name;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::cluster::BeforeChangeStatus;
use etcdadm_shared::api::conditions::{self, READY};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::error::Error;
use etcdadm_shared::names::{
    BEFORE_ROLLOUT, BEFORE_SCALE_DOWN, PROCEED_WITHOUT_SNAPSHOT_ANNOTATION, SNAPSHOT_REASON_LABEL,
};

use crate::controller::decision::reason::{ROLLING_UPDATE, SCALING_DOWN};
use crate::controller::decision::{
    After, Applied, ConcernStep, ConcernView, Decision, EventNote, FIELD_MANAGER, Hold, Outputs, StatusPart,
};
use crate::controller::observation::clock::UnhealthyClock;
use crate::controller::observation::{Observation, Reads};
use crate::snapshot::{new_snapshot, snapshots_of};

/// Condition reasons of a change waiting for its snapshot.
pub mod reason {
    pub const WAITING_FOR_SNAPSHOT: &str = "WaitingForBeforeChangeSnapshot";
    pub const SNAPSHOT_FAILED: &str = "BeforeChangeSnapshotFailed";
    /// A `proceed-without-snapshot` annotation naming no change under way is removed.
    pub const GO_AHEAD_IGNORED: &str = "ProceedWithoutSnapshotIgnored";
}

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum SafeChangeStep {
    /// Create EtcdadmSnapshot `name`, labelled `reason`, holding at least `revision`.
    TakeSnapshot {
        name: String,
        reason: &'static str,
        revision: Option<i64>,
    },
    /// An operator lets this change go ahead without a snapshot (`why` it had none): remove
    /// their annotation; status records that this change used it.
    ProceedWithout { reason: &'static str, why: String },
    /// The annotation names no change under way (`value`, and `why` not): remove it.
    DropStale { value: String, why: String },
}

impl ConcernStep for SafeChangeStep {
    type View = SafeChangeView;
    type Metrics = ();

    /// `status.beforeChange`.
    fn status(part: &mut StatusPart<'_>, step: Option<&Self>) {
        record_status(part.status, part.o, step, part.now);
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            SafeChangeStep::TakeSnapshot { name, reason, .. } => (
                change_reason(reason),
                format!(
                    "taking EtcdadmSnapshot {name} before the {} removes a member",
                    what(reason)
                ),
            ),
            SafeChangeStep::ProceedWithout { reason, .. } => (
                change_reason(reason),
                format!(
                    "the {} goes ahead without a before-change snapshot, as {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION} asks",
                    what(reason)
                ),
            ),
            SafeChangeStep::DropStale { value, .. } => (
                reason::GO_AHEAD_IGNORED,
                format!(
                    "removing {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION}={}: it names no change under way",
                    go_ahead::shown(value)
                ),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, _: &Observation) -> Option<EventNote> {
        Some(match self {
            SafeChangeStep::TakeSnapshot {
                name,
                reason,
                revision,
            } => EventNote::normal(
                "BeforeChangeSnapshot",
                format!(
                    "created EtcdadmSnapshot {name} ({SNAPSHOT_REASON_LABEL}={reason}): the {} removes no member until it \
                     has Succeeded{}",
                    what(reason),
                    revision
                        .map(|r| format!(" holding revision {r} or later"))
                        .unwrap_or_default()
                ),
            ),
            SafeChangeStep::ProceedWithout { reason, why } => EventNote::warning(
                "ProceedingWithoutSnapshot",
                format!(
                    "the {} goes ahead without a before-change snapshot ({why}), as {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION} \
                     asked; the annotation is removed",
                    what(reason)
                ),
            ),
            SafeChangeStep::DropStale { value, why } => EventNote::warning(
                reason::GO_AHEAD_IGNORED,
                format!(
                    "{PROCEED_WITHOUT_SNAPSHOT_ANNOTATION}={} lets no change go ahead and is removed: {why}",
                    go_ahead::shown(value)
                ),
            ),
        })
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            SafeChangeStep::TakeSnapshot { name, reason, .. } => {
                let mut snapshot: EtcdadmSnapshot = new_snapshot(&o.etcd_cluster, name, None);
                snapshot
                    .metadata
                    .labels
                    .get_or_insert_default()
                    .insert(SNAPSHOT_REASON_LABEL.to_string(), (*reason).to_string());
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                match Api::<EtcdadmSnapshot>::namespaced(out.client.clone(), &o.namespace)
                    .create(&params, &snapshot)
                    .await
                {
                    Ok(_) => Ok(Applied::Done),
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(Applied::AlreadyDone),
                    Err(e) => Err(e.into()),
                }
            }
            SafeChangeStep::ProceedWithout { .. } | SafeChangeStep::DropStale { .. } => {
                let patch =
                    json!({ "metadata": { "annotations": { PROCEED_WITHOUT_SNAPSHOT_ANNOTATION: null } } });
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                Api::<etcdadm_shared::api::EtcdadmCluster>::namespaced(out.client.clone(), &o.namespace)
                    .patch(&o.name, &params, &Patch::Merge(&patch))
                    .await?;
                Ok(Applied::Done)
            }
        }
    }

    /// What comes after: the change waits for the snapshot, or goes ahead.
    fn after(&self, _: &Observation) -> After {
        match self {
            SafeChangeStep::TakeSnapshot { .. }
            | SafeChangeStep::ProceedWithout { .. }
            | SafeChangeStep::DropStale { .. } => After::Again,
        }
    }
}

/// `Ready`'s reason while the change waits: the change's own.
fn change_reason(reason: &str) -> &'static str {
    if reason == BEFORE_SCALE_DOWN {
        SCALING_DOWN
    } else {
        ROLLING_UPDATE
    }
}

/// The change a reason label stands for, in words.
fn what(reason: &str) -> &'static str {
    if reason == BEFORE_SCALE_DOWN {
        "scale-down"
    } else {
        "rolling replacement"
    }
}

// Decisions.

/// The disruptive change under way, as its snapshot's reason label: a rolling replacement
/// while a Machine is outdated, a scale-down while there are more Machines than replicas.
pub fn change(o: &Observation) -> Option<&'static str> {
    let active = o.active_machines().count();
    if o.active_machines().any(|m| m.outdated.is_some()) {
        Some(BEFORE_ROLLOUT)
    } else if active > usize::try_from(o.replicas).unwrap_or(0) {
        Some(BEFORE_SCALE_DOWN)
    } else {
        None
    }
}

/// The change's record: the stored one if it is of this change, else the one this pass
/// records (the revision now).
fn record(o: &Observation, view: &BeforeChangeView, reason: &str) -> BeforeChangeStatus {
    match view.record.as_ref().filter(|r| r.reason == reason) {
        Some(r) => BeforeChangeStatus {
            reason: r.reason.clone(),
            revision: r.revision,
            decided: r.decided.map(Time),
            snapshot: r.snapshot.clone(),
            proceeded_without: r.proceeded_without,
        },
        None => BeforeChangeStatus {
            reason: reason.to_string(),
            revision: o.revision(),
            ..Default::default()
        },
    }
}

/// A Succeeded snapshot holding the decision's revision: the change's own, or one younger than
/// `maxAge`.
fn satisfying<'a>(view: &'a BeforeChangeView, record: &BeforeChangeStatus) -> Option<&'a SnapshotSummary> {
    let holds = |s: &SnapshotSummary| {
        s.phase == SnapshotPhase::Succeeded && s.revision.unwrap_or(0) >= record.revision.unwrap_or(0)
    };
    let own = |s: &SnapshotSummary| record.snapshot.as_deref() == Some(s.name.as_str());
    let fresh = |s: &SnapshotSummary| s.age.is_some_and(|age| age <= view.max_age);
    view.snapshots
        .iter()
        .filter(|s| holds(s) && (own(s) || fresh(s)))
        .min_by_key(|s| (!own(s), s.age))
}

/// Before the removal of a rolling replacement or a scale-down (never a dead member's): the
/// snapshot to take or wait for, unless one holds the change's revision, or the operator lets
/// it go ahead without.
pub fn before_removal(o: &Observation) -> Option<Decision<SafeChangeStep>> {
    let changes = o.view::<SafeChangeView>();
    let view = changes.before_change.as_ref()?;
    let reason = change(o)?;
    let record = record(o, view, reason);
    if record.proceeded_without || satisfying(view, &record).is_some() {
        return None;
    }
    let granted = granted(o);
    let go_ahead_hint = go_ahead::hint(current_change(o).as_deref());
    let own = record
        .snapshot
        .as_deref()
        .and_then(|name| view.snapshots.iter().find(|s| s.name == name));
    let held = match own {
        Some(s) if s.phase == SnapshotPhase::Failed => Hold::refuse(
            reason::SNAPSHOT_FAILED,
            format!(
                "the {} waits for its before-change snapshot, and EtcdadmSnapshot {} failed: {}; delete it to take \
                 another, or {go_ahead_hint}",
                what(reason),
                s.name,
                s.message.as_deref().unwrap_or("no reason given")
            ),
        ),
        Some(s) if matches!(s.phase, SnapshotPhase::Pending | SnapshotPhase::Running) => Hold::wait(
            reason::WAITING_FOR_SNAPSHOT,
            format!(
                "the {} removes no member until EtcdadmSnapshot {} has Succeeded (it is {:?}{})",
                what(reason),
                s.name,
                s.phase,
                s.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
            ),
        ),
        // None yet, deleted, or one that holds too little: take one.
        _ => {
            if granted {
                return Some(proceed_without(reason, "none was taken"));
            }
            return Some(Decision::Do(SafeChangeStep::TakeSnapshot {
                name: format!("{}-{reason}", o.new_member_name),
                reason,
                revision: record.revision,
            }));
        }
    };
    if granted {
        return Some(proceed_without(reason, &held.message));
    }
    Some(Decision::Hold(held))
}

/// The name of the change under way, once `status.beforeChange` records it.
fn current_change(o: &Observation) -> Option<String> {
    let changes = o.view::<SafeChangeView>();
    let record = changes.before_change.as_ref().and_then(|v| v.record.as_ref());
    go_ahead::current(change(o), record.map(|r| (r.reason.as_str(), r.decided)))
}

/// Whether the go-ahead annotation names the change under way: only then is it honoured.
fn granted(o: &Observation) -> bool {
    let asked = o.view::<SafeChangeView>().proceed_annotation.clone();
    asked.is_some() && asked == current_change(o)
}

/// The go-ahead annotation, when it names no change under way: removed, with why.
pub fn stale(o: &Observation) -> Option<Decision<SafeChangeStep>> {
    let changes = o.view::<SafeChangeView>();
    let value = changes.proceed_annotation.as_ref()?;
    let current = current_change(o);
    if current.as_ref() == Some(value) {
        return None;
    }
    Some(Decision::Do(SafeChangeStep::DropStale {
        value: value.clone(),
        why: go_ahead::why_stale(
            changes.before_change.is_some(),
            change(o).map(what),
            current.as_deref(),
        ),
    }))
}

fn proceed_without(reason: &'static str, why: &str) -> Decision<SafeChangeStep> {
    Decision::Do(SafeChangeStep::ProceedWithout {
        reason,
        why: why.to_string(),
    })
}

// Status.

/// `status.beforeChange`: recorded when a change is first seen, with the snapshot the step
/// takes (or a fresh one reused) and an operator's go-ahead; cleared when the change is done.
pub fn record_status(
    status: &mut EtcdadmClusterStatus,
    o: &Observation,
    step: Option<&SafeChangeStep>,
    now: &Time,
) {
    let changes = o.view::<SafeChangeView>();
    let (Some(view), Some(reason)) = (changes.before_change.as_ref(), change(o)) else {
        status.before_change = None;
        return;
    };
    let mut record = record(o, view, reason);
    let kept = status
        .before_change
        .as_ref()
        .filter(|r| r.reason == reason)
        .and_then(|r| r.decided.clone());
    record.decided = Some(kept.or(record.decided).unwrap_or_else(|| now.clone()));
    match step {
        Some(SafeChangeStep::TakeSnapshot { name, .. }) => record.snapshot = Some(name.clone()),
        Some(SafeChangeStep::ProceedWithout { .. }) => record.proceeded_without = true,
        Some(SafeChangeStep::DropStale { .. }) | None => {
            if record.snapshot.is_none()
                && let Some(reused) = satisfying(view, &record)
            {
                record.snapshot = Some(reused.name.clone());
            }
        }
    }
    status.before_change = Some(record);
}

// View.

/// What this concern sees: the snapshot before a disruptive change, and the snapshot of this
/// cluster waiting or being taken (maintenance waits for it too); there only while
/// `spec.backup` is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SafeChangeView {
    pub before_change: Option<BeforeChangeView>,
    /// An EtcdadmSnapshot of this cluster waiting or being taken, by name.
    pub snapshot_in_flight: Option<String>,
    /// The `proceed-without-snapshot` annotation's value, when it is set.
    pub proceed_annotation: Option<String>,
}

impl ConcernView for SafeChangeView {
    /// This cluster's EtcdadmSnapshots, while `spec.backup` is set (a change waits for one).
    type Read = Option<Vec<SnapshotRecord>>;

    async fn read(client: &Client, namespace: &str, etcd: &EtcdadmCluster) -> Result<Self::Read, Error> {
        if etcd.spec.backup.is_none() {
            return Ok(None);
        }
        let listed = snapshots_of(client, namespace, &etcd.name_any()).await?;
        Ok(Some(listed.iter().map(SnapshotRecord::from_snapshot).collect()))
    }

    /// A change waiting for its before-change snapshot is looked at afresh.
    fn keep(_: &Self::Read, etcd: &EtcdadmCluster) -> bool {
        etcd.status.as_ref().is_none_or(|s| s.before_change.is_none())
    }

    fn view(read: &Self::Read, reads: &Reads, clock: &UnhealthyClock) -> Self {
        SafeChangeView {
            before_change: before_change_view(read, reads, clock),
            snapshot_in_flight: read.as_ref().and_then(|listed| {
                listed
                    .iter()
                    .find(|s| !s.phase.is_finished())
                    .map(|s| s.name.clone())
            }),
            proceed_annotation: reads
                .etcd_cluster
                .annotations()
                .get(PROCEED_WITHOUT_SNAPSHOT_ANNOTATION)
                .cloned(),
        }
    }
}

/// One EtcdadmSnapshot as read: what a change waiting for it needs.
#[derive(Clone, Debug)]
pub struct SnapshotRecord {
    pub name: String,
    pub phase: SnapshotPhase,
    pub revision: Option<i64>,
    /// When it succeeded or failed.
    pub completed: Option<Timestamp>,
    /// Its `Ready` condition's message.
    pub message: Option<String>,
}

impl SnapshotRecord {
    fn from_snapshot(snapshot: &EtcdadmSnapshot) -> Self {
        let status = snapshot.status.clone().unwrap_or_default();
        SnapshotRecord {
            name: snapshot.name_any(),
            phase: snapshot.phase(),
            revision: status.revision,
            completed: status.completion_time.map(|t| t.0),
            message: conditions::find(&status.conditions, READY).and_then(|c| c.message.clone()),
        }
    }
}

/// What a change waiting for its snapshot sees, while `spec.backup` is set.
fn before_change_view(
    read: &Option<Vec<SnapshotRecord>>,
    reads: &Reads,
    clock: &UnhealthyClock,
) -> Option<BeforeChangeView> {
    let e = &reads.etcd_cluster;
    let backup = e.spec.backup.as_ref()?;
    let record = e
        .status
        .as_ref()
        .and_then(|s| s.before_change.as_ref())
        .map(|r| BeforeChangeRecord {
            reason: r.reason.clone(),
            revision: r.revision,
            decided: r.decided.as_ref().map(|t| t.0),
            snapshot: r.snapshot.clone(),
            proceeded_without: r.proceeded_without,
        });
    let snapshots = read
        .iter()
        .flatten()
        .map(|s| SnapshotSummary {
            name: s.name.clone(),
            phase: s.phase,
            revision: s.revision,
            age: s.completed.map(|t| clock.since(t)),
            message: s.message.clone(),
        })
        .collect();
    Some(BeforeChangeView {
        max_age: backup.before_change_max_age(),
        record,
        snapshots,
    })
}

/// What the snapshot before a disruptive change needs (docs/day2.md, "Snapshots before
/// changes"): there only while `spec.backup` is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeforeChangeView {
    /// `beforeChange.maxAge`: a Succeeded snapshot this young that holds the decision's revision
    /// is reused.
    pub max_age: Duration,
    /// `status.beforeChange` as stored.
    pub record: Option<BeforeChangeRecord>,
    /// This cluster's EtcdadmSnapshots.
    pub snapshots: Vec<SnapshotSummary>,
}

/// `status.beforeChange`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeforeChangeRecord {
    /// `before-rollout` or `before-scale-down`.
    pub reason: String,
    /// The cluster's revision when the change was decided.
    pub revision: Option<i64>,
    /// When the change was decided: with the reason, its name.
    pub decided: Option<Timestamp>,
    /// The snapshot the change waits for.
    pub snapshot: Option<String>,
    /// An operator let this change go ahead without one.
    pub proceeded_without: bool,
}

/// One EtcdadmSnapshot of this cluster, as far as a change waiting for it needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotSummary {
    pub name: String,
    pub phase: SnapshotPhase,
    /// The revision it holds, once Succeeded.
    pub revision: Option<i64>,
    /// Time since it succeeded or failed.
    pub age: Option<Duration>,
    /// Why it failed or waits (its `Ready` condition's message).
    pub message: Option<String>,
}

#[cfg(test)]
mod tests;
