//! What a CA rotation says (docs/security.md, "Rotating the etcd CA"): the `Ready` reason while
//! each step is next, the Event each step leaves, and the Event of each phase as it begins, so an
//! operator follows the rotation in `kubectl describe` phase by phase.

use etcdadm_shared::names;

use super::{Phase, RotationStep, reason};
use crate::controller::decision::EventNote;

/// The condition reason and message for `Ready` while `step` is next.
pub fn step_reason(step: &RotationStep) -> (&'static str, String) {
    let message = match step {
        RotationStep::CreateNextCa { request } => {
            format!("CA rotation {request:?}: generating the next etcd CA")
        }
        RotationStep::Roll { phase, outdated, .. } => format!(
            "CA rotation, phase {phase}: {} to replace ({})",
            count(outdated.len(), "member"),
            outdated.join(", ")
        ),
        RotationStep::HandControlPlane { reissue_client, .. } => format!(
            "CA rotation, phase ControlPlane: giving the control plane both etcd CAs to trust{}",
            if *reissue_client {
                " and a client certificate from the next CA"
            } else {
                ""
            }
        ),
        RotationStep::RollControlPlane { kcp, .. } => {
            format!("CA rotation, phase ControlPlane: asking KubeadmControlPlane {kcp} for a rollout")
        }
        RotationStep::AdoptNextCa { request } => {
            format!("CA rotation {request:?}: the next etcd CA becomes the current one")
        }
        RotationStep::ForgetOldCa { .. } => "CA rotation: forgetting the old etcd CA".to_string(),
    };
    (reason::ROTATING_CA, message)
}

/// The Event `step` leaves once applied, in a cluster named `cluster`; rolls leave the rolling
/// replacement's own.
pub fn step_event(step: &RotationStep, cluster: &str) -> Option<EventNote> {
    let (reason, note) = match step {
        RotationStep::CreateNextCa { request } => (
            "CARotationStarted",
            format!(
                "CA rotation {request:?}: generated the next etcd CA into Secret {}, beside {}, which is kept",
                names::next_ca_secret_name(cluster),
                names::ca_secret_name(cluster)
            ),
        ),
        RotationStep::Roll { .. } => return None,
        RotationStep::HandControlPlane { reissue_client, .. } => (
            "CARotationControlPlaneHanded",
            format!(
                "Secret {} now trusts both etcd CAs{}",
                names::kcp_etcd_ca_secret_name(cluster),
                if *reissue_client {
                    format!(
                        "; re-issued {} from the next CA",
                        names::apiserver_client_secret_name(cluster)
                    )
                } else {
                    String::new()
                }
            ),
        ),
        RotationStep::RollControlPlane { kcp, after } => (
            "ControlPlaneRolloutRequested",
            format!(
                "asked KubeadmControlPlane {kcp} to replace its Machines created before {after}, so they trust both etcd CAs and carry a client certificate from the next one"
            ),
        ),
        RotationStep::AdoptNextCa { request } => (
            "CARotated",
            format!(
                "CA rotation {request:?} done: Secret {} holds the new etcd CA; the old one is gone from every member",
                names::ca_secret_name(cluster)
            ),
        ),
        RotationStep::ForgetOldCa { trust_new_only } => (
            "CARotationCleanedUp",
            format!(
                "deleted Secret {}{}",
                names::next_ca_secret_name(cluster),
                if *trust_new_only {
                    format!(
                        "; Secret {} trusts the new etcd CA alone (new control plane Machines)",
                        names::kcp_etcd_ca_secret_name(cluster)
                    )
                } else {
                    String::new()
                }
            ),
        ),
    };
    Some(EventNote::normal(reason, note))
}

