//! Per-EtcdadmCluster metrics: what an operator alerts on. Here the members' (desired, ready,
//! voting, learners, a leader, leader changes, DB size, size in use, fragmentation and quota,
//! health-check latency, time since each member was last healthy against the remediation
//! delay), the snapshots' age and schedule, and the restore drills'; each concern's own families (alarms,
//! certificates, defragmentations, membership operations, remediations) are in its module,
//! registered through the registry of concerns and kept here by type (`ConcernFamilies`).
//! `config/prometheus/` alerts on them and draws them.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::snapshot::{DrillResult, DrillStatus, EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterSpec, EtcdadmClusterStatus};
use etcdadm_shared::cron::Schedule;
use etcdadm_shared::manager::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub namespace: String,
    pub name: String,
    pub member: String,
}

/// Handles to every family; cheap to clone.
#[derive(Clone, Debug)]
pub struct EtcdClusterMetrics {
    desired: Family<ClusterLabels, Gauge>,
    ready: Family<ClusterLabels, Gauge>,
    voting: Family<ClusterLabels, Gauge>,
    learners: Family<ClusterLabels, Gauge>,
    leader_changes: Family<ClusterLabels, Counter>,
    has_leader: Family<ClusterLabels, Gauge>,
    db_size: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    db_size_in_use: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    fragmentation: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    quota: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    remediation_delay: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    since_healthy: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    health_latency: Family<ClusterLabels, Histogram, fn() -> Histogram>,
    /// Last leader seen per cluster, to count changes.
    leaders: Arc<Mutex<HashMap<ClusterLabels, String>>>,
    /// Each concern's families.
    concerns: Arc<ConcernFamilies>,
}

/// Each concern's metric families, by type: registered through the registry of concerns
/// (`controller::plan::concern_metrics`), found by the concern that records into them.
#[derive(Default)]
pub struct ConcernFamilies(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl ConcernFamilies {
    /// Keep `families` (one value per type).
    pub fn insert<M: Any + Send + Sync>(&mut self, families: M) {
        self.0.insert(TypeId::of::<M>(), Box::new(families));
    }

    /// The families of type `M`, when they were registered.
    pub fn get<M: Any>(&self) -> Option<&M> {
        self.0.get(&TypeId::of::<M>())?.downcast_ref()
    }
}

impl std::fmt::Debug for ConcernFamilies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConcernFamilies({} kinds)", self.0.len())
    }
}

