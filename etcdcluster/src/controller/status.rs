//! The status an EtcdadmCluster shows after a reconcile, computed purely from the observation and
//! the planned step, and the transitions in it that deserve an Event: the members and their
//! health, the summary the contract and `kubectl get` read and the `Ready` condition here; each
//! concern's own part (its fields, its conditions, its Events) from the registry of concerns,
//! in registry order (`Step::concern_status`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use etcdadm_shared::api::cluster::MachineReference;
use etcdadm_shared::api::cluster::condition::{ENDPOINTS_AVAILABLE, INITIALIZED, MEMBERS_HEALTHY, READY};
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus, MemberStatus};
use etcdadm_shared::etcd::member_id_hex;
use etcdadm_shared::names;

use super::decision::reason::READY as READY_REASON;
use super::decision::{EventNote, HoldKind, StatusPart};
use super::observation::{
    EtcdView, MachineView, MemberView, Observation, healthy_client_urls, is_ready, up_to_date_machines,
    voting_endpoints,
};
use super::plan::Step;
use super::rules::reason::{WAITING_FOR_FIRST_MEMBER, WAITING_FOR_JOIN_TURN};

/// The new status and the transitions from the old one to it.
pub fn next_status(
    etcd: &EtcdadmCluster,
    o: &Observation,
    step: &Step,
    now: &Time,
) -> (EtcdadmClusterStatus, Vec<EventNote>) {
    let old = etcd.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let mut transitions = Vec::new();
    status.members = member_statuses(o, &old.members, now, &mut transitions);
    initialized(&mut status, o, step, &mut transitions);
    summary(&mut status, etcd, o);
    let (step_reason, step_message) = step.reason();
    step.concern_status(&mut StatusPart {
        o,
        old: &old,
        next: (step_reason, &step_message),
        now,
        status: &mut status,
        events: &mut transitions,
    });
    set_conditions(&mut status, o, step, now);
    transitions.extend(ready_transitions(&status, &old, step));
    (status, transitions)
}

/// `status.initialized`, once a member passed a health check (a step that forgets the cluster,
/// a recovery's reset, clears it, so the next member restores a new one), with its Event.
fn initialized(
    status: &mut EtcdadmClusterStatus,
    o: &Observation,
    step: &Step,
    transitions: &mut Vec<EventNote>,
) {
    let was = status.initialized;
    let initialized = !step.forgets_cluster() && (was || o.initialized_now());
    if initialized && !was {
        let first = status
            .members
            .iter()
            .find(|m| m.healthy)
            .map(|m| m.name.clone())
            .unwrap_or_default();
        transitions.push(EventNote::normal(
            "Initialized",
            format!("etcd is initialized: member {first} passed its health check"),
        ));
    }
    status.initialized = initialized;
}

/// The fields the contract and `kubectl get` read: ready, endpoints, counts.
fn summary(status: &mut EtcdadmClusterStatus, etcd: &EtcdadmCluster, o: &Observation) {
    let ready = serving(o);
    status.ready = ready;
    status.creation_complete = status.creation_complete || ready;
    if matches!(o.etcd, EtcdView::Members(_)) {
        status.endpoints = voting_endpoints(o).join(",");
    }
    if let (Some(cluster), Some(_)) = (o.cluster.name(), &o.init_secret) {
        status.init_machine_address = names::init_secret_name(cluster);
    }
    let ready_members = status
        .members
        .iter()
        .filter(|m| m.machine_ref.is_some() && m.healthy && !m.is_learner)
        .count();
    let ready_members = i32::try_from(ready_members).unwrap_or(i32::MAX);
    status.ready_count = Some(ready_members);
    status.ready_replicas = Some(ready_members);
    status.updated_replicas = Some(i32::try_from(up_to_date_machines(o)).unwrap_or(i32::MAX));
    if let Some(cluster) = o.cluster.name() {
        status.selector = Some(names::member_selector(cluster, &o.name));
    }
    status.observed_generation = etcd.metadata.generation;
}

