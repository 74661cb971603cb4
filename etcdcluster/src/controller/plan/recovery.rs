//! Quorum-loss recovery (docs/day2.md, "Quorum loss"): the annotation
//! `etcdcluster.cluster.x-k8s.io/recover=<latest|member/<machine>|snapshot/<name>>` replaces a
//! cluster that lost quorum with one restored from a snapshot. A request that fails a check is
//! refused with a condition and a Warning Event, nothing deleted, the annotation left in place
//! so the user sees why.
//!
//! Membership rule 3 of docs/safety.md (no membership change without quorum) protects a cluster that can still
//! come back; a recovery instead replaces the cluster, so the deletion of the dead cluster's
//! Machines (hooks released without MemberRemove) is outside that rule, and is allowed only when
//! quorum is really lost. Every step that is not the recovery's own keeps all the rules.
//!
//! The sequence is recorded in `status.recovery` before each step (status is written before
//! every step): snapshot the survivor (`Snapshotting`), delete the Machines (`Replacing`), then
//! forget `initialized` and restore a first member like `spec.restore` does (`Restoring`); the
//! others join and the control plane gets the new endpoints as for any new cluster, and once it
//! is Ready the annotation goes and `status.lastRecovery` is written.
//!
//! A refused request is answered in a condition of its own beside the plan's step, never the
//! step: it must not stop a healthy cluster's scaling, rollouts or remediation.

mod evidence;
mod view;
mod writes;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::condition::RECOVERY;
use etcdadm_shared::api::cluster::{LastRecovery, RecoveryPhase, RecoveryStatus};
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::api::snapshot::SnapshotPhase;
use etcdadm_shared::error::Error;
use etcdadm_shared::names::RECOVER_ANNOTATION;

pub use self::evidence::{Evidence, Fate};
pub use self::view::Recovery;
use self::writes::{finish, reset, snapshot_survivor};
use super::restore::view::RestoreFrom;
use super::{control_plane, machines, restore};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, Hold, HoldKind, Outputs, StatusPart, WAIT_REQUEUE,
};
use crate::controller::observation::{
    AlarmKind, EtcdView, Observation, RecoveryRecord, RecoverySource, RecoveryView, SnapshotCheck, is_ready,
};
use crate::controller::rules::{
    self,
    reason::{MEMBERS_UNREACHABLE, QUORUM_LOST},
};

/// Condition reasons of a recovery.
pub mod reason {
    pub const RECOVERY_REFUSED: &str = "RecoveryRefused";
    pub const RECOVERING: &str = "Recovering";
    pub const RECOVERY_FAILED: &str = "RecoveryFailed";
    pub const RECOVERY_WAITING: &str = "WaitingForEvidenceOfQuorumLoss";
}

/// What a recovery does next; status records `record` (or, for `Finish`, the last recovery)
/// before it is taken.
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryAction {
    /// Create the EtcdadmSnapshot `record.snapshot` of Machine `machine`'s member.
    SnapshotSurvivor { machine: String },
    /// Release the hooks of these Machines and delete them, without MemberRemove.
    DeleteMachines { names: Vec<String> },
    /// The lost cluster's Machines are gone: delete its init Secret (of Cluster `cluster`);
    /// status forgets `initialized`, so the next Machine restores a first member.
    Reset { cluster: Option<String> },
    /// Ready again: remove the annotation.
    Finish,
    /// The annotation was removed before any Machine was deleted: the recovery is dropped.
    Abandon,
}

/// The next action of a quorum-loss recovery, and the record status keeps of it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryStep {
    pub record: Box<RecoveryRecord>,
    pub action: RecoveryAction,
}

impl ConcernStep for RecoveryStep {
    type View = Recovery;
    type Metrics = ();

    /// `status.recovery`, `status.lastRecovery` and the `Recovery` condition, with the Warning
    /// Event of a new refusal.
    fn status(part: &mut StatusPart<'_>, step: Option<&Self>) {
        record_status(part.status, part.o, step, part.now);
        if let Some(note) = condition(part.status, part.o, &part.old.conditions, part.now) {
            part.event(note);
        }
    }

    /// A reset forgets the lost cluster.
    fn forgets_cluster(&self) -> bool {
        matches!(self.action, RecoveryAction::Reset { .. })
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        (reason::RECOVERING, note(&self.record, &self.action))
    }

