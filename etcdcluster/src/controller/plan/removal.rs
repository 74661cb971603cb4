//! Member removal (SPEC-etcdcluster.md rules 3, 4 and 6): a Machine being deleted, by anyone,
//! has its member removed first, leadership moved away first, and only while quorum survives
//! it; every Machine of ours carries the pre-terminate hook that makes this so; a Machine is
//! deleted only when its member may go.

use etcdadm_shared::names;

use super::gates::removal_refusal;
use super::observed::{EtcdView, MachineView, Observed, member_client_url};
use super::placement::pick_victim;
use super::rollout::Want;
use super::step::{Removal, Step, reason};

/// Machines labelled for us with no controller, or that lost our hook: adopted first, so no
/// deletion of theirs can skip member removal.
pub(super) fn adoption(o: &Observed) -> Option<Step> {
    o.active_machines()
        .find(|m| m.orphan || !m.has_hook)
        .map(|m| Step::AdoptMachine {
            machine: m.name.clone(),
        })
}

/// Rules 3, 4 and 6 for a Machine being deleted (by anyone) that still carries our hook: its
/// member is removed first, leadership moved away first, and only while quorum survives it.
pub(super) fn deleted_machine(o: &Observed) -> Option<Step> {
    let machine = o.machines.iter().find(|m| m.deleting && m.has_hook)?;
    let release = Step::ReleaseHook {
        machine: machine.name.clone(),
    };
    let members = match &o.etcd {
        EtcdView::Members(members) => members,
        // Nothing ever had an address: nothing can have joined.
        EtcdView::NotChecked if o.machines.iter().all(|m| m.address.is_none()) => return Some(release),
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => {
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
                message: format!(
                    "Machine {} is being deleted; waiting for a member to answer before removing its member",
                    machine.name
                ),
            });
        }
    };
    let Some(member) = members
        .iter()
        .find(|m| m.machine.as_deref() == Some(machine.name.as_str()))
    else {
        return Some(release);
    };
    if let Some(other) = members.iter().find(|m| m.id != member.id && m.is_joining()) {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_MEMBER_JOIN,
            message: format!(
                "{} is joining; Machine {}'s member is removed after it (one change at a time)",
                other.describe(),
                machine.name
            ),
        });
    }
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(refusal);
    }
    let healthy_other = o
        .voters()
        .into_iter()
        .filter(|m| m.id != member.id && m.healthy)
        .find_map(|m| member_client_url(o, m).map(|url| (m.id, url)));
    let Some((other_id, other_url)) = healthy_other else {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
            message: format!(
                "no other healthy voting member to remove Machine {}'s member through",
                machine.name
            ),
        });
    };
    if member.is_leader
        && member.healthy
        && let Some(leader_url) = member_client_url(o, member)
    {
        return Some(Step::MoveLeader {
            leader_url,
            to: other_id,
            machine: machine.name.clone(),
        });
    }
    Some(Step::RemoveMember {
        member_id: member.id,
        via_url: other_url,
        member: what,
        why: format!("Machine {} is being deleted", machine.name),
    })
}

/// Delete `victim` for `purpose`, if rules 3 and 6 allow removing its member now.
fn removal_step(o: &Observed, victim: &MachineView, purpose: Removal) -> Step {
    let what = format!("member of Machine {}", victim.name);
    if let Some(member) = o.member_of(&victim.name) {
        if let Some(refusal) = removal_refusal(o, member, &what) {
            return refusal;
        }
        if member.healthy
            && let Some((name, _, false)) = o.kcp_in_use()
        {
            return Step::Wait {
                reason: reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
                message: format!(
                    "waiting for KubeadmControlPlane {name} to finish its rollout before removing the {what}"
                ),
            };
        }
    }
    let replicas = o.replicas;
    let active = o.active_machines().count();
    let why = if o.is_dead(victim) {
        "its member is dead".to_string()
    } else if victim.delete_requested {
        format!("annotated {}", names::DELETE_MACHINE_ANNOTATION)
    } else if let Some(outdated) = &victim.outdated {
        format!("outdated: {outdated}")
    } else {
        "oldest in the most crowded failure domain".to_string()
    };
    let message = match purpose {
        Removal::ScaleDown => format!(
            "scaling down from {active} to {replicas} Machines: deleting Machine {} ({why}); its member is removed first",
            victim.name
        ),
        Removal::Rollout => format!(
            "rolling update: deleting Machine {} ({why}); its member is removed first",
            victim.name
        ),
        Removal::Remediation { .. } | Removal::OrphanMachine | Removal::FailedJoin => {
            format!("deleting Machine {} ({why})", victim.name)
        }
    };
    Step::DeleteMachine {
        machine: victim.name.clone(),
        purpose,
        message,
    }
}

