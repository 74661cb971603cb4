//! Snapshots before disruptive changes (docs/day2.md, "Snapshots before changes"): while
//! `spec.backup` is set, the first removal of a rolling replacement and of a scale-down waits
//! until an EtcdadmSnapshot labelled with the change's reason has Succeeded holding at least
//! the cluster's revision when the change was decided. That revision and the snapshot are
//! recorded in `status.beforeChange` when the change is first seen, so a restarted controller
//! waits for the same snapshot; a Succeeded one younger than `beforeChange.maxAge` that holds
//! the revision is reused. A failed one holds the change with its reason, until it is deleted
//! (another is taken) or the `proceed-without-snapshot` annotation lets this one change go
//! ahead without it (the annotation is then removed). A dead member's removal never waits.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::BeforeChangeStatus;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::error::Error;
use etcdadm_shared::names::{
    BEFORE_ROLLOUT, BEFORE_SCALE_DOWN, PROCEED_WITHOUT_SNAPSHOT_ANNOTATION, SNAPSHOT_REASON_LABEL,
};

use crate::controller::decision::reason::{ROLLING_UPDATE, SCALING_DOWN};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Hold, Outputs, StatusPart,
};
use crate::controller::observation::{BeforeChangeView, Observation, SnapshotSummary};
use crate::snapshot::new_snapshot;

/// Condition reasons of a change waiting for its snapshot.
pub mod reason {
    pub const WAITING_FOR_SNAPSHOT: &str = "WaitingForBeforeChangeSnapshot";
    pub const SNAPSHOT_FAILED: &str = "BeforeChangeSnapshotFailed";
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
}

