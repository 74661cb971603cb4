//! Tests of `recovery`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::plan::recovery::Recovery;
use crate::controller::plan::restore::view::RestoreFrom;
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
    o.view_mut::<Recovery>().unwrap().view = Some(RecoveryView {
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
    o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap().under_way = Some(UnderWay {
        record,
        snapshot_phase: phase,
        snapshot_failure: (phase == Some(SnapshotPhase::Failed)).then(|| "MemberUnreachable: refused".into()),
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
        o.view_mut::<Recovery>().unwrap().view = lost("latest").view::<Recovery>().view.clone();
        o
    };
    let one_dead = {
        let mut o = running(3);
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        o.view_mut::<Recovery>().unwrap().view = lost("latest").view::<Recovery>().view.clone();
        o
    };
    let never_initialized = {
        let mut o = base();
        o.view_mut::<Recovery>().unwrap().view = lost("latest").view::<Recovery>().view.clone();
        o
    };
    let no_store = |requested: &str| {
        let mut o = lost(requested);
        o.view_mut::<Recovery>()
            .unwrap()
            .view
            .as_mut()
            .unwrap()
            .store_configured = false;
        o
    };
    let with_snapshot = |requested: &str, check: Option<SnapshotCheck>| {
        let mut o = lost(requested);
        o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap().snapshot = check;
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
        unasked.view_mut::<Recovery>().unwrap().view = None;
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
    o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap().snapshot = nightly(None);
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
    assert!(wait_message(&step).contains("nothing was deleted") && wait_message(&step).contains("refused"));
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
    dropped
        .view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .requested = None;
    assert_eq!(action(&plan(&dropped)).1, &RecoveryAction::Abandon);

    // Replacing: hooks released on Machines being deleted; then waited for; then the reset.
    let mut replacing = under_way(
        o.clone(),
        record(RecoveryPhase::Replacing),
        Some(SnapshotPhase::Succeeded),
    );
    replacing
        .view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .requested = None;
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
    o.view_mut::<RestoreFrom>().unwrap().view = Some(RestoreView {
        snapshot: Some("c1-etcd-fresh-recovery".into()),
        location: Some("b/k.db".into()),
        revision: Some(100),
        download: Some(download()),
        ..Default::default()
    });
    assert_eq!(plan(&o), write_restore_secret());
    with_our_secret(
        o.view_mut::<RestoreFrom>().unwrap().view.as_mut().unwrap(),
        Duration::from_secs(1),
    );
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::CreateMachine {
            purpose: Growth::Restore,
            ..
        })
    ));
    // Back to three healthy members, the Secret deleted, the KCP given the new endpoints.
    let mut ready = running(3);
    ready.view_mut::<Recovery>().unwrap().view = o.view::<Recovery>().view.clone();
    ready.view_mut::<RestoreFrom>().unwrap().view = o.view::<RestoreFrom>().view.clone();
    ready.initialized = false;
    assert_eq!(
        plan(&ready),
        Step::Restore(RestoreStep::DeleteRestoreSecret {
            uid: "restore-uid".into()
        })
    );
    ready
        .view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .secret = None;
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
    // The infrastructure reports the two silent members' Machines failed: the evidence.
    for machine in &mut o.machines[1..] {
        machine.failed = true;
    }
    let view = o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap();
    view.requested = None;
    view.automatic = Some(automatic(599));
    assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST, "not yet");
    assert_eq!(super::answer(&o), None);
    o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap().automatic = Some(automatic(600));
    let step = plan(&o);
    let (record, act) = action(&step);
    assert_eq!(record.requested, "automatic");
    assert!(matches!(act, RecoveryAction::SnapshotSurvivor { .. }));
    // Due but refused (no store): said, without asking to remove an annotation.
    o.view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .store_configured = false;
    let message = wait_message(&super::answer(&o).unwrap());
    assert!(
        message.starts_with("spec.recovery.automatic (source latest) is refused"),
        "{message}"
    );
    assert!(!message.contains("annotation"), "{message}");
    // A cluster that never started, or one with quorum, is never recovered automatically.
    let mut starting = base();
    starting.view_mut::<Recovery>().unwrap().view = o.view::<Recovery>().view.clone();
    assert_eq!(super::answer(&starting), None);
    assert!(!matches!(plan(&starting), Step::Recover(RecoveryStep { .. })));
    let mut healthy = running(3);
    healthy.view_mut::<Recovery>().unwrap().view = o.view::<Recovery>().view.clone();
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
        let view = o.view_mut::<Recovery>().unwrap().view.as_mut().unwrap();
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
    by_hand
        .view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .requested = Some("snapshot/nightly".into());
    by_hand
        .view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .snapshot = nightly(None);
    assert!(
        is_recovery(&plan(&by_hand)),
        "the annotation recovers from silence"
    );
    // The same silence with the majority's Machines failed is evidence.
    let mut failed = partition.clone();
    failed
        .view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .snapshot = nightly(None);
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
    // Its own view shows no quorum: what the minority side of a partition sees, and what a
    // member sees while the other two are stalled. Still no evidence, and the condition says
    // what it sees.
    members_mut(&mut cut_off)[0].no_leader = true;
    assert!(!is_recovery(&plan(&cut_off)), "{:?}", plan(&cut_off));
    let waiting = super::answer(&cut_off).unwrap();
    assert_eq!(waiting.reason, reason::RECOVERY_WAITING);
    assert_eq!(
        waiting.message,
        "quorum is lost and 1 of 3 voting members answer the controller; of the 3 voting members \
         last recorded, the Machines of 3 standing (c1-etcd-m0, c1-etcd-m1, c1-etcd-m2): the silent \
         members may be stalled, or serving clients behind a network partition, so \
         spec.recovery.automatic waits until the infrastructure reports the Machines of a majority \
         (2 of 3) gone or failed; to recover anyway, set the annotation \
         etcdcluster.cluster.x-k8s.io/recover"
    );
    // One Machine failed is no majority; two are.
    cut_off.machines[1].failed = true;
    assert!(!is_recovery(&plan(&cut_off)));
    cut_off.machines[2].failed = true;
    assert!(is_recovery(&plan(&cut_off)));
    // Gone counts as failed: m2's Machine deleted, its member still listed.
    cut_off.machines[2].failed = false;
    cut_off.machines.truncate(2);
    members_mut(&mut cut_off)[2].machine = None;
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
    full.view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .requested = Some("latest".into());
    let refusal = super::answer(&full).unwrap();
    assert_eq!(refusal.reason, reason::RECOVERY_REFUSED);
    assert!(
        refusal.message.contains("quorum is not lost (3 of 3") && refusal.message.contains("raised NOSPACE"),
        "{}",
        refusal.message
    );
}

