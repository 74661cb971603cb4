//! Quorum-loss recovery (SPEC-day2.md section 3): the annotation
//! `etcdcluster.cluster.x-k8s.io/recover=<latest|member/<machine>|snapshot/<name>>` replaces a
//! cluster that lost quorum with one restored from a snapshot. A request that fails a check is
//! refused with a condition and a Warning Event, nothing deleted, the annotation left in place
//! so the user sees why.
//!
//! Membership rule 3 (no membership change without quorum) protects a cluster that can still
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

use std::time::Duration;

use etcdadm_shared::api::cluster::RecoveryPhase;
use etcdadm_shared::api::snapshot::SnapshotPhase;
use etcdadm_shared::names::RECOVER_ANNOTATION;

use super::observed::{Observed, is_ready};
use super::step::{Step, reason};
use super::{control_plane, gates, restore};

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

/// The recovery in `status.recovery`, and what its snapshot is now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnderWay {
    pub record: RecoveryRecord,
    /// The phase of its EtcdadmSnapshot; `None` while it does not exist.
    pub snapshot_phase: Option<SnapshotPhase>,
    /// Why it failed, when it did.
    pub snapshot_failure: Option<String>,
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

/// What a recovery does next; status records `record` (or, for `Finish`, the last recovery)
/// before it is taken.
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryAction {
    /// Create the EtcdadmSnapshot `record.snapshot` of Machine `machine`'s member.
    SnapshotSurvivor { machine: String },
    /// Release the hooks of these Machines and delete them, without MemberRemove.
    DeleteMachines { names: Vec<String> },
    /// The lost cluster's Machines are gone: delete its init Secret; status forgets
    /// `initialized`, so the next Machine restores a first member.
    Reset,
    /// Ready again: remove the annotation.
    Finish,
    /// The annotation was removed before any Machine was deleted: the recovery is dropped.
    Abandon,
}

/// The recovery's next step, while one is asked for and may begin, or is under way.
pub(super) fn plan(o: &Observed) -> Option<Step> {
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
                Some(SnapshotPhase::Failed) => Some(Step::Refuse {
                    reason: reason::RECOVERY_FAILED,
                    message: format!(
                        "the survivor's EtcdadmSnapshot {} failed: {}; nothing was deleted. Remove the \
                         annotation {RECOVER_ANNOTATION}, then ask again (another member, or snapshot/<name>)",
                        record.snapshot,
                        under_way.snapshot_failure.as_deref().unwrap_or("no reason given")
                    ),
                }),
                Some(phase) => Some(Step::Wait {
                    reason: reason::RECOVERING,
                    message: format!(
                        "recovering from {}: EtcdadmSnapshot {} is {phase:?}",
                        record.source.describe(),
                        record.snapshot
                    ),
                }),
            }
        }
        RecoveryPhase::Replacing => Some(replace(o, record)),
        RecoveryPhase::Restoring => {
            let done = is_ready(o) && restore::plan(o).is_none() && control_plane::hand_over(o).is_none();
            done.then(|| recover(record, RecoveryAction::Finish))
        }
    }
}

/// Delete the lost cluster's Machines; once they are gone, begin the restore.
fn replace(o: &Observed, mut record: RecoveryRecord) -> Step {
    record.phase = RecoveryPhase::Replacing;
    if o.machines.is_empty() {
        record.phase = RecoveryPhase::Restoring;
        return recover(record, RecoveryAction::Reset);
    }
    let names: Vec<String> = o
        .machines
        .iter()
        .filter(|m| !m.deleting || m.has_hook)
        .map(|m| m.name.clone())
        .collect();
    if names.is_empty() {
        return Step::Wait {
            reason: reason::RECOVERING,
            message: format!(
                "recovering from {}: waiting for the lost cluster's {} Machines to be deleted",
                record.source.describe(),
                o.machines.len()
            ),
        };
    }
    recover(record, RecoveryAction::DeleteMachines { names })
}

fn recover(record: RecoveryRecord, action: RecoveryAction) -> Step {
    Step::Recover {
        record: Box::new(record),
        action,
    }
}

