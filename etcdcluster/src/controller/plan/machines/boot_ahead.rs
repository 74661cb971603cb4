//! Boot ahead (docs/safety.md, "Boot ahead"): Machines created before their turn to join, and
//! those no member to add needs any more.

use super::decisions::{create_machine, creation_blocked};
use super::step::{Growth, MachineStep, Removal};
use crate::controller::decision::Decision;
use crate::controller::observation::{MachineView, Observation};

/// Boot ahead (docs/safety.md, "Boot ahead"): with learner joins, the Machine of a member still
/// to add is created while others boot, wait for their turn or join, as long as the rollout
/// leaves `room` for Machines waiting for their turn and `provisioning.parallelMachines` is not
/// reached. Creating it changes no membership: its learner is added on its turn, one at a time.
/// Only into a serving cluster: initialized, every voter a started healthy member of ours, no
/// alarm, no member gone from its Machine, no voter join in flight, a spec Machines can be made
/// from (otherwise the plan's own creation says why not).
pub fn create_ahead(
    o: &Observation,
    allowed_domains: &[String],
    room: usize,
) -> Option<Decision<MachineStep>> {
    if !o.learner_joins() || !o.initialized_now() {
        return None;
    }
    let waiting = o.waiting_machines().count();
    let joining: Vec<&MachineView> = o.joining_machines().collect();
    let bound = o.parallel_machines().unwrap_or(usize::MAX);
    if waiting >= room || waiting + joining.len() >= bound {
        return None;
    }
    let members = o.members();
    let serving = !members.is_empty()
        && members.iter().all(|m| m.machine.is_some())
        && o.voters().iter().all(|m| m.is_started() && m.healthy)
        && o.alarms.is_empty()
        && joining.iter().all(|m| m.learner_join)
        && !o
            .active_machines()
            .any(|m| m.was_member && o.member_of(&m.name).is_none());
    if !serving || creation_blocked(o).is_err() {
        return None;
    }
    let purpose = if o.joined_machines().any(|m| m.outdated.is_some()) {
        Growth::Rollout
    } else {
        Growth::ScaleUp
    };
    match create_machine(o, allowed_domains, purpose) {
        Decision::Do(step) => Some(Decision::Do(step)),
        Decision::Hold(_) => None,
    }
}

/// Machines waiting for their turn that no member to add needs any more (fewer replicas, or a
/// spec changed under them; `room` as for [`create_ahead`]): one goes at a time, an outdated one
/// first, else the newest. Nothing of it is in etcd, so its deletion changes no membership.
pub fn surplus_waiting(o: &Observation, room: usize) -> Option<Decision<MachineStep>> {
    let waiting: Vec<&MachineView> = o.waiting_machines().collect();
    let (victim, purpose, why) = match waiting.iter().find(|m| m.outdated.is_some()) {
        Some(outdated) => (
            *outdated,
            Removal::Rollout,
            format!("outdated ({})", outdated.outdated.as_deref().unwrap_or_default()),
        ),
        None if waiting.len() > room => (
            *waiting.last()?,
            Removal::ScaleDown,
            format!(
                "{} Machines wait for their turn, {room} still needed for {} replicas",
                waiting.len(),
                o.replicas
            ),
        ),
        None => return None,
    };
    Some(Decision::Do(MachineStep::DeleteMachine {
        machine: victim.name.clone(),
        purpose,
        message: format!(
            "deleting Machine {}, which waited for its turn to join and is no longer needed: {why}",
            victim.name
        ),
    }))
}