#[test]
fn quorum_loss_is_waited_out_without_the_annotation() {
    let mut o = lost("latest");
    o.view_mut::<Recovery>().unwrap().view = None;
    assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
    assert_eq!(super::answer(&o), None);
}

#[test]
fn a_refused_request_never_holds_back_a_healthy_clusters_changes() {
    let mut o = running(3);
    o.view_mut::<Recovery>().unwrap().view = lost("latest").view::<Recovery>().view.clone();
    o.replicas = 5;
    assert_eq!(wait_reason(&super::answer(&o).unwrap()), reason::RECOVERY_REFUSED);
    assert!(
        matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
        "{:?}",
        plan(&o)
    );
}

#[test]
fn a_recovering_cluster_is_always_read_afresh() {
    use crate::controller::decision::ConcernView;
    let etcd = running(3).etcd_cluster;
    let asked = Some(RecoveryView {
        requested: Some("latest".into()),
        ..Default::default()
    });
    assert!(!Recovery::keep(&asked, &etcd), "a request waits on its snapshot");
    let under_way = Some(RecoveryView {
        under_way: Some(UnderWay::default()),
        ..Default::default()
    });
    assert!(!Recovery::keep(&under_way, &etcd), "so does a recovery under way");
    assert!(Recovery::keep(&None, &etcd));
}
