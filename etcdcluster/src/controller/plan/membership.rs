//! etcd membership changes: a joining Machine's member pre-added as a learner at the exact peer
//! URL its node advertises and promoted as soon as etcd accepts (docs/day2.md, "Learner joins");
//! a deleted Machine's member removed first, leadership moved away first, and only while quorum
//! survives it (docs/safety.md rules 3, 4 and 6); the hook released once the member is gone.
//! The changes are asked of a member with the controller's client certificate; a refusal etcd
//! gives for a passing reason is waited out, any other is an error.

use crate::controller::decision::ConcernMetrics;
use etcdadm_shared::manager::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use std::sync::Arc;

use etcdadm_shared::error::Error;
use etcdadm_shared::etcd::{EtcdError, MemberClient, Refusal, member_id_hex};
use etcdadm_shared::names;

use super::machines::{record_join_start, release_hook};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, Hold, JOIN_POLL, MEMBERSHIP_RETRY, Outputs,
    PROMOTION_APPLIED,
};
use crate::controller::observation::{
    EtcdView, MachineView, Observation, healthy_client_urls, member_client_url,
};
use crate::controller::rules::{reason as rule, removal_refusal};

/// Condition reasons of membership changes.
pub mod reason {
    pub const REMOVING_MEMBER: &str = "RemovingMember";
    pub const ADDING_LEARNER: &str = "AddingLearner";
    pub const LEARNER_CATCHING_UP: &str = "LearnerCatchingUp";
}

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum MembershipStep {
    /// Rule 6: hand leadership from the member about to be removed (asked through its own
    /// client URL) to the healthy voter `to`.
    MoveLeader {
        leader_url: String,
        to: u64,
        machine: String,
    },
    /// Learner join: add Machine `machine`'s member as a learner at `peer_url`, asking the
    /// healthy voter at `via_url`; when its turn is new (`record_turn`), first write on the
    /// Machine when it came, which its join deadline runs from.
    AddLearner {
        machine: String,
        peer_url: String,
        via_url: String,
        record_turn: bool,
    },
    /// Learner join: turn Machine `machine`'s learner into a voter, asking `via_url` (etcd
    /// refuses until it has caught up).
    PromoteLearner {
        member_id: u64,
        machine: String,
        via_url: String,
    },
    /// Rules 3 and 4: remove a member (of a Machine being deleted, or an unhealthy one that
    /// runs on no Machine), asking a healthy member. `member` names it, `why` says why.
    RemoveMember {
        member_id: u64,
        via_url: String,
        member: String,
        why: String,
    },
    /// The Machine's member is gone: let CAPI terminate it.
    ReleaseHook { machine: String },
}

