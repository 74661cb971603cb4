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

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::condition::RECOVERY;
use etcdadm_shared::api::cluster::{LastRecovery, RecoveryPhase, RecoveryStatus};
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::error::Error;
use etcdadm_shared::names::{self, RECOVER_ANNOTATION};

use super::{control_plane, machines, restore};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Hold, HoldKind, Outputs, StatusPart,
    WAIT_REQUEUE,
};
use crate::controller::observation::{
    AlarmKind, EtcdView, Observation, RecoveryRecord, RecoverySource, RecoveryView, SnapshotCheck, is_ready,
};
use crate::controller::rules::{
    self,
    reason::{MEMBERS_UNREACHABLE, QUORUM_LOST},
};
use crate::snapshot::new_snapshot;

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
        if let (RecoveryAction::Finish, Some(restore)) = (&self.action, &o.restore) {
            let revision = restore
                .revision
                .map(|r| format!(" at revision {r}"))
                .unwrap_or_default();
            note = format!("{note}: {} members restored{revision}", o.replicas);
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
    let view = o.recovery.as_ref()?;
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

/// An automatic recovery's evidence (docs/safety.md, "Quorum loss"): the loss observed, never
/// inferred from silence. Quorum lost with a voter that answers and follows no leader (its own
/// view shows no quorum), or the infrastructure reporting the majority's Machines failed or
/// gone. With no member answering and the Machines standing, the members may serve behind a
/// partition: that is waited out.
pub fn majority_lost_observed(o: &Observation) -> bool {
    if !o.initialized_now() {
        return false;
    }
    let replicas = usize::try_from(o.replicas).unwrap_or(0);
    let standing = o.active_machines().filter(|m| m.was_member && !m.failed).count();
    let machines_lost = replicas > 0 && standing < rules::quorum(replicas);
    match &o.etcd {
        EtcdView::Members(_) => {
            let lost = rules::quorum_lost(o).is_some_and(|hold| hold.reason == QUORUM_LOST);
            lost && (machines_lost || o.voters().iter().any(|m| m.no_leader))
        }
        EtcdView::Unreachable { .. } => machines_lost,
        EtcdView::NotChecked => false,
    }
}

/// The answer to a recovery request or the state of one under way, for the `Recovery`
/// condition: a refusal, or a wait that says where the recovery is.
pub fn answer(o: &Observation) -> Option<Hold> {
    let view = o.recovery.as_ref()?;
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
            let seen = if matches!(o.etcd, EtcdView::Unreachable { .. }) {
                "no etcd member answers the controller, but their Machines stand"
            } else {
                "the members that answer still follow a leader, and the Machines stand"
            };
            return Some(Hold::wait(
                reason::RECOVERY_WAITING,
                format!(
                    "{seen}: the members may be serving behind a network partition, so spec.recovery.automatic waits for evidence of a lost majority (a member reporting no leader, or the infrastructure reporting the Machines failed); to recover anyway, set the annotation {RECOVER_ANNOTATION}"
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
    let requested = o.recovery.as_ref().and_then(|r| r.request());
    match action {
        RecoveryAction::Abandon => status.recovery = None,
        RecoveryAction::Finish => {
            let revision = o.restore.as_ref().and_then(|r| r.revision);
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
                    revision_bumped: Some(restore::revision_bumped(o, revision)),
                    control_plane_rollout: None,
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

// Effects.

/// Create the EtcdadmSnapshot `name` of Machine `machine`'s member (the snapshot controller
/// takes it without quorum); one that exists already is kept.
async fn snapshot_survivor(
    out: &Outputs<'_>,
    o: &Observation,
    name: &str,
    machine: &str,
) -> Result<Applied, Error> {
    let snapshot = new_snapshot(&o.etcd_cluster, name, Some(machine));
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

/// Delete the lost cluster's `<cluster>-etcd-init`: the restored first member publishes its own.
async fn reset(out: &Outputs<'_>, o: &Observation, cluster: Option<&str>) -> Result<Applied, Error> {
    let Some(cluster) = cluster else {
        return Ok(Applied::AlreadyDone);
    };
    let name = names::init_secret_name(cluster);
    match Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Applied::Done),
        Err(e) => Err(e.into()),
    }
}

/// Remove the `recover` annotation (status recorded the recovery first).
async fn finish(out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    if !etcd.annotations().contains_key(names::RECOVER_ANNOTATION) {
        return Ok(Applied::AlreadyDone);
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch = json!({ "metadata": { "annotations": { names::RECOVER_ANNOTATION: null } } });
    Api::<etcdadm_shared::api::EtcdadmCluster>::namespaced(out.client.clone(), &o.namespace)
        .patch(&etcd.name_any(), &params, &Patch::Merge(patch))
        .await?;
    Ok(Applied::Done)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::*;
    use crate::controller::testing::{plan, reason};
    use std::time::Duration;

    use etcdadm_shared::api::cluster::RecoveryPhase;
    use etcdadm_shared::api::snapshot::SnapshotPhase;

    use crate::controller::plan::versions::VERSION_FIELD;

    /// Three members, two of them dead (the survivor m0 at revision 100): quorum lost.
    fn lost(requested: &str) -> Observation {
        let mut o = running(3);
        for (i, m) in members_mut(&mut o).iter_mut().enumerate() {
            m.revision = Some(100 - i as i64);
        }
        for i in [1, 2] {
            members_mut(&mut o)[i] = unhealthy(members_mut(&mut o)[i].clone(), "connection refused");
            members_mut(&mut o)[i].revision = None;
        }
        // The survivor answers and, alone, follows no leader; every Machine was a member.
        members_mut(&mut o)[0] = unhealthy(members_mut(&mut o)[0].clone(), "RAFT NO LEADER");
        members_mut(&mut o)[0].no_leader = true;
        members_mut(&mut o)[0].is_leader = false;
        for machine in &mut o.machines {
            machine.was_member = true;
        }
        o.recovery = Some(RecoveryView {
            requested: Some(requested.into()),
            store_configured: true,
            snapshot: None,
            under_way: None,
            automatic: None,
        });
        o
    }

    fn nightly(problem: Option<&str>) -> Option<SnapshotCheck> {
        Some(SnapshotCheck {
            name: "nightly".into(),
            problem: problem.map(String::from),
            etcd_version: Some("3.5.9".into()),
        })
    }

    /// `o` with the recovery `record` under way and its snapshot in `phase`.
    fn under_way(mut o: Observation, record: RecoveryRecord, phase: Option<SnapshotPhase>) -> Observation {
        o.recovery.as_mut().unwrap().under_way = Some(UnderWay {
            record,
            snapshot_phase: phase,
            snapshot_failure: (phase == Some(SnapshotPhase::Failed))
                .then(|| "MemberUnreachable: refused".into()),
        });
        o
    }

    fn record(phase: RecoveryPhase) -> RecoveryRecord {
        RecoveryRecord {
            requested: "latest".into(),
            source: RecoverySource::Member("c1-etcd-m0".into()),
            phase,
            snapshot: "c1-etcd-fresh-recovery".into(),
            survivor_revision: Some(100),
        }
    }

    fn action(step: &Step) -> (&RecoveryRecord, &RecoveryAction) {
        match step {
            Step::Recover(RecoveryStep { record, action }) => (&**record, action),
            other => panic!("expected a recovery step, got {other:?}"),
        }
    }

    #[test]
    fn sources_parse_and_anything_else_is_named_wrong() {
        assert_eq!(RecoverySource::parse("latest"), Ok(RecoverySource::Latest));
        assert_eq!(
            RecoverySource::parse(" member/c1-etcd-m1 "),
            Ok(RecoverySource::Member("c1-etcd-m1".into()))
        );
        assert_eq!(
            RecoverySource::parse("snapshot/nightly"),
            Ok(RecoverySource::Snapshot("nightly".into()))
        );
        for bad in [
            "",
            "Latest",
            "member/",
            "snapshot/",
            "member/a/b",
            "machine/m1",
            "true",
        ] {
            assert!(RecoverySource::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_refusal_names_its_cause_and_writes_nothing() {
        let healthy = {
            let mut o = running(3);
            o.recovery = lost("latest").recovery;
            o
        };
        let one_dead = {
            let mut o = running(3);
            members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
            o.recovery = lost("latest").recovery;
            o
        };
        let never_initialized = {
            let mut o = base();
            o.recovery = lost("latest").recovery;
            o
        };
        let no_store = |requested: &str| {
            let mut o = lost(requested);
            o.recovery.as_mut().unwrap().store_configured = false;
            o
        };
        let with_snapshot = |requested: &str, check: Option<SnapshotCheck>| {
            let mut o = lost(requested);
            o.recovery.as_mut().unwrap().snapshot = check;
            o
        };
        let nobody_answers = |check: Option<SnapshotCheck>| {
            let mut o = with_snapshot("latest", check);
            members_mut(&mut o)[0].revision = None;
            o
        };
        let other_minor = {
            let mut o = with_snapshot("snapshot/nightly", nightly(None));
            o.spec_version = Some((VERSION_FIELD.into(), "3.4.23".into()));
            o
        };
        let cases: Vec<(&str, Observation, &str)> = vec![
            ("not a source", lost("yes please"), "is not a recovery source"),
            ("healthy", healthy, "quorum is not lost (3 of 3"),
            ("one of three dead", one_dead, "quorum is not lost (2 of 3"),
            ("never initialized", never_initialized, "quorum is not lost"),
            ("latest, no store", no_store("latest"), "needs an object store"),
            (
                "member, no store",
                no_store("member/c1-etcd-m0"),
                "needs an object store",
            ),
            (
                "member of no Machine",
                lost("member/c9"),
                "Machine c9 is not a member Machine",
            ),
            (
                "a member that does not answer",
                lost("member/c1-etcd-m2"),
                "the member of Machine c1-etcd-m2 does not answer",
            ),
            (
                "unusable snapshot",
                with_snapshot(
                    "snapshot/nightly",
                    nightly(Some("EtcdadmSnapshot nightly is Failed, not Succeeded")),
                ),
                "is Failed, not Succeeded",
            ),
            (
                "latest, nobody answers, no snapshot",
                nobody_answers(None),
                "no Succeeded EtcdadmSnapshot",
            ),
            ("another minor version", other_minor, "was taken from etcd 3.5.9"),
        ];
        for (what, o, says) in cases {
            let step = super::answer(&o).unwrap();
            assert_eq!(wait_reason(&step), reason::RECOVERY_REFUSED, "{what}: {step:?}");
            assert!(step.is_refusal() && !step.writes(), "{what}");
            let message = wait_message(&step);
            assert!(message.contains(says), "{what}: {message}");
            assert!(
                message.contains("etcdcluster.cluster.x-k8s.io/recover="),
                "{what}: {message}"
            );
            assert!(
                message.contains("nothing is changed or deleted"),
                "{what}: {message}"
            );
            // The plan goes on as if nothing was asked.
            let mut unasked = o.clone();
            unasked.recovery = None;
            assert_eq!(plan(&o), plan(&unasked), "{what}");
        }
    }

    #[test]
    fn latest_snapshots_the_survivor_with_the_highest_revision_first() {
        let mut o = lost("latest");
        // Two survivors of five: m1 is further ahead.
        o.replicas = 5;
        for i in 3..5 {
            o.machines.push(machine(
                &format!("c1-etcd-m{i}"),
                Some(&format!("10.0.0.{}", i + 1)),
                None,
            ));
            let mut dead = member(
                i as u64 + 1,
                &format!("c1-etcd-m{i}"),
                &format!("10.0.0.{}", i + 1),
            );
            dead = unhealthy(dead, "connection refused");
            members_mut(&mut o).push(dead);
        }
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "no leader");
        members_mut(&mut o)[1].revision = Some(120);
        let step = plan(&o);
        let (record, act) = action(&step);
        assert_eq!(
            act,
            &RecoveryAction::SnapshotSurvivor {
                machine: "c1-etcd-m1".into()
            }
        );
        assert_eq!(record.phase, RecoveryPhase::Snapshotting);
        assert_eq!(record.source, RecoverySource::Member("c1-etcd-m1".into()));
        assert_eq!(record.survivor_revision, Some(120));
        assert_eq!(record.snapshot, "c1-etcd-fresh-recovery");
        assert!(step.event(&o).unwrap().note.contains("c1-etcd-m1 (revision 120)"));
        // Nobody answers: the newest Succeeded snapshot, and the Machines go at once.
        for m in members_mut(&mut o) {
            m.revision = None;
        }
        o.recovery.as_mut().unwrap().snapshot = nightly(None);
        let step = plan(&o);
        let (record, act) = action(&step);
        assert_eq!(record.source, RecoverySource::Snapshot("nightly".into()));
        assert_eq!(
            (record.phase, record.survivor_revision),
            (RecoveryPhase::Replacing, None)
        );
        assert!(matches!(act, RecoveryAction::DeleteMachines { names } if names.len() == 5));
    }

    #[test]
    fn the_sequence_resumes_from_what_status_recorded() {
        let o = lost("latest");
        // Snapshotting: created if missing, waited for, failed → refused, succeeded → replace.
        let missing = under_way(o.clone(), record(RecoveryPhase::Snapshotting), None);
        assert!(
            matches!(action(&plan(&missing)).1, RecoveryAction::SnapshotSurvivor { machine } if machine == "c1-etcd-m0")
        );
        let running = under_way(
            o.clone(),
            record(RecoveryPhase::Snapshotting),
            Some(SnapshotPhase::Running),
        );
        assert_eq!(wait_reason(&plan(&running)), reason::RECOVERING);
        let failed = under_way(
            o.clone(),
            record(RecoveryPhase::Snapshotting),
            Some(SnapshotPhase::Failed),
        );
        let step = plan(&failed);
        assert_eq!(wait_reason(&step), reason::RECOVERY_FAILED);
        assert!(
            wait_message(&step).contains("nothing was deleted") && wait_message(&step).contains("refused")
        );
        assert_eq!(super::answer(&failed).as_ref(), step.held());
        let taken = under_way(
            o.clone(),
            record(RecoveryPhase::Snapshotting),
            Some(SnapshotPhase::Succeeded),
        );
        let step = plan(&taken);
        let (next, act) = action(&step);
        assert_eq!(next.phase, RecoveryPhase::Replacing);
        assert_eq!(
            act,
            &RecoveryAction::DeleteMachines {
                names: vec!["c1-etcd-m0".into(), "c1-etcd-m1".into(), "c1-etcd-m2".into()]
            }
        );
        // The annotation removed before anything was deleted: dropped.
        let mut dropped = missing.clone();
        dropped.recovery.as_mut().unwrap().requested = None;
        assert_eq!(action(&plan(&dropped)).1, &RecoveryAction::Abandon);

        // Replacing: hooks released on Machines being deleted; then waited for; then the reset.
        let mut replacing = under_way(
            o.clone(),
            record(RecoveryPhase::Replacing),
            Some(SnapshotPhase::Succeeded),
        );
        replacing.recovery.as_mut().unwrap().requested = None;
        replacing.machines[0].deleting = true;
        replacing.machines[1].deleting = true;
        replacing.machines[1].has_hook = false;
        replacing.machines.remove(2);
        assert_eq!(
            action(&plan(&replacing)).1,
            &RecoveryAction::DeleteMachines {
                names: vec!["c1-etcd-m0".into()]
            }
        );
        replacing.machines[0].has_hook = false;
        assert_eq!(wait_reason(&plan(&replacing)), reason::RECOVERING);
        replacing.machines.clear();
        replacing.etcd = EtcdView::NotChecked;
        let step = plan(&replacing);
        let (next, act) = action(&step);
        assert_eq!(
            (next.phase, act),
            (
                RecoveryPhase::Restoring,
                &RecoveryAction::Reset {
                    cluster: Some("c1".into())
                }
            )
        );
    }

    #[test]
    fn a_restoring_recovery_restores_like_a_new_cluster_and_finishes_once_ready() {
        let mut o = under_way(
            lost("latest"),
            record(RecoveryPhase::Restoring),
            Some(SnapshotPhase::Succeeded),
        );
        o.machines.clear();
        o.etcd = EtcdView::NotChecked;
        o.initialized = false;
        o.init_secret = None;
        o.restore = Some(RestoreView {
            snapshot: Some("c1-etcd-fresh-recovery".into()),
            location: Some("b/k.db".into()),
            revision: Some(100),
            download: Some(download()),
            ..Default::default()
        });
        assert_eq!(plan(&o), write_restore_secret());
        with_our_secret(o.restore.as_mut().unwrap(), Duration::from_secs(1));
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine {
                purpose: Growth::Restore,
                ..
            })
        ));
        // Back to three healthy members, the Secret deleted, the KCP given the new endpoints.
        let mut ready = running(3);
        ready.recovery = o.recovery.clone();
        ready.restore = o.restore.clone();
        ready.initialized = false;
        assert_eq!(
            plan(&ready),
            Step::Restore(RestoreStep::DeleteRestoreSecret {
                uid: "restore-uid".into()
            })
        );
        ready.restore.as_mut().unwrap().secret = None;
        ready.kcp = kcp(&["https://10.9.9.9:2379"], false, true);
        ready.creation_complete = true;
        assert!(matches!(
            plan(&ready),
            Step::ControlPlane(ControlPlaneStep::WriteKcpEndpoints { .. })
        ));
        ready.kcp = kcp(
            &[
                "https://10.0.0.1:2379",
                "https://10.0.0.2:2379",
                "https://10.0.0.3:2379",
            ],
            false,
            true,
        );
        let step = plan(&ready);
        assert_eq!(action(&step).1, &RecoveryAction::Finish);
        let note = step.event(&ready).unwrap().note;
        assert!(note.contains("3 members restored at revision 100"), "{note}");
    }

    #[test]
    fn an_automatic_recovery_begins_after_its_wait_and_only_without_quorum() {
        let automatic = |unserved_secs: u64| Automatic {
            after: Duration::from_secs(600),
            unserved_for: Duration::from_secs(unserved_secs),
        };
        let mut o = lost("latest");
        let view = o.recovery.as_mut().unwrap();
        view.requested = None;
        view.automatic = Some(automatic(599));
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST, "not yet");
        assert_eq!(super::answer(&o), None);
        o.recovery.as_mut().unwrap().automatic = Some(automatic(600));
        let step = plan(&o);
        let (record, act) = action(&step);
        assert_eq!(record.requested, "automatic");
        assert!(matches!(act, RecoveryAction::SnapshotSurvivor { .. }));
        // Due but refused (no store): said, without asking to remove an annotation.
        o.recovery.as_mut().unwrap().store_configured = false;
        let message = wait_message(&super::answer(&o).unwrap());
        assert!(
            message.starts_with("spec.recovery.automatic (source latest) is refused"),
            "{message}"
        );
        assert!(!message.contains("annotation"), "{message}");
        // A cluster that never started, or one with quorum, is never recovered automatically.
        let mut starting = base();
        starting.recovery = o.recovery.clone();
        assert_eq!(super::answer(&starting), None);
        assert!(!matches!(plan(&starting), Step::Recover(RecoveryStep { .. })));
        let mut healthy = running(3);
        healthy.recovery = o.recovery.clone();
        assert_eq!(super::answer(&healthy), None);
        assert_eq!(plan(&healthy), Step::Steady);
    }

    #[test]
    fn an_automatic_recovery_needs_the_loss_observed_never_silence_or_an_alarm() {
        let due = Some(Automatic {
            after: Duration::from_secs(600),
            unserved_for: Duration::from_secs(3600),
        });
        let automatic = |mut o: Observation| {
            let view = o.recovery.as_mut().unwrap();
            view.requested = None;
            view.automatic = due;
            o
        };
        let is_recovery = |step: &Step| matches!(step, Step::Recover(_));
        // No member answers the controller (a partition), every Machine standing: nothing is
        // deleted however long it lasts; the Recovery condition says why, and the annotation
        // still works.
        let mut partition = automatic(lost("latest"));
        partition.etcd = EtcdView::Unreachable {
            message: "https://10.0.0.1:2379: timed out".into(),
        };
        let step = plan(&partition);
        assert_eq!(wait_reason(&step), reason::MEMBERS_UNREACHABLE, "{step:?}");
        let answer = super::answer(&partition).unwrap();
        assert_eq!(answer.reason, reason::RECOVERY_WAITING);
        assert!(answer.message.contains("network partition"), "{}", answer.message);
        let mut by_hand = partition.clone();
        by_hand.recovery.as_mut().unwrap().requested = Some("snapshot/nightly".into());
        by_hand.recovery.as_mut().unwrap().snapshot = nightly(None);
        assert!(
            is_recovery(&plan(&by_hand)),
            "the annotation recovers from silence"
        );
        // The same silence with the majority's Machines failed is evidence.
        let mut failed = partition.clone();
        failed.recovery.as_mut().unwrap().snapshot = nightly(None);
        for machine in &mut failed.machines[1..] {
            machine.failed = true;
        }
        assert!(is_recovery(&plan(&failed)), "{:?}", plan(&failed));
        // Two members cut off while the one that answers follows a leader: not observed.
        let mut cut_off = automatic(lost("latest"));
        members_mut(&mut cut_off)[0] = member(1, "c1-etcd-m0", "10.0.0.1");
        members_mut(&mut cut_off)[0].healthy = false;
        members_mut(&mut cut_off)[0].revision = Some(100);
        assert_eq!(wait_reason(&plan(&cut_off)), reason::QUORUM_LOST);
        assert_eq!(super::answer(&cut_off).unwrap().reason, reason::RECOVERY_WAITING);
        // Its own view shows no quorum: observed.
        members_mut(&mut cut_off)[0].no_leader = true;
        assert!(is_recovery(&plan(&cut_off)));
        // Every member serving with NOSPACE raised is no loss at all: never due, and a person's
        // request is refused naming the alarm.
        let mut full = automatic(lost("latest"));
        full.etcd = running(3).etcd;
        full.alarms = vec![Alarm {
            member_id: 1,
            kind: AlarmKind::NoSpace,
        }];
        assert!(!is_recovery(&plan(&full)));
        assert_eq!(super::answer(&full), None);
        full.recovery.as_mut().unwrap().requested = Some("latest".into());
        let refusal = super::answer(&full).unwrap();
        assert_eq!(refusal.reason, reason::RECOVERY_REFUSED);
        assert!(
            refusal.message.contains("quorum is not lost (3 of 3")
                && refusal.message.contains("raised NOSPACE"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn quorum_loss_is_waited_out_without_the_annotation() {
        let mut o = lost("latest");
        o.recovery = None;
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
        assert_eq!(super::answer(&o), None);
    }

    #[test]
    fn a_refused_request_never_holds_back_a_healthy_clusters_changes() {
        let mut o = running(3);
        o.recovery = lost("latest").recovery;
        o.replicas = 5;
        assert_eq!(wait_reason(&super::answer(&o).unwrap()), reason::RECOVERY_REFUSED);
        assert!(
            matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
            "{:?}",
            plan(&o)
        );
    }
}