/// The Event of a phase beginning (`was` is the phase the last status recorded), None when the
/// phase did not change or the rotation is over (its last step says so). Each phase has a reason
/// of its own (`CARotation<Phase>`): Events of one reason within minutes fold into one series,
/// which would keep the first phase's note alone.
pub fn phase_event(was: Phase, now: Phase) -> Option<EventNote> {
    if was == now || now == Phase::Idle {
        return None;
    }
    let (reason, what) = match now {
        Phase::Idle => return None,
        Phase::Generating => (
            "CARotationGenerating",
            "a rotation was requested: the next etcd CA is generated",
        ),
        Phase::Trusting => (
            "CARotationTrusting",
            "members are replaced by ones trusting both etcd CAs, signed by the current one",
        ),
        Phase::ControlPlane => (
            "CARotationControlPlane",
            "every member trusts both etcd CAs: the control plane is given both and a client certificate from the next one, then rolled once",
        ),
        Phase::Signing => (
            "CARotationSigning",
            "members are replaced by ones signed by the next etcd CA, trusting both",
        ),
        Phase::Dropping => (
            "CARotationDropping",
            "members are replaced by ones trusting the next etcd CA alone",
        ),
        Phase::Finishing => (
            "CARotationFinishing",
            "no member trusts the old etcd CA: the next one becomes the current one",
        ),
    };
    Some(EventNote::normal(
        reason,
        format!("CA rotation phase {now}: {what}"),
    ))
}

/// Why a Machine is outdated while the roll of `phase` is under way: its `ca.crt` is not the
/// roll's target.
pub fn outdated_reason(phase: Phase) -> String {
    let target = match phase {
        Phase::Trusting => "trust both etcd CAs, signed by the current one",
        Phase::Signing => "be signed by the next etcd CA, trusting both",
        _ => "trust the next etcd CA alone",
    };
    format!("CA rotation, phase {phase}: its ca.crt is to {target}")
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::plan::ca_rotation::Bundle;

    #[test]
    fn every_phase_has_its_event_once() {
        let mut was = Phase::Idle;
        for now in Phase::ROTATING {
            let event = phase_event(was, now).unwrap();
            assert_eq!(
                (event.warning, event.reason),
                (false, format!("CARotation{now}").as_str())
            );
            assert!(
                event.note.starts_with(&format!("CA rotation phase {now}: ")),
                "{}",
                event.note
            );
            assert_eq!(phase_event(now, now), None, "{now} again");
            was = now;
        }
        assert_eq!(phase_event(Phase::Finishing, Phase::Idle), None);
    }

    #[test]
    fn each_step_says_what_it_does_and_names_its_objects() {
        let roll = RotationStep::Roll {
            phase: Phase::Signing,
            target: Bundle(vec!["n".into(), "o".into()]),
            outdated: vec!["m1".into(), "m2".into()],
        };
        assert_eq!(
            step_reason(&roll),
            (
                reason::ROTATING_CA,
                "CA rotation, phase Signing: 2 members to replace (m1, m2)".to_string()
            )
        );
        assert_eq!(step_event(&roll, "c1"), None);
        let created = step_event(&RotationStep::CreateNextCa { request: "r1".into() }, "c1").unwrap();
        assert_eq!(created.reason, "CARotationStarted");
        assert!(
            created.note.contains("c1-managed-etcd-next") && created.note.contains("c1-managed-etcd,"),
            "{}",
            created.note
        );
        let handed = step_event(
            &RotationStep::HandControlPlane {
                trusted: vec![],
                reissue_client: true,
            },
            "c1",
        )
        .unwrap();
        assert!(
            handed.note.contains("c1-etcd") && handed.note.contains("c1-apiserver-etcd-client"),
            "{}",
            handed.note
        );
        let done = step_event(&RotationStep::AdoptNextCa { request: "r1".into() }, "c1").unwrap();
        assert_eq!(done.reason, "CARotated");
        let cleaned = step_event(
            &RotationStep::ForgetOldCa {
                trust_new_only: false,
            },
            "c1",
        )
        .unwrap();
        assert_eq!(cleaned.note, "deleted Secret c1-managed-etcd-next");
        for step in [
            RotationStep::CreateNextCa { request: "r1".into() },
            RotationStep::RollControlPlane {
                kcp: "cp".into(),
                after: "2026-03-01T12:00:00Z".parse().unwrap(),
            },
            RotationStep::ForgetOldCa { trust_new_only: true },
        ] {
            let (reason, message) = step_reason(&step);
            assert_eq!(reason, reason::ROTATING_CA);
            assert!(message.starts_with("CA rotation"), "{message}");
        }
    }
}
