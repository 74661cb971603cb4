//! Scale and rolling replacement (docs/safety.md, "Scale up and down", "Rolling
//! replacement", "Boot ahead"): what the replica count and the rollout strategy want next, health
//! aside, counting the Machines whose join began; and how many more may boot ahead of their
//! turn. Which Machines are outdated is read into the observation (`observation::outdated`).

use super::machines::{Growth, Removal};
use crate::controller::observation::{MachineView, Observation, sorted_urls, voting_endpoints};

/// What the replica count and the rollout strategy want next, health aside.
pub enum Want<'a> {
    Add(Growth),
    /// Delete one of `candidates` (a victim is picked).
    Remove(Vec<&'a MachineView>, Removal),
    /// Point KubeadmControlPlane (name) at these endpoints.
    SwitchKcp(String, Vec<String>),
    /// The control plane is rolling onto the endpoints it was given.
    WaitForKcp(String),
    Nothing,
}

/// Scale and rollout decisions (docs/safety.md, "Scale up and down", "Rolling replacement"),
/// over the Machines whose join began: one waiting for its turn is not a member yet, and an
/// add gives it its turn before any Machine is created.
pub fn want(o: &Observation) -> Want<'_> {
    let active: Vec<&MachineView> = o.joined_machines().collect();
    let outdated: Vec<&MachineView> = active.iter().copied().filter(|m| m.outdated.is_some()).collect();
    let n = usize::try_from(o.replicas).unwrap_or(0);
    let (a, old) = (active.len(), outdated.len());
    let up_to_date = a - old;
    if old == 0 {
        return match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => Want::Nothing,
        };
    }
    let kcp = o.kcp_in_use();
    match (kcp, o.surge()) {
        // Surge-then-switch: every new member first, one endpoint update, then the old ones go.
        (Some((name, endpoints, complete)), true) => {
            if up_to_date < n {
                if old > n {
                    return Want::Remove(outdated, Removal::ScaleDown);
                }
                return Want::Add(Growth::Rollout);
            }
            let desired = up_to_date_endpoints(o);
            let mut current = endpoints.to_vec();
            current.sort();
            if current != desired {
                Want::SwitchKcp(name.to_string(), desired)
            } else if !complete {
                Want::WaitForKcp(name.to_string())
            } else {
                Want::Remove(outdated, Removal::Rollout)
            }
        }
        // One at a time, add first: never more than N+1 members.
        (None, true) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::Rollout),
            std::cmp::Ordering::Equal => Want::Add(Growth::Rollout),
        },
        // One at a time, remove first: never more than N members; with a KCP, each new member
        // reaches the control plane before the next old one goes.
        (kcp, false) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::Rollout),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => {
                if let Some((name, endpoints, complete)) = kcp {
                    let mut current = endpoints.to_vec();
                    current.sort();
                    let voting = voting_endpoints(o);
                    if current != voting {
                        return Want::SwitchKcp(name.to_string(), voting);
                    }
                    if !complete {
                        return Want::WaitForKcp(name.to_string());
                    }
                }
                Want::Remove(outdated, Removal::Rollout)
            }
        },
    }
}

/// How many Machines may wait for their turn to join (docs/safety.md, "Boot ahead"): one for
/// each member of the current spec still to add; during a rolling update the current step's
/// and, with a KubeadmControlPlane (every new member added before any removal), the next one's,
/// never past the Machines the strategy allows (removing first: N; adding first: N + 1; with a
/// KubeadmControlPlane: 2N).
pub fn waiting_room(o: &Observation) -> usize {
    let joined: Vec<&MachineView> = o.joined_machines().collect();
    let n = usize::try_from(o.replicas).unwrap_or(0);
    let old = joined.iter().filter(|m| m.outdated.is_some()).count();
    let needed = n.saturating_sub(joined.len() - old);
    if old == 0 {
        return needed;
    }
    let (ahead, most) = match (o.surge(), o.kcp_in_use()) {
        (false, _) => (1, n),
        (true, Some(_)) => (2, 2 * n),
        // Removals interleave with joins: a Machine booted ahead could wait on a member the next
        // removal takes away (its user data joins through one), so none boots ahead.
        (true, None) => (1, n + 1),
    };
    needed.min(ahead).min(most.saturating_sub(joined.len()))
}

