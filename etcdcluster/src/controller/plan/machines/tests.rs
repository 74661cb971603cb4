//! Tests of the Machine concern.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::testing::reason;
use crate::controller::testing::*;
use std::time::Duration;

use etcdadm_shared::names;

#[test]
fn a_join_is_waited_for_until_its_deadline_and_its_machine_replaced_after_it() {
    let no_address = |age| {
        let mut o = joining(age, None);
        o.machines[3].address = None;
        o
    };
    type Case = (&'static str, fn(Duration) -> Observation, &'static str);
    let cases: [Case; 4] = [
        ("no address", no_address, reason::WAITING_FOR_MACHINE_ADDRESS),
        (
            "never added",
            |age| joining(age, None),
            reason::WAITING_FOR_MEMBER_JOIN,
        ),
        (
            "added, never started",
            |age| joining(age, Some(added_not_started())),
            reason::WAITING_FOR_MEMBER_JOIN,
        ),
        (
            "started, never healthy",
            |age| joining(age, Some(started_never_healthy())),
            reason::WAITING_FOR_MEMBER_JOIN,
        ),
    ];
    for (what, make, waiting) in cases {
        let before = plan(&make(JUST_BEFORE));
        assert_eq!(wait_reason(&before), waiting, "{what}: {before:?}");
        let after = plan(&make(JUST_AFTER));
        assert_eq!(failed_join_of(&after), Some("c1-etcd-m3"), "{what}: {after:?}");
        let (reason, message) = after.reason();
        assert_eq!(reason, reason::MEMBER_JOIN_FAILED, "{what}");
        assert!(
            message.contains("did not become a healthy etcd member within 5m"),
            "{message}"
        );
    }
}

#[test]
fn the_member_a_failed_join_added_is_removed_before_anything_else() {
    // Scale-up (3 started voters + 1 never started) and a remove-first rollout (2 + 1): a
    // quorum of started voters remains either way, so the added member can always go.
    for started in [3, 2] {
        let mut o = joining(JUST_AFTER, Some(added_not_started()));
        if started == 2 {
            o.replicas = 3;
            o.machines.remove(2);
            members_mut(&mut o).remove(2);
        }
        o.machines.last_mut().unwrap().deleting = true;
        match plan(&o) {
            Step::Membership(MembershipStep::RemoveMember {
                member_id, via_url, ..
            }) => {
                assert_eq!(member_id, 4, "{started} started voters");
                assert_ne!(via_url, names::client_url("10.0.0.4"));
            }
            step => panic!("{started} started voters: expected the member's removal, got {step:?}"),
        }
        // Once it is gone from etcd, the hook is released.
        members_mut(&mut o).retain(|m| m.id != 4);
        assert_eq!(
            plan(&o),
            Step::Membership(MembershipStep::ReleaseHook {
                machine: "c1-etcd-m3".into()
            })
        );
    }
}

#[test]
fn a_healthy_new_member_or_the_first_member_is_never_a_failed_join() {
    let joined = joining(JUST_AFTER, Some(member(4, "c1-etcd-m3", "10.0.0.4")));
    assert_eq!(failed_join_of(&plan(&joined)), None, "{:?}", plan(&joined));
    let mut first = base();
    first.replicas = 3;
    let mut m = machine("c1-etcd-m0", Some("10.0.0.1"), None);
    m.age = JUST_AFTER * 10;
    first.machines.push(m);
    first.etcd = EtcdView::Unreachable {
        message: "connection refused".into(),
    };
    assert_eq!(failed_join_of(&plan(&first)), None);
}

#[test]
fn with_remediation_disabled_a_failed_join_is_reported_not_replaced() {
    let mut o = joining(JUST_AFTER, Some(added_not_started()));
    o.remediation.enabled = false;
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::MEMBER_JOIN_FAILED);
    assert!(step.is_refusal());
    assert!(wait_message(&step).contains("remediation is disabled"));
}

