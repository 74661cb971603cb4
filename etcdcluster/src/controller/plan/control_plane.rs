//! Control plane coordination (SPEC-etcdcluster.md "Control plane coordination (KCP)"): the
//! KubeadmControlPlane stays paused until this etcd is first ready, then gets the voting
//! endpoints and the two certificate Secrets and is un-paused. The removal and rollout rules ask
//! here whether a KCP uses this etcd.

use super::observed::{KcpView, Observed, is_ready, voting_endpoints};
use super::step::Step;

/// Until etcd is first ready, the KCP is kept paused (unless it carries the skip annotation or
/// declares local etcd, which is never touched).
pub(super) fn keep_paused(o: &Observed) -> Option<Step> {
    let kcp_unpaused = matches!(
        &o.kcp,
        KcpView::Found {
            local_etcd: false,
            paused: false,
            skip_pause: false,
            ..
        }
    );
    (kcp_unpaused && !is_ready(o) && !o.creation_complete).then_some(Step::PauseKcp)
}

/// Ready: hand the KCP its endpoints and certificates, then un-pause it.
pub(super) fn hand_over(o: &Observed) -> Option<Step> {
    let KcpView::Found {
        local_etcd: false,
        endpoints,
        paused,
        skip_pause,
        secrets_present,
        ..
    } = &o.kcp
    else {
        return None;
    };
    if !is_ready(o) {
        return None;
    }
    let desired = voting_endpoints(o);
    let mut current = endpoints.clone();
    current.sort();
    if current != desired {
        return Some(Step::WriteKcpEndpoints { endpoints: desired });
    }
    if !secrets_present {
        return Some(Step::CreateKcpSecrets);
    }
    (*paused && !skip_pause).then_some(Step::UnpauseKcp)
}

impl Observed {
    /// The KCP uses this etcd (external etcd, given our endpoints once creation completed):
    /// its name, its endpoints, and whether its own rollout is finished.
    pub(super) fn kcp_in_use(&self) -> Option<(&str, &[String], bool)> {
        match &self.kcp {
            KcpView::Found {
                name,
                local_etcd: false,
                endpoints,
                rollout_complete,
                ..
            } if self.creation_complete => Some((name.as_str(), endpoints.as_slice(), *rollout_complete)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
    #[test]
    fn kcp_is_paused_until_ready_then_gets_endpoints_secrets_and_unpause_in_order() {
        let mut o = base();
        o.kcp = kcp(&["https://placeholder:2379"], false, false);
        assert_eq!(plan(&o), Step::PauseKcp);
        // Skip annotation or local etcd: never paused.
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: false,
            endpoints: vec![],
            paused: false,
            skip_pause: true,
            secrets_present: false,
            rollout_complete: false,
            rollout_after: None,
        };
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: true,
            endpoints: vec![],
            paused: false,
            skip_pause: false,
            secrets_present: false,
            rollout_complete: false,
            rollout_after: None,
        };
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));

        let mut o = running(3);
        o.kcp = kcp(&["https://placeholder:2379"], true, false);
        let expected: Vec<String> = (1..=3).map(|i| format!("https://10.0.0.{i}:2379")).collect();
        assert_eq!(
            plan(&o),
            Step::WriteKcpEndpoints {
                endpoints: expected.clone()
            }
        );
        let refs: Vec<&str> = expected.iter().map(String::as_str).collect();
        o.kcp = kcp(&refs, true, false);
        assert_eq!(plan(&o), Step::CreateKcpSecrets);
        o.kcp = kcp(&refs, true, true);
        assert_eq!(plan(&o), Step::UnpauseKcp);
        o.kcp = kcp(&refs, false, true);
        assert_eq!(plan(&o), Step::Steady);
        // Not ready (one member missing): KCP is not touched, and after creation not re-paused.
        let mut o = running(2);
        o.kcp = kcp(&[], false, false);
        o.creation_complete = true;
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
    }

    #[test]
    fn the_control_plane_keeps_a_working_endpoint_and_its_rollout_finishes_first() {
        // KCP lists only m0; removing m0 (Machine deleted by hand) waits for another endpoint.
        let mut o = zoned(3, false);
        o.kcp = kcp(&["https://10.0.0.1:2379"], false, true);
        o.machines[0].deleting = true;
        o.etcd = EtcdView::Members(
            members_mut(&mut o)
                .iter()
                .map(|m| MemberView {
                    is_leader: m.id == 2,
                    ..m.clone()
                })
                .collect(),
        );
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CONTROL_PLANE_NEEDS_MEMBER, "{step:?}");
        assert!(step.is_refusal());
        // A scale down waits while the KCP is rolling.
        let mut o = zoned(3, true);
        o.replicas = 1;
        if let KcpView::Found { rollout_complete, .. } = &mut o.kcp {
            *rollout_complete = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT);
    }
}