/// Client URLs of the members of up-to-date active Machines: the endpoints a rollout switches
/// the control plane to.
fn up_to_date_endpoints(o: &Observation) -> Vec<String> {
    sorted_urls(
        o,
        o.members().iter().filter(|m| {
            m.machine.as_deref().is_some_and(|name| {
                o.active_machines()
                    .any(|machine| machine.name == name && machine.outdated.is_none())
            })
        }),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    #[test]
    fn rollout_with_a_kcp_adds_all_then_switches_once_then_removes_the_old() {
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        let old = voting_endpoints(&o);
        let mut w = World::new(o);
        let steps = w.run();
        assert_eq!(w.max_members, 6, "surge to 2N");
        assert_eq!(w.max_machines, 6, "Machines booted ahead stay within 2N");
        assert_eq!(w.max_learners, 1);
        assert_eq!(w.kcp_writes.len(), 1, "one endpoint update: {:?}", w.kcp_writes);
        assert!(
            w.kcp_writes[0].iter().all(|e| !old.contains(e)),
            "{:?}",
            w.kcp_writes
        );
        assert!(new_members_only(&w), "{:?}", w.member_names());
        assert_eq!(w.o.machines.len(), 3);
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // Adds all come before the switch; removals all after it.
        let switch = steps
            .iter()
            .position(|s| matches!(s, Step::ControlPlane(ControlPlaneStep::WriteKcpEndpoints { .. })))
            .unwrap();
        assert!(
            steps[..switch]
                .iter()
                .all(|s| !matches!(s, Step::Machines(MachineStep::DeleteMachine { .. })))
        );
        assert!(
            steps[switch..]
                .iter()
                .all(|s| !matches!(s, Step::Machines(MachineStep::CreateMachine { .. })))
        );
        assert_eq!(up_to_date_machines(&w.o), 3);
    }

    #[test]
    fn rollout_without_kcp_or_with_max_surge_zero_stays_within_its_bounds() {
        // No KCP, maxSurge 1: never more than N+1 members nor Machines (nothing boots ahead:
        // removals interleave with joins), with learner or voter joins.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        let mut w = World::new(o);
        let steps = w.run();
        assert_eq!(w.max_members, 4);
        assert_eq!(w.max_machines, 4);
        assert_eq!(w.max_learners, 1);
        assert!(new_members_only(&w));
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        let adds = steps
            .iter()
            .filter(|s| matches!(s, Step::Membership(MembershipStep::AddLearner { .. })))
            .count();
        assert_eq!(adds, 3, "one learner per replaced member: {steps:#?}");
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        voter_joins(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!((w.max_members, w.max_machines), (4, 4));
        assert!(new_members_only(&w));
        // maxSurge 0 without KCP: never more than N, Machines included.
        let mut o = zoned(3, false);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert_eq!(w.max_machines, 3);
        assert!(new_members_only(&w));
        // maxSurge 0 with a KCP: never more than N, one control plane rollout per member.
        let mut o = zoned(3, true);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert_eq!(w.kcp_writes.len(), 3, "{:?}", w.kcp_writes);
        assert!(new_members_only(&w));
        // A single member cannot be replaced remove-first: maxSurge 0 surges anyway.
        let mut o = zoned(1, true);
        o.replicas = 1;
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 2);
        assert_eq!(w.kcp_writes.len(), 1);
        assert!(new_members_only(&w));
    }

    #[test]
    fn a_rollout_starts_only_healthy_pauses_when_health_is_lost_and_replaces_dead_members_first() {
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::ROLLOUT_PAUSED);
        assert!(step.is_refusal() && !step.writes());
        assert!(wait_message(&step).contains("c1-etcd-m2"), "{step:?}");
        // Mid-way (N+1 Machines), the dead member is the one removed.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        o.machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), Some("a")));
        members_mut(&mut o).push(member(9, "c1-etcd-n1", "10.0.1.1"));
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        assert!(
            matches!(plan(&o), Step::Machines(MachineStep::DeleteMachine { machine, .. }) if machine == "c1-etcd-m1")
        );
        // With a KCP, the switch waits for health too.
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        for i in 0..3 {
            let name = format!("c1-etcd-n{i}");
            let address = format!("10.0.1.{i}");
            o.machines.push(machine(&name, Some(&address), Some("a")));
            members_mut(&mut o).push(MemberView {
                is_leader: false,
                ..member(10 + i, &name, &address)
            });
        }
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        assert!(
            matches!(
                plan(&o),
                Step::ControlPlane(ControlPlaneStep::WriteKcpEndpoints { .. })
            ),
            "{:?}",
            plan(&o)
        );
        members_mut(&mut o)[4] = unhealthy(members_mut(&mut o)[4].clone(), "down");
        assert_eq!(wait_reason(&plan(&o)), reason::ROLLOUT_PAUSED);
    }
}
