//! Learner joins (SPEC-day2.md section 4): a joining Machine's member is pre-added as a learner
//! at the exact peer URL its node advertises, then promoted as soon as etcd accepts, so a
//! machine that never catches up never counts toward quorum.

use etcdadm_shared::names;

use super::observed::{Observed, healthy_client_urls};
use super::step::Step;

/// Rule 1: promotion finishes the learner's add. Our started learner is promoted (unless
/// another member is still joining), asking a healthy voter; etcd refuses until it has caught
/// up, and the attempt is repeated.
pub(super) fn promote(o: &Observed) -> Option<Step> {
    let members = o.members();
    if members.iter().any(|m| !m.is_started()) {
        return None;
    }
    let learner = members
        .iter()
        .find(|m| m.is_learner && m.is_started() && m.machine.is_some())?;
    let via_url = healthy_client_urls(o).into_iter().next()?;
    Some(Step::PromoteLearner {
        member_id: learner.id,
        machine: learner.machine.clone()?,
        via_url,
    })
}

/// Rules 1, 2 and 4: a Machine that joins as a learner and has its address is pre-added, once
/// every member is a started, healthy voter of ours (so never two learners). The first member
/// initializes the cluster and is never pre-added.
pub(super) fn pre_add(o: &Observed) -> Option<Step> {
    if !o.initialized_now() {
        return None;
    }
    let machine = o
        .active_machines()
        .find(|m| m.learner_join && !m.was_member && o.member_of(&m.name).is_none())?;
    let address = machine.address.as_deref()?;
    let members = o.members();
    let clear = !members.is_empty()
        && members
            .iter()
            .all(|m| m.is_started() && m.healthy && !m.is_learner && m.machine.is_some());
    if !clear {
        return None;
    }
    let via_url = healthy_client_urls(o).into_iter().next()?;
    Some(Step::AddLearner {
        machine: machine.name.clone(),
        peer_url: names::peer_url(address),
        via_url,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use etcdadm_shared::names;

    use super::super::testing::*;
    use super::super::*;

    /// `running(voters)` growing by one learner-join Machine `c1-etcd-m<voters>`, `age` old,
    /// whose member is in the state `member` gives (`None`: not added yet).
    fn learner_joining(voters: usize, age: std::time::Duration, member: Option<MemberView>) -> Observed {
        let mut o = running(voters);
        // The next odd size: the spec allows no other.
        o.replicas = (voters as i32 + 1) | 1;
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
            Step::AddLearner {
                machine: "c1-etcd-m3".into(),
                peer_url: "https://10.0.0.4:2380".into(),
                via_url: "https://10.0.0.1:2379".into(),
            }
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
            Step::PromoteLearner {
                member_id: 13,
                machine: "c1-etcd-m3".into(),
                via_url: "https://10.0.0.1:2379".into(),
            }
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
        assert!(matches!(plan(&o), Step::CreateMachine { .. }), "{:?}", plan(&o));
    }

    #[test]
    fn a_started_learner_is_promoted_even_past_the_join_deadline_only_until_it_fails() {
        // Promotion keeps being asked for until the join deadline; past it, a learner that
        // never became healthy is a failed join like any other.
        let before = plan(&learner_joining(1, JUST_BEFORE, Some(learner_started(1))));
        assert!(matches!(before, Step::PromoteLearner { .. }), "{before:?}");
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
            Step::RemoveMember {
                member_id, via_url, ..
            } => {
                assert_eq!(member_id, 11);
                assert_eq!(via_url, "https://10.0.0.1:2379");
            }
            step => panic!("expected the learner's removal, got {step:?}"),
        }
        members_mut(&mut o).retain(|m| m.id != 11);
        assert_eq!(
            plan(&o),
            Step::ReleaseHook {
                machine: "c1-etcd-m1".into()
            }
        );
        // Gone: a new Machine replaces it.
        o.machines.pop();
        assert!(matches!(plan(&o), Step::CreateMachine { .. }), "{:?}", plan(&o));
    }

    #[test]
    fn never_two_learners_and_never_a_learner_beside_another_change() {
        // A second learner-join Machine waits while the first one's learner is there.
        let mut o = learner_joining(3, JUST_BEFORE, Some(learner_added(3)));
        let mut second = machine("c1-etcd-m4", Some("10.0.0.5"), None);
        second.learner_join = true;
        o.machines.push(second);
        o.replicas = 5;
        assert!(!matches!(plan(&o), Step::AddLearner { .. }), "{:?}", plan(&o));
        members_mut(&mut o).pop();
        members_mut(&mut o).push(learner_started(3));
        assert!(matches!(plan(&o), Step::PromoteLearner { member_id: 13, .. }));
        // Not while a voter is unhealthy (rule 2), nor beside a stranger (rule 4).
        let mut sick = learner_joining(3, JUST_BEFORE, None);
        members_mut(&mut sick)[2] = unhealthy(members_mut(&mut sick)[2].clone(), "connection refused");
        assert!(
            !matches!(plan(&sick), Step::AddLearner { .. }),
            "{:?}",
            plan(&sick)
        );
        let mut stranger = learner_joining(3, JUST_BEFORE, None);
        members_mut(&mut stranger)[2].machine = None;
        stranger.machines.remove(2);
        let step = plan(&stranger);
        assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN);
        assert!(
            wait_message(&step).contains("added as a learner once every member is a healthy voter of ours")
        );
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
            matches!(plan(&o), Step::RemoveMember { member_id: 20, .. }),
            "{:?}",
            plan(&o)
        );
    }

    #[test]
    fn growing_one_to_five_every_join_is_a_learner_add_then_its_promotion() {
        let mut w = World::new(running(1));
        w.learner_joins = true;
        w.o.replicas = 5;
        let steps = w.run();
        let joins: Vec<&str> = steps
            .iter()
            .filter_map(|s| match s {
                Step::CreateMachine { .. } => Some("create"),
                Step::AddLearner { .. } => Some("add-learner"),
                Step::PromoteLearner { .. } => Some("promote"),
                _ => None,
            })
            .collect();
        assert_eq!(
            joins,
            ["create", "add-learner", "promote"].repeat(4),
            "{steps:#?}"
        );
        assert_eq!(w.max_learners, 1);
        assert_eq!(w.o.voters().len(), 5);
    }
}
