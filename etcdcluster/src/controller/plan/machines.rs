//! Member Machines: when one is created (in the failure domain with the fewest members,
//! finishing an interrupted creation first), adopted, given up on after a failed join, chosen
//! to leave, deleted (its hook removes its member first, docs/safety.md rule 4) or cleaned up
//! after an interrupted creation; what each of those says; and the writes that do it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::api::cluster::condition::{MACHINES_READY, MACHINES_SPEC_UP_TO_DATE, RESIZE_COMPLETED};
use etcdadm_shared::api::conditions::{NewCondition, Severity};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::contract::{controller_reference, create_if_absent, owner_reference};
use etcdadm_shared::duration;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::placement::{pick_failure_domain, pick_victim};
use super::versions;
use crate::controller::decision::reason::{
    INVALID_SPEC, PROVISIONING, REMEDIATING, RESTORING, ROLLING_UPDATE, SCALING_DOWN, SCALING_UP,
};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Hold, Outputs, WAIT_REQUEUE,
};
use crate::controller::observation::clock::{
    REMEDIATION_ANNOTATION, REMEDIATION_FOR_ANNOTATION, RemediationRecord,
};
use crate::controller::observation::{MachineView, Observation, learner_listed_wait};
use crate::controller::rules::reason::{ROLLOUT_PAUSED, WAITING_FOR_JOIN_TURN, WAITING_FOR_MACHINE_ADDRESS};
use crate::controller::rules::removal_refusal;

/// Condition reasons of Machine creation and deletion.
pub mod reason {
    pub const ADOPTING_MACHINE: &str = "AdoptingMachine";
    pub const ORPHAN_MACHINE: &str = "OrphanMachine";
    pub const MEMBER_JOIN_FAILED: &str = "MemberJoinFailed";
    pub const INFRASTRUCTURE_TEMPLATE_NOT_FOUND: &str = "InfrastructureTemplateNotFound";
    pub const WAITING_FOR_MACHINE_DELETION: &str = "WaitingForMachineDeletion";
    pub const WAITING_FOR_CONTROL_PLANE_ROLLOUT: &str = "WaitingForControlPlaneRollout";
}

const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// Apply sites on member Machines.
const HOOK_MANAGER: &str = "etcdadm-controller/pre-terminate-hook";
const ADOPTION_MANAGER: &str = "etcdadm-controller/adoption";

/// Why a Machine is deleted (its member is removed first, through the pre-terminate hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    ScaleDown,
    /// An outdated member during a rolling replacement.
    Rollout,
    /// Its member was unhealthy for longer than `unhealthyAfter`; `retries` counts the failed
    /// replacements before this one.
    Remediation {
        retries: u32,
    },
    /// Its member left etcd (removed by someone) and never came back.
    OrphanMachine,
    /// It did not become a healthy member within the join deadline.
    FailedJoin,
}

/// Why a Machine is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    ScaleUp,
    /// A member of the current spec during a rolling replacement.
    Rollout,
    /// The replacement of a remediated member: it carries the remediation's record, so its own
    /// failure soon after counts as a failed replacement.
    Replacement,
    /// The first member of a cluster created from a snapshot: its EtcdadmConfig names the
    /// restore Secret.
    Restore,
}

/// What every new member's objects are made of besides its name, as observed: the Cluster, the
/// infrastructure machine kind cloned from the template, the Machine version, how long a
/// learner join waits to be listed and, for a replacement, the remediation record it carries.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberTemplate {
    pub cluster: String,
    pub infra: ApiResource,
    pub version: Option<String>,
    /// Written on its EtcdadmConfig for the bootstrap provider (`learner_listed_wait`).
    pub listed_wait: Duration,
    pub remediation_for: Option<String>,
}

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum MachineStep {
    /// Create the infra machine, EtcdadmConfig and Machine of one new member, all named `name`:
    /// a fresh name, or the name of an interrupted creation to finish (`resume`).
    CreateMachine {
        name: String,
        resume: bool,
        failure_domain: Option<String>,
        purpose: Growth,
        template: MemberTemplate,
    },
    /// A Machine labelled for us without a controller (`orphan`), or without our pre-terminate
    /// hook: take it over so its deletion cannot skip member removal.
    AdoptMachine { machine: String, orphan: bool },
    /// Delete a member Machine; its member is removed first (the hook holds the Machine).
    DeleteMachine {
        machine: String,
        purpose: Removal,
        message: String,
    },
    /// Remove infra machines/configs of interrupted creations no longer needed.
    DeleteLeftovers {
        names: Vec<String>,
        infra: Option<ApiResource>,
    },
}

