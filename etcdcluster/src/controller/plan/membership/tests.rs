//! Tests of `membership`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::testing::reason;
use crate::controller::testing::*;
use std::time::Duration;

use etcdadm_shared::names;

/// `running(voters)` growing by one learner-join Machine `c1-etcd-m<voters>`, `age` old,
/// whose member is in the state `member` gives (`None`: not added yet).
fn learner_joining(voters: usize, age: std::time::Duration, member: Option<MemberView>) -> Observation {
    let mut o = running(voters);
    // The next odd size: the spec allows no other. One Machine at a time, so that the join
    // of this one is all there is (booting ahead is tested on its own).
    o.replicas = (voters as i32 + 1) | 1;
    parallel_machines(&mut o, 1);
    let name = format!("c1-etcd-m{voters}");
    let mut m = machine(&name, Some(&format!("10.0.0.{}", voters + 1)), None);
    m.age = age;
    m.learner_join = true;
    o.machines.push(m);
    if let Some(member) = member {
        members_mut(&mut o).push(member);
    }
    o
}

/// The learner pre-added for Machine `c1-etcd-m<index>`, not started yet.
fn learner_added(index: usize) -> MemberView {
    MemberView {
        id: 10 + index as u64,
        peer_urls: vec![names::peer_url(&format!("10.0.0.{}", index + 1))],
        is_learner: true,
        machine: Some(format!("c1-etcd-m{index}")),
        message: Some("added, not started yet".into()),
        ..Default::default()
    }
}

/// The same learner, started and catching up (it refuses the linearizable health read).
fn learner_started(index: usize) -> MemberView {
    let name = format!("c1-etcd-m{index}");
    let mut m = unhealthy(
        member(10 + index as u64, &name, &format!("10.0.0.{}", index + 1)),
        "etcdserver: rpc not supported for learner",
    );
    m.is_learner = true;
    m.ever_healthy = false;
    m.is_leader = false;
    m
}

#[test]
fn a_learner_join_is_pre_added_at_its_exact_peer_url_once_the_machine_has_an_address() {
    let mut o = learner_joining(3, JUST_BEFORE, None);
    o.machines[3].address = None;
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
    o.machines[3].address = Some("10.0.0.4".into());
    let step = plan(&o);
    assert_eq!(
        step,
        Step::Membership(MembershipStep::AddLearner {
            machine: "c1-etcd-m3".into(),
            peer_url: "https://10.0.0.4:2380".into(),
            via_url: "https://10.0.0.1:2379".into(),
            record_turn: true,
        })
    );
    assert_eq!(step.reason().0, reason::ADDING_LEARNER);
    assert_eq!(step.event(&o).unwrap().reason, "LearnerAdded");
}

#[test]
fn a_pending_learner_is_waited_for_a_started_one_promoted() {
    let pending = plan(&learner_joining(3, JUST_BEFORE, Some(learner_added(3))));
    assert_eq!(
        wait_reason(&pending),
        reason::WAITING_FOR_MEMBER_JOIN,
        "{pending:?}"
    );
    assert!(
        wait_message(&pending).contains("added but has not started"),
        "{pending:?}"
    );
    let o = learner_joining(3, JUST_BEFORE, Some(learner_started(3)));
    let step = plan(&o);
    assert_eq!(
        step,
        Step::Membership(MembershipStep::PromoteLearner {
            member_id: 13,
            machine: "c1-etcd-m3".into(),
            via_url: "https://10.0.0.1:2379".into(),
        })
    );
    assert_eq!(step.reason().0, reason::LEARNER_CATCHING_UP);
    assert_eq!(step.event(&o).unwrap().reason, "LearnerPromoted");
    // Promoted: a voter like any other, healthy once caught up.
    let mut promoted = learner_started(3);
    promoted.is_learner = false;
    promoted.healthy = true;
    promoted.message = None;
    let mut o = learner_joining(3, JUST_BEFORE, Some(promoted));
    o.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: healthy_client_urls(&o),
    });
    assert!(
        matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
        "{:?}",
        plan(&o)
    );
}

