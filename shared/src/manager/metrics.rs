//! Prometheus metrics: one registry per process, generic reconcile and admission series every
//! controller gets, and a hook for controller-specific families; served at `/metrics`.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// The content type of the OpenMetrics text exposition Prometheus scrapes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    path: String,
    outcome: &'static str,
}

type DurationFamily = Family<ControllerLabel, Histogram, fn() -> Histogram>;

/// The process's metrics. Cheap to clone; clones share the registry.
///
/// Series every binary exposes:
/// - `etcdadm_reconcile_total{controller, result="success|error|cancelled"}`
/// - `etcdadm_reconcile_errors_total{controller, category}` (the crate error's `category()`)
/// - `etcdadm_reconcile_duration_seconds{controller}` (histogram)
/// - `etcdadm_leader_election_is_leader` (1 while this replica holds the lease)
/// - `etcdadm_admission_requests_total{path, outcome="allowed|denied|invalid"}`
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<RwLock<Registry>>,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: DurationFamily,
    is_leader: Gauge,
    admissions: Family<AdmissionLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~41 s: a reconcile is a handful of API calls, occasionally a key generation.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Metrics {
            registry: Arc::new(RwLock::new(Registry::default())),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(duration_histogram),
            is_leader: Gauge::default(),
            admissions: Family::default(),
        };
        metrics.register(
            "etcdadm_reconcile",
            "Reconciles finished, by controller and result",
            metrics.reconciles.clone(),
        );
        metrics.register(
            "etcdadm_reconcile_errors",
            "Reconciles that failed, by controller and error category",
            metrics.reconcile_errors.clone(),
        );
        metrics.register(
            "etcdadm_reconcile_duration_seconds",
            "Time one reconcile took, by controller",
            metrics.reconcile_duration.clone(),
        );
        metrics.register(
            "etcdadm_leader_election_is_leader",
            "1 while this replica holds the leader election lease",
            metrics.is_leader.clone(),
        );
        metrics.register(
            "etcdadm_admission_requests",
            "Admission requests answered, by webhook path and outcome",
            metrics.admissions.clone(),
        );
        metrics
    }

    /// Add a controller's own family. Counters get the `_total` suffix in the exposition, so
    /// name them without it. Register before serving; names must be unique.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        let mut registry = self.registry.write().unwrap_or_else(|e| e.into_inner());
        registry.register(name, help, metric);
    }

    /// Start timing one reconcile of `controller`; finish the returned timer with the result.
    pub fn reconcile_started(&self, controller: &str) -> ReconcileTimer {
        ReconcileTimer {
            metrics: self.clone(),
            controller: controller.to_string(),
            started: Instant::now(),
            finished: false,
        }
    }

    pub(crate) fn set_leader(&self, leading: bool) {
        self.is_leader.set(i64::from(leading));
    }

    pub(crate) fn admission_answered(&self, path: &str, outcome: &'static str) {
        self.admissions
            .get_or_create(&AdmissionLabels {
                path: path.to_string(),
                outcome,
            })
            .inc();
    }

    fn record(&self, controller: &str, started: Instant, result: &'static str, category: Option<&str>) {
        let controller = controller.to_string();
        self.reconcile_duration
            .get_or_create(&ControllerLabel {
                controller: controller.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Some(category) = category {
            self.reconcile_errors
                .get_or_create(&ErrorLabels {
                    controller: controller.clone(),
                    category: category.to_string(),
                })
                .inc();
        }
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
    }

    /// The OpenMetrics text exposition of every registered family.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let registry = self.registry.read().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }

    /// `GET /metrics`.
    pub fn router(&self) -> Router {
        let metrics = self.clone();
        Router::new().route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics.encode() {
                        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
                        Err(_) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                            "encoding metrics failed\n".to_string(),
                        ),
                    }
                }
            }),
        )
    }
}

/// Times one reconcile. Finish it with [`ReconcileTimer::succeeded`], [`ReconcileTimer::failed`]
/// or [`ReconcileTimer::finish`]; dropped unfinished (the reconcile future was cancelled, e.g. at
/// shutdown) it counts as `cancelled`.
#[derive(Debug)]
#[must_use = "finish the timer with the reconcile's result"]
pub struct ReconcileTimer {
    metrics: Metrics,
    controller: String,
    started: Instant,
    finished: bool,
}

impl ReconcileTimer {
    pub fn succeeded(mut self) {
        self.finished = true;
        self.metrics
            .record(&self.controller, self.started, "success", None);
    }

    /// Count a failure under the error's category (e.g. `Error::category()`).
    pub fn failed(mut self, category: &str) {
        self.finished = true;
        self.metrics
            .record(&self.controller, self.started, "error", Some(category));
    }

    /// Record `result`, categorising an error with `category` (e.g. `Error::category`).
    pub fn finish<T, E, C: AsRef<str>>(self, result: &Result<T, E>, category: impl FnOnce(&E) -> C) {
        match result {
            Ok(_) => self.succeeded(),
            Err(e) => self.failed(category(e).as_ref()),
        }
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        if !self.finished {
            self.metrics
                .record(&self.controller, self.started, "cancelled", None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_are_counted_timed_and_categorised() {
        let metrics = Metrics::new();
        metrics.reconcile_started("widgets").succeeded();
        metrics.reconcile_started("widgets").failed("kube");
        let result: Result<(), &str> = Err("boom");
        metrics.reconcile_started("widgets").finish(&result, |_| "pki");
        drop(metrics.reconcile_started("widgets"));
        let text = metrics.encode().unwrap();
        for line in [
            r#"etcdadm_reconcile_total{controller="widgets",result="success"} 1"#,
            r#"etcdadm_reconcile_total{controller="widgets",result="error"} 2"#,
            r#"etcdadm_reconcile_total{controller="widgets",result="cancelled"} 1"#,
            r#"etcdadm_reconcile_errors_total{controller="widgets",category="kube"} 1"#,
            r#"etcdadm_reconcile_errors_total{controller="widgets",category="pki"} 1"#,
            r#"etcdadm_reconcile_duration_seconds_count{controller="widgets"} 4"#,
            "etcdadm_leader_election_is_leader 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn controllers_add_their_own_families() {
        let metrics = Metrics::new();
        let things: Counter = Counter::default();
        metrics.register("etcdadm_things", "Things", things.clone());
        things.inc_by(3);
        assert!(metrics.encode().unwrap().contains("etcdadm_things_total 3"));
    }
}
