//! The bootstrap provider's own metrics, next to the runtime's generic reconcile series: how
//! many data Secrets were rendered, in which format, and how that went.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use etcdadm_shared::api::Format;
use etcdadm_shared::manager::{Metrics, ReconcileTimer};

/// The controller label of this provider's reconcile series.
pub const CONTROLLER: &str = "etcdadmconfig";

/// How rendering a data Secret ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSecretOutcome {
    /// User data rendered and the Secret written.
    Created,
    /// The spec cannot be rendered (a `Ready=False` condition names the field).
    InvalidSpec,
    /// Rendered, but writing the Secret failed (retried).
    WriteFailed,
}

impl DataSecretOutcome {
    fn as_str(self) -> &'static str {
        match self {
            DataSecretOutcome::Created => "created",
            DataSecretOutcome::InvalidSpec => "invalid-spec",
            DataSecretOutcome::WriteFailed => "write-failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DataSecretLabels {
    format: &'static str,
    outcome: &'static str,
}

/// Handles to the runtime metrics and this provider's families.
#[derive(Clone, Debug)]
pub struct BootstrapMetrics {
    runtime: Metrics,
    data_secrets: Family<DataSecretLabels, Counter>,
}

impl BootstrapMetrics {
    /// Register `etcdadm_bootstrap_data_secrets_total{format, outcome}` with `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let data_secrets = Family::default();
        metrics.register(
            "etcdadm_bootstrap_data_secrets",
            "Bootstrap data Secrets rendered, by format and outcome",
            data_secrets.clone(),
        );
        BootstrapMetrics {
            runtime: metrics.clone(),
            data_secrets,
        }
    }

    /// Count one data Secret attempt.
    pub fn data_secret(&self, format: Format, outcome: DataSecretOutcome) {
        self.data_secrets
            .get_or_create(&DataSecretLabels {
                format: format.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Time one EtcdadmConfig reconcile.
    pub fn reconcile_started(&self) -> ReconcileTimer {
        self.runtime.reconcile_started(CONTROLLER)
    }
}

impl Default for BootstrapMetrics {
    /// Metrics in a registry of their own, which nothing serves (tests, tools).
    fn default() -> Self {
        Self::register(&Metrics::new())
    }
}