#[test]
fn a_started_learner_is_promoted_even_past_the_join_deadline_only_until_it_fails() {
    // Promotion keeps being asked for until the join deadline; past it, a learner that
    // never became healthy is a failed join like any other.
    let before = plan(&learner_joining(1, JUST_BEFORE, Some(learner_started(1))));
    assert!(
        matches!(before, Step::Membership(MembershipStep::PromoteLearner { .. })),
        "{before:?}"
    );
    let after = plan(&learner_joining(1, JUST_AFTER, Some(learner_started(1))));
    assert_eq!(failed_join_of(&after), Some("c1-etcd-m1"), "{after:?}");
}

#[test]
fn a_learner_that_never_starts_is_removed_with_its_machine_even_beside_a_single_voter() {
    // Growing 1 -> 2: the second Machine never boots. Its learner never counted toward
    // quorum, so the one voter keeps serving and the learner goes once the deadline passes.
    let mut o = learner_joining(1, JUST_BEFORE, Some(learner_added(1)));
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    o.machines[1].age = JUST_AFTER;
    let step = plan(&o);
    assert_eq!(failed_join_of(&step), Some("c1-etcd-m1"), "{step:?}");
    assert_eq!(step.reason().0, reason::MEMBER_JOIN_FAILED);
    assert!(
        step.reason().1.contains("its member was added but never started"),
        "{step:?}"
    );
    // Its deletion removes the learner first (rule 4), asking the voter; then lets it go.
    o.machines[1].deleting = true;
    match plan(&o) {
        Step::Membership(MembershipStep::RemoveMember {
            member_id, via_url, ..
        }) => {
            assert_eq!(member_id, 11);
            assert_eq!(via_url, "https://10.0.0.1:2379");
        }
        step => panic!("expected the learner's removal, got {step:?}"),
    }
    members_mut(&mut o).retain(|m| m.id != 11);
    assert_eq!(
        plan(&o),
        Step::Membership(MembershipStep::ReleaseHook {
            machine: "c1-etcd-m1".into()
        })
    );
    // Gone: a new Machine replaces it.
    o.machines.pop();
    assert!(
        matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
        "{:?}",
        plan(&o)
    );
}

#[test]
fn never_two_learners_and_never_a_learner_beside_another_change() {
    // A second learner-join Machine waits while the first one's learner is there.
    let mut o = learner_joining(3, JUST_BEFORE, Some(learner_added(3)));
    let mut second = machine("c1-etcd-m4", Some("10.0.0.5"), None);
    second.learner_join = true;
    o.machines.push(second);
    o.replicas = 5;
    assert!(
        !matches!(plan(&o), Step::Membership(MembershipStep::AddLearner { .. })),
        "{:?}",
        plan(&o)
    );
    members_mut(&mut o).pop();
    members_mut(&mut o).push(learner_started(3));
    assert!(matches!(
        plan(&o),
        Step::Membership(MembershipStep::PromoteLearner { member_id: 13, .. })
    ));
    // Not while a voter is unhealthy (rule 2), nor beside a stranger (rule 4).
    let mut sick = learner_joining(3, JUST_BEFORE, None);
    members_mut(&mut sick)[2] = unhealthy(members_mut(&mut sick)[2].clone(), "connection refused");
    assert!(
        !matches!(plan(&sick), Step::Membership(MembershipStep::AddLearner { .. })),
        "{:?}",
        plan(&sick)
    );
    let mut stranger = learner_joining(3, JUST_BEFORE, None);
    members_mut(&mut stranger)[2].machine = None;
    stranger.machines.remove(2);
    let step = plan(&stranger);
    assert_eq!(wait_reason(&step), reason::UNKNOWN_MEMBERS, "{step:?}");
}

