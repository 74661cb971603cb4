//! Tests of `safe_changes`.

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
    o.view_mut::<SafeChangeView>().unwrap().before_change = Some(BeforeChangeView {
        max_age: Duration::from_secs(600),
        record,
        snapshots,
    });
    o
}

fn snap(name: &str, phase: SnapshotPhase, revision: Option<i64>, age_secs: Option<u64>) -> SnapshotSummary {
    SnapshotSummary {
        name: name.into(),
        phase,
        revision,
        age: age_secs.map(Duration::from_secs),
        message: (phase == SnapshotPhase::Failed).then(|| "StoreUnreachable: connection refused".into()),
    }
}

/// When the recorded changes were decided.
fn decided() -> Timestamp {
    "2026-11-28T10:00:00Z".parse().unwrap()
}

fn recorded(reason: &str, snapshot: Option<&str>) -> Option<BeforeChangeRecord> {
    Some(BeforeChangeRecord {
        reason: reason.into(),
        revision: Some(100),
        decided: Some(decided()),
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
        let view = waiting
            .view_mut::<SafeChangeView>()
            .unwrap()
            .before_change
            .as_mut()
            .unwrap();
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
        let view = waiting
            .view_mut::<SafeChangeView>()
            .unwrap()
            .before_change
            .as_mut()
            .unwrap();
        view.snapshots = vec![snap(
            &format!("c1-etcd-fresh-{label}"),
            SnapshotPhase::Succeeded,
            Some(104),
            Some(7200),
        )];
        assert!(is_removal(&plan(&waiting)), "{what}: {:?}", plan(&waiting));
        // Once the change is done, the record goes.
        let mut done = running(3);
        done.view_mut::<SafeChangeView>().unwrap().before_change =
            waiting.view::<SafeChangeView>().before_change.clone();
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

/// The annotation set on `o` with `value`.
fn annotate(o: &mut Observation, value: &str) {
    o.view_mut::<SafeChangeView>().unwrap().proceed_annotation = Some(value.into());
}

/// `o`'s change held by its failed before-change snapshot, recorded under `label`.
fn held_by_failure(mut o: Observation, label: &str) -> Observation {
    let view = o
        .view_mut::<SafeChangeView>()
        .unwrap()
        .before_change
        .as_mut()
        .unwrap();
    view.record = recorded(label, Some("c1-etcd-x-before"));
    view.snapshots = vec![snap("c1-etcd-x-before", SnapshotPhase::Failed, None, Some(5))];
    o
}

#[test]
fn a_failed_snapshot_holds_the_change_with_its_reason_until_deleted() {
    for (what, label, o) in disruptive(backed_up(vec![], None)) {
        let mut failed = held_by_failure(o, label);
        let step = plan(&failed);
        assert_eq!(wait_reason(&step), reason::SNAPSHOT_FAILED, "{what}");
        assert!(step.is_refusal() && !step.writes());
        let message = wait_message(&step);
        assert!(
            message.contains("StoreUnreachable: connection refused"),
            "{message}"
        );
        // The refusal prints the exact value that lets this change, and only it, go ahead.
        assert!(
            message.contains(&format!(
                "{PROCEED_WITHOUT_SNAPSHOT_ANNOTATION}={label}@2026-11-28T10:00:00Z"
            )),
            "{message}"
        );
        // Deleted by the operator: another is taken.
        failed
            .view_mut::<SafeChangeView>()
            .unwrap()
            .before_change
            .as_mut()
            .unwrap()
            .snapshots
            .clear();
        assert!(matches!(
            plan(&failed),
            Step::SafeChanges(SafeChangeStep::TakeSnapshot { .. })
        ));
    }
}

#[test]
fn the_override_annotation_lets_one_change_go_ahead_and_is_removed() {
    for (what, label, o) in disruptive(backed_up(vec![], None)) {
        let mut asked = held_by_failure(o, label);
        annotate(&mut asked, &format!("{label}@2026-11-28T10:00:00Z"));
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
        asked.view_mut::<SafeChangeView>().unwrap().proceed_annotation = None;
        let view = asked
            .view_mut::<SafeChangeView>()
            .unwrap()
            .before_change
            .as_mut()
            .unwrap();
        view.record.as_mut().unwrap().proceeded_without = true;
        assert!(is_removal(&plan(&asked)), "{what}: {:?}", plan(&asked));
        // The next change needs its snapshot again.
        record_status(&mut status, &running(3), None, &now);
        assert_eq!(status.before_change, None);
    }
}

#[test]
fn the_go_ahead_annotation_is_honoured_only_for_the_change_it_names() {
    for (what, label, o) in disruptive(backed_up(vec![], None)) {
        let held = held_by_failure(o, label);
        let this_change = format!("{label}@2026-11-28T10:00:00Z");
        let other_label = if label == BEFORE_ROLLOUT {
            BEFORE_SCALE_DOWN
        } else {
            BEFORE_ROLLOUT
        };
        // (value, whether it lets this change go ahead)
        for (value, honoured) in [
            (this_change.clone(), true),
            // An earlier change of the same kind, or one of the other kind.
            (format!("{label}@2026-11-28T09:00:00Z"), false),
            (format!("{other_label}@2026-11-28T10:00:00Z"), false),
            // Without a change's name (what the annotation used to be): never.
            (String::new(), false),
            ("true".to_string(), false),
        ] {
            let mut asked = held.clone();
            annotate(&mut asked, &value);
            let step = plan(&asked);
            if honoured {
                assert!(
                    matches!(step, Step::SafeChanges(SafeChangeStep::ProceedWithout { .. })),
                    "{what} {value:?}: {step:?}"
                );
                continue;
            }
            // Not honoured: removed, with a Warning Event printing the value that would be.
            let Step::SafeChanges(SafeChangeStep::DropStale { why, .. }) = &step else {
                panic!("{what} {value:?}: {step:?}")
            };
            assert!(why.contains(&this_change), "{what} {value:?}: {why}");
            let event = step.event(&asked).unwrap();
            assert!(
                event.warning && event.note.contains(&format!("{value:?}")),
                "{}",
                event.note
            );
            // Once removed, the change is held as before.
            asked.view_mut::<SafeChangeView>().unwrap().proceed_annotation = None;
            assert_eq!(wait_reason(&plan(&asked)), reason::SNAPSHOT_FAILED, "{what}");
        }
    }
}

#[test]
fn a_go_ahead_annotation_naming_no_change_under_way_is_removed_with_a_word() {
    let name = format!("{BEFORE_ROLLOUT}@2026-11-28T10:00:00Z");
    // Set early, before any change: a later rollout is not waived by it.
    let mut early = backed_up(vec![], None);
    annotate(&mut early, &name);
    // The change it named has ended (the snapshot was retaken and it went ahead): cleared.
    let mut ended = backed_up(vec![], recorded(BEFORE_ROLLOUT, Some("c1-etcd-x-before")));
    annotate(&mut ended, &name);
    // Without spec.backup nothing waits for a snapshot.
    let mut no_store = running(3);
    annotate(&mut no_store, &name);
    // A change under way not recorded yet has no name: none can match it.
    let (_, _, mut unrecorded) = disruptive(backed_up(vec![], None)).remove(0);
    annotate(&mut unrecorded, &name);
    for (what, o, why) in [
        (
            "set early",
            early,
            "no rolling replacement or scale-down is under way",
        ),
        (
            "its change ended",
            ended,
            "no rolling replacement or scale-down is under way",
        ),
        ("no store", no_store, "spec.backup is not set"),
        (
            "change not recorded yet",
            unrecorded,
            "not recorded in status.beforeChange yet",
        ),
    ] {
        let step = plan(&o);
        let Step::SafeChanges(SafeChangeStep::DropStale { why: said, .. }) = &step else {
            panic!("{what}: {step:?}")
        };
        assert!(said.contains(why), "{what}: {said}");
        assert_eq!(step.reason().0, reason::GO_AHEAD_IGNORED, "{what}");
        assert!(step.writes());
    }
    // Naming the change under way, before its removal is reached (a rollout's surge): kept.
    let mut surging = backed_up(vec![], recorded(BEFORE_ROLLOUT, None));
    outdate_all(&mut surging);
    annotate(&mut surging, &name);
    assert!(
        matches!(plan(&surging), Step::Machines(MachineStep::CreateMachine { .. })),
        "{:?}",
        plan(&surging)
    );
}

#[test]
fn a_change_keeps_the_time_it_was_decided_so_its_name_holds() {
    let (_, label, o) = disruptive(backed_up(vec![], recorded(BEFORE_ROLLOUT, None))).remove(0);
    assert_eq!(label, BEFORE_ROLLOUT);
    let mut status = EtcdadmClusterStatus::default();
    let later = Time("2026-11-28T11:00:00Z".parse().unwrap());
    record_status(&mut status, &o, None, &later);
    assert_eq!(
        status.before_change.unwrap().decided,
        Some(Time(decided())),
        "a restarted controller names the change as before"
    );
    assert_eq!(
        change_name(label, decided()),
        "before-rollout@2026-11-28T10:00:00Z"
    );
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
        o.view_mut::<SafeChangeView>().unwrap().before_change = None;
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
        o.view_mut::<SafeChangeView>().unwrap().before_change = backed_up(vec![], None)
            .view::<SafeChangeView>()
            .before_change
            .clone();
        let mut steps = vec![];
        for _ in 0..200 {
            let step = plan(&o);
            if step == Step::Steady {
                break;
            }
            let view = o
                .view_mut::<SafeChangeView>()
                .unwrap()
                .before_change
                .as_mut()
                .unwrap();
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
