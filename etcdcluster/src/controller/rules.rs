//! The membership safety rules every change passes (docs/safety.md, rules 1–3): quorum, one
//! change at a time, every member healthy before the next one. Each answers with the hold that
//! keeps the plan back, or nothing when the way is clear; the reasons they hold with are here
//! too, since every concern that changes membership meets them.

use std::time::Duration;

use etcdadm_shared::duration;

use super::decision::Hold;
use super::observation::{EtcdView, MemberView, Observation, healthy_client_urls, member_client_url};

/// Condition reasons of the membership rules.
pub mod reason {
    pub const QUORUM_LOST: &str = "QuorumLost";
    pub const MEMBERS_UNREACHABLE: &str = "MembersUnreachable";
    pub const WAITING_FOR_MACHINE_ADDRESS: &str = "WaitingForMachineAddress";
    pub const WAITING_FOR_FIRST_MEMBER: &str = "WaitingForFirstMember";
    pub const WAITING_FOR_MEMBER_JOIN: &str = "WaitingForMemberJoin";
    pub const WAITING_FOR_LEARNER: &str = "WaitingForLearnerPromotion";
    /// A Machine booted ahead waits to be added as a learner (docs/safety.md, "Boot ahead").
    pub const WAITING_FOR_JOIN_TURN: &str = "WaitingForJoinTurn";
    pub const WAITING_FOR_HEALTHY_MEMBERS: &str = "WaitingForHealthyMembers";
    pub const UNKNOWN_MEMBERS: &str = "MembersWithoutMachines";
    pub const REMOVAL_WOULD_LOSE_QUORUM: &str = "RemovalWouldLoseQuorum";
    pub const LAST_MEMBER: &str = "LastMember";
    pub const CONTROL_PLANE_NEEDS_MEMBER: &str = "ControlPlaneNeedsMember";
    pub const ROLLOUT_PAUSED: &str = "RollingUpdatePaused";
    pub const REMEDIATION_DISABLED: &str = "RemediationDisabled";
}

/// `q(n) = n/2 + 1`: how many voters a cluster of `n` needs to commit anything.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// Rule 3's precondition: with fewer healthy voters than a quorum nothing may change. A join in
/// flight (added but not started, or started and catching up) is reported as such, not as lost.
pub fn quorum_lost(o: &Observation) -> Option<Hold> {
    match &o.etcd {
        // Silence is not a lost quorum: the controller may be cut off from members that serve.
        EtcdView::Unreachable { message } if o.initialized => Some(Hold::refusal(
            reason::MEMBERS_UNREACHABLE,
            format!(
                "no etcd member answers the controller: {message}; the members may be down or cut off from the management cluster; nothing is changed until one answers"
            ),
        )),
        EtcdView::Members(_) if !o.initialized_now() => None,
        EtcdView::Members(members) => {
            let voters: Vec<&MemberView> = members.iter().filter(|m| !m.is_learner).collect();
            let healthy = voters.iter().filter(|m| m.healthy).count();
            if voters.is_empty() || healthy >= quorum(voters.len()) {
                return None;
            }
            let settled = voters.iter().filter(|m| !m.is_joining()).count();
            let joining = voters.iter().find(|m| m.is_joining());
            if let (Some(joining), true) = (joining, healthy >= quorum(settled)) {
                return Some(Hold::wait(
                    reason::WAITING_FOR_MEMBER_JOIN,
                    format!("{} is joining; waiting until it is healthy", joining.describe()),
                ));
            }
            let unhealthy: Vec<String> = voters
                .iter()
                .filter(|m| !m.healthy)
                .map(|m| m.describe())
                .collect();
            Some(Hold::refusal(
                reason::QUORUM_LOST,
                format!(
                    "{healthy} of {} voting members healthy, {} needed for quorum (unhealthy: {}); \
                     nothing is changed or removed until quorum is back",
                    voters.len(),
                    quorum(voters.len()),
                    unhealthy.join(", ")
                ),
            ))
        }
        _ => None,
    }
}