    /// The Event this step leaves once applied (a Warning but for the end of a recovery).
    fn event(&self, o: &Observation) -> Option<EventNote> {
        let reason = match self.action {
            RecoveryAction::SnapshotSurvivor { .. } => "RecoverySnapshot",
            RecoveryAction::DeleteMachines { .. } => "RecoveryReplacingMachines",
            RecoveryAction::Reset { .. } => "RecoveryRestoring",
            RecoveryAction::Finish => "Recovered",
            RecoveryAction::Abandon => "RecoveryAbandoned",
        };
        let mut note = note(&self.record, &self.action);
        let from = o.view::<RestoreFrom>();
        if let (RecoveryAction::Finish, Some(restore)) = (&self.action, &from.view) {
            let revision = restore
                .revision
                .map(|r| format!(" at revision {r}"))
                .unwrap_or_default();
            let deltas = o
                .etcd_cluster
                .status
                .as_ref()
                .and_then(|s| s.recovery.as_ref()?.deltas.as_ref())
                .map(|d| {
                    format!(
                        ", then {} events of {} delta objects replayed to revision {}",
                        d.events, d.objects, d.revision
                    )
                })
                .unwrap_or_default();
            note = format!("{note}: {} members restored{revision}{deltas}", o.replicas);
        }
        Some(EventNote {
            warning: !matches!(self.action, RecoveryAction::Finish),
            reason,
            note,
        })
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match &self.action {
            RecoveryAction::SnapshotSurvivor { machine } => {
                snapshot_survivor(out, o, &self.record.snapshot, machine).await
            }
            RecoveryAction::DeleteMachines { names } => {
                machines::release_and_delete(out, &o.namespace, names).await
            }
            RecoveryAction::Reset { cluster } => reset(out, o, cluster.as_deref()).await,
            RecoveryAction::Finish => finish(out, o).await,
            RecoveryAction::Abandon => Ok(Applied::Done),
        }
    }

    /// What comes after: a snapshot is taken and Machines deleted by others.
    fn after(&self, o: &Observation) -> After {
        match self.action {
            RecoveryAction::SnapshotSurvivor { .. } | RecoveryAction::DeleteMachines { .. } => {
                After::Requeue(o.health_interval().min(WAIT_REQUEUE))
            }
            RecoveryAction::Reset { .. } | RecoveryAction::Finish | RecoveryAction::Abandon => After::Again,
        }
    }
}

/// What a recovery step does, for its condition message and its Event.
fn note(record: &RecoveryRecord, action: &RecoveryAction) -> String {
    let source = record.source.describe();
    let snapshot = &record.snapshot;
    match action {
        RecoveryAction::SnapshotSurvivor { machine } => format!(
            "quorum is lost: taking EtcdadmSnapshot {snapshot} of the member of Machine {machine}{} to recover from",
            record
                .survivor_revision
                .map(|r| format!(" (revision {r})"))
                .unwrap_or_default()
        ),
        RecoveryAction::DeleteMachines { names } => format!(
            "recovering from {source}: deleting the lost cluster's Machines {} without removing their \
             members (the CA and client certificates are kept)",
            names.join(", ")
        ),
        RecoveryAction::Reset { .. } => format!(
            "recovering from {source}: the lost cluster's Machines are gone; a first member is restored \
             from EtcdadmSnapshot {snapshot}"
        ),
        RecoveryAction::Finish => {
            format!("recovered from {source} (EtcdadmSnapshot {snapshot}); the recover annotation is removed")
        }
        RecoveryAction::Abandon => format!(
            "the recover annotation was removed before any Machine was deleted: the recovery from {source} \
             is dropped (EtcdadmSnapshot {snapshot} is kept)"
        ),
    }
}

// Decisions.

