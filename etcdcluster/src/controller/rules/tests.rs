//! Tests of `rules`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::testing::reason;
use crate::controller::testing::*;
use etcdadm_shared::names;

#[test]
fn never_add_while_a_member_is_unhealthy() {
    let mut o = running(2);
    o.replicas = 3;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "RAFT NO LEADER");
    // 1 of 2 healthy is below quorum: nothing at all.
    assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
    let mut o = running(3);
    o.replicas = 5;
    members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::WAITING_FOR_HEALTHY_MEMBERS);
    assert!(wait_message(&step).contains("c1-etcd-m2"));
    assert!(wait_message(&step).contains("connection refused"));
}

#[test]
fn never_add_while_a_join_is_pending() {
    // A Machine without an etcd member yet.
    let mut o = running(1);
    o.machines.push(machine("c1-etcd-m1", Some("10.0.0.2"), None));
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN);
    assert!(wait_message(&step).contains("c1-etcd-m1"));
    // MemberAdd done, process not started: pending (rule 1), not "quorum lost".
    members_mut(&mut o).push(MemberView {
        id: 9,
        peer_urls: vec![names::peer_url("10.0.0.2")],
        healthy: false,
        machine: Some("c1-etcd-m1".into()),
        ..Default::default()
    });
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    // Started, catching up (never healthy yet): still a join in flight.
    let joined = member(9, "c1-etcd-m1", "10.0.0.2");
    members_mut(&mut o)[1] = MemberView {
        ever_healthy: false,
        ..unhealthy(joined, "not ready")
    };
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
    // A learner is a change in flight too: ours is promoted, nothing is added beside it;
    // one on none of our Machines is waited for.
    let mut o = running(3);
    o.replicas = 5;
    members_mut(&mut o)[2].is_learner = true;
    assert!(
        matches!(
            plan(&o),
            Step::Membership(MembershipStep::PromoteLearner { member_id: 3, .. })
        ),
        "{:?}",
        plan(&o)
    );
    o.machines.pop();
    members_mut(&mut o)[2].machine = None;
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_LEARNER);
}

#[test]
fn exactly_one_machine_is_added_per_step_once_all_are_healthy_voters() {
    let mut o = running(1);
    assert_eq!(
        plan(&o),
        created_machine("c1-etcd-fresh", false, None, Growth::ScaleUp)
    );
    // Before the first member was ever healthy, even with a member list, no second add.
    o.initialized = false;
    members_mut(&mut o)[0] = MemberView {
        ever_healthy: false,
        ..unhealthy(members_mut(&mut o)[0].clone(), "starting")
    };
    assert!(!matches!(
        plan(&o),
        Step::Machines(MachineStep::CreateMachine { .. })
    ));
}

#[test]
fn quorum_lost_means_no_writes_at_all() {
    let mut o = running(3);
    for i in [1, 2] {
        members_mut(&mut o)[i] = unhealthy(members_mut(&mut o)[i].clone(), "connection refused");
    }
    o.kcp = kcp(&[], true, false);
    o.leftovers = vec!["c1-etcd-zzzzz".into()];
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::QUORUM_LOST);
    assert!(wait_message(&step).contains("1 of 3"));
    assert!(!step.writes());
    // Nobody answering at all after initialization holds everything too, said as it is.
    let mut o = running(3);
    o.etcd = EtcdView::Unreachable {
        message: "all refused".into(),
    };
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::MEMBERS_UNREACHABLE);
    assert!(!step.writes());
}

#[test]
fn a_member_without_machine_blocks_ready_but_is_never_touched() {
    let mut o = running(3);
    members_mut(&mut o).push(MemberView {
        machine: None,
        ..member(7, "restored", "10.0.0.9")
    });
    assert!(!is_ready(&o));
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::UNKNOWN_MEMBERS);
    assert!(!step.writes());
}