impl ConcernStep for MachineStep {
    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            MachineStep::CreateMachine { purpose, .. } => match purpose {
                Growth::ScaleUp => (SCALING_UP, "creating a member Machine".into()),
                Growth::Rollout => (
                    ROLLING_UPDATE,
                    "creating a member Machine of the current spec".into(),
                ),
                Growth::Replacement => (
                    REMEDIATING,
                    "creating a Machine to replace the remediated member".into(),
                ),
                Growth::Restore => (
                    RESTORING,
                    "creating the first member Machine, its data restored from the snapshot".into(),
                ),
            },
            MachineStep::AdoptMachine { machine, .. } => (
                reason::ADOPTING_MACHINE,
                format!("adopting Machine {machine} (controller reference, pre-terminate hook)"),
            ),
            MachineStep::DeleteMachine { purpose, message, .. } => {
                (removal_reason(*purpose), message.clone())
            }
            MachineStep::DeleteLeftovers { names, .. } => (
                PROVISIONING,
                format!(
                    "removing leftovers of interrupted creations: {}",
                    names.join(", ")
                ),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, o: &Observation) -> Option<EventNote> {
        Some(match self {
            MachineStep::CreateMachine {
                name,
                resume,
                failure_domain,
                purpose,
                ..
            } => {
                let machines = o.active_machines().count() + 1;
                let replicas = o.replicas;
                let mut note = match purpose {
                    Growth::ScaleUp => {
                        format!("created Machine {name} (Machine {machines} for {replicas} replicas)")
                    }
                    Growth::Rollout => format!(
                        "rolling update: created Machine {name} of the current spec ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Replacement => format!(
                        "created Machine {name} to replace the remediated member ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Restore => format!(
                        "created Machine {name}, the first member, its data restored from {}",
                        o.restore.clone().unwrap_or_default().describe()
                    ),
                };
                if let Some(domain) = failure_domain {
                    note.push_str(&format!(" in failure domain {domain}"));
                }
                if *resume {
                    note.push_str(", finishing an interrupted creation");
                }
                EventNote::normal("MachineCreated", note)
            }
            MachineStep::AdoptMachine { machine, orphan } => {
                let note = if *orphan {
                    format!(
                        "adopted Machine {machine}: it carries this EtcdadmCluster's label but had no controller"
                    )
                } else {
                    format!(
                        "restored the pre-terminate hook on Machine {machine}: its deletion must remove its member first"
                    )
                };
                EventNote::normal("MachineAdopted", note)
            }
            MachineStep::DeleteMachine { purpose, message, .. } => {
                let (warning, reason) = match purpose {
                    Removal::ScaleDown => (false, "ScalingDown"),
                    Removal::Rollout => (false, "RollingUpdate"),
                    Removal::Remediation { .. } => (true, "MemberRemediation"),
                    Removal::OrphanMachine => (true, "OrphanMachineDeleted"),
                    Removal::FailedJoin => (true, "MemberJoinFailed"),
                };
                EventNote {
                    warning,
                    reason,
                    note: message.clone(),
                }
            }
            MachineStep::DeleteLeftovers { names, .. } => EventNote::normal(
                "LeftoversDeleted",
                format!("deleted leftovers of interrupted creations: {}", names.join(", ")),
            ),
        })
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            MachineStep::CreateMachine {
                name,
                failure_domain,
                purpose,
                template,
                ..
            } => create(out, o, name, failure_domain.as_deref(), *purpose, template).await,
            MachineStep::AdoptMachine { machine, .. } => adopt(out, o, machine).await,
            MachineStep::DeleteMachine { machine, purpose, .. } => delete(out, o, machine, *purpose).await,
            MachineStep::DeleteLeftovers { names, infra } => {
                delete_leftovers(out, &o.namespace, names, infra.as_ref()).await
            }
        }
    }

    /// What comes after: a new Machine boots, a deleted one waits for its member's removal.
    fn after(&self, o: &Observation) -> After {
        match self {
            MachineStep::CreateMachine { .. } => After::Requeue(o.health_interval().min(WAIT_REQUEUE)),
            MachineStep::AdoptMachine { .. }
            | MachineStep::DeleteMachine { .. }
            | MachineStep::DeleteLeftovers { .. } => After::Again,
        }
    }
}