impl ClusterLabels {
    pub fn new(namespace: &str, name: &str) -> Self {
        ClusterLabels {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl EtcdClusterMetrics {
    /// Register every family with the runtime's registry; `concerns` are each concern's,
    /// registered already.
    pub fn register(metrics: &Metrics, concerns: ConcernFamilies) -> Self {
        // One registration per family, each with its help text: a list, read top to bottom.
        let this = EtcdClusterMetrics {
            desired: Family::default(),
            ready: Family::default(),
            voting: Family::default(),
            learners: Family::default(),
            leader_changes: Family::default(),
            has_leader: Family::default(),
            db_size: Family::default(),
            db_size_in_use: Family::default(),
            fragmentation: Family::default(),
            quota: Family::default(),
            remediation_delay: Family::default(),
            since_healthy: Family::default(),
            health_latency: Family::new_with_constructor(latency_histogram),
            leaders: Arc::default(),
            concerns: Arc::new(concerns),
        };
        metrics.register(
            "etcdadm_cluster_desired_members",
            "Desired members (spec.replicas)",
            this.desired.clone(),
        );
        metrics.register(
            "etcdadm_cluster_ready_members",
            "Healthy voting members",
            this.ready.clone(),
        );
        metrics.register(
            "etcdadm_cluster_voting_members",
            "Voting members in etcd's member list",
            this.voting.clone(),
        );
        metrics.register(
            "etcdadm_cluster_learner_members",
            "Learner members in etcd's member list",
            this.learners.clone(),
        );
        metrics.register(
            "etcdadm_cluster_leader_changes",
            "Leader changes seen by the health checks",
            this.leader_changes.clone(),
        );
        metrics.register(
            "etcdadm_cluster_has_leader",
            "1 while the health check found a leader, 0 while no member follows one",
            this.has_leader.clone(),
        );
        metrics.register(
            "etcdadm_member_db_size_bytes",
            "Backend database size reported by each member",
            this.db_size.clone(),
        );
        metrics.register(
            "etcdadm_member_db_size_in_use_bytes",
            "Bytes of each member's database in use (the rest is free space a defragmentation returns)",
            this.db_size_in_use.clone(),
        );
        metrics.register(
            "etcdadm_member_fragmentation_ratio",
            "Share of each member's database that is free space: (size - in use) / size",
            this.fragmentation.clone(),
        );
        metrics.register(
            "etcdadm_cluster_remediation_delay_seconds",
            "How long a member may be unhealthy before it is replaced (spec.healthCheck.unhealthyAfter)",
            this.remediation_delay.clone(),
        );
        metrics.register(
            "etcdadm_member_quota_backend_bytes",
            "Backend quota each member runs with (etcd raises NOSPACE when the database reaches it)",
            this.quota.clone(),
        );
        metrics.register(
            "etcdadm_member_seconds_since_healthy",
            "Seconds since each member last passed a health check",
            this.since_healthy.clone(),
        );
        metrics.register(
            "etcdadm_health_check_duration_seconds",
            "Time to health-check every member of a cluster once",
            this.health_latency.clone(),
        );
        this
    }

    fn cluster(namespace: &str, name: &str) -> ClusterLabels {
        ClusterLabels::new(namespace, name)
    }

    /// The families of concern type `M`, when they were registered.
    pub fn concern<M: Any>(&self) -> Option<&M> {
        self.concerns.get()
    }

    /// Gauges derived from the spec and the status just written (members, leader, time since
    /// healthy and how long that may last).
    pub fn observe_status(
        &self,
        namespace: &str,
        name: &str,
        spec: &EtcdadmClusterSpec,
        status: &EtcdadmClusterStatus,
    ) {
        let labels = Self::cluster(namespace, name);
        let voting: Vec<_> = status.members.iter().filter(|m| !m.is_learner).collect();
        self.desired
            .get_or_create(&labels)
            .set(i64::from(spec.replicas()));
        self.remediation_delay
            .get_or_create(&labels)
            .set(spec.health_settings().unhealthy_after.as_secs_f64());
        let leader = status.members.iter().any(|m| m.is_leader && m.healthy);
        self.has_leader.get_or_create(&labels).set(i64::from(leader));
        self.voting.get_or_create(&labels).set(voting.len() as i64);
        self.learners
            .get_or_create(&labels)
            .set((status.members.len() - voting.len()) as i64);
        self.ready
            .get_or_create(&labels)
            .set(voting.iter().filter(|m| m.healthy).count() as i64);
        if let Some(leader) = status.members.iter().find(|m| m.is_leader) {
            let mut leaders = self.leaders.lock().unwrap_or_else(PoisonError::into_inner);
            let previous = leaders.insert(labels.clone(), leader.name.clone());
            // Served from the first leader on, at 0, so a rate over it has a series to work on.
            let changes = self.leader_changes.get_or_create(&labels);
            if previous.is_some_and(|p| p != leader.name) {
                changes.inc();
            }
        }
        for member in &status.members {
            let member_labels = MemberLabels {
                namespace: namespace.into(),
                name: name.into(),
                member: member.name.clone(),
            };
            let since = member
                .last_healthy_time
                .as_ref()
                .and_then(|t| SystemTime::from(t.0).elapsed().ok())
                .or_else(|| member.healthy.then_some(Duration::ZERO));
            let seconds = match (member.healthy, since) {
                (true, _) => 0.0,
                (false, Some(since)) => since.as_secs_f64(),
                (false, None) => f64::NAN,
            };
            self.since_healthy.get_or_create(&member_labels).set(seconds);
        }
    }

    /// A member's database size, the bytes of it in use (when it said) and the backend quota it
    /// runs with (size over quota is how full it is: at 1 etcd raises NOSPACE).
    pub fn observe_db_size(
        &self,
        namespace: &str,
        name: &str,
        member: &str,
        bytes: u64,
        in_use: Option<u64>,
        quota: u64,
    ) {
        let labels = MemberLabels {
            namespace: namespace.into(),
            name: name.into(),
            member: member.into(),
        };
        self.db_size.get_or_create(&labels).set(bytes as f64);
        self.quota.get_or_create(&labels).set(quota as f64);
        if let Some(in_use) = in_use {
            self.db_size_in_use.get_or_create(&labels).set(in_use as f64);
            let free = bytes.saturating_sub(in_use) as f64;
            let ratio = if bytes == 0 { 0.0 } else { free / bytes as f64 };
            self.fragmentation.get_or_create(&labels).set(ratio);
        }
    }

    /// How long one health pass over every member took.
    pub fn observe_health_check(&self, namespace: &str, name: &str, took: Duration) {
        self.health_latency
            .get_or_create(&Self::cluster(namespace, name))
            .observe(took.as_secs_f64());
    }
}

/// Per-cluster snapshot metrics, from the snapshot controller's reconciles: when the newest
/// snapshot succeeded, and how far apart the schedule's snapshots are (an alert compares the
/// two); likewise for restore drills, read from the snapshots' `status.lastDrill`, and whether
/// the newest drill failed.
#[derive(Clone, Debug)]
pub struct SnapshotMetrics {
    last_success: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    schedule_interval: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    drill_last_success: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    drill_failed: Family<ClusterLabels, Gauge>,
    drill_interval: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
}

impl SnapshotMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let this = SnapshotMetrics {
            last_success: Family::default(),
            schedule_interval: Family::default(),
            drill_last_success: Family::default(),
            drill_failed: Family::default(),
            drill_interval: Family::default(),
        };
        metrics.register(
            "etcdadm_snapshot_last_success_timestamp_seconds",
            "When the newest Succeeded EtcdadmSnapshot of each cluster completed (Unix seconds)",
            this.last_success.clone(),
        );
        metrics.register(
            "etcdadm_snapshot_schedule_interval_seconds",
            "Seconds between two snapshots of spec.backup.schedule (the next two runs)",
            this.schedule_interval.clone(),
        );
        metrics.register(
            "etcdadm_backup_drill_last_success_timestamp_seconds",
            "When the newest restore drill of each cluster that passed started (Unix seconds)",
            this.drill_last_success.clone(),
        );
        metrics.register(
            "etcdadm_backup_drill_failed",
            "1 when the newest restore drill of each cluster failed, else 0",
            this.drill_failed.clone(),
        );
        metrics.register(
            "etcdadm_backup_drill_interval_seconds",
            "Seconds between two restore drills of spec.backup.verify.schedule (the next two runs)",
            this.drill_interval.clone(),
        );
        this
    }

    /// What one reconcile of `cluster`'s snapshots saw at `now`.
    pub fn observe(&self, cluster: &EtcdadmCluster, snapshots: &[EtcdadmSnapshot], now: Timestamp) {
        let labels =
            EtcdClusterMetrics::cluster(&cluster.namespace().unwrap_or_default(), &cluster.name_any());
        let newest = snapshots
            .iter()
            .filter(|s| s.phase() == SnapshotPhase::Succeeded)
            .filter_map(|s| s.status.as_ref()?.completion_time.as_ref().map(|t| t.0))
            .max();
        if let Some(newest) = newest {
            self.last_success
                .get_or_create(&labels)
                .set(newest.as_millisecond() as f64 / 1000.0);
        }
        let backup = cluster.spec.backup.as_ref();
        let schedule = backup.and_then(|b| b.schedule.as_deref());
        set_period(&self.schedule_interval, &labels, schedule, now);
        let verify = backup
            .and_then(|b| b.verify.as_ref())
            .map(|v| v.schedule.as_str());
        set_period(&self.drill_interval, &labels, verify, now);
        if verify.is_some() {
            self.observe_drills(&labels, snapshots);
        } else {
            // Drills turned off: nothing to alert on.
            self.drill_last_success.remove(&labels);
            self.drill_failed.remove(&labels);
        }
    }

    /// The drills recorded on `snapshots`: the newest that passed, and whether the newest failed.
    fn observe_drills(&self, labels: &ClusterLabels, snapshots: &[EtcdadmSnapshot]) {
        let drills: Vec<&DrillStatus> = snapshots
            .iter()
            .filter_map(|s| s.status.as_ref()?.last_drill.as_ref())
            .collect();
        let passed = drills
            .iter()
            .filter(|d| d.result == DrillResult::Passed)
            .map(|d| d.time.0)
            .max();
        if let Some(passed) = passed {
            self.drill_last_success
                .get_or_create(labels)
                .set(passed.as_millisecond() as f64 / 1000.0);
        }
        if let Some(newest) = drills.iter().max_by_key(|d| d.time.0) {
            self.drill_failed
                .get_or_create(labels)
                .set(i64::from(newest.result == DrillResult::Failed));
        }
    }
}

/// `family`'s series for `labels`: the seconds between the next two runs of `schedule`, or none
/// when there is no schedule.
fn set_period(
    family: &Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    labels: &ClusterLabels,
    schedule: Option<&str>,
    now: Timestamp,
) {
    let period = schedule
        .and_then(|text| Schedule::parse(text).ok())
        .and_then(|schedule| {
            let next = schedule.next_after(now)?;
            let after = schedule.next_after(next)?;
            Some(after.duration_since(next).unsigned_abs())
        });
    match period {
        Some(period) => {
            family.get_or_create(labels).set(period.as_secs_f64());
        }
        None => {
            family.remove(labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::alarms::AlarmMetrics;
    use crate::controller::plan::certificates::CertificateMetrics;
    use crate::controller::plan::concern_metrics;
    use crate::controller::plan::machines::MachineMetrics;
    use crate::controller::plan::maintenance::MaintenanceMetrics;
    use crate::controller::plan::membership::MembershipMetrics;
    use etcdadm_shared::api::MemberStatus;
    use etcdadm_shared::api::cluster::CertificatesStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn member(name: &str, healthy: bool, leader: bool) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            healthy,
            is_leader: leader,
            ..Default::default()
        }
    }

    #[test]
    fn snapshot_age_and_schedule_are_exported() {
        let runtime = Metrics::new();
        let metrics = SnapshotMetrics::register(&runtime);
        let cluster: EtcdadmCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {"infrastructureTemplate": {}, "backup": {"schedule": "0 * * * *", "store": {"s3": {
                "endpoint": "https://s3.example", "bucket": "b", "credentialsSecretRef": {"name": "s"}}}}}}))
        .unwrap();
        let snapshot = |name: &str, phase: &str, completed: &str| -> EtcdadmSnapshot {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"clusterName": "c1"},
                "status": {"phase": phase, "completionTime": completed}}))
            .unwrap()
        };
        let snapshots = [
            snapshot("older", "Succeeded", "2023-11-14T21:13:20Z"),
            snapshot("newest", "Succeeded", "2023-11-14T22:13:20Z"),
            snapshot("failed", "Failed", "2023-11-14T23:13:20Z"),
        ];
        let now: Timestamp = "2023-11-15T00:00:00Z".parse().unwrap();
        metrics.observe(&cluster, &snapshots, now);
        let text = runtime.encode().unwrap();
        for line in [
            r#"etcdadm_snapshot_last_success_timestamp_seconds{namespace="default",name="c1"} 1700000000.0"#,
            r#"etcdadm_snapshot_schedule_interval_seconds{namespace="default",name="c1"} 3600.0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        let mut unscheduled = cluster.clone();
        unscheduled.spec.backup = None;
        metrics.observe(&unscheduled, &[], now);
        let text = runtime.encode().unwrap();
        assert!(
            !text.contains("etcdadm_snapshot_schedule_interval_seconds{"),
            "{text}"
        );
        assert!(text.contains("1700000000.0"), "the last success stays");
    }

    #[test]
    fn restore_drills_newest_success_failure_and_schedule_are_exported() {
        let runtime = Metrics::new();
        let metrics = SnapshotMetrics::register(&runtime);
        let cluster = |verify: serde_json::Value| -> EtcdadmCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": "c1", "namespace": "default"},
                "spec": {"infrastructureTemplate": {}, "backup": {"verify": verify, "store": {"s3": {
                    "endpoint": "https://s3.example", "bucket": "b", "credentialsSecretRef": {"name": "s"}}}}}}))
            .unwrap()
        };
        let drilled = |name: &str, time: &str, result: &str| -> EtcdadmSnapshot {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
                "metadata": {"name": name, "namespace": "default"}, "spec": {"clusterName": "c1"},
                "status": {"phase": "Succeeded", "lastDrill": {"time": time, "result": result, "message": ""}}}))
            .unwrap()
        };
        let daily = cluster(serde_json::json!({"schedule": "0 4 * * *"}));
        let now: Timestamp = "2023-11-15T00:00:00Z".parse().unwrap();
        let line = |name: &str, value: &str| format!(r#"{name}{{namespace="default",name="c1"}} {value}"#);
        let cases = [
            // A pass, then a newer failure: the pass stays the last success, the failure shows.
            (
                vec![
                    drilled("a", "2023-11-14T22:13:20Z", "Passed"),
                    drilled("b", "2023-11-14T23:13:20Z", "Failed"),
                ],
                "1700000000.0",
                "1",
            ),
            // A newer pass clears the failure.
            (
                vec![
                    drilled("b", "2023-11-14T23:13:20Z", "Failed"),
                    drilled("c", "2023-11-14T23:30:00Z", "Passed"),
                ],
                "1700004600.0",
                "0",
            ),
            // An inconclusive drill is no failure and no success.
            (
                vec![
                    drilled("c", "2023-11-14T23:30:00Z", "Passed"),
                    drilled("d", "2023-11-14T23:40:00Z", "Inconclusive"),
                ],
                "1700004600.0",
                "0",
            ),
        ];
        for (i, (snapshots, success, failed)) in cases.iter().enumerate() {
            metrics.observe(&daily, snapshots, now);
            let text = runtime.encode().unwrap();
            for want in [
                line("etcdadm_backup_drill_last_success_timestamp_seconds", success),
                line("etcdadm_backup_drill_failed", failed),
                line("etcdadm_backup_drill_interval_seconds", "86400.0"),
            ] {
                assert!(text.contains(&want), "case {i}: missing {want} in\n{text}");
            }
        }
        let mut unverified = daily.clone();
        if let Some(b) = unverified.spec.backup.as_mut() {
            b.verify = None;
        }
        metrics.observe(&unverified, &[], now);
        let text = runtime.encode().unwrap();
        for gone in [
            "etcdadm_backup_drill_interval_seconds{",
            "etcdadm_backup_drill_failed{",
            "etcdadm_backup_drill_last_success_timestamp_seconds{",
        ] {
            assert!(!text.contains(gone), "{gone} stays without verify:\n{text}");
        }
    }

    #[test]
    fn status_gauges_and_leader_changes_are_exported() {
        let runtime = Metrics::new();
        let metrics = EtcdClusterMetrics::register(&runtime, concern_metrics(&runtime));
        let certificates = metrics.concern::<CertificateMetrics>().unwrap();
        let in_days = |days: i64| {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            Time(k8s_openapi::jiff::Timestamp::from_second(now + days * 86_400 + 600).unwrap())
        };
        let mut status = EtcdadmClusterStatus {
            members: vec![
                member("a", true, true),
                member("b", true, false),
                member("c", false, false),
            ],
            certificates: Some(CertificatesStatus {
                ca_expiry: Some(in_days(3652)),
                apiserver_client_expiry: Some(in_days(1)),
                next_expiry: None,
            }),
            ..Default::default()
        };
        status.members[0].certificate_expiry = Some(in_days(30));
        // The soonest member's certificate counts: one expired a day ago.
        status.members[1].certificate_expiry = Some(in_days(-2));
        let spec = EtcdadmClusterSpec {
            replicas: Some(3),
            ..Default::default()
        };
        metrics.observe_status("default", "c1", &spec, &status);
        certificates.observe_status("default", "c1", &status);
        status.members[0].is_leader = false;
        status.members[1].is_leader = true;
        metrics.observe_status("default", "c1", &spec, &status);
        certificates.observe_status("default", "c1", &status);
        metrics.observe_db_size("default", "c1", "a", 20480, Some(5120), 2 << 30);
        let defragmentations = metrics.concern::<MaintenanceMetrics>().unwrap();
        defragmentations.defragmented("default", "c1", "policy", 15360, Duration::from_millis(80));
        let alarms = metrics.concern::<AlarmMetrics>().unwrap();
        alarms.observe_alarms("default", "c1", &["NOSPACE".into()]);
        metrics.observe_health_check("default", "c1", Duration::from_millis(12));
        let operations = metrics.concern::<MembershipMetrics>().unwrap();
        operations.membership_operation("default", "c1", "remove", "done");
        let remediations = metrics.concern::<MachineMetrics>().unwrap();
        remediations.remediation("default", "c1");
        let text = runtime.encode().unwrap();
        for line in [
            r#"etcdadm_cluster_desired_members{namespace="default",name="c1"} 3"#,
            r#"etcdadm_cluster_ready_members{namespace="default",name="c1"} 2"#,
            r#"etcdadm_cluster_voting_members{namespace="default",name="c1"} 3"#,
            r#"etcdadm_cluster_learner_members{namespace="default",name="c1"} 0"#,
            r#"etcdadm_cluster_leader_changes_total{namespace="default",name="c1"} 1"#,
            r#"etcdadm_cluster_has_leader{namespace="default",name="c1"} 1"#,
            r#"etcdadm_cluster_remediation_delay_seconds{namespace="default",name="c1"} 300.0"#,
            r#"etcdadm_member_db_size_bytes{namespace="default",name="c1",member="a"} 20480.0"#,
            r#"etcdadm_member_db_size_in_use_bytes{namespace="default",name="c1",member="a"} 5120.0"#,
            r#"etcdadm_member_fragmentation_ratio{namespace="default",name="c1",member="a"} 0.75"#,
            r#"etcdadm_defragmentations_total{namespace="default",name="c1",trigger="policy"} 1"#,
            r#"etcdadm_defragmentation_reclaimed_bytes_total{namespace="default",name="c1",trigger="policy"} 15360"#,
            r#"etcdadm_defragmentation_duration_seconds_count{namespace="default",name="c1"} 1"#,
            r#"etcdadm_member_quota_backend_bytes{namespace="default",name="c1",member="a"} 2147483648.0"#,
            r#"etcdadm_member_seconds_since_healthy{namespace="default",name="c1",member="a"} 0.0"#,
            r#"etcdadm_cluster_alarms{namespace="default",name="c1",alarm="NOSPACE"} 1"#,
            r#"etcdadm_cluster_alarms{namespace="default",name="c1",alarm="CORRUPT"} 0"#,
            r#"etcdadm_health_check_duration_seconds_count{namespace="default",name="c1"} 1"#,
            r#"etcdadm_membership_operations_total{namespace="default",name="c1",kind="remove",outcome="done"} 1"#,
            r#"etcdadm_remediations_total{namespace="default",name="c1"} 1"#,
            r#"etcdadm_certificate_expiry_seconds{namespace="default",name="c1",kind="ca"} 3155"#,
            r#"etcdadm_certificate_expiry_seconds{namespace="default",name="c1",kind="member"} -17"#,
            r#"etcdadm_certificate_expiry_seconds{namespace="default",name="c1",kind="apiserver-client"} 8"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