/// Whether the request may begin: the record it begins with, or why it is refused. `None`
/// without a request.
fn check(o: &Observed, view: &RecoveryView) -> Option<Result<RecoveryRecord, String>> {
    let requested = view.request()?.to_string();
    let source = match RecoverySource::parse(&requested) {
        Ok(source) => source,
        Err(why) => return Some(Err(why)),
    };
    if !quorum_lost(o) {
        let voters = o.voters();
        let healthy = voters.iter().filter(|m| m.healthy).count();
        return Some(Err(format!(
            "is refused: quorum is not lost ({healthy} of {} voting members healthy, {} needed), and a \
             recovery replaces a cluster only when a majority of its members is gone for good",
            voters.len(),
            gates::quorum(voters.len())
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

/// Quorum is lost now (rule 3's wait), on a cluster that was initialized.
fn quorum_lost(o: &Observed) -> bool {
    o.initialized_now()
        && matches!(gates::quorum_lost(o), Some(Step::Wait { reason, .. }) if reason == reason::QUORUM_LOST)
}

/// The answer to a recovery request or the state of one under way, for the `Recovery`
/// condition: a refusal, or a wait that says where the recovery is.
pub fn answer(o: &Observed) -> Option<Step> {
    let view = o.recovery.as_ref()?;
    if let Some(under_way) = &view.under_way {
        let record = &under_way.record;
        return Some(match plan(o) {
            Some(step @ Step::Refuse { .. }) => step,
            _ => Step::Wait {
                reason: reason::RECOVERING,
                message: format!(
                    "recovering from {} ({:?}): EtcdadmSnapshot {}",
                    record.source.describe(),
                    record.phase,
                    record.snapshot
                ),
            },
        });
    }
    // An automatic recovery is asked for only while quorum is lost; the annotation always.
    let asked = match &view.requested {
        Some(requested) => format!("{RECOVER_ANNOTATION}={requested:?}"),
        None if quorum_lost(o) => "spec.recovery.automatic (source latest)".to_string(),
        None => return None,
    };
    Some(match check(o, view)? {
        Ok(record) => Step::Wait {
            reason: reason::RECOVERING,
            message: format!("recovering from {} ({asked})", record.source.describe()),
        },
        Err(why) => Step::Refuse {
            reason: reason::RECOVERY_REFUSED,
            message: format!(
                "{asked} {why}; nothing is changed or deleted{}",
                if view.requested.is_some() {
                    " (remove the annotation once read)"
                } else {
                    ""
                }
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use etcdadm_shared::api::cluster::RecoveryPhase;
    use etcdadm_shared::api::snapshot::SnapshotPhase;

    use super::super::testing::*;
    use super::super::*;
    use super::{RecoveryAction, RecoveryRecord, RecoverySource, RecoveryView, SnapshotCheck, UnderWay};

    /// Three members, two of them dead (the survivor m0 at revision 100): quorum lost.
    fn lost(requested: &str) -> Observed {
        let mut o = running(3);
        for (i, m) in members_mut(&mut o).iter_mut().enumerate() {
            m.revision = Some(100 - i as i64);
        }
        for i in [1, 2] {
            members_mut(&mut o)[i] = unhealthy(members_mut(&mut o)[i].clone(), "connection refused");
            members_mut(&mut o)[i].revision = None;
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
    fn under_way(mut o: Observed, record: RecoveryRecord, phase: Option<SnapshotPhase>) -> Observed {
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
            Step::Recover { record, action } => (&**record, action),
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
        let cases: Vec<(&str, Observed, &str)> = vec![
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
        assert_eq!(super::answer(&failed), Some(step));
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
            (RecoveryPhase::Restoring, &RecoveryAction::Reset)
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
            ..Default::default()
        });
        assert_eq!(plan(&o), Step::WriteRestoreSecret);
        o.restore.as_mut().unwrap().secret_age = Some(Duration::from_secs(1));
        assert!(matches!(
            plan(&o),
            Step::CreateMachine {
                purpose: Growth::Restore,
                ..
            }
        ));
        // Back to three healthy members, the Secret deleted, the KCP given the new endpoints.
        let mut ready = running(3);
        ready.recovery = o.recovery.clone();
        ready.restore = o.restore.clone();
        ready.initialized = false;
        assert_eq!(plan(&ready), Step::DeleteRestoreSecret);
        ready.restore.as_mut().unwrap().secret_age = None;
        ready.kcp = kcp(&["https://10.9.9.9:2379"], false, true);
        ready.creation_complete = true;
        assert!(matches!(plan(&ready), Step::WriteKcpEndpoints { .. }));
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
        let automatic = |unserved_secs: u64| super::Automatic {
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
        assert!(!matches!(plan(&starting), Step::Recover { .. }));
        let mut healthy = running(3);
        healthy.recovery = o.recovery.clone();
        assert_eq!(super::answer(&healthy), None);
        assert_eq!(plan(&healthy), Step::Steady);
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
        assert!(matches!(plan(&o), Step::CreateMachine { .. }), "{:?}", plan(&o));
    }
}