/// The condition reason of a Machine deletion.
pub fn removal_reason(purpose: Removal) -> &'static str {
    match purpose {
        Removal::ScaleDown => SCALING_DOWN,
        Removal::Rollout => ROLLING_UPDATE,
        Removal::Remediation { .. } => REMEDIATING,
        Removal::OrphanMachine => reason::ORPHAN_MACHINE,
        Removal::FailedJoin => reason::MEMBER_JOIN_FAILED,
    }
}

// Decisions.

/// Machines labelled for us with no controller, or that lost our hook: adopted first, so no
/// deletion of theirs can skip member removal (rule 4).
pub fn adoption(o: &Observation) -> Option<Decision<MachineStep>> {
    o.active_machines().find(|m| m.orphan || !m.has_hook).map(|m| {
        Decision::Do(MachineStep::AdoptMachine {
            machine: m.name.clone(),
            orphan: m.orphan,
        })
    })
}

/// A join that missed its deadline (never an address, never added, added but never started,
/// or started but never healthy) is given up on: its Machine is deleted; its hook removes an
/// added member first, which a quorum of started voters always allows, and a new Machine
/// replaces it. Before that, the join is waited for (rules 1 and 2). The deadline runs from
/// the join's start: a learner's from its turn, not from its Machine's creation. A Machine
/// waiting for its turn fails only by itself: reported failed, no address within the deadline,
/// or past the wait its user data allows (docs/safety.md, "Boot ahead"). The first member is
/// left alone: without a healthy member there is no cluster to keep safe or to join anew.
pub fn failed_join(o: &Observation) -> Option<Decision<MachineStep>> {
    if !o.initialized_now() {
        return None;
    }
    let deadline = o.remediation.join_deadline;
    let limit = duration::format(deadline);
    let (machine, failure) = o.active_machines().filter(|m| !m.was_member).find_map(|m| {
        let failure = if o.awaits_turn(m) {
            failed_before_turn(m, deadline)?
        } else {
            format!(
                "did not become a healthy etcd member within {limit} ({})",
                failed_join_state(o, m, deadline)?
            )
        };
        Some((m, failure))
    })?;
    if !o.remediation.enabled {
        return Some(Decision::Hold(Hold::refusal(
            reason::MEMBER_JOIN_FAILED,
            format!(
                "Machine {} {failure}; remediation is disabled: delete the Machine to replace it",
                machine.name
            ),
        )));
    }
    Some(Decision::Do(MachineStep::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::FailedJoin,
        message: format!(
            "Machine {} {failure}: deleting it (a member it added is removed first); a new one replaces it",
            machine.name
        ),
    }))
}

/// How a join under way for longer than `deadline` stands, when it did not succeed.
fn failed_join_state(o: &Observation, m: &MachineView, deadline: Duration) -> Option<&'static str> {
    if m.join_age() <= deadline {
        return None;
    }
    Some(match (&m.address, o.member_of(&m.name)) {
        (None, _) => "it has no address",
        (Some(_), None) => "it never became an etcd member",
        (Some(_), Some(member)) if !member.is_started() => "its member was added but never started",
        (Some(_), Some(member)) if !member.healthy && !member.ever_healthy => {
            "its member started but was never healthy"
        }
        (Some(_), Some(_)) => return None,
    })
}

/// Why a Machine waiting for its turn will never join, if it will not: the infrastructure
/// says it failed, it found no address within the join deadline, or its user data has
/// stopped waiting to be listed.
fn failed_before_turn(m: &MachineView, deadline: Duration) -> Option<String> {
    let before = "failed before its turn to join";
    if m.failed {
        return Some(format!("{before} (the infrastructure reports it failed)"));
    }
    if m.address.is_none() && m.age > deadline {
        return Some(format!(
            "{before} (it has no address after {})",
            duration::format(deadline)
        ));
    }
    let wait = m.listed_wait?;
    (m.age >= wait).then(|| {
        format!(
            "{before} (its user data stops waiting to be listed after {})",
            duration::format(wait)
        )
    })
}