/// Rules 3 and 6 for the member about to be removed: never the last voter, never below quorum
/// of the remaining voters; a healthy member keeps the control plane one working endpoint.
pub fn removal_refusal(o: &Observation, member: &MemberView, what: &str) -> Option<Hold> {
    if member.is_learner {
        return None;
    }
    let voters = o.voters();
    if voters.len() <= 1 {
        return Some(Hold::refusal(
            reason::LAST_MEMBER,
            format!(
                "{what} is the last etcd member, which is never removed; delete the EtcdadmCluster to delete the whole etcd cluster"
            ),
        ));
    }
    let healthy = voters.iter().filter(|m| m.healthy).count();
    let after = healthy.saturating_sub(usize::from(member.healthy));
    if after < quorum(voters.len() - 1) {
        return Some(Hold::refusal(
            reason::REMOVAL_WOULD_LOSE_QUORUM,
            format!(
                "removing the {what} would leave {after} healthy of {} voters, below quorum {}; waiting until other members are healthy",
                voters.len() - 1,
                quorum(voters.len() - 1)
            ),
        ));
    }
    if member.healthy
        && let Some((kcp, endpoints, _)) = o.kcp_in_use()
        && let Some(url) = member_client_url(o, member)
    {
        let healthy_urls = healthy_client_urls(o);
        let ours = endpoints.iter().any(|e| {
            o.members()
                .iter()
                .any(|m| member_client_url(o, m).as_deref() == Some(e.as_str()))
        });
        let others_working = endpoints.iter().any(|e| *e != url && healthy_urls.contains(e));
        if ours && !others_working {
            return Some(Hold::refusal(
                reason::CONTROL_PLANE_NEEDS_MEMBER,
                format!(
                    "KubeadmControlPlane {kcp} lists {url} as its only working etcd endpoint; the {what} stays until the control plane uses another"
                ),
            ));
        }
    }
    None
}

/// Rules 1 and 2: a membership change in flight (a Machine whose join began without address or
/// member yet, an added member not started, a started member catching up, a learner) is waited
/// out. A Machine waiting for its turn to join is none: etcd holds nothing of it.
pub fn pending_change(o: &Observation) -> Option<Hold> {
    for machine in o.joined_machines() {
        if machine.address.is_none() {
            return Some(Hold::wait(
                reason::WAITING_FOR_MACHINE_ADDRESS,
                format!("Machine {} has no address yet", machine.name),
            ));
        }
    }
    let members = match &o.etcd {
        EtcdView::Members(members) => members,
        EtcdView::NotChecked if o.machines.is_empty() => return None,
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => {
            let message = match &o.etcd {
                EtcdView::Unreachable { message } => message.clone(),
                _ => "not checked yet".into(),
            };
            return Some(Hold::wait(
                reason::WAITING_FOR_FIRST_MEMBER,
                format!("waiting for the first etcd member to answer: {message}"),
            ));
        }
    };
    if let Some(m) = members.iter().find(|m| !m.is_started()) {
        return Some(Hold::wait(
            reason::WAITING_FOR_MEMBER_JOIN,
            format!(
                "{} was added but has not started yet{}",
                m.describe(),
                waiting_after(o)
            ),
        ));
    }
    if let Some(m) = members.iter().find(|m| m.is_learner) {
        return Some(Hold::wait(
            reason::WAITING_FOR_LEARNER,
            format!(
                "{} is a learner; one membership change at a time{}",
                m.describe(),
                waiting_after(o)
            ),
        ));
    }
    if let Some(m) = members.iter().find(|m| m.is_joining()) {
        let why = m.message.clone().unwrap_or_else(|| "not healthy yet".into());
        return Some(Hold::wait(
            reason::WAITING_FOR_MEMBER_JOIN,
            format!(
                "{} joined and is catching up: {why}{}",
                m.describe(),
                waiting_after(o)
            ),
        ));
    }
    for machine in o.joined_machines().filter(|m| !m.was_member) {
        if o.member_of(&machine.name).is_none() {
            let how = if machine.learner_join {
                "; it is added as a learner once every member is a healthy voter of ours"
            } else {
                ""
            };
            return Some(Hold::wait(
                reason::WAITING_FOR_MEMBER_JOIN,
                format!("Machine {} is not an etcd member yet{how}", machine.name),
            ));
        }
    }
    None
}

