//! Remediation (docs/safety.md, "Health and remediation"): a member dead for longer than
//! `unhealthyAfter` is replaced, one at a time, under rule 3, with backoff after a failed
//! replacement; a member whose data differs from the majority's, once CORRUPT is raised, is
//! replaced with the same backoff; a Machine whose member left
//! etcd is replaced; an unhealthy member on no Machine of ours is removed (rule 4). The deletions themselves are the Machine concern's steps.

use std::time::Duration;

use etcdadm_shared::duration;

use etcdadm_shared::api::cluster::AlarmRepair;

use super::alarms;
use super::machines::{MachineStep, Removal};
use super::membership::MembershipStep;
use crate::controller::decision::{Decision, Hold};
use crate::controller::observation::{MachineView, MemberView, Observation, member_client_url};
use crate::controller::rules::removal_refusal;

/// Condition reasons of remediation.
pub mod reason {
    pub const REMEDIATION_BACKOFF: &str = "RemediationBackoff";
}

/// A replacement that fails within this time of its creation is a failed replacement (the next
/// remediation backs off), as KCP's `minHealthyPeriod` default.
pub const MIN_HEALTHY_PERIOD: Duration = Duration::from_secs(3600);

/// Rule 4: a member on no Machine of ours, unhealthy for longer than `unhealthyAfter`, is
/// removed through a healthy voter (whether remediation is enabled or not: it is nobody's).
pub fn remove_stranger(o: &Observation) -> Option<Decision<MembershipStep>> {
    let member = overdue_stranger(o)?;
    let what = member.describe();
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(Decision::Hold(refusal));
    }
    let via = o
        .voters()
        .into_iter()
        .filter(|m| m.healthy && m.id != member.id)
        .find_map(|m| member_client_url(o, m))?;
    Some(Decision::Do(MembershipStep::RemoveMember {
        member_id: member.id,
        via_url: via,
        member: what,
        why: format!(
            "it runs on no Machine of this EtcdadmCluster and has been unhealthy for {} ({})",
            duration::format(member.unhealthy_for),
            member.message.as_deref().unwrap_or("unhealthy")
        ),
    }))
}

/// A started member on no Machine of ours, unhealthy for longer than `unhealthyAfter`.
fn overdue_stranger(o: &Observation) -> Option<&MemberView> {
    let after = o.remediation.unhealthy_after;
    o.members()
        .iter()
        .find(|m| m.machine.is_none() && m.is_started() && !m.healthy && m.unhealthy_for > after)
}

/// Machines whose member left etcd, and Machines whose member is dead, deleted once unhealthy
/// for `unhealthyAfter`: one at a time, under rule 3, with backoff after a failed replacement.
/// Nothing while an overdue stranger waits for its removal ([`remove_stranger`]). While Machines
/// wait for their turn to join, whose user data may join through that member, not before the
/// join deadline either, as a join in flight would hold it (docs/safety.md, "Boot ahead").
pub fn replace_overdue(o: &Observation) -> Option<Decision<MachineStep>> {
    let policy = o.remediation;
    let after = if o.waiting_machines().next().is_some() {
        policy.unhealthy_after.max(policy.join_deadline)
    } else {
        policy.unhealthy_after
    };
    let overdue = |d: Duration| d > after;
    if overdue_stranger(o).is_some() || !policy.enabled {
        return None;
    }
    if let Some(machine) = o
        .active_machines()
        .find(|m| m.was_member && o.member_of(&m.name).is_none() && overdue(m.unhealthy_for))
    {
        return Some(Decision::Do(MachineStep::DeleteMachine {
            machine: machine.name.clone(),
            purpose: Removal::OrphanMachine,
            message: format!(
                "Machine {}'s member left etcd {} ago and cannot rejoin: deleting the Machine; a new one replaces it",
                machine.name,
                duration::format(machine.unhealthy_for)
            ),
        }));
    }
    let (machine, member) = o
        .active_machines()
        .filter_map(|machine| o.member_of(&machine.name).map(|member| (machine, member)))
        .filter(|(_, member)| member.is_started() && !member.healthy && overdue(member.unhealthy_for))
        .max_by_key(|(_, member)| member.unhealthy_for)?;
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(Decision::Hold(refusal));
    }
    let retries = match backoff(o, machine, "is unhealthy too") {
        Ok(retries) => retries,
        Err(hold) => return Some(Decision::Hold(hold)),
    };
    Some(Decision::Do(MachineStep::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::Remediation { retries },
        message: format!(
            "the member of Machine {} has been unhealthy for {} ({}), longer than unhealthyAfter {}: deleting the Machine (its member is removed first); a new one replaces it",
            machine.name,
            duration::format(member.unhealthy_for),
            member.message.as_deref().unwrap_or("unhealthy"),
            duration::format(after)
        ),
    }))
}