/// What new members are made of, or why no member Machine can be made from the spec now: the
/// problem admission would have refused, the version the members cannot move to, or the
/// missing template it is cloned from.
pub fn creation_blocked(o: &Observation) -> Result<MemberTemplate, Hold> {
    if let Some(problem) = &o.member_spec_problem {
        return Err(Hold::refuse(
            INVALID_SPEC,
            format!("no member Machine is created from this spec until it is fixed: {problem}"),
        ));
    }
    if let Some(refusal) = versions::refusal(o) {
        return Err(refusal);
    }
    if let Some(template) = &o.missing_infra_template {
        return Err(Hold::refusal(
            reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND,
            format!(
                "infrastructure template {template} not found: member Machines are cloned from it once it exists"
            ),
        ));
    }
    let (Some(cluster), Some(infra)) = (o.cluster.name(), &o.infra_machine) else {
        return Err(Hold::refuse(
            INVALID_SPEC,
            "spec.infrastructureTemplate names no infrastructure machine kind: no member Machine can be made",
        ));
    };
    Ok(MemberTemplate {
        cluster: cluster.to_string(),
        infra: infra.clone(),
        version: o.machine_version.clone(),
        listed_wait: learner_listed_wait(o.replicas, o.remediation.join_deadline),
        remediation_for: None,
    })
}

/// One new member Machine for `purpose`, unless none can be made from the spec.
pub fn create_machine(o: &Observation, allowed_domains: &[String], purpose: Growth) -> Decision<MachineStep> {
    let mut template = match creation_blocked(o) {
        Ok(template) => template,
        Err(blocked) => return Decision::Hold(blocked),
    };
    let (name, resume) = match o.leftovers.first() {
        Some(leftover) => (leftover.clone(), true),
        None => (o.new_member_name.clone(), false),
    };
    let purpose = if o.replacement_pending() {
        Growth::Replacement
    } else {
        purpose
    };
    if purpose == Growth::Replacement {
        template.remediation_for = o.etcd_cluster.annotations().get(REMEDIATION_ANNOTATION).cloned();
    }
    Decision::Do(MachineStep::CreateMachine {
        name,
        resume,
        failure_domain: pick_failure_domain(allowed_domains, &o.machines),
        purpose,
        template,
    })
}

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

/// Infra machines and configs of interrupted creations nobody needs any more.
pub fn leftovers(o: &Observation) -> Option<Decision<MachineStep>> {
    (!o.leftovers.is_empty()).then(|| {
        Decision::Do(MachineStep::DeleteLeftovers {
            names: o.leftovers.clone(),
            infra: o.infra_machine.clone(),
        })
    })
}

/// Rule 1 for removals: one Machine deletion at a time, the next change after it is gone.
pub fn deletion_in_flight(o: &Observation) -> Option<Hold> {
    let m = o.machines.iter().find(|m| m.deleting)?;
    Some(Hold::wait(
        reason::WAITING_FOR_MACHINE_DELETION,
        format!(
            "Machine {} is being deleted; the next change waits until it is gone",
            m.name
        ),
    ))
}

/// A dead victim goes at once, before remediation and health waits: removing it is the safest
/// change there is.
pub fn dead_victim(
    o: &Observation,
    allowed_domains: &[String],
    candidates: &[&MachineView],
    purpose: Removal,
) -> Option<Decision<MachineStep>> {
    let victim = pick_victim(o, allowed_domains, candidates)?;
    o.is_dead(victim).then(|| removal_step(o, victim, purpose))
}

/// Delete the victim among `candidates` for `purpose`; `None` when there is none.
pub fn remove_one(
    o: &Observation,
    allowed_domains: &[String],
    candidates: &[&MachineView],
    purpose: Removal,
) -> Option<Decision<MachineStep>> {
    pick_victim(o, allowed_domains, candidates).map(|victim| removal_step(o, victim, purpose))
}