#[test]
fn refusals_never_break_the_membership_rules() {
    // Removing a member from a 2-member cluster whose other member is unhealthy: quorum is
    // already lost, nothing is written.
    let mut o = running(2);
    o.replicas = 1;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::QUORUM_LOST);
    assert!(!step.writes() && step.is_refusal());
    // Removing a healthy member while another is dead (3 members): refused, whoever asks.
    let mut o = running(3);
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    o.machines[2].deleting = true;
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::REMOVAL_WOULD_LOSE_QUORUM);
    assert!(step.is_refusal());
    // ... and a scale down to 1 takes the dead one, never a healthy one first.
    let mut o = running(3);
    o.replicas = 1;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    assert!(
        matches!(plan(&o), Step::Machines(MachineStep::DeleteMachine { machine, .. }) if machine == "c1-etcd-m1")
    );
    let mut o = running(3);
    o.replicas = 1;
    o.machines[2].delete_requested = true;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    let step = plan(&o);
    assert_eq!(
        wait_reason(&step),
        reason::WAITING_FOR_HEALTHY_MEMBERS,
        "{step:?}"
    );
    // Removing the last member.
    let mut o = running(1);
    o.machines[0].deleting = true;
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::LAST_MEMBER);
    assert!(step.is_refusal());
    // Adding while a member is unhealthy.
    let mut o = running(3);
    o.replicas = 5;
    members_mut(&mut o)[0] = unhealthy(members_mut(&mut o)[0].clone(), "down");
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
    // Promoting or adding during quorum loss: nothing, even with a learner waiting.
    let mut o = running(3);
    o.replicas = 5;
    members_mut(&mut o)[2].is_learner = true;
    members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::QUORUM_LOST, "{step:?}");
    assert!(!step.writes());
    // Allowed: one healthy member of a healthy 2-member cluster (that is how 3 → 1 works).
    let mut o = running(2);
    o.replicas = 1;
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::DeleteMachine {
            purpose: Removal::ScaleDown,
            ..
        })
    ));
    let mut o = running(2);
    o.machines[1].deleting = true;
    assert!(matches!(
        plan(&o),
        Step::Membership(MembershipStep::RemoveMember { member_id: 2, .. })
    ));
}

#[test]
fn quorum_is_a_strict_majority() {
    assert_eq!([1, 2, 3, 4, 5].map(quorum), [1, 2, 2, 3, 3]);
}

/// Property tests in the manner of KCP's `canSafelyRemoveEtcdMember` tests: random
/// memberships, health, Machines and specs; whatever the plan picks never breaks rules 1, 2,
/// 3 or 6.
mod properties {
    use std::time::Duration;

    use etcdadm_shared::names;
    use proptest::prelude::*;

    use crate::controller::testing::*;

    #[derive(Clone, Debug)]
    struct MemberSeed {
        started: bool,
        healthy: bool,
        ever_healthy: bool,
        learner: bool,
        on_machine: bool,
        overdue: bool,
        machine: MachineSeed,
    }

    #[derive(Clone, Debug)]
    struct MachineSeed {
        address: bool,
        deleting: bool,
        /// A Machine being deleted still holds our hook (its member is not removed yet).
        hook_kept: bool,
        delete_requested: bool,
        outdated: bool,
        was_member: bool,
        old: bool,
        /// Its config asks for a learner join.
        learner_join: bool,
        /// A learner join whose turn came (recorded on the Machine).
        turn: bool,
        /// The infrastructure reports it failed.
        failed: bool,
    }

    #[derive(Clone, Debug)]
    struct WorldSeed {
        members: Vec<MemberSeed>,
        leader: Option<usize>,
        extra_machines: Vec<MachineSeed>,
        replicas: i32,
        max_surge: i32,
        remediation: bool,
        creation_complete: bool,
        unreachable: bool,
        kcp: Option<(u8, bool)>,
        /// The spec's new members join as voters (the eks-anywhere flavor), else as learners
        /// that may boot ahead of their turn.
        voter_joins: bool,
        /// `provisioning.parallelMachines`.
        parallel_machines: Option<i32>,
    }