#[test]
fn the_first_member_and_voter_joins_are_never_pre_added() {
    let mut first = base();
    let mut m = machine("c1-etcd-m0", Some("10.0.0.1"), None);
    m.learner_join = true;
    first.machines.push(m);
    first.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: vec!["https://10.0.0.1:2379".into()],
    });
    first.etcd = EtcdView::Unreachable {
        message: "connection refused".into(),
    };
    assert_eq!(wait_reason(&plan(&first)), reason::WAITING_FOR_FIRST_MEMBER);
    // A Machine whose config renders today's voter join (no annotation, or a flavor that
    // cannot join as a learner) is waited for as before: etcdadm adds its voter itself.
    let mut voter = learner_joining(3, JUST_BEFORE, None);
    voter.machines[3].learner_join = false;
    let step = plan(&voter);
    assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN);
    assert_eq!(
        wait_message(&step),
        "Machine c1-etcd-m3 is not an etcd member yet"
    );
}

#[test]
fn a_voter_that_took_the_learners_peer_url_is_its_machines_member() {
    // Removal race: the stuck learner was removed as its node passed its wait, so etcdadm
    // added a voter itself. It is that Machine's member (rule 5), not a stranger.
    // (Beside a single voter that voter can never be removed: etcd needs both to commit.)
    let mut voter = unhealthy(member(20, "c1-etcd-m3", "10.0.0.4"), "not yet synced");
    voter.ever_healthy = false;
    voter.name = String::new();
    voter.client_urls = vec![];
    let mut o = learner_joining(3, JUST_BEFORE, Some(voter));
    o.machines[3].deleting = true;
    assert!(
        matches!(
            plan(&o),
            Step::Membership(MembershipStep::RemoveMember { member_id: 20, .. })
        ),
        "{:?}",
        plan(&o)
    );
}

#[test]
fn growing_one_to_five_machines_boot_ahead_up_to_the_bound_and_join_one_at_a_time() {
    // (parallelMachines, the creations and joins expected in order, when one order is the
    // only one the bound allows)
    let serial = ["create", "add-learner", "promote"].repeat(4);
    let ahead = [["create"].repeat(4), ["add-learner", "promote"].repeat(4)].concat();
    let cases: [(Option<i32>, Option<Vec<&str>>); 5] = [
        (None, Some(ahead)),
        (Some(4), None),
        (Some(3), None),
        (Some(2), None),
        (Some(1), Some(serial)),
    ];
    for (bound, expected) in cases {
        let mut o = running(1);
        o.replicas = 5;
        if let Some(n) = bound {
            parallel_machines(&mut o, n);
        }
        let mut w = World::new(o);
        let steps = w.run();
        let joins: Vec<&str> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Machines(MachineStep::CreateMachine { .. }) => Some("create"),
                Step::Membership(MembershipStep::AddLearner { .. }) => Some("add-learner"),
                Step::Membership(MembershipStep::PromoteLearner { .. }) => Some("promote"),
                _ => None,
            })
            .collect();
        if let Some(expected) = expected {
            assert_eq!(joins, expected, "{bound:?}: {steps:#?}");
        }
        // Joins one at a time: every learner added is promoted before the next is added.
        let adds: Vec<&str> = joins.iter().copied().filter(|s| *s != "create").collect();
        assert_eq!(adds, ["add-learner", "promote"].repeat(4), "{bound:?}");
        assert_eq!(joins.iter().filter(|s| **s == "create").count(), 4, "{bound:?}");
        assert_eq!(w.max_learners, 1, "{bound:?}");
        let most = bound.map_or(4, |n| n as usize);
        assert_eq!(w.max_unjoined, most, "{bound:?}: Machines not yet voters at once");
        assert_eq!(w.max_machines, 5, "{bound:?}");
        assert_eq!(w.o.voters().len(), 5);
    }
}

#[test]
fn voter_joins_create_one_machine_at_a_time_whatever_the_bound() {
    let mut o = running(1);
    o.replicas = 5;
    voter_joins(&mut o);
    let mut w = World::new(o);
    let steps = w.run();
    assert!(
        steps
            .iter()
            .all(|s| !matches!(s, Step::Membership(MembershipStep::AddLearner { .. }))),
        "{steps:#?}"
    );
    assert_eq!(
        w.max_unjoined, 0,
        "each voter joins at its creation in this world"
    );
    // A voter join in flight (created, not a member yet) holds the next creation back.
    let mut o = running(3);
    o.replicas = 5;
    voter_joins(&mut o);
    o.machines.push(machine("c1-etcd-m3", None, None));
    let step = plan(&o);
    assert_eq!(
        wait_reason(&step),
        reason::WAITING_FOR_MACHINE_ADDRESS,
        "{step:?}"
    );
    o.machines[3].address = Some("10.0.0.4".into());
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
}