impl ConcernStep for MembershipStep {
    type View = ();
    type Metrics = MembershipMetrics;

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            MembershipStep::MoveLeader { machine, .. } => (
                reason::REMOVING_MEMBER,
                format!("moving etcd leadership away from Machine {machine} before removing its member"),
            ),
            MembershipStep::AddLearner {
                machine, peer_url, ..
            } => (
                reason::ADDING_LEARNER,
                format!("adding Machine {machine}'s member as a learner at {peer_url}"),
            ),
            MembershipStep::PromoteLearner { machine, .. } => (
                reason::LEARNER_CATCHING_UP,
                format!(
                    "Machine {machine}'s member is a learner catching up; it is promoted to a voter as soon as etcd accepts"
                ),
            ),
            MembershipStep::RemoveMember { member, why, .. } => {
                (reason::REMOVING_MEMBER, format!("removing the {member}: {why}"))
            }
            MembershipStep::ReleaseHook { machine } => (
                reason::REMOVING_MEMBER,
                format!("Machine {machine} has no etcd member any more; letting it go"),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, _: &Observation) -> Option<EventNote> {
        let (reason, note) = match self {
            MembershipStep::MoveLeader { to, machine, .. } => (
                "LeadershipMoved",
                format!(
                    "moved etcd leadership to member {} before removing Machine {machine}'s member",
                    member_id_hex(*to)
                ),
            ),
            MembershipStep::AddLearner {
                machine, peer_url, ..
            } => (
                "LearnerAdded",
                format!("added Machine {machine}'s member as a learner at {peer_url}"),
            ),
            MembershipStep::PromoteLearner {
                member_id, machine, ..
            } => (
                "LearnerPromoted",
                format!(
                    "promoted Machine {machine}'s learner ({}) to a voting member",
                    member_id_hex(*member_id)
                ),
            ),
            MembershipStep::RemoveMember {
                member_id,
                member,
                why,
                ..
            } => (
                "MemberRemoved",
                format!("removed the etcd {member} ({}): {why}", member_id_hex(*member_id)),
            ),
            MembershipStep::ReleaseHook { machine } => (
                "PreTerminateHookReleased",
                format!("Machine {machine} has no etcd member; released its pre-terminate hook"),
            ),
        };
        Some(EventNote::normal(reason, note))
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            MembershipStep::MoveLeader { leader_url, to, .. } => {
                let member = member_client(out, o, leader_url)?;
                outcome(out, o, "move-leader", member.move_leader(*to).await)
            }
            MembershipStep::RemoveMember {
                member_id, via_url, ..
            } => {
                let member = member_client(out, o, via_url)?;
                // One already gone is fine.
                let result = match member.member_remove(*member_id).await {
                    Err(e) if e.refusal() == Some(Refusal::MemberNotFound) => Ok(()),
                    other => other,
                };
                outcome(out, o, "remove", result)
            }
            MembershipStep::AddLearner {
                machine,
                via_url,
                peer_url,
                record_turn,
            } => {
                if *record_turn {
                    record_join_start(out, &o.namespace, machine).await?;
                }
                let member = member_client(out, o, via_url)?;
                // A member already there with that peer URL (an earlier attempt) is the one wanted.
                match member.member_add(std::slice::from_ref(peer_url), true).await {
                    Err(e) if e.refusal() == Some(Refusal::PeerUrlExists) => Ok(Applied::AlreadyDone),
                    other => outcome(out, o, "add-learner", other.map(drop)),
                }
            }
            MembershipStep::PromoteLearner {
                member_id, via_url, ..
            } => {
                let member = member_client(out, o, via_url)?;
                // Not caught up yet: asked again shortly; a voter already (an earlier attempt): done.
                match member.member_promote(*member_id).await {
                    Err(e) if e.refusal() == Some(Refusal::LearnerNotReady) => Ok(Applied::NotYet),
                    Err(e) if e.refusal() == Some(Refusal::MemberNotLearner) => Ok(Applied::AlreadyDone),
                    other => outcome(out, o, "promote", other),
                }
            }
            MembershipStep::ReleaseHook { machine } => {
                release_hook(out, &o.namespace, machine).await?;
                Ok(Applied::Done)
            }
        }
    }

    /// What comes after: the reconcile's etcd view predates the change, so the next step needs
    /// a new health round: after a learner's addition once its node had time to start it, after
    /// a promotion as soon as the members applied it (the voter it made is healthy already, and
    /// what follows, the next learner's turn or Ready, waits on nothing else; at once, a member
    /// that has not applied it yet would still list a learner).
    fn after(&self, _: &Observation) -> After {
        match self {
            MembershipStep::MoveLeader { .. } | MembershipStep::RemoveMember { .. } => {
                After::Requeue(MEMBERSHIP_RETRY)
            }
            MembershipStep::AddLearner { .. } => After::Requeue(JOIN_POLL),
            MembershipStep::PromoteLearner { .. } => After::Requeue(PROMOTION_APPLIED),
            MembershipStep::ReleaseHook { .. } => After::Again,
        }
    }
}

// Decisions.