impl ConcernStep for SafeChangeStep {
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
            SafeChangeStep::ProceedWithout { .. } => {
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
            SafeChangeStep::TakeSnapshot { .. } | SafeChangeStep::ProceedWithout { .. } => After::Again,
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
            decided: None,
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
    let view = o.before_change.as_ref()?;
    let reason = change(o)?;
    let record = record(o, view, reason);
    if record.proceeded_without || satisfying(view, &record).is_some() {
        return None;
    }
    let own = record
        .snapshot
        .as_deref()
        .and_then(|name| view.snapshots.iter().find(|s| s.name == name));
    let held = match own {
        Some(s) if s.phase == SnapshotPhase::Failed => Hold::refuse(
            reason::SNAPSHOT_FAILED,
            format!(
                "the {} waits for its before-change snapshot, and EtcdadmSnapshot {} failed: {}; delete it to take \
                 another, or annotate {PROCEED_WITHOUT_SNAPSHOT_ANNOTATION} to go ahead without one",
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
            if view.proceed_without {
                return Some(proceed_without(reason, "none was taken"));
            }
            return Some(Decision::Do(SafeChangeStep::TakeSnapshot {
                name: format!("{}-{reason}", o.new_member_name),
                reason,
                revision: record.revision,
            }));
        }
    };
    if view.proceed_without {
        return Some(proceed_without(reason, &held.message));
    }
    Some(Decision::Hold(held))
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
    let (Some(view), Some(reason)) = (o.before_change.as_ref(), change(o)) else {
        status.before_change = None;
        return;
    };
    let mut record = record(o, view, reason);
    let kept = status
        .before_change
        .as_ref()
        .filter(|r| r.reason == reason)
        .and_then(|r| r.decided.clone());
    record.decided = Some(kept.unwrap_or_else(|| now.clone()));
    match step {
        Some(SafeChangeStep::TakeSnapshot { name, .. }) => record.snapshot = Some(name.clone()),
        Some(SafeChangeStep::ProceedWithout { .. }) => record.proceeded_without = true,
        None => {
            if record.snapshot.is_none()
                && let Some(reused) = satisfying(view, &record)
            {
                record.snapshot = Some(reused.name.clone());
            }
        }
    }
    status.before_change = Some(record);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;
    use std::time::Duration;

    /// `running(3)` with a store, every member at revision 100.
    fn backed_up(snapshots: Vec<SnapshotSummary>, record: Option<BeforeChangeRecord>) -> Observation {
        let mut o = running(3);
        for m in members_mut(&mut o) {
            m.revision = Some(100);
        }
        o.before_change = Some(BeforeChangeView {
            max_age: Duration::from_secs(600),
            record,
            snapshots,
            proceed_without: false,
        });
        o
    }

    fn snap(
        name: &str,
        phase: SnapshotPhase,
        revision: Option<i64>,
        age_secs: Option<u64>,
    ) -> SnapshotSummary {
        SnapshotSummary {
            name: name.into(),
            phase,
            revision,
            age: age_secs.map(Duration::from_secs),
            message: (phase == SnapshotPhase::Failed).then(|| "StoreUnreachable: connection refused".into()),
        }
    }

    fn recorded(reason: &str, snapshot: Option<&str>) -> Option<BeforeChangeRecord> {
        Some(BeforeChangeRecord {
            reason: reason.into(),
            revision: Some(100),
            snapshot: snapshot.map(String::from),
            proceeded_without: false,
        })
    }

    /// Each disruptive kind: a rollout (maxSurge 0, remove first), a rollout's removal after
    /// its surge, a scale-down.
    fn disruptive(o: Observation) -> Vec<(&'static str, &'static str, Observation)> {
        let mut remove_first = o.clone();
        remove_first.max_surge = 0;
        outdate_all(&mut remove_first);
        let mut after_surge = o.clone();
        outdate_all(&mut after_surge);
        after_surge
            .machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), None));
        let mut new = member(9, "c1-etcd-n1", "10.0.1.1");
        new.is_leader = false;
        new.revision = Some(100);
        members_mut(&mut after_surge).push(new);
        after_surge.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&after_surge),
        });
        let mut scale_down = o;
        scale_down.replicas = 1;
        vec![
            ("rollout, remove first", BEFORE_ROLLOUT, remove_first),
            ("rollout, after its surge", BEFORE_ROLLOUT, after_surge),
            ("scale down", BEFORE_SCALE_DOWN, scale_down),
        ]
    }

    fn is_removal(step: &Step) -> bool {
        matches!(
            step,
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Rollout | Removal::ScaleDown,
                ..
            })
        )
    }

    #[test]
    fn a_snapshot_is_required_before_each_disruptive_kind_and_its_record_kept() {
        for (what, label, o) in disruptive(backed_up(vec![], None)) {
            let step = plan(&o);
            assert_eq!(
                step,
                Step::SafeChanges(SafeChangeStep::TakeSnapshot {
                    name: format!("c1-etcd-fresh-{label}"),
                    reason: label,
                    revision: Some(100),
                }),
                "{what}"
            );
            let event = step.event(&o).unwrap();
            assert!(
                event.note.contains("holding revision 100 or later"),
                "{what}: {}",
                event.note
            );
            // Status records the decision and the snapshot before it is created.
            let mut status = EtcdadmClusterStatus::default();
            let Step::SafeChanges(taken) = &step else { panic!() };
            let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            record_status(&mut status, &o, Some(taken), &now);
            let stored = status.before_change.clone().unwrap();
            assert_eq!(
                (
                    stored.reason.as_str(),
                    stored.revision,
                    stored.snapshot.as_deref()
                ),
                (label, Some(100), Some(format!("c1-etcd-fresh-{label}").as_str())),
                "{what}"
            );
            // A restarted controller waits for that same snapshot, whatever name it would draw.
            let mut waiting = o.clone();
            waiting.new_member_name = "c1-etcd-other".into();
            let view = waiting.before_change.as_mut().unwrap();
            view.record = recorded(label, stored.snapshot.as_deref());
            view.snapshots = vec![snap(
                &format!("c1-etcd-fresh-{label}"),
                SnapshotPhase::Running,
                None,
                None,
            )];
            let held = plan(&waiting);
            assert_eq!(wait_reason(&held), reason::WAITING_FOR_SNAPSHOT, "{what}");
            assert!(!held.writes() && !held.is_refusal());
            // Succeeded at or beyond the decision's revision: the removal goes ahead.
            let view = waiting.before_change.as_mut().unwrap();
            view.snapshots = vec![snap(
                &format!("c1-etcd-fresh-{label}"),
                SnapshotPhase::Succeeded,
                Some(104),
                Some(7200),
            )];
            assert!(is_removal(&plan(&waiting)), "{what}: {:?}", plan(&waiting));
            // Once the change is done, the record goes.
            let mut done = running(3);
            done.before_change = waiting.before_change.clone();
            record_status(&mut status, &done, None, &now);
            assert_eq!(status.before_change, None, "{what}");
        }
    }

    #[test]
    fn a_fresh_snapshot_holding_the_revision_is_reused() {
        let reusable =
            |age: u64, revision: i64| snap("nightly", SnapshotPhase::Succeeded, Some(revision), Some(age));
        for (what, label, o) in disruptive(backed_up(vec![reusable(300, 100)], None)) {
            assert!(is_removal(&plan(&o)), "{what}: {:?}", plan(&o));
            let mut status = EtcdadmClusterStatus::default();
            record_status(
                &mut status,
                &o,
                None,
                &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            );
            let stored = status.before_change.unwrap();
            assert_eq!(
                (stored.reason.as_str(), stored.snapshot.as_deref()),
                (label, Some("nightly"))
            );
        }
        // Too old, or older than the decision's revision: a new one is taken.
        for stale in [reusable(601, 100), reusable(60, 99)] {
            for (what, _, o) in disruptive(backed_up(vec![stale.clone()], None)) {
                assert!(
                    matches!(plan(&o), Step::SafeChanges(SafeChangeStep::TakeSnapshot { .. })),
                    "{what}: {stale:?}"
                );
            }
        }
    }

    #[test]
    fn a_failed_snapshot_holds_the_change_with_its_reason_until_deleted() {
        for (what, label, o) in disruptive(backed_up(vec![], None)) {
            let mut failed = o.clone();
            let view = failed.before_change.as_mut().unwrap();
            view.record = recorded(label, Some("c1-etcd-x-before"));
            view.snapshots = vec![snap("c1-etcd-x-before", SnapshotPhase::Failed, None, Some(5))];
            let step = plan(&failed);
            assert_eq!(wait_reason(&step), reason::SNAPSHOT_FAILED, "{what}");
            assert!(step.is_refusal() && !step.writes());
            let message = wait_message(&step);
            assert!(
                message.contains("StoreUnreachable: connection refused"),
                "{message}"
            );
            assert!(message.contains(PROCEED_WITHOUT_SNAPSHOT_ANNOTATION), "{message}");
            // Deleted by the operator: another is taken.
            failed.before_change.as_mut().unwrap().snapshots.clear();
            assert!(matches!(
                plan(&failed),
                Step::SafeChanges(SafeChangeStep::TakeSnapshot { .. })
            ));
        }
    }

    #[test]
    fn the_override_annotation_lets_one_change_go_ahead_and_is_removed() {
        for (what, label, o) in disruptive(backed_up(vec![], None)) {
            let mut asked = o.clone();
            let view = asked.before_change.as_mut().unwrap();
            view.record = recorded(label, Some("c1-etcd-x-before"));
            view.snapshots = vec![snap("c1-etcd-x-before", SnapshotPhase::Failed, None, Some(5))];
            view.proceed_without = true;
            let step = plan(&asked);
            let Step::SafeChanges(used @ SafeChangeStep::ProceedWithout { .. }) = &step else {
                panic!("{what}: {step:?}")
            };
            assert!(step.event(&asked).unwrap().warning);
            let mut status = EtcdadmClusterStatus::default();
            let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            record_status(&mut status, &asked, Some(used), &now);
            assert!(status.before_change.as_ref().unwrap().proceeded_without);
            // The annotation is gone: this change goes ahead, the snapshot still Failed.
            let view = asked.before_change.as_mut().unwrap();
            view.proceed_without = false;
            view.record.as_mut().unwrap().proceeded_without = true;
            assert!(is_removal(&plan(&asked)), "{what}: {:?}", plan(&asked));
            // The next change needs its snapshot again.
            record_status(&mut status, &running(3), None, &now);
            assert_eq!(status.before_change, None);
        }
    }

    #[test]
    fn remediation_of_a_dead_member_and_a_cluster_without_a_store_never_wait() {
        // A dead member, remediated: no snapshot asked for, even mid-rollout.
        let mut dead = backed_up(vec![], None);
        members_mut(&mut dead)[2] = unhealthy(members_mut(&mut dead)[2].clone(), "connection refused");
        members_mut(&mut dead)[2].unhealthy_for = dead.remediation.unhealthy_after * 2;
        dead.machines[2].unhealthy_for = dead.remediation.unhealthy_after * 2;
        assert!(
            matches!(
                plan(&dead),
                Step::Machines(MachineStep::DeleteMachine {
                    purpose: Removal::Remediation { .. },
                    ..
                })
            ),
            "{:?}",
            plan(&dead)
        );
        // A rollout's dead victim goes at once too.
        let mut dead_victim = backed_up(vec![], None);
        outdate_all(&mut dead_victim);
        dead_victim
            .machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), None));
        members_mut(&mut dead_victim).push(member(9, "c1-etcd-n1", "10.0.1.1"));
        members_mut(&mut dead_victim)[1] = unhealthy(members_mut(&mut dead_victim)[1].clone(), "down");
        assert!(matches!(
            plan(&dead_victim),
            Step::Machines(MachineStep::DeleteMachine { machine, .. }) if machine == "c1-etcd-m1"
        ));
        // Without spec.backup nothing waits.
        for (what, _, mut o) in disruptive(backed_up(vec![], None)) {
            o.before_change = None;
            assert!(is_removal(&plan(&o)), "{what}: {:?}", plan(&o));
        }
    }

    #[test]
    fn a_whole_rollout_or_scale_down_takes_one_snapshot_before_its_first_removal_and_proceeds() {
        let rollout = |kcp: bool, surge: i32| {
            let mut o = zoned(3, kcp);
            o.max_surge = surge;
            outdate_all(&mut o);
            o
        };
        let scale_down = {
            let mut o = zoned(3, false);
            o.replicas = 1;
            o
        };
        for (what, mut o, label) in [
            ("rollout without a KCP", rollout(false, 1), BEFORE_ROLLOUT),
            (
                "rollout with a KCP, surge then switch",
                rollout(true, 1),
                BEFORE_ROLLOUT,
            ),
            ("rollout with a KCP, maxSurge 0", rollout(true, 0), BEFORE_ROLLOUT),
            ("scale down 3 to 1", scale_down, BEFORE_SCALE_DOWN),
        ] {
            o.before_change = backed_up(vec![], None).before_change;
            let mut steps = vec![];
            for _ in 0..200 {
                let step = plan(&o);
                if step == Step::Steady {
                    break;
                }
                let view = o.before_change.as_mut().unwrap();
                match &step {
                    // The snapshot controller takes it at once.
                    Step::SafeChanges(SafeChangeStep::TakeSnapshot { name, reason, .. }) => {
                        view.record = recorded(reason, Some(name));
                        view.snapshots
                            .push(snap(name, SnapshotPhase::Succeeded, Some(120), Some(1)));
                    }
                    other => {
                        let mut w = World::new(o.clone());
                        w.apply(other);
                        o = w.o;
                    }
                }
                steps.push(step);
            }
            assert_eq!(plan(&o), Step::Steady, "{what}: {steps:#?}");
            let taken: Vec<&Step> = steps
                .iter()
                .filter(|s| matches!(s, Step::SafeChanges(SafeChangeStep::TakeSnapshot { .. })))
                .collect();
            assert_eq!(taken.len(), 1, "{what}: {steps:#?}");
            assert!(
                matches!(taken[0], Step::SafeChanges(SafeChangeStep::TakeSnapshot { reason, .. }) if *reason == label),
                "{what}"
            );
            let first_removal = steps.iter().position(is_removal).unwrap();
            let snapshot = steps
                .iter()
                .position(|s| matches!(s, Step::SafeChanges(_)))
                .unwrap();
            assert!(snapshot < first_removal, "{what}");
            assert_eq!(
                up_to_date_machines(&o),
                usize::try_from(o.replicas).unwrap(),
                "{what}"
            );
        }
    }
}