#[test]
fn a_stuck_join_never_blocks_remediation_for_longer_than_its_deadline() {
    // Five members, m1 dead and overdue, a sixth Machine m5 joining: until m5's deadline the
    // join is waited for (one change at a time); past it m5 goes first, then m1 is
    // remediated. (Four healthy of six voters keep a quorum throughout.)
    let mut o = running(5);
    o.replicas = 7;
    let mut dead = unhealthy(member(2, "c1-etcd-m1", "10.0.0.2"), "connection refused");
    dead.unhealthy_for = DEADLINE * 2;
    members_mut(&mut o)[1] = dead;
    o.machines[1].was_member = true;
    o.machines[1].unhealthy_for = DEADLINE * 2;
    let mut m5 = machine("c1-etcd-m5", Some("10.0.0.6"), None);
    m5.age = JUST_BEFORE;
    o.machines.push(m5);
    members_mut(&mut o).push(MemberView {
        id: 6,
        peer_urls: vec![names::peer_url("10.0.0.6")],
        machine: Some("c1-etcd-m5".into()),
        ..Default::default()
    });
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    o.machines[5].age = JUST_AFTER;
    assert_eq!(failed_join_of(&plan(&o)), Some("c1-etcd-m5"));
    o.machines.pop();
    members_mut(&mut o).pop();
    match plan(&o) {
        Step::Machines(MachineStep::DeleteMachine {
            machine,
            purpose: Removal::Remediation { .. },
            ..
        }) => assert_eq!(machine, "c1-etcd-m1"),
        step => panic!("expected m1's remediation, got {step:?}"),
    }
}

#[test]
fn the_first_machine_is_created_when_nothing_exists() {
    let o = base();
    assert_eq!(
        plan(&o),
        created_machine("c1-etcd-fresh", false, None, Growth::ScaleUp)
    );
}

#[test]
fn an_interrupted_creation_is_adopted_not_orphaned() {
    let mut o = base();
    o.leftovers = vec!["c1-etcd-abcde".into()];
    assert_eq!(
        plan(&o),
        created_machine("c1-etcd-abcde", true, None, Growth::ScaleUp)
    );
    // At full size the leftovers are cleaned up instead, once ready.
    let mut o = running(3);
    o.leftovers = vec!["c1-etcd-abcde".into()];
    assert_eq!(
        plan(&o),
        Step::Machines(MachineStep::DeleteLeftovers {
            names: vec!["c1-etcd-abcde".into()],
            infra: Some(infra_kind()),
        })
    );
}

#[test]
fn a_missing_infrastructure_template_is_named_and_waited_for() {
    let mut o = running(2);
    o.replicas = 3;
    o.missing_infra_template = Some("DevMachineTemplate default/etcd".into());
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND);
    assert!(step.is_refusal(), "a Warning Event says so");
    assert!(wait_message(&step).contains("DevMachineTemplate default/etcd"));
    o.missing_infra_template = None;
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::CreateMachine { .. })
    ));
}

#[test]
fn a_member_spec_admission_would_refuse_creates_no_machine_but_stops_nothing_else() {
    let problem = "spec.etcdadmConfigSpec.cloudInitConfig.version: \"v3\" is not an etcd version";
    let mut o = base();
    o.member_spec_problem = Some(problem.into());
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::INVALID_SPEC);
    let (_, message) = step.reason();
    assert!(message.contains(problem), "{message}");
    // A cluster whose members need nothing new keeps being looked after.
    let mut steady = running(3);
    steady.replicas = 3;
    steady.member_spec_problem = Some(problem.into());
    assert_eq!(plan(&steady), Step::Steady);
}

// Boot ahead (docs/safety.md, "Boot ahead").

/// `running(3)` growing to 5, with a learner-join Machine `c1-etcd-m<i>` for each of
/// `waiting` (its address, if it has booted), none of them given its turn yet.
fn growing(waiting: &[Option<&str>]) -> Observation {
    let mut o = running(3);
    o.replicas = 5;
    for (i, address) in waiting.iter().enumerate() {
        let mut m = machine(&format!("c1-etcd-m{}", i + 3), *address, None);
        m.learner_join = true;
        m.listed_wait = Some(learner_listed_wait(5, DEADLINE));
        o.machines.push(m);
    }
    o
}

/// Machine `c1-etcd-m3`'s turn came `ago`, and its learner is in state `member`.
fn in_its_turn(o: &mut Observation, ago: Duration, member: MemberView) {
    o.machines[3].join_started = Some(ago);
    members_mut(o).push(member);
}

/// The learner of Machine `c1-etcd-m3` (10.0.0.4), added and not started yet.
fn learner_added() -> MemberView {
    MemberView {
        is_learner: true,
        ..added_not_started()
    }
}

/// The same learner, started and catching up.
fn learner_catching_up() -> MemberView {
    let mut m = unhealthy(
        member(4, "c1-etcd-m3", "10.0.0.4"),
        "etcdserver: rpc not supported for learner",
    );
    m.is_learner = true;
    m.ever_healthy = false;
    m.is_leader = false;
    m
}

fn add_learner_for(step: &Step) -> Option<(&str, bool)> {
    match step {
        Step::Membership(MembershipStep::AddLearner {
            machine, record_turn, ..
        }) => Some((machine, *record_turn)),
        _ => None,
    }
}