/// The conditions of the members and their health, and `Ready` (after every concern's).
fn set_conditions(status: &mut EtcdadmClusterStatus, o: &Observation, step: &Step, now: &Time) {
    let generation = o.etcd_cluster.metadata.generation;
    let ready_condition = if serving(o) {
        NewCondition::true_(READY, READY_REASON)
    } else {
        let (step_reason, step_message) = step.reason();
        let severity = match step.hold().map(|hold| hold.kind) {
            Some(HoldKind::Refuse) => Severity::Error,
            Some(HoldKind::Refusal) => Severity::Warning,
            Some(HoldKind::Wait) | None => Severity::Info,
        };
        NewCondition::false_(READY, severity, step_reason, step_message)
    };
    for condition in [
        initialized_condition(status.initialized),
        members_condition(o),
        endpoints_condition(o),
        ready_condition,
    ] {
        conditions::set(&mut status.conditions, condition, generation, now);
    }
}

/// Ready: every member a healthy voter, no alarm keeping etcd from accepting writes, and no
/// restore's deltas still to replay.
fn serving(o: &Observation) -> bool {
    is_ready(o) && o.alarms.is_empty() && !super::plan::restore::deltas_pending(o)
}

/// The Events of Ready's changes: becoming ready, no longer ready, and a refusal beginning.
fn ready_transitions(
    status: &EtcdadmClusterStatus,
    old: &EtcdadmClusterStatus,
    step: &Step,
) -> Vec<EventNote> {
    let mut transitions = Vec::new();
    let old_reason = conditions::find(&old.conditions, READY).and_then(|c| c.reason.clone());
    let new_reason = conditions::find(&status.conditions, READY).and_then(|c| c.reason.clone());
    if status.ready && !old.ready {
        let members = status.ready_replicas.unwrap_or_default();
        transitions.push(EventNote::normal(
            "Ready",
            format!(
                "all {members} members are healthy voting members: {}",
                status.endpoints
            ),
        ));
    } else if !status.ready && old.ready {
        let (why, message) = step.reason();
        transitions.push(EventNote::warning(
            "NotReady",
            format!("etcd is no longer ready ({why}): {message}"),
        ));
    }
    if old_reason != new_reason
        && let Some(hold) = step.hold()
        && hold.is_refusal()
    {
        transitions.push(EventNote::warning(hold.reason, hold.message.clone()));
    }
    transitions
}

fn initialized_condition(initialized: bool) -> NewCondition {
    if initialized {
        NewCondition::true_(INITIALIZED, "Initialized")
    } else {
        NewCondition::false_(
            INITIALIZED,
            Severity::Info,
            WAITING_FOR_FIRST_MEMBER,
            "waiting for the first member to pass a health check",
        )
    }
}

/// `EndpointsAvailable`: a healthy voting member serves clients (the remediation clock reads
/// when this last turned True).
fn endpoints_condition(o: &Observation) -> NewCondition {
    if healthy_client_urls(o).is_empty() {
        NewCondition::false_(
            ENDPOINTS_AVAILABLE,
            Severity::Info,
            "NoHealthyMembers",
            "no healthy voting member to serve clients",
        )
    } else {
        NewCondition::true_(ENDPOINTS_AVAILABLE, "EndpointsAvailable")
    }
}

fn members_condition(o: &Observation) -> NewCondition {
    match &o.etcd {
        EtcdView::NotChecked => NewCondition::unknown(
            MEMBERS_HEALTHY,
            "NotChecked",
            "no member could be checked yet (no CA or no Machine with an address)",
        ),
        EtcdView::Unreachable { message } => NewCondition::false_(
            MEMBERS_HEALTHY,
            Severity::Warning,
            "MembersUnreachable",
            message.as_str(),
        ),
        EtcdView::Members(members) => {
            let mut problems: Vec<String> = members
                .iter()
                .filter(|m| !m.healthy)
                .map(|m| {
                    format!(
                        "{}: {}",
                        display_name(m),
                        m.message.as_deref().unwrap_or("unhealthy")
                    )
                })
                .collect();
            let mut joining = !problems.is_empty();
            for machine in o.machines.iter().filter(|m| !m.deleting) {
                if !members
                    .iter()
                    .any(|m| m.machine.as_deref() == Some(machine.name.as_str()))
                {
                    let waits = o.awaits_turn(machine);
                    joining |= !waits;
                    problems.push(format!("{}: {}", machine.name, not_a_member_yet(waits)));
                }
            }
            if problems.is_empty() {
                return NewCondition::true_(MEMBERS_HEALTHY, "MembersHealthy");
            }
            let degraded = members.iter().any(|m| !m.healthy && m.ever_healthy);
            let (severity, why) = if degraded {
                (Severity::Warning, "MembersUnhealthy")
            } else if joining {
                (Severity::Info, "MembersJoining")
            } else {
                (Severity::Info, WAITING_FOR_JOIN_TURN)
            };
            NewCondition::false_(MEMBERS_HEALTHY, severity, why, problems.join("; "))
        }
    }
}