/// The retries count of a remediation of `machine`, or the backoff hold when it is itself a
/// recent replacement made too short a time ago (`what` says what is wrong with it again).
fn backoff(o: &Observation, machine: &MachineView, what: &str) -> Result<u32, Hold> {
    match &machine.replaces {
        Some(last) if machine.age < MIN_HEALTHY_PERIOD => {
            let wait = remediation_backoff(o.remediation.unhealthy_after, last.retries);
            if last.ago < wait {
                return Err(Hold::refusal(
                    reason::REMEDIATION_BACKOFF,
                    format!(
                        "Machine {} replaced Machine {} {} ago and {what}; the next remediation waits {} (failed replacements: {})",
                        machine.name,
                        last.machine,
                        duration::format(last.ago),
                        duration::format(wait.saturating_sub(last.ago)),
                        last.retries + 1
                    ),
                ));
            }
            Ok(last.retries.saturating_add(1))
        }
        _ => Ok(0),
    }
}

/// A member etcd raised CORRUPT for is replaced like a dead one, under rule 3 and with the
/// remediation backoff, once etcd's own evidence confirms it: its hash differs from a majority
/// that agrees (`alarms::confirmed`); never a member whose hash agrees. One on no Machine of ours
/// is left to a person (`alarms::remaining` says so). With `spec.maintenance.alarms` Manual,
/// nothing.
pub fn replace_corrupt(o: &Observation) -> Option<Decision<MachineStep>> {
    if o.alarm_repair == AlarmRepair::Manual {
        return None;
    }
    let (machine, member) = alarms::corrupt::confirmed(o).into_iter().find_map(|member| {
        let name = member.machine.as_deref()?;
        let machine = o.active_machines().find(|m| m.name == name)?;
        Some((machine, member))
    })?;
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(Decision::Hold(Hold {
            message: format!(
                "etcd raised CORRUPT on the {what}, which is replaced once that is safe: {}",
                refusal.message
            ),
            ..refusal
        }));
    }
    let retries = match backoff(o, machine, "its data differs from the majority's too") {
        Ok(retries) => retries,
        Err(hold) => return Some(Decision::Hold(hold)),
    };
    let revision = member.hash.map_or(0, |h| h.revision);
    Some(Decision::Do(MachineStep::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::Remediation { retries },
        message: format!(
            "etcd raised CORRUPT and the {what}'s data differs from the majority's (its HashKV at revision {revision} differs from theirs, which agree): deleting the Machine (its member is removed first); a new one replaces it, then the alarm is disarmed"
        ),
    }))
}