/// Delete `victim` for `purpose`, if rules 3 and 6 allow removing its member now.
fn removal_step(o: &Observation, victim: &MachineView, purpose: Removal) -> Decision<MachineStep> {
    let what = format!("member of Machine {}", victim.name);
    if let Some(member) = o.member_of(&victim.name) {
        if let Some(refusal) = removal_refusal(o, member, &what) {
            return Decision::Hold(refusal);
        }
        if member.healthy
            && let Some((name, _, false)) = o.kcp_in_use()
        {
            return Decision::Hold(Hold::wait(
                reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
                format!(
                    "waiting for KubeadmControlPlane {name} to finish its rollout before removing the {what}"
                ),
            ));
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
    Decision::Do(MachineStep::DeleteMachine {
        machine: victim.name.clone(),
        purpose,
        message,
    })
}

// Status.

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

// Effects.

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// `cluster-name` and `etcd-cluster` labels of every member object.
fn member_labels(cluster: &str, etcd: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (names::ETCD_CLUSTER_LABEL.to_string(), etcd.to_string()),
    ])
}

/// What a new member is made of besides its name.
struct NewMember<'a> {
    etcd: &'a EtcdadmCluster,
    ns: &'a str,
    template: &'a MemberTemplate,
    failure_domain: Option<&'a str>,
}

/// Create member `name`: infra machine cloned from the template, EtcdadmConfig, then the Machine
/// that references both, all named `name`. Parts that exist already (an interrupted attempt)
/// are kept.
async fn create(
    out: &Outputs<'_>,
    o: &Observation,
    name: &str,
    failure_domain: Option<&str>,
    purpose: Growth,
    template: &MemberTemplate,
) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    let m = NewMember {
        etcd,
        ns: &o.namespace,
        template,
        failure_domain,
    };
    let labels = member_labels(&template.cluster, &etcd.name_any());
    let client = out.client;
    let infra = &template.infra;

    // 1. Infra machine, cloned from the template.
    let template_ref = &etcd.spec.infrastructure_template;
    let template_name = template_ref.name.clone().unwrap_or_default();
    let template_kind = template_ref.kind.clone().unwrap_or_default();
    let template_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        &infra.group,
        &infra.version,
        &template_kind,
    ));
    let infra_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), m.ns, infra);
    if infra_api.get_opt(name).await?.is_none() {
        let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), m.ns, &template_resource);
        let template = templates.get_opt(&template_name).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "infrastructure template {template_kind} {}/{template_name} not found",
                m.ns
            ))
        })?;
        let infra = clone_infra_machine(&template, &m, name, &labels)?;
        create_if_absent(&infra_api, &infra, FIELD_MANAGER).await?;
    }

    // 2. EtcdadmConfig with the cluster's config spec (corruption checks on unless it turns
    // them off: docs/day2.md, "Routine maintenance"), asking for a learner join and saying how
    // long it may wait for its turn (the first member initializes instead; a flavor that
    // cannot join as a learner keeps the voter join), or, for the restored first member, naming
    // the Secret with its snapshot's download.
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), m.ns);
    let mut config = EtcdadmConfig::new(name, etcd.spec.etcdadm_config_spec.for_new_member());
    config.metadata.namespace = Some(m.ns.into());
    config.metadata.labels = Some(labels.clone());
    let annotations = if purpose == Growth::Restore {
        BTreeMap::from([(
            names::RESTORE_SECRET_ANNOTATION.to_string(),
            names::restore_secret_name(&etcd.name_any()),
        )])
    } else {
        BTreeMap::from([
            (names::LEARNER_JOIN_ANNOTATION.to_string(), "true".to_string()),
            (
                names::LEARNER_LISTED_WAIT_ANNOTATION.to_string(),
                template.listed_wait.as_secs().to_string(),
            ),
        ])
    };
    config.metadata.annotations = Some(annotations);
    config.metadata.owner_references = Some(vec![owner_reference(etcd)?]);
    create_if_absent(&configs, &config, FIELD_MANAGER).await?;

    // 3. The Machine, controlled by the EtcdadmCluster, with our pre-terminate hook.
    let machine: Machine = serde_json::from_value(member_machine(&m, name, &labels)?)?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), m.ns);
    create_if_absent(&machines, &machine, FIELD_MANAGER).await?;
    Ok(Applied::Done)
}