/// `; Machines a, b wait for their turn to join` when some do: what comes after the join in
/// flight.
pub fn waiting_after(o: &Observation) -> String {
    let waiting: Vec<&str> = o.waiting_machines().map(|m| m.name.as_str()).collect();
    match waiting.as_slice() {
        [] => String::new(),
        [one] => format!("; Machine {one} waits for its turn to join"),
        many => format!("; Machines {} wait for their turn to join", many.join(", ")),
    }
}

/// Rule 4: a member on none of our Machines (a stranger) is never touched while healthy, and
/// nothing else changes while it is there.
pub fn unknown_members_wait(o: &Observation) -> Option<Hold> {
    let unknown: Vec<String> = o
        .members()
        .iter()
        .filter(|m| m.machine.is_none())
        .map(|m| m.describe())
        .collect();
    (!unknown.is_empty()).then(|| Hold::refusal(reason::UNKNOWN_MEMBERS, format!(
            "etcd has members that run on none of this cluster's Machines ({}); they are never removed while healthy, and nothing else changes until they are gone",
            unknown.join(", ")
        )))
}

/// Rule 2 and the rollout rule: adding, switching endpoints and removing healthy members all
/// need every member healthy. Says what happens to the unhealthy ones.
pub fn unhealthy_wait(o: &Observation) -> Option<Hold> {
    let mut problems: Vec<(String, Duration)> = o
        .members()
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| {
            let why = m.message.clone().unwrap_or_else(|| "unhealthy".into());
            (format!("{} is not healthy: {why}", m.describe()), m.unhealthy_for)
        })
        .collect();
    for machine in o.active_machines() {
        if machine.was_member && o.member_of(&machine.name).is_none() {
            problems.push((
                format!("Machine {}'s member is no longer in etcd", machine.name),
                machine.unhealthy_for,
            ));
        }
    }
    let (problem, longest) = problems.iter().max_by_key(|(_, d)| *d)?.clone();
    let policy = o.remediation;
    let rollout = o.active_machines().any(|m| m.outdated.is_some());
    let (reason, next) = if !policy.enabled && longest > policy.unhealthy_after {
        (
            reason::REMEDIATION_DISABLED,
            "remediation is disabled (healthCheck.remediation or the healthcheck-retries annotation): fix the member or delete its Machine".to_string(),
        )
    } else if policy.enabled {
        (
            reason::WAITING_FOR_HEALTHY_MEMBERS,
            format!(
                "it is replaced once unhealthy for {} (unhealthy for {} so far)",
                duration::format(policy.unhealthy_after),
                duration::format(longest)
            ),
        )
    } else {
        (
            reason::WAITING_FOR_HEALTHY_MEMBERS,
            "remediation is disabled".to_string(),
        )
    };
    let (reason, prefix) = if rollout {
        (
            reason::ROLLOUT_PAUSED,
            "the rolling update is paused until every member is healthy: ",
        )
    } else {
        (reason, "")
    };
    let message = format!("{prefix}{problem}; {next}");
    Some(match reason {
        reason::WAITING_FOR_HEALTHY_MEMBERS => Hold::wait(reason, message),
        _ => Hold::refusal(reason, message),
    })
}

/// Before the first member passed a health check nothing joins it: its Machine is the only one
/// until then.
pub fn first_member_wait(o: &Observation) -> Option<Hold> {
    let first = o.machines.is_empty() && o.members().is_empty();
    (!first && !o.initialized_now()).then(|| {
        Hold::wait(
            reason::WAITING_FOR_FIRST_MEMBER,
            "waiting for the first member to pass a health check",
        )
    })
}

#[cfg(test)]
mod tests;