#[test]
fn a_deleted_machines_member_is_removed_first_under_quorum_and_leader_rules() {
    // A follower: removed through a healthy member, then the hook is released.
    let mut o = running(3);
    o.machines[2].deleting = true;
    let step = plan(&o);
    assert_eq!(
        step,
        Step::Membership(MembershipStep::RemoveMember {
            member_id: 3,
            via_url: "https://10.0.0.1:2379".into(),
            member: "member of Machine c1-etcd-m2".into(),
            why: "Machine c1-etcd-m2 is being deleted".into(),
        })
    );
    members_mut(&mut o).pop();
    assert_eq!(
        plan(&o),
        Step::Membership(MembershipStep::ReleaseHook {
            machine: "c1-etcd-m2".into()
        })
    );
    // The leader (member 1): leadership moves first (rule 6), asked of the leader itself.
    let mut o = running(3);
    o.machines[0].deleting = true;
    assert_eq!(
        plan(&o),
        Step::Membership(MembershipStep::MoveLeader {
            leader_url: "https://10.0.0.1:2379".into(),
            to: 2,
            machine: "c1-etcd-m0".into()
        })
    );
    // Rule 3: 3 voters, one already unhealthy: removing a healthy one leaves 1 of 2.
    let mut o = running(3);
    o.machines[2].deleting = true;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    assert_eq!(wait_reason(&plan(&o)), reason::REMOVAL_WOULD_LOSE_QUORUM);
    // Removing the unhealthy one instead is fine: 2 of 2 remain.
    let mut o = running(3);
    o.machines[1].deleting = true;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    assert!(matches!(
        plan(&o),
        Step::Membership(MembershipStep::RemoveMember { member_id: 2, .. })
    ));
    // Never the last member.
    let mut o = running(1);
    o.replicas = 1;
    o.machines[0].deleting = true;
    assert_eq!(wait_reason(&plan(&o)), reason::LAST_MEMBER);
    // Membership unknown: wait, never release blindly.
    let mut o = running(3);
    o.machines[2].deleting = true;
    o.etcd = EtcdView::Unreachable { message: "x".into() };
    o.initialized = false;
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
    // A Machine that never got an address never joined.
    let mut o = base();
    o.machines.push(MachineView {
        deleting: true,
        ..machine("c1-etcd-x", None, None)
    });
    assert_eq!(
        plan(&o),
        Step::Membership(MembershipStep::ReleaseHook {
            machine: "c1-etcd-x".into()
        })
    );
    // No scale-up while a removal is in flight.
    let mut o = running(3);
    o.replicas = 3;
    o.machines[2].deleting = true;
    assert!(!matches!(
        plan(&o),
        Step::Machines(MachineStep::CreateMachine { .. })
    ));
}

#[test]
fn scale_down_five_to_three_to_one_removes_members_first_one_at_a_time() {
    let mut w = World::new(zoned(5, false));
    w.o.replicas = 3;
    let steps = w.run();
    assert_eq!(w.o.machines.len(), 3);
    assert_eq!(w.member_names().len(), 3);
    // Each Machine deletion is followed by its member's removal before the next deletion.
    let mut deleting: Option<String> = None;
    for step in &steps {
        match step {
            Step::Machines(MachineStep::DeleteMachine { machine, purpose, .. }) => {
                assert_eq!(*purpose, Removal::ScaleDown);
                assert!(deleting.is_none(), "two removals in flight: {steps:#?}");
                deleting = Some(machine.clone());
            }
            Step::Membership(MembershipStep::ReleaseHook { machine }) => {
                assert_eq!(deleting.as_deref(), Some(machine.as_str()));
                assert!(
                    w.removed.contains(machine),
                    "hook released before the member left"
                );
                deleting = None;
            }
            _ => {}
        }
    }
    assert_eq!(zone_counts(&w.o), vec![1, 1, 1], "{:?}", w.o.machines);
    // 3 → 1 passes through two members: removing a healthy one of two is allowed.
    w.o.replicas = 1;
    w.run();
    assert_eq!(w.o.machines.len(), 1);
    assert_eq!(w.member_names().len(), 1);
    // And back to 3.
    w.o.replicas = 3;
    w.run();
    assert_eq!(w.member_names().len(), 3);
    assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
}