/// The infra machine for member `name`: the template's `spec.template.spec` (and metadata), the
/// kind without `Template`, CAPI's cloned-from annotations, owned by the EtcdadmCluster.
fn clone_infra_machine(
    template: &DynamicObject,
    m: &NewMember<'_>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<DynamicObject, Error> {
    let template_spec = &template.data["spec"]["template"];
    let spec = template_spec.get("spec").cloned().unwrap_or_else(|| json!({}));
    let strings = |value: &Value| -> BTreeMap<String, String> {
        value
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut all_labels = strings(&template_spec["metadata"]["labels"]);
    all_labels.extend(labels.clone());
    let mut annotations = strings(&template_spec["metadata"]["annotations"]);
    let template_kind = m
        .etcd
        .spec
        .infrastructure_template
        .kind
        .clone()
        .unwrap_or_default();
    let infra = &m.template.infra;
    let group_kind = if infra.group.is_empty() {
        template_kind
    } else {
        format!("{template_kind}.{}", infra.group)
    };
    annotations.insert(names::CLONED_FROM_NAME_ANNOTATION.into(), template.name_any());
    annotations.insert(names::CLONED_FROM_GROUPKIND_ANNOTATION.into(), group_kind);
    let mut object = DynamicObject::new(name, infra).within(m.ns);
    object.metadata.labels = Some(all_labels);
    object.metadata.annotations = Some(annotations);
    object.metadata.owner_references = Some(vec![owner_reference(m.etcd)?]);
    object.data = json!({ "spec": spec });
    Ok(object)
}

/// The Machine of member `name`.
fn member_machine(m: &NewMember<'_>, name: &str, labels: &BTreeMap<String, String>) -> Result<Value, Error> {
    let template_meta = m
        .etcd
        .spec
        .machine_template
        .as_ref()
        .and_then(|t| t.metadata.clone())
        .unwrap_or_default();
    let mut all_labels = template_meta.labels.clone();
    all_labels.extend(labels.clone());
    let mut annotations = template_meta.annotations.clone();
    annotations.insert(names::PRE_TERMINATE_HOOK_ANNOTATION.into(), String::new());
    if let Some(record) = &m.template.remediation_for {
        annotations.insert(REMEDIATION_FOR_ANNOTATION.into(), record.clone());
    }
    let mut owner = controller_reference(m.etcd)?;
    owner.block_owner_deletion = Some(true);
    let infra = &m.template.infra;
    let mut spec = json!({
        "clusterName": m.template.cluster,
        "bootstrap": { "configRef": { "apiGroup": BOOTSTRAP_GROUP, "kind": "EtcdadmConfig", "name": name } },
        "infrastructureRef": { "apiGroup": infra.group, "kind": infra.kind, "name": name },
    });
    if let Some(domain) = m.failure_domain {
        spec["failureDomain"] = json!(domain);
    }
    if let Some(version) = &m.template.version {
        spec["version"] = json!(version);
    }
    Ok(json!({
        "apiVersion": Machine::api_version(&()),
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": m.ns,
            "labels": all_labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": spec,
    }))
}

/// Delete infra machines and EtcdadmConfigs of interrupted creations.
async fn delete_leftovers(
    out: &Outputs<'_>,
    namespace: &str,
    names: &[String],
    infra: Option<&ApiResource>,
) -> Result<Applied, Error> {
    let configs: Api<EtcdadmConfig> = Api::namespaced(out.client.clone(), namespace);
    for name in names {
        ignore_not_found(configs.delete(name, &DeleteParams::default()).await.map(drop))?;
        if let Some(resource) = infra {
            let api: Api<DynamicObject> = Api::namespaced_with(out.client.clone(), namespace, resource);
            ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Remove our pre-terminate hook from Machine `machine` (its member is gone, or the whole
/// cluster is).
pub async fn release_hook(out: &Outputs<'_>, namespace: &str, machine: &str) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), namespace);
    // A merge patch: an apply removes only what its manager alone owns, and the hook came with
    // the Machine's creation.
    let patch = json!({ "metadata": { "annotations": { names::PRE_TERMINATE_HOOK_ANNOTATION: null } } });
    ignore_not_found(
        machines
            .patch(machine, &patch_params(), &Patch::Merge(&patch))
            .await
            .map(drop),
    )
}

/// Record on Machine `machine` that its turn to join came now (its join deadline runs from it),
/// before its learner is added. A merge patch: a Machine deleted meanwhile is not made again.
pub async fn record_join_start(out: &Outputs<'_>, namespace: &str, machine: &str) -> Result<(), Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({ "metadata": { "annotations": { names::JOIN_STARTED_ANNOTATION: now } } });
    Api::<Machine>::namespaced(out.client.clone(), namespace)
        .patch(machine, &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Deletion of the whole etcd cluster (or of a lost one a recovery replaces): drop our
/// pre-terminate hook (no member removal: every member is going) and delete each Machine.
pub async fn release_and_delete(
    out: &Outputs<'_>,
    namespace: &str,
    names: &[String],
) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), namespace);
    for name in names {
        let Some(machine) = machines.get_opt(name).await? else {
            continue;
        };
        if machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            release_hook(out, namespace, name).await?;
        }
        if !machine.is_deleting() {
            ignore_not_found(machines.delete(name, &DeleteParams::background()).await.map(drop))?;
        }
    }
    Ok(Applied::Done)
}

/// Take over a Machine labelled for us: our pre-terminate hook, and our controller reference
/// when it has no controller. Two apply sites, so restoring the hook never drops the reference.
async fn adopt(out: &Outputs<'_>, o: &Observation, name: &str) -> Result<Applied, Error> {
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &o.namespace);
    let Some(machine) = machines.get_opt(name).await? else {
        return Ok(Applied::AlreadyDone);
    };
    if machine.is_deleting() {
        return Ok(Applied::AlreadyDone);
    }
    let apply = |manager: &'static str, force: bool, metadata: Value| {
        let body = ssa::configuration::<Machine>(name, metadata, json!({}));
        let machines = machines.clone();
        async move {
            machines
                .patch(name, &ssa::params(manager, force), &Patch::Apply(body))
                .await
        }
    };
    let hook = json!({ "annotations": { names::PRE_TERMINATE_HOOK_ANNOTATION: "" } });
    apply(HOOK_MANAGER, true, hook).await?;
    if !machine
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true))
    {
        let mut owner = controller_reference(&o.etcd_cluster)?;
        owner.block_owner_deletion = Some(true);
        // Not forced: if another controller took the Machine meanwhile, it stays theirs.
        apply(ADOPTION_MANAGER, false, json!({ "ownerReferences": [owner] })).await?;
    }
    Ok(Applied::Done)
}