    fn machine_seed() -> impl Strategy<Value = MachineSeed> {
        (
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.15),
            any::<bool>(),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.3),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.1),
        )
            .prop_map(
                |(
                    address,
                    deleting,
                    hook_kept,
                    delete_requested,
                    outdated,
                    was_member,
                    old,
                    learner_join,
                    turn,
                    failed,
                )| {
                    MachineSeed {
                        address,
                        deleting,
                        hook_kept,
                        delete_requested,
                        outdated,
                        was_member,
                        old,
                        learner_join,
                        turn,
                        failed,
                    }
                },
            )
    }

    fn member_seed() -> impl Strategy<Value = MemberSeed> {
        (
            prop::bool::weighted(0.95),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.95),
            any::<bool>(),
            machine_seed(),
        )
            .prop_map(
                |(started, healthy, ever_healthy, learner, on_machine, overdue, machine)| MemberSeed {
                    started,
                    healthy,
                    ever_healthy,
                    learner,
                    on_machine,
                    overdue,
                    machine,
                },
            )
    }

    fn world_seed() -> impl Strategy<Value = WorldSeed> {
        (
            prop::collection::vec(member_seed(), 1..=7),
            prop::option::of(0usize..7),
            prop::collection::vec(machine_seed(), 0..=3),
            prop::sample::select(vec![1, 3, 5, 7]),
            0..=1i32,
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.05),
            prop::option::of((any::<u8>(), any::<bool>())),
            prop::bool::weighted(0.3),
            prop::option::of(1..=3i32),
        )
            .prop_map(
                |(
                    members,
                    leader,
                    extra_machines,
                    replicas,
                    max_surge,
                    remediation,
                    creation_complete,
                    unreachable,
                    kcp,
                    voter_joins,
                    parallel_machines,
                )| WorldSeed {
                    members,
                    leader,
                    extra_machines,
                    replicas,
                    max_surge,
                    remediation,
                    creation_complete,
                    unreachable,
                    kcp,
                    voter_joins,
                    parallel_machines,
                },
            )
    }

    /// Mostly serving clusters growing or rolling with learner joins: healthy voters of ours,
    /// perhaps a learner, and Machines booting, waiting for their turn or failing before
    /// it. (The worlds above are mostly broken, where nothing boots ahead.)
    fn serving_world_seed() -> impl Strategy<Value = WorldSeed> {
        let machine = (
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.03),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.05),
        )
            .prop_map(
                |(address, deleting, outdated, old, learner_join, turn, failed)| MachineSeed {
                    address,
                    deleting,
                    hook_kept: true,
                    delete_requested: false,
                    outdated,
                    was_member: false,
                    old,
                    learner_join,
                    turn,
                    failed,
                },
            );
        let member = (
            prop::bool::weighted(0.6),
            prop::bool::weighted(0.95),
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.98),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(started, healthy, learner, on_machine, outdated)| MemberSeed {
                // Only a learner may not have started yet (it was just added).
                started: started || !learner,
                healthy,
                ever_healthy: !learner,
                learner,
                on_machine,
                overdue: false,
                machine: MachineSeed {
                    address: true,
                    deleting: false,
                    hook_kept: true,
                    delete_requested: false,
                    outdated,
                    was_member: !learner,
                    old: false,
                    learner_join: learner,
                    turn: learner,
                    failed: false,
                },
            });
        (
            prop::collection::vec(member, 1..=5),
            prop::collection::vec(machine, 0..=3),
            prop::sample::select(vec![3, 5, 7]),
            0..=1i32,
            any::<bool>(),
            prop::option::of(any::<bool>()),
            prop::bool::weighted(0.15),
            prop::option::of(1..=4i32),
        )
            .prop_map(
                |(
                    members,
                    extra_machines,
                    replicas,
                    max_surge,
                    creation_complete,
                    kcp,
                    voter_joins,
                    parallel_machines,
                )| {
                    WorldSeed {
                        members,
                        leader: Some(0),
                        extra_machines,
                        replicas,
                        max_surge,
                        remediation: true,
                        creation_complete,
                        unreachable: false,
                        kcp: kcp.map(|complete| (u8::MAX, complete)),
                        voter_joins,
                        parallel_machines,
                    }
                },
            )
    }

    const OVERDUE: Duration = Duration::from_secs(600);

    fn machine_view(name: &str, address: &str, seed: &MachineSeed) -> MachineView {
        MachineView {
            name: name.into(),
            address: seed.address.then(|| address.to_string()),
            deleting: seed.deleting,
            has_hook: !seed.deleting || seed.hook_kept,
            delete_requested: seed.delete_requested,
            outdated: seed.outdated.then(|| "etcdadmConfigSpec changed".to_string()),
            age: if seed.old {
                OVERDUE
            } else {
                Duration::from_secs(10)
            },
            learner_join: seed.learner_join,
            join_started: (seed.learner_join && seed.turn).then_some(if seed.old {
                OVERDUE
            } else {
                Duration::from_secs(10)
            }),
            // Between a young Machine's age and an old one's: an old one waiting for its turn
            // has outlived its user data's wait.
            listed_wait: seed.learner_join.then_some(Duration::from_secs(400)),
            failed: seed.failed,
            ..Default::default()
        }
    }

    /// An initialized cluster past all housekeeping, as the seed describes it.
    fn world(seed: &WorldSeed) -> Observation {
        let mut o = base();
        o.initialized = true;
        o.replicas = seed.replicas;
        o.max_surge = seed.max_surge;
        o.remediation.enabled = seed.remediation;
        o.remediation.unhealthy_after = Duration::from_secs(300);
        o.remediation.join_deadline = Duration::from_secs(300);
        o.creation_complete = seed.creation_complete;
        if seed.voter_joins {
            voter_joins(&mut o);
        }
        if let Some(n) = seed.parallel_machines {
            parallel_machines(&mut o, n);
        }
        let mut members = vec![];
        for (i, m) in seed.members.iter().enumerate() {
            let name = format!("c1-etcd-m{i}");
            let address = format!("10.0.0.{}", i + 1);
            let healthy = m.started && m.healthy;
            let unhealthy_for = if !healthy && m.overdue {
                OVERDUE
            } else {
                Duration::ZERO
            };
            members.push(MemberView {
                id: i as u64 + 1,
                name: if m.started { name.clone() } else { String::new() },
                peer_urls: vec![names::peer_url(&address)],
                client_urls: if m.started {
                    vec![names::client_url(&address)]
                } else {
                    vec![]
                },
                is_learner: m.learner,
                healthy,
                ever_healthy: healthy || (m.started && m.ever_healthy),
                is_leader: m.started && seed.leader == Some(i),
                message: (!healthy).then(|| "connection refused".to_string()),
                machine: m.on_machine.then(|| name.clone()),
                unhealthy_for,
                ..Default::default()
            });
            if m.on_machine {
                let mut machine = machine_view(&name, &address, &m.machine);
                machine.address = Some(address);
                machine.was_member = m.started && !m.learner;
                machine.unhealthy_for = unhealthy_for;
                o.machines.push(machine);
            }
        }
        for (j, seed) in seed.extra_machines.iter().enumerate() {
            let mut machine = machine_view(&format!("c1-etcd-x{j}"), &format!("10.0.1.{j}"), seed);
            machine.was_member = seed.was_member;
            machine.unhealthy_for = if seed.was_member && seed.old {
                OVERDUE
            } else {
                Duration::ZERO
            };
            o.machines.push(machine);
        }
        o.etcd = if seed.unreachable {
            EtcdView::Unreachable {
                message: "connection refused".into(),
            }
        } else {
            EtcdView::Members(members)
        };
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        if let Some((mask, rollout_complete)) = seed.kcp {
            let endpoints: Vec<String> = o
                .members()
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .flat_map(|(_, m)| m.client_urls.clone())
                .collect();
            let refs: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            // Paused until creation completes, as the plan itself leaves it.
            o.kcp = kcp(&refs, !seed.creation_complete, true);
            if let KcpView::Found {
                rollout_complete: complete,
                ..
            } = &mut o.kcp
            {
                *complete = rollout_complete;
            }
        }
        o
    }

    /// Steps that change the membership now or start a change (a Machine deletion removes
    /// its member through the hook).
    fn changes_membership(step: &Step) -> bool {
        matches!(
            step,
            Step::Machines(MachineStep::CreateMachine { .. })
                | Step::Machines(MachineStep::DeleteMachine { .. })
                | Step::Membership(MembershipStep::RemoveMember { .. })
                | Step::Membership(MembershipStep::MoveLeader { .. })
                | Step::Membership(MembershipStep::AddLearner { .. })
                | Step::Membership(MembershipStep::PromoteLearner { .. })
        )
    }

    /// Rule 3 for removing `member`: never the last voter, and a quorum of the remaining
    /// voters stays healthy.
    fn removable(o: &Observation, member: &MemberView) -> Result<(), String> {
        if member.is_learner {
            return Ok(());
        }
        let voters = o.voters();
        let healthy = voters.iter().filter(|m| m.healthy).count();
        if voters.len() <= 1 {
            return Err(format!("removes the last voter {}", member.id));
        }
        let after = healthy - usize::from(member.healthy);
        if after < quorum(voters.len() - 1) {
            return Err(format!(
                "removing {} leaves {after} healthy of {} voters",
                member.id,
                voters.len() - 1
            ));
        }
        Ok(())
    }

    /// Rules 1 and 2 for an add (a Machine, or a learner for one): nothing being deleted,
    /// every member a started, healthy voter of ours (so never a second learner).
    fn add_allowed(o: &Observation, what: &str) -> Result<(), String> {
        if o.machines.iter().any(|m| m.deleting) {
            return Err(format!("{what} while a Machine is being deleted"));
        }
        if let Some(m) = o
            .members()
            .iter()
            .find(|m| !m.is_started() || !m.healthy || m.is_learner || m.machine.is_none())
        {
            return Err(format!(
                "{what} while member {} is not a healthy voter of ours (learner: {})",
                m.id, m.is_learner
            ));
        }
        Ok(())
    }

    /// Boot ahead: a Machine that joins as a learner may be created while learners and other
    /// Machines wait (creating it changes no membership), but only into a cluster whose
    /// voters are started, healthy and ours, with nothing being deleted, no voter join in
    /// flight, and within the Machines the strategy allows: N for a resize and a
    /// remove-first rollout, N + 2 adding first (one member ahead, one Machine booting
    /// for the next step), 2N with a control plane; and within `parallelMachines`.
    fn ahead_allowed(o: &Observation) -> Result<(), String> {
        if let Some(m) = o.machines.iter().find(|m| m.deleting) {
            return Err(format!("adds while Machine {} is being deleted", m.name));
        }
        if matches!(o.etcd, EtcdView::Unreachable { .. }) || o.members().is_empty() {
            return Err("adds while no member answers".into());
        }
        if let Some(m) = o
            .members()
            .iter()
            .find(|m| m.machine.is_none() || (!m.is_learner && (!m.is_started() || !m.healthy)))
        {
            return Err(format!(
                "adds while member {} is not a healthy voter of ours",
                m.id
            ));
        }
        let unjoined = |m: &&MachineView| {
            !m.was_member
                && !o
                    .member_of(&m.name)
                    .is_some_and(|member| member.is_started() && !member.is_learner)
        };
        if let Some(m) = o.active_machines().filter(unjoined).find(|m| !m.learner_join) {
            return Err(format!("adds while Machine {} joins as a voter", m.name));
        }
        let n = usize::try_from(o.replicas).unwrap();
        let after = o.active_machines().count() + 1;
        let rolling = o.active_machines().any(|m| m.outdated.is_some());
        let most = match (rolling && o.surge(), o.kcp_in_use()) {
            (false, _) => n,
            (true, Some(_)) => 2 * n,
            (true, None) => n + 2,
        };
        if after > most {
            return Err(format!("{after} Machines, more than {most}"));
        }
        let not_voters = o.active_machines().filter(unjoined).count() + 1;
        if o.parallel_machines().is_some_and(|bound| not_voters > bound) {
            return Err(format!(
                "{not_voters} Machines not yet voters, over parallelMachines"
            ));
        }
        Ok(())
    }

    fn check(o: &Observation, step: &Step) -> Result<(), String> {
        let voters = o.voters();
        let healthy = voters.iter().filter(|m| m.healthy).count();
        let quorum_lost = match &o.etcd {
            EtcdView::Unreachable { .. } => true,
            _ => !voters.is_empty() && healthy < quorum(voters.len()),
        };
        if quorum_lost && changes_membership(step) {
            return Err("a membership change while quorum is lost".into());
        }
        let deleting = o.machines.iter().filter(|m| m.deleting).count();
        match step {
            Step::Membership(MembershipStep::RemoveMember { member_id, .. }) => {
                let member = o
                    .members()
                    .iter()
                    .find(|m| m.id == *member_id)
                    .ok_or("an unknown member")?;
                removable(o, member)?;
                if member.is_leader && member.healthy {
                    return Err("removes the healthy leader without moving leadership".into());
                }
                if let Some(other) = o.members().iter().find(|m| m.id != *member_id && m.is_joining()) {
                    return Err(format!("removes a member while {} joins", other.id));
                }
            }
            Step::Membership(MembershipStep::MoveLeader { to, machine, .. }) => {
                let from = o.member_of(machine).ok_or("moves leadership from no member")?;
                let target = o
                    .members()
                    .iter()
                    .find(|m| m.id == *to)
                    .ok_or("to an unknown member")?;
                if !from.is_leader || target.id == from.id || !target.healthy || target.is_learner {
                    return Err(format!("moves leadership from {} to {}", from.id, target.id));
                }
                removable(o, from)?;
            }
            Step::Machines(MachineStep::DeleteMachine { machine, .. }) => {
                if deleting > 0 {
                    return Err("deletes a Machine while another is being deleted".into());
                }
                if let Some(member) = o.member_of(machine) {
                    removable(o, member)?;
                }
            }
            Step::Membership(MembershipStep::AddLearner {
                machine, peer_url, ..
            }) => {
                add_allowed(o, "adds a learner")?;
                let target = o
                    .active_machines()
                    .find(|m| &m.name == machine)
                    .ok_or("adds a learner for no active Machine")?;
                if !target.learner_join || o.member_of(machine).is_some() {
                    return Err(format!(
                        "adds a learner for Machine {machine}, which does not need one"
                    ));
                }
                if target.address.as_deref().map(names::peer_url).as_ref() != Some(peer_url) {
                    return Err(format!(
                        "adds a learner at {peer_url}, not Machine {machine}'s peer URL"
                    ));
                }
            }
            Step::Membership(MembershipStep::PromoteLearner { member_id, .. }) => {
                let learner = o
                    .members()
                    .iter()
                    .find(|m| m.id == *member_id)
                    .ok_or("promotes an unknown member")?;
                if !learner.is_learner || !learner.is_started() || learner.machine.is_none() {
                    return Err(format!(
                        "promotes member {member_id}, not a started learner of ours"
                    ));
                }
                if deleting > 0 {
                    return Err("promotes while a Machine is being deleted".into());
                }
                if let Some(m) = o.members().iter().find(|m| !m.is_started()) {
                    return Err(format!("promotes while member {} has not started", m.id));
                }
            }
            Step::Machines(MachineStep::CreateMachine { .. }) if !o.learner_joins() => {
                add_allowed(o, "adds")?;
                if let Some(m) = o
                    .active_machines()
                    .find(|m| m.address.is_none() || o.member_of(&m.name).is_none())
                {
                    return Err(format!("adds while Machine {} has not joined", m.name));
                }
                if matches!(o.etcd, EtcdView::Unreachable { .. }) {
                    return Err("adds while no member answers".into());
                }
            }
            Step::Machines(MachineStep::CreateMachine { .. }) => ahead_allowed(o)?,
            _ => {}
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_planned_step_breaks_the_membership_rules(seed in world_seed()) {
            let o = world(&seed);
            let step = plan(&o);
            if let Err(broken) = check(&o, &step) {
                prop_assert!(false, "{broken}: {step:?}\nin {o:#?}");
            }
        }

        /// Booting ahead of the turn to join (docs/safety.md, "Boot ahead") keeps every rule,
        /// in the worlds where Machines boot ahead.
        #[test]
        fn booting_ahead_breaks_no_membership_rule(seed in serving_world_seed()) {
            let o = world(&seed);
            let step = plan(&o);
            if let Err(broken) = check(&o, &step) {
                prop_assert!(false, "{broken}: {step:?}\nin {o:#?}");
            }
        }

        /// A learner never counts toward H or |V|: how healthy the learners are never
        /// decides whether quorum is lost, nor which removal is allowed.
        #[test]
        fn a_learners_health_never_counts_toward_quorum(seed in world_seed()) {
            let o = world(&seed);
            let mut flipped = o.clone();
            if let EtcdView::Members(members) = &mut flipped.etcd {
                for m in members.iter_mut().filter(|m| m.is_learner && m.is_started()) {
                    m.healthy = !m.healthy;
                }
            }
            let lost = |step: &Step| matches!(step, Step::Hold(hold) if hold.reason == reason::QUORUM_LOST);
            let (a, b) = (plan(&o), plan(&flipped));
            prop_assert_eq!(lost(&a), lost(&b), "{:?} / {:?}", a, b);
            for (world, step) in [(&o, &a), (&flipped, &b)] {
                if let Step::Membership(MembershipStep::RemoveMember { member_id, .. }) = step {
                    let member = world.members().iter().find(|m| m.id == *member_id).unwrap();
                    if let Err(broken) = removable(world, member) {
                        prop_assert!(false, "{broken}: {step:?}");
                    }
                }
            }
        }
    }
}