/// What a Machine without a member is doing: joining, or waiting for its turn to (booted ahead,
/// docs/safety.md "Boot ahead").
fn not_a_member_yet(awaits_turn: bool) -> &'static str {
    if awaits_turn {
        "waiting for its turn to join (members join one at a time, each once every member is healthy)"
    } else {
        "not an etcd member yet"
    }
}

fn display_name(m: &MemberView) -> String {
    m.machine
        .clone()
        .filter(|_| !m.is_started())
        .or_else(|| (!m.name.is_empty()).then(|| m.name.clone()))
        .unwrap_or_else(|| member_id_hex(m.id))
}

/// One entry per Machine (in Machine order), then one per member that runs on none of them.
fn member_statuses(
    o: &Observation,
    previous: &[MemberStatus],
    now: &Time,
    transitions: &mut Vec<EventNote>,
) -> Vec<MemberStatus> {
    let members: &[MemberView] = match &o.etcd {
        EtcdView::Members(members) => members,
        _ => &[],
    };
    let mut out = Vec::new();
    for machine in &o.machines {
        let prev = previous.iter().find(|p| p.name == machine.name);
        let member = members
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine.name.as_str()));
        let entry = machine_entry(o, machine, member, prev);
        out.push(entry);
    }
    out.extend(voters_without_machines(o, previous));
    for member in members.iter().filter(|m| m.machine.is_none()) {
        let name = display_name(member);
        let prev = previous.iter().find(|p| p.name == name);
        let mut entry = member_entry(&name, member, prev);
        let why = member.message.clone().unwrap_or_else(|| "healthy".into());
        entry.message = Some(format!(
            "no Machine of this EtcdadmCluster runs this member ({why})"
        ));
        out.push(entry);
    }
    for entry in &mut out {
        let prev = previous.iter().find(|p| p.name == entry.name);
        stamp_times(entry, prev, now);
        if let Some(t) = health_transition(entry, prev) {
            transitions.push(t);
        }
    }
    out
}

/// Without a member list this round, the voting members last recorded whose Machine is gone
/// stay recorded (without health): what a recovery counts a lost majority against
/// (`plan/recovery/evidence.rs`). The next member list says who they are again.
fn voters_without_machines(o: &Observation, previous: &[MemberStatus]) -> Vec<MemberStatus> {
    if matches!(o.etcd, EtcdView::Members(_)) || !o.initialized {
        return vec![];
    }
    previous
        .iter()
        .filter(|p| p.machine_ref.is_some() && p.member_id.is_some() && !p.is_learner)
        .filter(|p| !o.machines.iter().any(|m| m.name == p.name))
        .map(|p| MemberStatus {
            healthy: false,
            is_leader: false,
            message: Some(
                "its Machine is gone; kept as the last recorded voting member until a member \
                 answers with the member list"
                    .into(),
            ),
            ..p.clone()
        })
        .collect()
}