/// The recovery's next step, while one is asked for and may begin, or is under way.
pub fn plan(o: &Observation) -> Option<Decision<RecoveryStep>> {
    let recovery = o.view::<Recovery>();
    let view = recovery.view.as_ref()?;
    let Some(under_way) = &view.under_way else {
        let record = check(o, view)?.ok()?;
        return Some(match &record.source {
            RecoverySource::Member(machine) => recover(
                record.clone(),
                RecoveryAction::SnapshotSurvivor {
                    machine: machine.clone(),
                },
            ),
            _ => replace(o, record),
        });
    };
    let record = under_way.record.clone();
    match record.phase {
        RecoveryPhase::Snapshotting => {
            if view.request().is_none() {
                return Some(recover(record, RecoveryAction::Abandon));
            }
            match under_way.snapshot_phase {
                None => match &record.source {
                    RecoverySource::Member(machine) => {
                        let machine = machine.clone();
                        Some(recover(record, RecoveryAction::SnapshotSurvivor { machine }))
                    }
                    _ => Some(replace(o, record)),
                },
                Some(SnapshotPhase::Succeeded) => Some(replace(o, record)),
                Some(SnapshotPhase::Failed) => Some(Decision::Hold(Hold::refuse(
                    reason::RECOVERY_FAILED,
                    format!(
                        "the survivor's EtcdadmSnapshot {} failed: {}; nothing was deleted. Remove the \
                         annotation {RECOVER_ANNOTATION}, then ask again (another member, or snapshot/<name>)",
                        record.snapshot,
                        under_way.snapshot_failure.as_deref().unwrap_or("no reason given")
                    ),
                ))),
                Some(phase) => Some(Decision::Hold(Hold::wait(
                    reason::RECOVERING,
                    format!(
                        "recovering from {}: EtcdadmSnapshot {} is {phase:?}",
                        record.source.describe(),
                        record.snapshot
                    ),
                ))),
            }
        }
        RecoveryPhase::Replacing => Some(replace(o, record)),
        RecoveryPhase::Restoring => {
            let done = is_ready(o)
                && restore::secret(o).is_none()
                && restore::first_member(o).is_none()
                && control_plane::hand_over(o).is_none();
            done.then(|| recover(record, RecoveryAction::Finish))
        }
    }
}

/// Delete the lost cluster's Machines; once they are gone, begin the restore.
fn replace(o: &Observation, mut record: RecoveryRecord) -> Decision<RecoveryStep> {
    record.phase = RecoveryPhase::Replacing;
    if o.machines.is_empty() {
        record.phase = RecoveryPhase::Restoring;
        let cluster = o.cluster.name().map(String::from);
        return recover(record, RecoveryAction::Reset { cluster });
    }
    let names: Vec<String> = o
        .machines
        .iter()
        .filter(|m| !m.deleting || m.has_hook)
        .map(|m| m.name.clone())
        .collect();
    if names.is_empty() {
        return Decision::Hold(Hold::wait(
            reason::RECOVERING,
            format!(
                "recovering from {}: waiting for the lost cluster's {} Machines to be deleted",
                record.source.describe(),
                o.machines.len()
            ),
        ));
    }
    recover(record, RecoveryAction::DeleteMachines { names })
}

fn recover(record: RecoveryRecord, action: RecoveryAction) -> Decision<RecoveryStep> {
    Decision::Do(RecoveryStep {
        record: Box::new(record),
        action,
    })
}

/// Whether the request may begin: the record it begins with, or why it is refused. `None`
/// without a request.
fn check(o: &Observation, view: &RecoveryView) -> Option<Result<RecoveryRecord, String>> {
    // The checks in the order a person reads the refusals: each one a reason to say no.
    let requested = view.request()?.to_string();
    // An automatic recovery needs the loss observed; silence alone is waited out (`answer`).
    if view.requested.is_none() && !majority_lost_observed(o) {
        return None;
    }
    let source = match RecoverySource::parse(&requested) {
        Ok(source) => source,
        Err(why) => return Some(Err(why)),
    };
    if !loss_reported(o) {
        let voters = o.voters();
        let healthy = voters.iter().filter(|m| m.healthy).count();
        let alarms: Vec<&str> = AlarmKind::ALL
            .into_iter()
            .filter(|kind| o.alarm_raised(*kind))
            .map(AlarmKind::as_str)
            .collect();
        let alarmed = if alarms.is_empty() {
            String::new()
        } else {
            format!(
                "; the members serve but refuse writes because etcd raised {}, which is an alarm to repair, not a lost quorum (see the Ready condition)",
                alarms.join(" and ")
            )
        };
        return Some(Err(format!(
            "is refused: quorum is not lost ({healthy} of {} voting members healthy, {} needed), and a \
             recovery replaces a cluster only when a majority of its members is gone for good{alarmed}",
            voters.len(),
            rules::quorum(voters.len())
        )));
    }
    if matches!(source, RecoverySource::Latest | RecoverySource::Member(_)) && !view.store_configured {
        return Some(Err(
            "is refused: a survivor's snapshot needs an object store, and spec.backup.store is not set; \
             set it, or recover from snapshot/<name>"
                .into(),
        ));
    }
    // The survivors: started voters on a Machine that answered this round, highest revision first.
    let mut survivors: Vec<(&str, i64)> = o
        .voters()
        .into_iter()
        .filter(|m| m.is_started())
        .filter_map(|m| Some((m.machine.as_deref()?, m.revision?)))
        .collect();
    survivors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let survivor_revision = survivors.first().map(|s| s.1);
    let record = |source: RecoverySource, snapshot: String| RecoveryRecord {
        requested: view.requested.clone().unwrap_or_else(|| "automatic".into()),
        source,
        phase: RecoveryPhase::Snapshotting,
        snapshot,
        survivor_revision,
    };
    let survivor_snapshot = format!("{}-recovery", o.new_member_name);
    let named = |check: Option<&SnapshotCheck>| -> Result<RecoveryRecord, String> {
        let Some(check) = check else {
            return Err(
                "is refused: no member answers and this cluster has no Succeeded EtcdadmSnapshot".into(),
            );
        };
        if let Some(problem) = &check.problem {
            return Err(format!("is refused: {problem}"));
        }
        // Checked before anything is deleted.
        if let Some(why) = restore::minor_mismatch(o, check.etcd_version.as_deref()) {
            return Err(format!("is refused: EtcdadmSnapshot {} {why}", check.name));
        }
        Ok(record(
            RecoverySource::Snapshot(check.name.clone()),
            check.name.clone(),
        ))
    };
    Some(match &source {
        RecoverySource::Member(machine) if !o.machines.iter().any(|m| m.name == *machine) => Err(format!(
            "is refused: Machine {machine} is not a member Machine of this EtcdadmCluster"
        )),
        RecoverySource::Member(machine) if !survivors.iter().any(|s| s.0 == machine) => Err(format!(
            "is refused: the member of Machine {machine} does not answer, so it cannot be snapshotted; \
             name a member that answers, or snapshot/<name>"
        )),
        RecoverySource::Member(_) => Ok(record(source.clone(), survivor_snapshot)),
        RecoverySource::Latest => match survivors.first() {
            Some((machine, _)) => Ok(record(
                RecoverySource::Member((*machine).to_string()),
                survivor_snapshot,
            )),
            None => named(view.snapshot.as_ref()),
        },
        RecoverySource::Snapshot(_) => named(view.snapshot.as_ref()),
    })
}