/// Rule 1: promotion finishes the learner's add. Our started learner is promoted (unless
/// another member is still joining), asking a healthy voter; etcd refuses until it has caught
/// up, and the attempt is repeated.
pub fn promote(o: &Observation) -> Option<Decision<MembershipStep>> {
    let members = o.members();
    if members.iter().any(|m| !m.is_started()) {
        return None;
    }
    let learner = members
        .iter()
        .find(|m| m.is_learner && m.is_started() && m.machine.is_some())?;
    let via_url = healthy_client_urls(o).into_iter().next()?;
    Some(Decision::Do(MembershipStep::PromoteLearner {
        member_id: learner.id,
        machine: learner.machine.clone()?,
        via_url,
    }))
}

/// Rules 1, 2 and 4: a Machine whose turn to join came (recorded on it) and that has no member
/// yet (the controller stopped between recording the turn and adding the learner) is pre-added,
/// once every member is a started, healthy voter of ours (so never two learners). The first
/// member initializes the cluster and is never pre-added.
pub fn pre_add(o: &Observation) -> Option<Decision<MembershipStep>> {
    if !o.initialized_now() {
        return None;
    }
    let machine = o.joined_machines().find(|m| {
        m.learner_join && !m.was_member && m.join_started.is_some() && o.member_of(&m.name).is_none()
    })?;
    add_learner(o, machine, false)
}

/// Whose turn it is to join (docs/safety.md, "Boot ahead"), once the replica count or the
/// rollout wants a member added and rules 1 and 2 allow it: the oldest Machine waiting for its
/// turn that has an address is added as a learner, its turn recorded first. While every waiting
/// Machine still boots, that is what is awaited. `None` when no Machine waits: one is created.
pub fn next_turn(o: &Observation) -> Option<Decision<MembershipStep>> {
    let waiting: Vec<&MachineView> = o.waiting_machines().filter(|m| m.outdated.is_none()).collect();
    let first = waiting.first()?;
    let Some(booted) = waiting.iter().find(|m| m.address.is_some()) else {
        return Some(Decision::Hold(Hold::wait(
            rule::WAITING_FOR_MACHINE_ADDRESS,
            format!(
                "Machine {} has no address yet: its member is added as a learner once it has booted",
                first.name
            ),
        )));
    };
    Some(add_learner(o, booted, true).unwrap_or_else(|| {
        Decision::Hold(Hold::wait(
            rule::WAITING_FOR_HEALTHY_MEMBERS,
            format!(
                "Machine {} waits for its turn to join: every member must be a healthy voter first",
                booted.name
            ),
        ))
    }))
}

/// Machine `machine`'s learner added at its peer URL through a healthy voter, if every member is
/// a started, healthy voter of ours (rules 1, 2 and 4: so never two learners).
fn add_learner(
    o: &Observation,
    machine: &MachineView,
    record_turn: bool,
) -> Option<Decision<MembershipStep>> {
    let address = machine.address.as_deref()?;
    let members = o.members();
    let clear = !members.is_empty()
        && members
            .iter()
            .all(|m| m.is_started() && m.healthy && !m.is_learner && m.machine.is_some());
    if !clear {
        return None;
    }
    let via_url = healthy_client_urls(o).into_iter().next()?;
    Some(Decision::Do(MembershipStep::AddLearner {
        machine: machine.name.clone(),
        peer_url: names::peer_url(address),
        via_url,
        record_turn,
    }))
}