#[test]
fn machines_boot_ahead_of_their_turn_up_to_the_bound_and_join_in_creation_order() {
    let creates = |step: &Step| {
        matches!(
            step,
            Step::Machines(MachineStep::CreateMachine {
                purpose: Growth::ScaleUp,
                ..
            })
        )
    };
    // 3 → 5: both Machines are created before either has booted.
    assert!(creates(&plan(&growing(&[]))));
    assert!(creates(&plan(&growing(&[None]))), "{:?}", plan(&growing(&[None])));
    let both = growing(&[None, None]);
    let step = plan(&both);
    assert_eq!(
        wait_reason(&step),
        reason::WAITING_FOR_MACHINE_ADDRESS,
        "{step:?}"
    );
    assert!(wait_message(&step).contains("c1-etcd-m3"), "{step:?}");
    // parallelMachines 1: the second waits until the first has joined.
    let mut serial = growing(&[None]);
    parallel_machines(&mut serial, 1);
    assert_eq!(wait_reason(&plan(&serial)), reason::WAITING_FOR_MACHINE_ADDRESS);
    serial.machines[3].address = Some("10.0.0.4".into());
    assert_eq!(add_learner_for(&plan(&serial)), Some(("c1-etcd-m3", true)));
    in_its_turn(&mut serial, Duration::from_secs(1), learner_added());
    assert_eq!(wait_reason(&plan(&serial)), reason::WAITING_FOR_MEMBER_JOIN);
    // Unbounded, the second is created while the first one's learner joins.
    let mut ahead = serial.clone();
    ahead.etcd_cluster.spec.provisioning = None;
    assert!(creates(&plan(&ahead)), "{:?}", plan(&ahead));
    // The first booted is the first added, its turn recorded as it is.
    assert_eq!(
        add_learner_for(&plan(&growing(&[Some("10.0.0.4"), Some("10.0.0.5")]))),
        Some(("c1-etcd-m3", true))
    );
    assert_eq!(
        add_learner_for(&plan(&growing(&[None, Some("10.0.0.5")]))),
        Some(("c1-etcd-m4", true))
    );
    // A turn recorded but no learner yet (the controller stopped in between): its learner
    // is added without recording the turn again.
    let mut resumed = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
    resumed.machines[3].join_started = Some(Duration::from_secs(2));
    assert_eq!(add_learner_for(&plan(&resumed)), Some(("c1-etcd-m3", false)));
}

#[test]
fn joins_stay_one_at_a_time_while_machines_wait_for_their_turn() {
    let mut o = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
    in_its_turn(&mut o, Duration::from_secs(1), learner_added());
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN, "{step:?}");
    assert!(
        wait_message(&step).contains("Machine c1-etcd-m4 waits for its turn to join"),
        "{step:?}"
    );
    members_mut(&mut o).pop();
    members_mut(&mut o).push(learner_catching_up());
    assert!(
        matches!(
            plan(&o),
            Step::Membership(MembershipStep::PromoteLearner { member_id: 4, .. })
        ),
        "{:?}",
        plan(&o)
    );
    // Promoted but not healthy yet: the next learner waits (rule 2).
    let mut promoted = learner_catching_up();
    promoted.is_learner = false;
    members_mut(&mut o).pop();
    members_mut(&mut o).push(promoted);
    assert_eq!(add_learner_for(&plan(&o)), None, "{:?}", plan(&o));
    // Healthy (and published for joins): m4's turn.
    members_mut(&mut o)[3] = member(4, "c1-etcd-m3", "10.0.0.4");
    members_mut(&mut o)[3].is_leader = false;
    o.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: healthy_client_urls(&o),
    });
    assert_eq!(
        add_learner_for(&plan(&o)),
        Some(("c1-etcd-m4", true)),
        "{:?}",
        plan(&o)
    );
    // Nor while a voter is unhealthy.
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
    assert_eq!(add_learner_for(&plan(&o)), None);
}

#[test]
fn a_machine_waiting_for_its_turn_is_not_a_failed_join_however_long_it_waits() {
    // m4 booted long ago and waits while m3's learner joins: a join in flight, no failure.
    let mut o = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
    o.machines[4].age = DEADLINE * 4;
    in_its_turn(&mut o, JUST_BEFORE, learner_added());
    let step = plan(&o);
    assert_eq!(failed_join_of(&step), None, "{step:?}");
    assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN);
    // Its state in status: waiting for its turn, its own reason.
    let condition = machines_condition(&o, 5);
    assert_eq!(condition.reason, reason::WAITING_FOR_JOIN_TURN, "{condition:?}");
    assert!(condition.message.contains("c1-etcd-m4"), "{condition:?}");
    assert!(!condition.message.contains("c1-etcd-m3"), "{condition:?}");
}