/// Rule 3's wait reports quorum lost, or no member answering, on a cluster that was
/// initialized: a person may recover then.
fn loss_reported(o: &Observation) -> bool {
    o.initialized_now()
        && rules::quorum_lost(o).is_some_and(|hold| [QUORUM_LOST, MEMBERS_UNREACHABLE].contains(&hold.reason))
}

/// An automatic recovery's evidence (docs/day2.md, "Quorum loss"): quorum lost (or no member
/// answering) and the infrastructure reporting the Machines of a majority of the voting members
/// last recorded gone or failed ([`Evidence`]). What the members say is no evidence: a member
/// that answers and follows no leader is what the minority side of a partition sees, and what a
/// member sees while the others are stalled; silence is what a partition from the controller
/// looks like. The majority may be serving, and a restore would lose every write since.
pub fn majority_lost_observed(o: &Observation) -> bool {
    o.initialized_now() && loss_reported(o) && Evidence::of(o).majority_lost()
}

/// The answer to a recovery request or the state of one under way, for the `Recovery`
/// condition: a refusal, or a wait that says where the recovery is.
pub fn answer(o: &Observation) -> Option<Hold> {
    let recovery = o.view::<Recovery>();
    let view = recovery.view.as_ref()?;
    if let Some(under_way) = &view.under_way {
        let record = &under_way.record;
        if let Some(Decision::Hold(hold)) = plan(o)
            && hold.kind == HoldKind::Refuse
        {
            return Some(hold);
        }
        return Some(Hold::wait(
            reason::RECOVERING,
            format!(
                "recovering from {} ({:?}): EtcdadmSnapshot {}",
                record.source.describe(),
                record.phase,
                record.snapshot
            ),
        ));
    }
    // An automatic recovery is asked for only on evidence of a lost majority; the annotation
    // always.
    let asked = match &view.requested {
        Some(requested) => format!("{RECOVER_ANNOTATION}={requested:?}"),
        None if majority_lost_observed(o) => "spec.recovery.automatic (source latest)".to_string(),
        None if view.request().is_some() && loss_reported(o) => {
            let seen = match &o.etcd {
                EtcdView::Members(_) => {
                    let answering = o.voters().iter().filter(|m| m.revision.is_some()).count();
                    format!(
                        "quorum is lost and {answering} of {} voting members answer the controller",
                        o.voters().len()
                    )
                }
                _ => "no etcd member answers the controller".to_string(),
            };
            let evidence = Evidence::of(o);
            return Some(Hold::wait(
                reason::RECOVERY_WAITING,
                format!(
                    "{seen}; {}: the silent members may be stalled, or serving clients behind a network partition, so spec.recovery.automatic waits until the infrastructure reports the Machines of a majority ({} of {}) gone or failed; to recover anyway, set the annotation {RECOVER_ANNOTATION}",
                    evidence.describe(),
                    rules::quorum(evidence.voters.len()),
                    evidence.voters.len()
                ),
            ));
        }
        None => return None,
    };
    Some(match check(o, view)? {
        Ok(record) => Hold::wait(
            reason::RECOVERING,
            format!("recovering from {} ({asked})", record.source.describe()),
        ),
        Err(why) => Hold::refuse(
            reason::RECOVERY_REFUSED,
            format!(
                "{asked} {why}; nothing is changed or deleted{}",
                if view.requested.is_some() {
                    " (remove the annotation once read)"
                } else {
                    ""
                }
            ),
        ),
    })
}