/// Rules 3, 4 and 6 for a Machine being deleted (by anyone) that still carries our hook: its
/// member is removed first, leadership moved away first, and only while quorum survives it.
pub fn deleted_machine(o: &Observation) -> Option<Decision<MembershipStep>> {
    let machine = o.machines.iter().find(|m| m.deleting && m.has_hook)?;
    let release = Decision::Do(MembershipStep::ReleaseHook {
        machine: machine.name.clone(),
    });
    let members = match &o.etcd {
        EtcdView::Members(members) => members,
        // Nothing ever had an address: nothing can have joined.
        EtcdView::NotChecked if o.machines.iter().all(|m| m.address.is_none()) => return Some(release),
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => {
            return Some(Decision::Hold(Hold::wait(
                rule::WAITING_FOR_HEALTHY_MEMBERS,
                format!(
                    "Machine {} is being deleted; waiting for a member to answer before removing its member",
                    machine.name
                ),
            )));
        }
    };
    let Some(member) = members
        .iter()
        .find(|m| m.machine.as_deref() == Some(machine.name.as_str()))
    else {
        return Some(release);
    };
    if let Some(other) = members.iter().find(|m| m.id != member.id && m.is_joining()) {
        return Some(Decision::Hold(Hold::wait(
            rule::WAITING_FOR_MEMBER_JOIN,
            format!(
                "{} is joining; Machine {}'s member is removed after it (one change at a time)",
                other.describe(),
                machine.name
            ),
        )));
    }
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(Decision::Hold(refusal));
    }
    let healthy_other = o
        .voters()
        .into_iter()
        .filter(|m| m.id != member.id && m.healthy)
        .find_map(|m| member_client_url(o, m).map(|url| (m.id, url)));
    let Some((other_id, other_url)) = healthy_other else {
        return Some(Decision::Hold(Hold::wait(
            rule::WAITING_FOR_HEALTHY_MEMBERS,
            format!(
                "no other healthy voting member to remove Machine {}'s member through",
                machine.name
            ),
        )));
    };
    if member.is_leader
        && member.healthy
        && let Some(leader_url) = member_client_url(o, member)
    {
        return Some(Decision::Do(MembershipStep::MoveLeader {
            leader_url,
            to: other_id,
            machine: machine.name.clone(),
        }));
    }
    Some(Decision::Do(MembershipStep::RemoveMember {
        member_id: member.id,
        via_url: other_url,
        member: what,
        why: format!("Machine {} is being deleted", machine.name),
    }))
}

// Effects.

/// The client of the member at `url`, with this round's client identity.
fn member_client(out: &Outputs<'_>, o: &Observation, url: &str) -> Result<Arc<MemberClient>, Error> {
    let timeout = o.etcd_cluster.spec.health_settings().timeout;
    out.etcd_clients.client(&o.cache_key(), url, timeout)
}

/// etcd refusing a membership change for a passing reason (its strict reconfiguration check
/// wants every peer connected for a while, leadership just moved...) is retried shortly.
fn passing(e: &EtcdError) -> bool {
    matches!(
        e.refusal(),
        Some(
            Refusal::UnhealthyCluster
                | Refusal::NotEnoughStartedMembers
                | Refusal::NoLeader
                | Refusal::NotLeader
                | Refusal::RequestTimedOut
                | Refusal::TooManyLearners
        )
    )
}

/// The outcome of operation `kind`, counted; a passing refusal is deferred.
fn outcome(
    out: &Outputs<'_>,
    o: &Observation,
    kind: &str,
    result: Result<(), EtcdError>,
) -> Result<Applied, Error> {
    let (counted, applied) = match result {
        Ok(()) => ("done", Ok(Applied::Done)),
        Err(e) if passing(&e) => ("refused", Ok(Applied::Deferred(e))),
        Err(e) => ("refused", Err(e.into())),
    };
    out.concern_metrics(&o.etcd_cluster, |m: &MembershipMetrics, ns, name| {
        m.membership_operation(ns, name, kind, counted)
    });
    applied
}

// Metrics.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub namespace: String,
    pub name: String,
    /// `add`, `remove`, `move-leader`, `promote`.
    pub kind: String,
    /// `done`, `refused`, `failed`.
    pub outcome: String,
}

/// Membership operations by kind and outcome.
#[derive(Clone, Debug, Default)]
pub struct MembershipMetrics {
    operations: Family<OperationLabels, Counter>,
}

impl ConcernMetrics for MembershipMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_membership_operations",
            "Membership operations by kind and outcome",
            self.operations.clone(),
        );
    }
}

impl MembershipMetrics {
    /// A membership operation and how it ended (`done`, `refused`, `failed`).
    pub fn membership_operation(&self, namespace: &str, name: &str, kind: &str, outcome: &str) {
        let labels = OperationLabels {
            namespace: namespace.into(),
            name: name.into(),
            kind: kind.into(),
            outcome: outcome.into(),
        };
        self.operations.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests;