#[test]
fn orphans_unhealthy_members_go_healthy_ones_stay_machines_are_adopted_or_replaced() {
    let after = Duration::from_secs(5);
    // An unhealthy member on no Machine: removed under rule 3 once overdue.
    let mut o = running(3);
    o.remediation.unhealthy_after = after;
    members_mut(&mut o).push(MemberView {
        machine: None,
        unhealthy_for: Duration::from_secs(9),
        ..unhealthy(member(7, "gone-machine", "10.0.0.9"), "connection refused")
    });
    let step = plan(&o);
    assert!(
        matches!(&step, Step::Membership(MembershipStep::RemoveMember { member_id: 7, why, .. }) if why.contains("no Machine")),
        "{step:?}"
    );
    // Even with remediation disabled (rule 4 is not remediation).
    o.remediation.enabled = false;
    assert!(matches!(
        plan(&o),
        Step::Membership(MembershipStep::RemoveMember { member_id: 7, .. })
    ));
    // Healthy: never touched.
    members_mut(&mut o)[3].healthy = true;
    assert_eq!(wait_reason(&plan(&o)), reason::UNKNOWN_MEMBERS);
    // A Machine whose member left etcd: replaced once overdue.
    let mut o = running(3);
    o.remediation.unhealthy_after = after;
    members_mut(&mut o).remove(2);
    o.machines[2].was_member = true;
    o.machines[2].unhealthy_for = Duration::from_secs(2);
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
    o.machines[2].unhealthy_for = Duration::from_secs(6);
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::DeleteMachine {
            purpose: Removal::OrphanMachine,
            ..
        })
    ));
    // A new Machine without a member is a join in flight, not an orphan.
    o.machines[2].was_member = false;
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    // Labelled Machines with no controller, or without our hook, are adopted first.
    let mut o = running(3);
    o.machines[1].orphan = true;
    assert_eq!(
        plan(&o),
        Step::Machines(MachineStep::AdoptMachine {
            machine: "c1-etcd-m1".into(),
            orphan: true,
        })
    );
    let mut o = running(3);
    o.machines[2].has_hook = false;
    assert_eq!(
        plan(&o),
        Step::Machines(MachineStep::AdoptMachine {
            machine: "c1-etcd-m2".into(),
            orphan: false,
        })
    );
}

#[test]
fn after_a_promotion_the_next_step_follows_shortly_and_after_an_addition_the_node_is_given_time() {
    let o = running(3);
    let url = || "https://10.0.0.1:2379".to_string();
    for (what, step, after) in [
        (
            "learner added: its node starts etcd",
            MembershipStep::AddLearner {
                machine: "c1-etcd-m4".into(),
                via_url: url(),
                peer_url: "https://10.0.0.4:2380".into(),
                record_turn: true,
            },
            After::Requeue(JOIN_POLL),
        ),
        (
            "learner promoted: the next learner's turn or Ready",
            MembershipStep::PromoteLearner {
                member_id: 13,
                machine: "c1-etcd-m3".into(),
                via_url: url(),
            },
            After::Requeue(PROMOTION_APPLIED),
        ),
        (
            "member removed",
            MembershipStep::RemoveMember {
                member_id: 13,
                member: "member m3".into(),
                via_url: url(),
                why: "x".into(),
            },
            After::Requeue(MEMBERSHIP_RETRY),
        ),
    ] {
        assert_eq!(step.after(&o), after, "{what}");
    }
}
