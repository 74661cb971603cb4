//! Performing the planned step, end to end: the status it leaves first, then one function per
//! step, grouped by what it acts on (the EtcdadmCluster itself, Secrets, member Machines, etcd
//! membership, the control plane), then the step is reported (the Event the plan names for it,
//! a log line, metrics) and the reconcile told what comes next. Every write is safe to repeat and to interrupt: a crash
//! between any two writes leaves objects the next observation recognises and resumes from.
//! Objects are created only if absent; changes are server-side applied, each site as a field
//! manager of its own, forced only for fields this controller alone decides; a merge patch is
//! kept only where an apply cannot remove what an earlier writer added.

mod control_plane;
mod etcd_cluster;
mod machines;
mod membership;
mod recovery;
mod restore;
mod secrets;

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::etcd::EtcdError;
use etcdadm_shared::manager::events::Recorder;

use self::etcd_cluster::write_status;
use super::health::EtcdClients;
use super::observe::Observation;
use super::plan::{EventNote, Observed, RecoveryAction, Step, reason};
use crate::error::Error;
use crate::metrics::EtcdClusterMetrics;

/// Field manager of this controller's creations and merge patches; each server-side apply site
/// has one of its own (`etcdadm-controller/<scope>`).
pub const FIELD_MANAGER: &str = "etcdadm-controller";
/// Requeue while waiting on another actor, at most (the health interval may be shorter).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// Requeue while a member joins: its start and its catching up show in etcd, not in any object
/// a watch would report (a learner's node writes nothing until it is promoted), so polling is
/// the only way to take the next step of a join promptly; it lasts only as long as the join.
/// Promotion in particular must follow quickly (SPEC-day2.md: etcdadm's health read gives up
/// about 2.7 s after a learner starts).
const JOIN_POLL: Duration = Duration::from_millis(500);
/// A state only a human can fix is still looked at now and then.
const REFUSED_REQUEUE: Duration = Duration::from_secs(60);
/// Retry of a membership change etcd refused for a passing reason (its strict reconfiguration
/// check wants a new member connected for 5 s before another change).
const MEMBERSHIP_RETRY: Duration = Duration::from_secs(1);

/// Where a step's effects go: the API server, Events, etcd, metrics.
pub struct Outputs<'a> {
    pub client: &'a Client,
    pub recorder: &'a Recorder,
    pub etcd_clients: &'a EtcdClients,
    /// Per-cluster metrics, when run by the manager (tests go without).
    pub metrics: Option<&'a EtcdClusterMetrics>,
}

impl Outputs<'_> {
    fn metrics(&self, etcd: &EtcdadmCluster, record: impl FnOnce(&EtcdClusterMetrics, &str, &str)) {
        if let Some(metrics) = self.metrics {
            record(metrics, &etcd.namespace().unwrap_or_default(), &etcd.name_any());
        }
    }

    async fn publish(&self, etcd: &EtcdadmCluster, note: EventNote) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.into(),
            note: Some(note.note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &etcd.object_ref(&())).await {
            warn!(error = %e, "publishing event failed");
        }
    }
}

/// What the reconcile does after a step.
pub enum Next {
    /// Something changed; observe again.
    Again,
    Done(Action),
}

/// How applying a step went.
enum Applied {
    /// It took effect: its Event is published.
    Done,
    /// What it creates existed already (an earlier attempt or a racer made it): no Event.
    AlreadyDone,
    /// etcd refused the membership change for a passing reason: retried shortly.
    Deferred(EtcdError),
    /// etcd is not ready for it yet (a learner catching up): asked again after [`JOIN_POLL`],
    /// without an Event.
    NotYet,
}

impl From<bool> for Applied {
    /// `created` as returned by a create-if-absent.
    fn from(created: bool) -> Self {
        if created {
            Applied::Done
        } else {
            Applied::AlreadyDone
        }
    }
}

