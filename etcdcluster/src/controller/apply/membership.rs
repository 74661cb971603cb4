//! etcd membership changes, asked of a member with the controller's client certificate:
//! leadership moved away from a member about to go (rule 6), a member removed (rules 3, 4), a
//! learner added and promoted (learner joins).
//! A refusal etcd gives for a passing reason is waited out; any other is an error.

use std::sync::Arc;

use etcdadm_shared::etcd::{EtcdError, MemberClient, Refusal};

use super::{Applied, Outputs, observed};
use crate::controller::observe::Observation;
use crate::error::Error;

/// The client of the member at `url`.
fn member_client(out: &Outputs<'_>, obs: &Observation, url: &str) -> Result<Arc<MemberClient>, Error> {
    let ca = observed(&obs.ca, "etcd CA")?;
    let timeout = obs.etcd_cluster.spec.health_settings().timeout;
    let mut clients = out
        .etcd_clients
        .clients(&obs.cache_key(), ca, &[url.to_string()], timeout)?;
    match clients.pop() {
        Some((_, client)) => Ok(client?),
        None => Err(Error::Internal(format!(
            "asked for a client of {url}, the etcd client cache made none"
        ))),
    }
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
    obs: &Observation,
    kind: &str,
    result: Result<(), EtcdError>,
) -> Result<Applied, Error> {
    let (counted, applied) = match result {
        Ok(()) => ("done", Ok(Applied::Done)),
        Err(e) if passing(&e) => ("refused", Ok(Applied::Deferred(e))),
        Err(e) => ("refused", Err(e.into())),
    };
    out.metrics(&obs.etcd_cluster, |m, ns, name| {
        m.membership_operation(ns, name, kind, counted)
    });
    applied
}

/// Rule 6: hand leadership from the member about to be removed (asked through its own client
/// URL, as etcd wants) to the healthy voter `to`.
pub(super) async fn move_leader(
    out: &Outputs<'_>,
    obs: &Observation,
    leader_url: &str,
    to: u64,
) -> Result<Applied, Error> {
    let member = member_client(out, obs, leader_url)?;
    outcome(out, obs, "move-leader", member.move_leader(to).await)
}

/// Remove member `id`, asking the member at `via_url`; one already gone is fine.
pub(super) async fn remove_member(
    out: &Outputs<'_>,
    obs: &Observation,
    via_url: &str,
    id: u64,
) -> Result<Applied, Error> {
    let member = member_client(out, obs, via_url)?;
    let result = match member.member_remove(id).await {
        Err(e) if e.refusal() == Some(Refusal::MemberNotFound) => Ok(()),
        other => other,
    };
    outcome(out, obs, "remove", result)
}

/// Pre-add the learner at `peer_url`, asking the member at `via_url`; a member already there
/// with that peer URL (an earlier attempt) is the one wanted.
pub(super) async fn add_learner(
    out: &Outputs<'_>,
    obs: &Observation,
    via_url: &str,
    peer_url: &str,
) -> Result<Applied, Error> {
    let member = member_client(out, obs, via_url)?;
    match member.member_add(&[peer_url.to_string()], true).await {
        Err(e) if e.refusal() == Some(Refusal::PeerUrlExists) => Ok(Applied::AlreadyDone),
        other => outcome(out, obs, "add-learner", other.map(drop)),
    }
}

/// Promote learner `id`, asking the member at `via_url`. Not caught up yet: asked again shortly;
/// a voter already (an earlier attempt): done.
pub(super) async fn promote_learner(
    out: &Outputs<'_>,
    obs: &Observation,
    via_url: &str,
    id: u64,
) -> Result<Applied, Error> {
    let member = member_client(out, obs, via_url)?;
    match member.member_promote(id).await {
        Err(e) if e.refusal() == Some(Refusal::LearnerNotReady) => Ok(Applied::NotYet),
        Err(e) if e.refusal() == Some(Refusal::MemberNotLearner) => Ok(Applied::AlreadyDone),
        other => outcome(out, obs, "promote", other),
    }
}
