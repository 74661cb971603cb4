//! The decisions of the Machine concern: adoption, failed joins, what a new member is made of
//! and where it goes, interrupted creations, and which Machine leaves.

use std::time::Duration;

use kube::ResourceExt;

use etcdadm_shared::duration;
use etcdadm_shared::names;

use super::step::{Growth, MachineStep, MemberTemplate, Removal, UpToDateReport, reason};
use crate::controller::decision::reason::INVALID_SPEC;
use crate::controller::decision::{Decision, Hold};
use crate::controller::observation::clock::REMEDIATION_ANNOTATION;
use crate::controller::observation::{MachineView, Observation, learner_listed_wait};
use crate::controller::plan::placement::{pick_failure_domain, pick_victim};
use crate::controller::plan::versions;
use crate::controller::rules::removal_refusal;

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

/// What each member Machine must report of whether it runs the current spec (its `UpToDate`
/// condition, which v1beta2 leaves to the Machine's owner, as KubeadmControlPlane reports it on
/// its Machines), where it reports otherwise or nothing: written with the status, whatever the
/// step; its transition time kept while its status stays.
pub fn up_to_date_reports(o: &Observation) -> Vec<UpToDateReport> {
    o.active_machines()
        .filter_map(|m| {
            let up_to_date = m.outdated.is_none();
            let message = m
                .outdated
                .as_ref()
                .map(|why| format!("* {why}"))
                .unwrap_or_default();
            let status = if up_to_date { "True" } else { "False" };
            let reported = m.up_to_date.as_ref();
            if reported.is_some_and(|r| r.status == status && r.message == message) {
                return None;
            }
            let since = reported
                .filter(|r| r.status == status)
                .map(|r| r.last_transition_time.clone());
            Some(UpToDateReport {
                machine: m.name.clone(),
                up_to_date,
                message,
                since,
            })
        })
        .collect()
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
        ca_bundle: super::super::ca_rotation::seen::new_member_annotation(o),
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