/// Time between a remediation and the next one when the replacement it made failed: doubles
/// with each failed replacement, from twice `unhealthyAfter`, capped at an hour (or
/// `unhealthyAfter` if that is longer).
pub fn remediation_backoff(unhealthy_after: Duration, previous_retries: u32) -> Duration {
    let cap = unhealthy_after.max(Duration::from_secs(3600));
    let factor = 2u32.saturating_pow(previous_retries.saturating_add(1).min(20));
    unhealthy_after.saturating_mul(factor).min(cap)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;
    use std::time::Duration;

    #[test]
    fn a_member_dead_longer_than_unhealthy_after_is_replaced_once_at_a_time() {
        let after = Duration::from_secs(5);
        let mut o = zoned(3, false);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(3);
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::WAITING_FOR_HEALTHY_MEMBERS);
        assert!(
            wait_message(&step).contains("replaced once unhealthy for 5s"),
            "{step:?}"
        );
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(6);
        let step = plan(&o);
        assert_eq!(
            step,
            Step::Machines(MachineStep::DeleteMachine {
                machine: "c1-etcd-m1".into(),
                purpose: Removal::Remediation { retries: 0 },
                message: "the member of Machine c1-etcd-m1 has been unhealthy for 6s (connection refused), longer than unhealthyAfter 5s: deleting the Machine (its member is removed first); a new one replaces it".into(),
            })
        );
        // The whole replacement: member removed, Machine gone, a new one added, healthy.
        let mut w = World::new(o.clone());
        w.apply(&step);
        let rest = w.run();
        assert!(
            matches!(
                rest[0],
                Step::Membership(MembershipStep::RemoveMember { member_id: 2, .. })
            ),
            "{rest:?}"
        );
        assert_eq!(w.member_names().len(), 3);
        assert!(!w.member_names().contains(&"c1-etcd-m1".to_string()));
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // Never two at a time: while the first Machine is still being deleted, wait.
        let mut two = o.clone();
        members_mut(&mut two)[2] = unhealthy(members_mut(&mut two)[2].clone(), "down");
        members_mut(&mut two)[2].unhealthy_for = Duration::from_secs(60);
        assert_eq!(
            wait_reason(&plan(&two)),
            reason::QUORUM_LOST,
            "2 of 3 dead: nothing"
        );
        let mut five = zoned(5, false);
        five.replicas = 5;
        five.remediation.unhealthy_after = after;
        for i in [1, 2] {
            members_mut(&mut five)[i] = unhealthy(members_mut(&mut five)[i].clone(), "down");
            members_mut(&mut five)[i].unhealthy_for = Duration::from_secs(60);
        }
        assert!(matches!(
            plan(&five),
            Step::Machines(MachineStep::DeleteMachine { .. })
        ));
        five.machines[1].deleting = true;
        five.machines[1].has_hook = false;
        assert_eq!(wait_reason(&plan(&five)), reason::WAITING_FOR_MACHINE_DELETION);
        // Disabled: reported, nothing removed.
        let mut off = o.clone();
        off.remediation.enabled = false;
        let step = plan(&off);
        assert_eq!(wait_reason(&step), reason::REMEDIATION_DISABLED);
        assert!(!step.writes() && step.is_refusal());
    }

    #[test]
    fn a_failed_replacement_is_retried_with_backoff() {
        let after = Duration::from_secs(5);
        let mut o = zoned(3, false);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(6);
        o.machines[1].age = Duration::from_secs(9);
        o.machines[1].replaces = Some(LastRemediation {
            machine: "c1-etcd-old".into(),
            ago: Duration::from_secs(9),
            retries: 0,
        });
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::REMEDIATION_BACKOFF);
        assert!(wait_message(&step).contains("c1-etcd-old"), "{step:?}");
        fn replaces(o: &mut Observation) -> &mut LastRemediation {
            o.machines[1].replaces.as_mut().unwrap()
        }
        replaces(&mut o).ago = Duration::from_secs(11);
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Remediation { retries: 1 },
                ..
            })
        ));
        // The second failure waits twice as long.
        replaces(&mut o).retries = 1;
        assert_eq!(wait_reason(&plan(&o)), reason::REMEDIATION_BACKOFF);
        replaces(&mut o).ago = Duration::from_secs(21);
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Remediation { retries: 2 },
                ..
            })
        ));
        // A replacement that stayed healthy for long is not a failed replacement.
        o.machines[1].age = MIN_HEALTHY_PERIOD + Duration::from_secs(1);
        replaces(&mut o).ago = Duration::from_secs(1);
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Remediation { retries: 0 },
                ..
            })
        ));
        // Nor is any other Machine, however recent the last remediation.
        o.machines[1].age = Duration::from_secs(9);
        o.machines[1].replaces = None;
        o.last_remediation = Some(LastRemediation {
            machine: "c1-etcd-old".into(),
            ago: Duration::from_secs(1),
            retries: 3,
        });
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Remediation { retries: 0 },
                ..
            })
        ));
        assert_eq!(
            remediation_backoff(Duration::from_secs(300), 10),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn the_machine_created_after_a_remediation_is_marked_as_its_replacement() {
        let mut o = running(2);
        for m in &mut o.machines {
            m.age = Duration::from_secs(100);
        }
        o.last_remediation = Some(LastRemediation {
            machine: "c1-etcd-dead".into(),
            ago: Duration::from_secs(2),
            retries: 0,
        });
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine {
                purpose: Growth::Replacement,
                ..
            })
        ));
        // Once a Machine was created after it, later ones are ordinary.
        o.machines[1].age = Duration::from_secs(1);
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine {
                purpose: Growth::ScaleUp,
                ..
            })
        ));
    }
}