// Status.

/// `status.recovery` as the step leaves it (recorded before the step is taken), and
/// `status.lastRecovery` once the cluster is back.
pub fn record_status(
    status: &mut EtcdadmClusterStatus,
    o: &Observation,
    step: Option<&RecoveryStep>,
    now: &Time,
) {
    let Some(RecoveryStep { record, action }) = step else {
        return;
    };
    let started = status
        .recovery
        .as_ref()
        .and_then(|r| r.started.clone())
        .unwrap_or_else(|| now.clone());
    let requested = o
        .view::<Recovery>()
        .view
        .as_ref()
        .and_then(|r| r.request().map(str::to_string));
    match action {
        RecoveryAction::Abandon => status.recovery = None,
        RecoveryAction::Finish => {
            let deltas = status.recovery.as_ref().and_then(|r| r.deltas.clone());
            let snapshot_revision = o.view::<RestoreFrom>().view.as_ref().and_then(|r| r.revision);
            let revision = deltas.as_ref().map(|d| d.revision).or(snapshot_revision);
            let same = |last: &LastRecovery| {
                last.snapshot == record.snapshot && last.started.as_ref() == Some(&started)
            };
            if !status.last_recovery.as_ref().is_some_and(same) {
                status.last_recovery = Some(LastRecovery {
                    requested: record.requested.clone(),
                    source: record.source.describe(),
                    snapshot: record.snapshot.clone(),
                    revision,
                    revisions_lost: record
                        .survivor_revision
                        .zip(revision)
                        .map(|(survivor, restored)| (survivor - restored).max(0)),
                    started: Some(started),
                    time: Some(now.clone()),
                    revision_bumped: Some(restore::revision_bumped(o, snapshot_revision)),
                    control_plane_rollout: None,
                    deltas,
                });
            }
            // Kept until the annotation is gone, so a crash between the two finishes the job.
            if requested.is_none() {
                status.recovery = None;
            }
        }
        RecoveryAction::SnapshotSurvivor { .. }
        | RecoveryAction::DeleteMachines { .. }
        | RecoveryAction::Reset { .. } => {
            status.recovery = Some(RecoveryStatus {
                requested: record.requested.clone(),
                source: record.source.describe(),
                phase: record.phase,
                snapshot: record.snapshot.clone(),
                survivor_revision: record.survivor_revision,
                started: Some(started),
                deltas: None,
            })
        }
    }
}

/// The `Recovery` condition while a request or a recovery is there, and the Warning Event of a
/// new refusal.
pub fn condition(
    status: &mut EtcdadmClusterStatus,
    o: &Observation,
    old: &[conditions::Condition],
    now: &Time,
) -> Option<EventNote> {
    let generation = o.etcd_cluster.metadata.generation;
    let old_answer = conditions::find(old, RECOVERY).map(|c| (c.reason.clone(), c.message.clone()));
    match answer(o) {
        Some(Hold {
            reason,
            message,
            kind: HoldKind::Refuse,
        }) => {
            let refusal = NewCondition::false_(RECOVERY, Severity::Warning, reason, message.clone());
            conditions::set(&mut status.conditions, refusal, generation, now);
            (old_answer != Some((Some(reason.to_string()), Some(message.clone()))))
                .then(|| EventNote::warning(reason, message))
        }
        Some(Hold { reason, message, .. }) => {
            let progress = NewCondition::false_(RECOVERY, Severity::Info, reason, message);
            conditions::set(&mut status.conditions, progress, generation, now);
            None
        }
        None => {
            status.conditions.retain(|c| c.type_ != RECOVERY);
            None
        }
    }
}

#[cfg(test)]
mod tests;