#[test]
fn a_learners_join_deadline_runs_from_its_turn_not_from_its_machines_creation() {
    let mut o = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
    o.machines[3].age = DEADLINE * 10;
    in_its_turn(&mut o, JUST_BEFORE, learner_added());
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    o.machines[3].join_started = Some(JUST_AFTER);
    let step = plan(&o);
    assert_eq!(failed_join_of(&step), Some("c1-etcd-m3"), "{step:?}");
    assert!(
        step.reason().1.contains(
            "did not become a healthy etcd member within 5m0s (its member was added but never started)"
        ),
        "{step:?}"
    );
    // A learner whose turn was never recorded (added before boot ahead existed): its
    // Machine's age counts, as it did.
    o.machines[3].join_started = None;
    assert_eq!(failed_join_of(&plan(&o)), Some("c1-etcd-m3"));
}

#[test]
fn a_machine_that_fails_before_its_turn_is_replaced_without_touching_the_join_in_flight() {
    // m3's learner catches up; m4 waits for its turn and fails.
    let waiting = |edit: fn(&mut MachineView)| {
        let mut o = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
        in_its_turn(&mut o, Duration::from_secs(1), learner_catching_up());
        edit(&mut o.machines[4]);
        o
    };
    type Case = (&'static str, fn(&mut MachineView), Option<&'static str>);
    let listed_wait = learner_listed_wait(5, DEADLINE);
    let cases: [Case; 6] = [
        (
            "reported failed",
            |m| m.failed = true,
            Some("the infrastructure reports it failed"),
        ),
        (
            "no address past the deadline",
            |m| {
                m.address = None;
                m.age = JUST_AFTER;
            },
            Some("it has no address after 5m0s"),
        ),
        (
            "past its user data's wait",
            |m| m.age = learner_listed_wait(5, DEADLINE),
            Some("its user data stops waiting to be listed after 40m0s"),
        ),
        (
            "booting, within the deadline",
            |m| {
                m.address = None;
                m.age = JUST_BEFORE;
            },
            None,
        ),
        (
            "waiting, within its wait",
            |m| m.age = learner_listed_wait(5, DEADLINE) - Duration::from_secs(1),
            None,
        ),
        ("waiting", |_| {}, None),
    ];
    assert_eq!(listed_wait, Duration::from_secs(2400));
    for (what, edit, failure) in cases {
        let o = waiting(edit);
        let step = plan(&o);
        match failure {
            Some(why) => {
                assert_eq!(failed_join_of(&step), Some("c1-etcd-m4"), "{what}: {step:?}");
                let (reason, message) = step.reason();
                assert_eq!(reason, reason::MEMBER_JOIN_FAILED, "{what}");
                assert!(
                    message.contains("failed before its turn to join"),
                    "{what}: {message}"
                );
                assert!(message.contains(why), "{what}: {message}");
            }
            None => assert!(
                matches!(step, Step::Membership(MembershipStep::PromoteLearner { .. })),
                "{what}: {step:?}"
            ),
        }
    }
    // Its deletion removes no member: the hook goes at once; then a new Machine replaces
    // it, booting ahead while m3 still joins.
    let mut o = waiting(|m| m.failed = true);
    o.machines[4].deleting = true;
    assert_eq!(
        plan(&o),
        Step::Membership(MembershipStep::ReleaseHook {
            machine: "c1-etcd-m4".into()
        })
    );
    o.machines.pop();
    members_mut(&mut o).pop();
    members_mut(&mut o).push(learner_added());
    assert!(
        matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
        "{:?}",
        plan(&o)
    );
    // Remediation disabled: reported, left to a person.
    let mut o = waiting(|m| m.failed = true);
    o.remediation.enabled = false;
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::MEMBER_JOIN_FAILED);
    assert!(
        wait_message(&step).contains("remediation is disabled"),
        "{step:?}"
    );
}

