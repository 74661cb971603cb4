//! The Machine conditions: `MachinesReady`, `ResizeCompleted`, `MachinesSpecUpToDate`.

use etcdadm_shared::api::cluster::condition::{MACHINES_READY, MACHINES_SPEC_UP_TO_DATE, RESIZE_COMPLETED};
use etcdadm_shared::api::conditions::{NewCondition, Severity};

use super::step::reason;
use crate::controller::decision::reason::{ROLLING_UPDATE, SCALING_DOWN, SCALING_UP};
use crate::controller::observation::Observation;
use crate::controller::rules::reason::{ROLLOUT_PAUSED, WAITING_FOR_JOIN_TURN, WAITING_FOR_MACHINE_ADDRESS};

/// `MachinesReady`: as many Machines as replicas, each with an address, none waiting for its
/// turn to join (booted ahead, docs/safety.md "Boot ahead").
pub fn machines_condition(o: &Observation, active: usize) -> NewCondition {
    let replicas = usize::try_from(o.replicas).unwrap_or(0);
    let with_address = o
        .machines
        .iter()
        .filter(|m| !m.deleting && m.address.is_some())
        .count();
    let message = format!("{active} of {replicas} Machines, {with_address} with an address");
    let rolling = o.machines.iter().any(|m| !m.deleting && m.outdated.is_some());
    let waiting: Vec<&str> = o
        .waiting_machines()
        .filter(|m| m.address.is_some())
        .map(|m| m.name.as_str())
        .collect();
    if active == replicas && with_address == active && waiting.is_empty() {
        NewCondition::true_(MACHINES_READY, "MachinesReady")
    } else if active == replicas && with_address == active {
        NewCondition::false_(
            MACHINES_READY,
            Severity::Info,
            WAITING_FOR_JOIN_TURN,
            format!(
                "{message}; booted and waiting for their turn to join (one learner at a time): {}",
                waiting.join(", ")
            ),
        )
    } else if rolling && active != replicas {
        NewCondition::false_(MACHINES_READY, Severity::Info, ROLLING_UPDATE, message)
    } else if active < replicas {
        NewCondition::false_(MACHINES_READY, Severity::Info, SCALING_UP, message)
    } else if active > replicas {
        NewCondition::false_(MACHINES_READY, Severity::Info, SCALING_DOWN, message)
    } else {
        NewCondition::false_(
            MACHINES_READY,
            Severity::Info,
            WAITING_FOR_MACHINE_ADDRESS,
            message,
        )
    }
}

/// `ResizeCompleted`: as many Machines as replicas (a rolling update's extra one says so).
pub fn resize_condition(o: &Observation, active: usize) -> NewCondition {
    let replicas = usize::try_from(o.replicas).unwrap_or(0);
    let deleting = o.machines.iter().filter(|m| m.deleting).count();
    if active == replicas && deleting == 0 {
        return NewCondition::true_(RESIZE_COMPLETED, "ResizeCompleted");
    }
    let rolling = o.machines.iter().any(|m| !m.deleting && m.outdated.is_some());
    let mut message = format!("{active} Machines for {replicas} replicas");
    if deleting > 0 {
        message.push_str(&format!(", {deleting} being deleted"));
    }
    let why = if rolling {
        ROLLING_UPDATE
    } else if active < replicas {
        SCALING_UP
    } else if active > replicas {
        SCALING_DOWN
    } else {
        reason::WAITING_FOR_MACHINE_DELETION
    };
    NewCondition::false_(RESIZE_COMPLETED, Severity::Info, why, message)
}

/// `MachinesSpecUpToDate`: no Machine left from an older spec, template or `rolloutAfter`.
/// `MachinesSpecUpToDate`: no Machine left from an older spec, template or `rolloutAfter`;
/// while one is, what the plan does about it (`next`: its reason and message).
pub fn spec_up_to_date_condition(o: &Observation, next: (&str, &str)) -> NewCondition {
    let outdated: Vec<String> = o
        .machines
        .iter()
        .filter(|m| !m.deleting)
        .filter_map(|m| m.outdated.as_ref().map(|why| format!("{} ({why})", m.name)))
        .collect();
    if outdated.is_empty() {
        return NewCondition::true_(MACHINES_SPEC_UP_TO_DATE, "MachinesSpecUpToDate");
    }
    let (step_reason, step_message) = next;
    let (severity, why) = if step_reason == ROLLOUT_PAUSED {
        (Severity::Warning, ROLLOUT_PAUSED)
    } else {
        (Severity::Info, ROLLING_UPDATE)
    };
    let mut message = format!("{} outdated: {}", outdated.len(), outdated.join("; "));
    if !step_message.is_empty() {
        message.push_str(&format!("; now: {step_message}"));
    }
    NewCondition::false_(MACHINES_SPEC_UP_TO_DATE, severity, why, message)
}
