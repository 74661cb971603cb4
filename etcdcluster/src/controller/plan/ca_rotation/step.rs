//! Why: the rotation as a concern of the plan (the contract of `decision.rs`): its place in the
//! plan (`plan`), its steps' words and effects dispatched to `words` and `writes`, and
//! `status.caRotation` with an Event per phase.

use etcdadm_shared::api::cluster::{CaRotationMember, CaRotationStatus};
use etcdadm_shared::error::Error;

use super::seen::{RotationSeen, rotation};
use super::{Phase, RotationStep, decide, progress, words, writes};
use crate::controller::decision::{After, Applied, ConcernStep, Decision, EventNote, Outputs, StatusPart};
use crate::controller::observation::{ClusterView, Observation};

/// The apply site of the control plane rollout a rotation asks for.
const ROLLOUT_MANAGER: &str = "etcdadm-controller/ca-rotation-rollout";

/// The rotation's next write, or what holds it: asked once no membership change is wanted
/// (a rotation never runs while quorum is lost or a change is in flight). Its rolls are the
/// rolling replacement's (the Machines are outdated in the observation), so none is answered
/// here.
pub fn plan(o: &Observation) -> Option<Decision<RotationStep>> {
    match decide(&rotation(o)?)? {
        Decision::Do(RotationStep::Roll { .. }) => None,
        other => Some(other),
    }
}

impl ConcernStep for RotationStep {
    type View = RotationSeen;
    type Metrics = super::metrics::RotationMetrics;

    /// `status.caRotation` while a rotation is under way, and the Event of each phase as it
    /// begins.
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        let now = rotation(part.o).map(|v| progress(&v));
        let was = part
            .old
            .ca_rotation
            .as_ref()
            .and_then(|r| Phase::parse(&r.phase))
            .unwrap_or(Phase::Idle);
        let Some(now) = now.filter(|p| p.phase != Phase::Idle) else {
            part.status.ca_rotation = None;
            return;
        };
        if let Some(event) = words::phase_event(was, now.phase) {
            part.event(event);
        }
        part.status.ca_rotation = Some(CaRotationStatus {
            phase: now.phase.as_str().to_string(),
            request: now.request,
            members: now
                .members
                .into_iter()
                .map(|(machine, signed_by)| CaRotationMember {
                    machine,
                    signed_by: signed_by.to_string(),
                })
                .collect(),
            remaining: now.remaining.iter().map(|p| p.as_str().to_string()).collect(),
        });
    }

    fn reason(&self) -> (&'static str, String) {
        words::step_reason(self)
    }

    fn event(&self, o: &Observation) -> Option<EventNote> {
        words::step_event(self, o.cluster.name().unwrap_or(o.name.as_str()))
    }

    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        let ClusterView::Found { reference, .. } = &o.cluster else {
            return Err(Error::Internal(
                "a CA rotation step was planned without a Cluster".into(),
            ));
        };
        let cluster = reference.name.as_str();
        let seen = o.view::<RotationSeen>();
        let current = o
            .ca
            .ca()
            .ok_or_else(|| Error::Internal("a CA rotation step was planned without a usable CA".into()))?;
        let next = || {
            seen.next_ca
                .clone()
                .ok_or_else(|| Error::Internal("a CA rotation step was planned without the next CA".into()))
        };
        match self {
            RotationStep::CreateNextCa { request } => {
                Ok(writes::create_next_ca(out.client, reference, request)
                    .await?
                    .into())
            }
            // The rolling replacement's, never dispatched here.
            RotationStep::Roll { .. } => Ok(Applied::AlreadyDone),
            RotationStep::HandControlPlane { reissue_client, .. } => {
                let next = next()?;
                let reissue_from = reissue_client.then_some(&*next);
                writes::hand_control_plane(
                    out.client,
                    &o.namespace,
                    cluster,
                    &[current, &next],
                    reissue_from,
                )
                .await?;
                Ok(Applied::Done)
            }
            RotationStep::RollControlPlane { kcp, after } => {
                super::super::control_plane::request_rollout(out, o, kcp, after, ROLLOUT_MANAGER).await
            }
            RotationStep::AdoptNextCa { request } => {
                let version = seen.current_version.as_deref().ok_or_else(|| {
                    Error::Internal("the CA Secret was read without a resourceVersion".into())
                })?;
                let next = next()?;
                writes::adopt_next_ca(out.client, &o.namespace, cluster, version, &next, request).await?;
                Ok(Applied::Done)
            }
            RotationStep::ForgetOldCa { trust_new_only } => {
                let trust_only = trust_new_only.then_some(&**current);
                writes::forget_old_ca(out.client, &o.namespace, cluster, trust_only).await?;
                Ok(Applied::Done)
            }
        }
    }

    /// The next step follows at once: what comes next shows in what was just written.
    fn after(&self, _: &Observation) -> After {
        After::Again
    }
}

impl Phase {
    /// The phase `status.caRotation.phase` names.
    pub fn parse(text: &str) -> Option<Phase> {
        Phase::ROTATING.into_iter().find(|p| p.as_str() == text)
    }
}
