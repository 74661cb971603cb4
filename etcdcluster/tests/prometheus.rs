#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What `config/prometheus/` ships is checked against Prometheus itself and against what the
//! controller exports: the PrometheusRule's groups pass `promtool check rules` and the unit tests
//! of `rules-test.yaml` (`promtool test rules`), and every metric an alert or a dashboard panel
//! names is one the etcdadm-controller serves on /metrics.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use std::time::Duration;

use serde_json::{Value, json};

use etcdadm_etcdcluster::controller::plan::alarms::AlarmMetrics;
use etcdadm_etcdcluster::controller::plan::certificates::CertificateMetrics;
use etcdadm_etcdcluster::controller::plan::concern_metrics;
use etcdadm_etcdcluster::controller::plan::machines::MachineMetrics;
use etcdadm_etcdcluster::controller::plan::maintenance::MaintenanceMetrics;
use etcdadm_etcdcluster::controller::plan::membership::MembershipMetrics;
use etcdadm_etcdcluster::metrics::{EtcdClusterMetrics, SnapshotMetrics};
use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::manager::Metrics;
use etcdadm_shared::testing::{TempDir, run_promtool};

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/prometheus")
}

/// Every sample name the controller's registry serves: gauges as named, counters with `_total`,
/// histograms with `_bucket`, `_sum` and `_count`.
fn exported() -> BTreeSet<String> {
    let runtime = Metrics::new();
    let cluster = EtcdClusterMetrics::register(&runtime, concern_metrics(&runtime));
    let snapshots = SnapshotMetrics::register(&runtime);
    // A family shows in the exposition once it has a series: one of each, through the calls the
    // controller makes.
    let etcd: EtcdadmCluster = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {"replicas": 3, "infrastructureTemplate": {}, "backup": {"schedule": "@hourly", "verify": {"schedule": "@daily"}, "store": {"s3": {
            "endpoint": "https://s3.example", "bucket": "b", "credentialsSecretRef": {"name": "s"}}}}},
        "status": {"members": [{"name": "m0", "healthy": true, "isLeader": true,
            "certificateExpiry": "2030-01-01T00:00:00Z"}],
            "certificates": {"caExpiry": "2035-01-01T00:00:00Z", "apiserverClientExpiry": "2030-01-01T00:00:00Z"}}
    }))
    .unwrap();
    let snapshot: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": "s1", "namespace": "ns"}, "spec": {"clusterName": "c1"},
        "status": {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z",
            "lastDrill": {"time": "2026-01-01T00:30:00Z", "result": "Passed", "message": ""}}
    }))
    .unwrap();
    let status = etcd.status.as_ref().unwrap();
    cluster.observe_status("ns", "c1", &etcd.spec, status);
    let certificates = cluster
        .concern::<CertificateMetrics>()
        .expect("certificates registered");
    certificates.observe_status("ns", "c1", status);
    cluster.observe_db_size("ns", "c1", "m0", 1 << 20, Some(1 << 19), 2 << 30);
    let alarms = cluster.concern::<AlarmMetrics>().expect("alarms registered");
    alarms.observe_alarms("ns", "c1", &[]);
    cluster.observe_health_check("ns", "c1", Duration::from_millis(5));
    let membership = cluster
        .concern::<MembershipMetrics>()
        .expect("membership registered");
    membership.membership_operation("ns", "c1", "add", "done");
    let machines = cluster.concern::<MachineMetrics>().expect("machines registered");
    machines.remediation("ns", "c1");
    let maintenance = cluster
        .concern::<MaintenanceMetrics>()
        .expect("maintenance registered");
    maintenance.defragmented("ns", "c1", "policy", 1 << 19, Duration::from_millis(50));
    snapshots.observe(&etcd, &[snapshot], "2026-01-01T01:00:00Z".parse().unwrap());
    let text = runtime.encode().unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The metric names a PromQL expression uses (ours all start with `etcdadm_`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("etcdadm_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

fn rules() -> Value {
    let text = std::fs::read_to_string(config_dir().join("rules.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let rule = rules();
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let work = TempDir::new("prometheus-rules");
    // JSON is YAML: promtool reads the groups as the operator hands them to Prometheus.
    std::fs::write(work.path().join("etcdadm-rules.yaml"), rule["spec"].to_string()).unwrap();
    std::fs::copy(
        config_dir().join("rules-test.yaml"),
        work.path().join("rules-test.yaml"),
    )
    .unwrap();
    let checked = run_promtool(&["check", "rules", "etcdadm-rules.yaml"], work.path());
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = run_promtool(&["test", "rules", "rules-test.yaml"], work.path());
    assert!(tested.contains("SUCCESS"), "{tested}");
    let alerts: BTreeSet<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    let tests = std::fs::read_to_string(config_dir().join("rules-test.yaml")).unwrap();
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
    }
}

#[test]
fn every_metric_an_alert_or_a_panel_names_is_exported() {
    let exported = exported();
    let mut queries: Vec<(String, String)> = Vec::new();
    for rule in rules()["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        queries.push((
            format!("alert {alert}"),
            rule["expr"].as_str().unwrap().to_string(),
        ));
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(config_dir().join("dashboard.json")).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(
        panels.len() >= 9,
        "members, leader, health, size, fragmentation, defragmentations, alarms, snapshots, certificates"
    );
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} queries nothing");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(
                expr.contains("namespace=\"$namespace\",name=\"$name\""),
                "panel {title} is not per cluster: {expr}"
            );
            queries.push((format!("panel {title}"), expr.to_string()));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            queries.push((format!("variable {}", variable["name"]), query.to_string()));
        }
    }
    for (what, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what} names no etcdadm metric: {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "{what} uses {name}, which the controller does not export: {expr}\nexported: {exported:?}"
            );
        }
    }
}
