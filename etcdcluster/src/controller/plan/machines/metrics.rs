//! The Machine concern's metric family: dead members removed for replacement.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use etcdadm_shared::manager::Metrics;

use crate::controller::decision::ConcernMetrics;
use crate::metrics::ClusterLabels;

/// Remediations: Machines deleted because their member was dead for too long.
#[derive(Clone, Debug, Default)]
pub struct MachineMetrics {
    remediations: Family<ClusterLabels, Counter>,
}

impl ConcernMetrics for MachineMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_remediations",
            "Dead members removed for replacement",
            self.remediations.clone(),
        );
    }
}

impl MachineMetrics {
    /// A dead member removed so that it can be replaced.
    pub fn remediation(&self, namespace: &str, name: &str) {
        self.remediations
            .get_or_create(&ClusterLabels::new(namespace, name))
            .inc();
    }
}
