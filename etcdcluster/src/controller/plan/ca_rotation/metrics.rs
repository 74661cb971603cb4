//! Why: a rotation lasts minutes to hours (three rolling replacements and a control plane
//! rollout); the phase each cluster is in, as a gauge, lets an alert catch one that stalls.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::manager::Metrics;

use super::Phase;
use crate::controller::decision::ConcernMetrics;
use crate::controller::observation::Observation;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RotationLabels {
    pub namespace: String,
    pub name: String,
}

/// The phase of each cluster's CA rotation.
#[derive(Default)]
pub struct RotationMetrics {
    phase: Family<RotationLabels, Gauge>,
}

impl ConcernMetrics for RotationMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_cluster_ca_rotation_phase",
            "The etcd CA rotation's phase: 0 none, 1 Generating, 2 Trusting, 3 ControlPlane, 4 Signing, 5 Dropping, 6 Finishing",
            self.phase.clone(),
        );
    }

    /// As the status written records it.
    fn observe(&self, namespace: &str, name: &str, _: &Observation, status: &EtcdadmClusterStatus) {
        self.observe_phase(namespace, name, status);
    }
}

impl RotationMetrics {
    /// The phase `status.caRotation` records (0 without one).
    pub fn observe_phase(&self, namespace: &str, name: &str, status: &EtcdadmClusterStatus) {
        let phase = status
            .ca_rotation
            .as_ref()
            .and_then(|r| Phase::parse(&r.phase))
            .and_then(|p| Phase::ROTATING.iter().position(|q| *q == p))
            .map_or(0, |at| at + 1);
        let labels = RotationLabels {
            namespace: namespace.into(),
            name: name.into(),
        };
        self.phase
            .get_or_create(&labels)
            .set(i64::try_from(phase).unwrap_or(0));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use etcdadm_shared::api::cluster::CaRotationStatus;

    #[test]
    fn the_gauge_follows_the_recorded_phase_and_reads_zero_without_a_rotation() {
        let registry = Metrics::new();
        let metrics = RotationMetrics::default();
        metrics.register(&registry);
        let mut status = EtcdadmClusterStatus {
            ca_rotation: Some(CaRotationStatus {
                phase: "Signing".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        metrics.observe_phase("default", "c1", &status);
        let line = r#"etcdadm_cluster_ca_rotation_phase{namespace="default",name="c1"}"#;
        assert!(registry.encode().unwrap().contains(&format!("{line} 4")));
        status.ca_rotation = None;
        metrics.observe_phase("default", "c1", &status);
        assert!(registry.encode().unwrap().contains(&format!("{line} 0")));
    }
}