/// Delete a member Machine; CAPI's finalizer and our hook keep it until its member is removed.
/// A remediation is recorded first, for the backoff after a failed replacement.
async fn delete(
    out: &Outputs<'_>,
    o: &Observation,
    machine: &str,
    purpose: Removal,
) -> Result<Applied, Error> {
    if let Removal::Remediation { retries } = purpose {
        let record = RemediationRecord {
            machine: machine.to_string(),
            timestamp: Time(k8s_openapi::jiff::Timestamp::now()),
            retry_count: retries,
        };
        record_remediation(out, &o.etcd_cluster, &record).await?;
        out.metrics(&o.etcd_cluster, |m, ns, name| m.remediation(ns, name));
    }
    let machines: Api<Machine> = Api::namespaced(out.client.clone(), &o.namespace);
    ignore_not_found(
        machines
            .delete(machine, &DeleteParams::background())
            .await
            .map(drop),
    )?;
    Ok(Applied::Done)
}

/// Record a remediation on the EtcdadmCluster (read back for the backoff after a failed
/// replacement): one annotation, this controller's alone.
async fn record_remediation(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    record: &RemediationRecord,
) -> Result<(), Error> {
    const REMEDIATION_MANAGER: &str = "etcdadm-controller/remediation";
    let metadata = json!({ "annotations": { REMEDIATION_ANNOTATION: record.to_annotation() } });
    let body = ssa::configuration::<EtcdadmCluster>(&etcd.name_any(), metadata, json!({}));
    Api::<EtcdadmCluster>::namespaced(out.client.clone(), &etcd.namespace().unwrap_or_default())
        .patch(
            &etcd.name_any(),
            &ssa::params(REMEDIATION_MANAGER, true),
            &Patch::Apply(body),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