/// Write the status `o` and `step` make, then perform `step` and report it. Status comes
/// first, so what the step's consequences rely on (e.g. `status.initialized` for a joining
/// Machine's bootstrap) is stored before they happen.
pub async fn apply(
    out: &Outputs<'_>,
    obs: &mut Observation,
    o: &Observed,
    step: Step,
) -> Result<Next, Error> {
    if let Some(updated) = write_status(out, obs, o, &step).await? {
        // The finalizer's removal is guarded by the resourceVersion this write produced.
        obs.etcd_cluster = updated;
    }
    let obs = &*obs;
    let etcd = &obs.etcd_cluster;
    let interval = etcd.spec.health_settings().interval;
    let applied = match &step {
        Step::Wait { reason, .. } => {
            let poll = match *reason {
                reason::WAITING_FOR_MEMBER_JOIN | reason::WAITING_FOR_LEARNER => JOIN_POLL,
                _ => WAIT_REQUEUE,
            };
            return Ok(Next::Done(Action::requeue(interval.min(poll))));
        }
        Step::Refuse { reason, message } => {
            debug!(reason, %message, "refusing to act");
            return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
        }
        Step::Paused | Step::Steady => return Ok(Next::Done(Action::requeue(interval))),
        Step::AddClusterOwnerRef => etcd_cluster::add_cluster_owner_ref(out, obs).await?,
        Step::AddFinalizer => etcd_cluster::add_finalizer(out, obs).await?,
        Step::RemoveFinalizer => etcd_cluster::remove_finalizer(out, obs).await?,
        Step::CreateCa => secrets::create_ca(out, obs).await?,
        Step::PublishInitSecret { address, client_urls } => {
            secrets::publish_init_secret(out, obs, address, client_urls).await?
        }
        Step::UpdateInitSecretUrls { client_urls } => {
            secrets::update_init_secret_urls(out, obs, client_urls).await?
        }
        Step::CreateKcpSecrets => secrets::create_kcp_secrets(out, obs).await?,
        Step::WriteRestoreSecret => restore::write_secret(out, obs).await?,
        Step::DeleteRestoreSecret => restore::delete_secret(out, obs).await?,
        Step::PauseKcp => control_plane::pause(out, obs).await?,
        Step::UnpauseKcp => control_plane::unpause(out, obs).await?,
        Step::WriteKcpEndpoints { endpoints } => control_plane::write_endpoints(out, obs, endpoints).await?,
        Step::RenewApiserverClientCertificate { .. } => secrets::renew_apiserver_client(out, obs).await?,
        Step::RequestControlPlaneRollout { after } => {
            control_plane::request_rollout(out, obs, *after).await?
        }
        Step::CreateMachine {
            name,
            failure_domain,
            purpose,
            ..
        } => machines::create(out, obs, name, failure_domain.as_deref(), *purpose).await?,
        Step::AdoptMachine { machine } => machines::adopt(out, obs, machine).await?,
        Step::DeleteMachine { machine, purpose, .. } => machines::delete(out, obs, machine, *purpose).await?,
        Step::DeleteLeftovers { names } => machines::delete_leftovers(out, obs, names).await?,
        Step::ReleaseHook { machine } => machines::release_hook(out, obs, machine).await?,
        Step::ReleaseAndDeleteMachines { names } => machines::release_and_delete(out, obs, names).await?,
        Step::Recover { record, action } => match action {
            RecoveryAction::SnapshotSurvivor { machine } => {
                recovery::snapshot_survivor(out, obs, &record.snapshot, machine).await?
            }
            RecoveryAction::DeleteMachines { names } => machines::release_and_delete(out, obs, names).await?,
            RecoveryAction::Reset => recovery::reset(out, obs).await?,
            RecoveryAction::Finish => recovery::finish(out, obs).await?,
            RecoveryAction::Abandon => Applied::Done,
        },
        Step::MoveLeader { leader_url, to, .. } => membership::move_leader(out, obs, leader_url, *to).await?,
        Step::RemoveMember {
            member_id, via_url, ..
        } => membership::remove_member(out, obs, via_url, *member_id).await?,
        Step::AddLearner {
            via_url, peer_url, ..
        } => membership::add_learner(out, obs, via_url, peer_url).await?,
        Step::PromoteLearner {
            member_id, via_url, ..
        } => membership::promote_learner(out, obs, via_url, *member_id).await?,
    };
    match applied {
        Applied::Done => report(out, etcd, o, &step).await,
        Applied::AlreadyDone => debug!(step = step.reason().0, "nothing to do: done already"),
        Applied::Deferred(e) => {
            info!(error = %e, "etcd refused a membership change for now; retrying");
            let note = format!("etcd refused the membership change for now, retrying: {e}");
            out.publish(etcd, EventNote::normal("MembershipChangeDeferred", note))
                .await;
            return Ok(Next::Done(Action::requeue(MEMBERSHIP_RETRY)));
        }
        Applied::NotYet => {
            debug!(
                step = step.reason().0,
                "etcd is not ready for it yet; asking again shortly"
            );
            return Ok(Next::Done(Action::requeue(JOIN_POLL)));
        }
    }
    Ok(match step {
        Step::CreateMachine { .. }
        | Step::ReleaseAndDeleteMachines { .. }
        | Step::Recover {
            action: RecoveryAction::SnapshotSurvivor { .. } | RecoveryAction::DeleteMachines { .. },
            ..
        } => Next::Done(Action::requeue(interval.min(WAIT_REQUEUE))),
        Step::MoveLeader { .. } | Step::RemoveMember { .. } => Next::Done(Action::requeue(MEMBERSHIP_RETRY)),
        // The reconcile's etcd view predates the change: the next step needs a new health round.
        Step::AddLearner { .. } | Step::PromoteLearner { .. } => Next::Done(Action::requeue(JOIN_POLL)),
        Step::RemoveFinalizer => Next::Done(Action::await_change()),
        _ => Next::Again,
    })
}

/// The Event the plan names for `step`, with a log line saying the same.
async fn report(out: &Outputs<'_>, etcd: &EtcdadmCluster, o: &Observed, step: &Step) {
    match step.event(o) {
        Some(note) => {
            info!(reason = note.reason, "{}", note.note);
            out.publish(etcd, note).await;
        }
        None => debug!(step = step.reason().0, "applied"),
    }
}

/// What `step` needs of the observation, which the plan saw there.
fn observed<'a, T>(value: &'a Option<T>, what: &str) -> Result<&'a T, Error> {
    value.as_ref().ok_or_else(|| {
        Error::Internal(format!(
            "the plan chose a step that needs the {what}, which the observation does not hold"
        ))
    })
}