/// Rule 1 for removals: one Machine deletion at a time, the next change after it is gone.
pub(super) fn deletion_in_flight(o: &Observed) -> Option<Step> {
    let m = o.machines.iter().find(|m| m.deleting)?;
    Some(Step::Wait {
        reason: reason::WAITING_FOR_MACHINE_DELETION,
        message: format!(
            "Machine {} is being deleted; the next change waits until it is gone",
            m.name
        ),
    })
}

/// A dead victim goes at once, before remediation and health waits: removing it is the safest
/// change there is.
pub(super) fn dead_victim(o: &Observed, allowed_domains: &[String], wanted: &Want<'_>) -> Option<Step> {
    let Want::Remove(candidates, purpose) = wanted else {
        return None;
    };
    let victim = pick_victim(o, allowed_domains, candidates)?;
    o.is_dead(victim).then(|| removal_step(o, victim, *purpose))
}

/// Delete the victim among `candidates` for `purpose`; `None` when there is none.
pub(super) fn remove_one(
    o: &Observed,
    allowed_domains: &[String],
    candidates: &[&MachineView],
    purpose: Removal,
) -> Option<Step> {
    pick_victim(o, allowed_domains, candidates).map(|victim| removal_step(o, victim, purpose))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use super::super::testing::*;
    use super::super::*;
    #[test]
    fn a_deleted_machines_member_is_removed_first_under_quorum_and_leader_rules() {
        // A follower: removed through a healthy member, then the hook is released.
        let mut o = running(3);
        o.machines[2].deleting = true;
        let step = plan(&o);
        assert_eq!(
            step,
            Step::RemoveMember {
                member_id: 3,
                via_url: "https://10.0.0.1:2379".into(),
                member: "member of Machine c1-etcd-m2".into(),
                why: "Machine c1-etcd-m2 is being deleted".into(),
            }
        );
        members_mut(&mut o).pop();
        assert_eq!(
            plan(&o),
            Step::ReleaseHook {
                machine: "c1-etcd-m2".into()
            }
        );
        // The leader (member 1): leadership moves first (rule 6), asked of the leader itself.
        let mut o = running(3);
        o.machines[0].deleting = true;
        assert_eq!(
            plan(&o),
            Step::MoveLeader {
                leader_url: "https://10.0.0.1:2379".into(),
                to: 2,
                machine: "c1-etcd-m0".into()
            }
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
        assert!(matches!(plan(&o), Step::RemoveMember { member_id: 2, .. }));
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
            Step::ReleaseHook {
                machine: "c1-etcd-x".into()
            }
        );
        // No scale-up while a removal is in flight.
        let mut o = running(3);
        o.replicas = 3;
        o.machines[2].deleting = true;
        assert!(!matches!(plan(&o), Step::CreateMachine { .. }));
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
                Step::DeleteMachine { machine, purpose, .. } => {
                    assert_eq!(*purpose, Removal::ScaleDown);
                    assert!(deleting.is_none(), "two removals in flight: {steps:#?}");
                    deleting = Some(machine.clone());
                }
                Step::ReleaseHook { machine } => {
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
            matches!(&step, Step::RemoveMember { member_id: 7, why, .. } if why.contains("no Machine")),
            "{step:?}"
        );
        // Even with remediation disabled (rule 4 is not remediation).
        o.remediation.enabled = false;
        assert!(matches!(plan(&o), Step::RemoveMember { member_id: 7, .. }));
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
            Step::DeleteMachine {
                purpose: Removal::OrphanMachine,
                ..
            }
        ));
        // A new Machine without a member is a join in flight, not an orphan.
        o.machines[2].was_member = false;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        // Labelled Machines with no controller, or without our hook, are adopted first.
        let mut o = running(3);
        o.machines[1].orphan = true;
        assert_eq!(
            plan(&o),
            Step::AdoptMachine {
                machine: "c1-etcd-m1".into()
            }
        );
        let mut o = running(3);
        o.machines[2].has_hook = false;
        assert_eq!(
            plan(&o),
            Step::AdoptMachine {
                machine: "c1-etcd-m2".into()
            }
        );
    }
}