#[test]
fn a_dead_member_is_remediated_past_the_join_deadline_while_machines_wait_for_their_turn() {
    // A waiting Machine's user data may join through the dead member: as a join in flight
    // would, it holds the remediation until the join deadline (the member may come back).
    let deletes_m1 = |o: &Observation| matches!(plan(o), Step::Machines(MachineStep::DeleteMachine { machine, .. }) if machine == "c1-etcd-m1");
    let with_dead_member = |waiting: &[Option<&str>], unhealthy_for: Duration| {
        let mut o = growing(waiting);
        o.remediation.unhealthy_after = Duration::from_secs(60);
        let m1 = &mut members_mut(&mut o)[1];
        *m1 = unhealthy(m1.clone(), "connection refused");
        m1.unhealthy_for = unhealthy_for;
        o
    };
    let two_minutes = Duration::from_secs(120);
    assert!(
        deletes_m1(&with_dead_member(&[], two_minutes)),
        "{:?}",
        plan(&with_dead_member(&[], two_minutes))
    );
    let waiting = with_dead_member(&[Some("10.0.0.4")], two_minutes);
    assert!(!deletes_m1(&waiting), "{:?}", plan(&waiting));
    let waiting = with_dead_member(&[Some("10.0.0.4")], JUST_AFTER);
    assert!(deletes_m1(&waiting), "{:?}", plan(&waiting));
}

#[test]
fn machines_waiting_for_a_turn_no_longer_needed_go_outdated_first_then_newest() {
    // Scaled back to 3 before either joined.
    let mut o = growing(&[Some("10.0.0.4"), None]);
    o.replicas = 3;
    match plan(&o) {
        Step::Machines(MachineStep::DeleteMachine {
            machine,
            purpose: Removal::ScaleDown,
            message,
        }) => {
            assert_eq!(machine, "c1-etcd-m4");
            assert!(message.contains("no longer needed"), "{message}");
        }
        step => panic!("expected the newest waiting Machine to go, got {step:?}"),
    }
    // The spec changed under a waiting Machine: it goes rather than join.
    let mut o = growing(&[Some("10.0.0.4"), Some("10.0.0.5")]);
    o.machines[3].outdated = Some("etcdadmConfigSpec changed".into());
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::DeleteMachine { machine, purpose: Removal::Rollout, .. }) if machine == "c1-etcd-m3"
    ));
}

#[test]
fn a_rolling_update_without_a_control_plane_boots_nothing_ahead_of_its_step() {
    // Without a KubeadmControlPlane, maxSurge 1: n1 replaces an old member and its learner
    // joins; the next step's Machine is not created meanwhile (the removal after n1 could
    // take away the member its user data would join through): never more than N+1 Machines.
    let mut o = zoned(3, false);
    outdate_all(&mut o);
    let mut n1 = machine("c1-etcd-n1", Some("10.0.1.1"), Some("a"));
    n1.learner_join = true;
    n1.join_started = Some(Duration::from_secs(1));
    o.machines.push(n1);
    members_mut(&mut o).push(MemberView {
        id: 9,
        peer_urls: vec![names::peer_url("10.0.1.1")],
        is_learner: true,
        machine: Some("c1-etcd-n1".into()),
        ..Default::default()
    });
    assert_eq!(
        wait_reason(&plan(&o)),
        reason::WAITING_FOR_MEMBER_JOIN,
        "{:?}",
        plan(&o)
    );
    assert_eq!(crate::controller::plan::rollout::waiting_room(&o), 0);
}

#[test]
fn each_machine_reports_whether_it_runs_the_current_spec_once_and_keeps_its_transition_time() {
    use crate::controller::observation::ReportedCondition;
    let mut o = running(3);
    // Nothing reported yet: every Machine reports, up to date.
    let reports = up_to_date_reports(&o);
    assert_eq!(reports.len(), 3);
    assert!(
        reports
            .iter()
            .all(|r| r.up_to_date && r.message.is_empty() && r.since.is_none())
    );
    // Reported as it is: nothing to write.
    for m in &mut o.machines {
        m.up_to_date = Some(ReportedCondition {
            status: "True".into(),
            message: String::new(),
            last_transition_time: "2026-11-28T00:00:00Z".into(),
        });
    }
    assert!(up_to_date_reports(&o).is_empty());
    // Outdated: False with why, the transition time new.
    o.machines[0].outdated = Some("etcd version 3.5.16, 3.5.17 required".into());
    let reports = up_to_date_reports(&o);
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (
            reports[0].up_to_date,
            reports[0].message.as_str(),
            reports[0].since.as_deref()
        ),
        (false, "* etcd version 3.5.16, 3.5.17 required", None)
    );
    // Still False for another reason: the transition time kept.
    o.machines[0].up_to_date = Some(ReportedCondition {
        status: "False".into(),
        message: "* something else".into(),
        last_transition_time: "2026-11-28T01:00:00Z".into(),
    });
    assert_eq!(
        up_to_date_reports(&o)[0].since.as_deref(),
        Some("2026-11-28T01:00:00Z")
    );
    // A Machine being deleted reports nothing more.
    o.machines[0].deleting = true;
    assert!(up_to_date_reports(&o).is_empty());
}