fn member_entry(name: &str, member: &MemberView, prev: Option<&MemberStatus>) -> MemberStatus {
    MemberStatus {
        name: name.to_string(),
        machine_ref: None,
        member_id: Some(member_id_hex(member.id)),
        peer_url: member.peer_urls.first().cloned(),
        client_url: member.client_urls.first().cloned(),
        healthy: member.healthy,
        is_leader: member.is_leader,
        is_learner: member.is_learner,
        last_healthy_time: prev.and_then(|p| p.last_healthy_time.clone()),
        last_transition_time: prev.and_then(|p| p.last_transition_time.clone()),
        etcd_version: member.etcd_version.clone(),
        db_size: member.db_size,
        db_size_in_use: member.db_size_in_use,
        quota_backend_bytes: i64::try_from(member.quota()).ok(),
        last_defragmentation: prev.and_then(|p| p.last_defragmentation.clone()),
        alarms: member.alarms.clone(),
        // A member that did not complete a handshake this round keeps what it last presented.
        certificate_expiry: member
            .certificate_expiry
            .map(Time)
            .or_else(|| prev.and_then(|p| p.certificate_expiry.clone())),
        message: member.message.clone(),
    }
}

fn machine_entry(
    o: &Observation,
    machine: &MachineView,
    member: Option<&MemberView>,
    prev: Option<&MemberStatus>,
) -> MemberStatus {
    let mut entry = match member {
        Some(member) => member_entry(&machine.name, member, prev),
        None => MemberStatus {
            name: machine.name.clone(),
            // Without a fresh member list, what was known stays (minus health).
            member_id: prev.and_then(|p| p.member_id.clone()),
            is_learner: prev.is_some_and(|p| p.is_learner),
            last_healthy_time: prev.and_then(|p| p.last_healthy_time.clone()),
            last_transition_time: prev.and_then(|p| p.last_transition_time.clone()),
            message: Some(match (&machine.address, &o.etcd) {
                (None, _) => "waiting for the Machine's address".into(),
                (Some(_), EtcdView::NotChecked) => "not checked yet".into(),
                (Some(_), EtcdView::Unreachable { message }) => format!("no member answers: {message}"),
                (Some(_), EtcdView::Members(_)) => not_a_member_yet(o.awaits_turn(machine)).into(),
            }),
            ..Default::default()
        },
    };
    entry.machine_ref = Some(MachineReference {
        name: machine.name.clone(),
    });
    if let Some(address) = &machine.address {
        entry.client_url = Some(names::client_url(address));
        entry.peer_url = Some(names::peer_url(address));
    }
    if machine.deleting {
        let why = entry.message.take();
        entry.message = Some(match why {
            Some(why) => format!("Machine is being deleted; {why}"),
            None => "Machine is being deleted".into(),
        });
    }
    entry
}

/// `lastHealthyTime` moves at most this often while a member stays healthy: exact to the check
/// would rewrite every cluster's status at every interval.
pub const LAST_HEALTHY_GRANULARITY_SECS: i64 = 30;

fn stamp_times(entry: &mut MemberStatus, prev: Option<&MemberStatus>, now: &Time) {
    let still_fresh = prev
        .filter(|p| p.healthy)
        .and_then(|p| p.last_healthy_time.as_ref())
        .is_some_and(|t| now.0.as_second() - t.0.as_second() < LAST_HEALTHY_GRANULARITY_SECS);
    if entry.healthy && !still_fresh {
        entry.last_healthy_time = Some(now.clone());
    }
    let flipped = prev.is_none_or(|p| p.healthy != entry.healthy);
    if flipped || entry.last_transition_time.is_none() {
        entry.last_transition_time = Some(now.clone());
    }
}

fn health_transition(entry: &MemberStatus, prev: Option<&MemberStatus>) -> Option<EventNote> {
    let joined = entry.member_id.is_some() && prev.is_none_or(|p| p.member_id.is_none());
    if joined && entry.machine_ref.is_some() {
        return Some(EventNote::normal(
            "MemberJoined",
            format!(
                "Machine {} is etcd member {}",
                entry.name,
                entry.member_id.clone().unwrap_or_default()
            ),
        ));
    }
    let was_healthy = prev.is_some_and(|p| p.healthy);
    match (was_healthy, entry.healthy) {
        (true, false) => Some(EventNote::warning(
            "MemberUnhealthy",
            format!(
                "member {} is unhealthy: {}",
                entry.name,
                entry.message.clone().unwrap_or_default()
            ),
        )),
        (false, true) if prev.is_some_and(|p| p.last_healthy_time.is_some()) => Some(EventNote::normal(
            "MemberHealthy",
            format!("member {} is healthy again", entry.name),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
