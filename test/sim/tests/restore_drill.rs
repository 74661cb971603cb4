#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Restore drills end to end with the real controller, real etcd machines and a real store
//! (SeaweedFS): a cluster with continuous backup and `spec.backup.verify` every minute gets a
//! drill, asked for now (`drill-now`) once every write is in the deltas, that restores its
//! snapshot and deltas into a throwaway etcd and passes, comparing the key count and sampled
//! values with the cluster; then a delta object is damaged in the store, the next drill asked
//! for fails naming it, the metric shows it, and the alert rule fires on the values scraped from
//! the controller (`promtool test rules`).

mod lifecycle_support;

use std::time::Duration;

use etcdadm_shared::api::snapshot::{DrillResult, DrillStatus, EtcdadmSnapshot};
use etcdadm_shared::backup::delta::listing;
use etcdadm_shared::names;
use etcdadm_shared::testing::{SeaweedFs, TempDir, etcd_tools_dir, run_promtool};
use kube::ResourceExt;
use kube::api::Api;
use lifecycle_support::*;
use serde_json::{Value, json};

/// Long enough for the continuous snapshot, writes, and two drills a minute apart.
const TIMEOUT: Duration = Duration::from_secs(240);
const BUCKET: &str = "etcd-backups";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_of_a_whole_backup_passes_and_one_of_a_damaged_delta_fails_and_alerts() {
    let work = TempDir::new("sim-restore-drill");
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    // The drill runs the etcd the members run (3.4's etcdctl restores, 3.5's etcdutl).
    let tools = etcd_tools_dir().unwrap_or_else(|hint| panic!("{hint}"));
    let mut options = plane_options(92, &work, Duration::from_secs(1));
    let scratch = work.path().join("drills");
    std::fs::create_dir_all(&scratch).unwrap();
    options.controller_own_args.insert(
        CONTROLLER,
        vec![
            format!("--drill-etcd-dir={}", tools.display()),
            format!("--drill-scratch-dir={}", scratch.display()),
        ],
    );
    let plane = etcdadm_sim::plane::Plane::start(options).await.unwrap();
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        "rd",
        3,
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}, "continuous": {"interval": "5s"},
                          "verify": {"schedule": "* * * * *", "sampleKeys": 50}}}),
    )
    .await;
    let etcd = wait_settled(&client, "rd", 3, TIMEOUT, &work).await;
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let first = continuous_snapshot(&client, "rd", &work, TIMEOUT).await;
    let name = first.name_any();

    // Writes after the snapshot, in the deltas; a drill asked for now restores all of them
    // and passes (the schedule's, every minute, would do the same, a minute later).
    let (member, written) = write_keys(&client, "rd", &etcd, 300).await;
    let key = object_key(&first, BUCKET);
    wait_for(&work, "every write in the deltas", || async {
        let listed = listing::listed(&bucket, &key).await.ok()?;
        let reached = listed.iter().map(|d| d.last).max()?;
        (reached >= written).then_some(())
    })
    .await;
    annotate_etcd_cluster(&client, "rd", names::DRILL_NOW_ANNOTATION, Some("first")).await;
    let passed = wait_for(&work, "a drill that passed with every write", || async {
        let drill = last_drill(&snapshots, &name).await?;
        (drill.result == DrillResult::Passed && drill.revision? >= written).then_some(drill)
    })
    .await;
    let mut kv = member.workload_client().await.unwrap();
    let at = passed.revision.unwrap();
    let source_count = kv
        .get(
            vec![0],
            Some(
                etcd_client::GetOptions::new()
                    .with_all_keys()
                    .with_count_only()
                    .with_revision(at),
            ),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(passed.keys, Some(source_count), "{passed:?}");
    assert!(source_count >= 300, "{passed:?}");
    assert_eq!(passed.sampled, Some(50), "{passed:?}");
    assert!(passed.deltas.unwrap() >= 1, "{passed:?}");
    let text = scrape_until(&plane, &work, "etcdadm_backup_drill_failed", "0").await;
    assert_eq!(
        gauge(&text, "etcdadm_backup_drill_interval_seconds"),
        Some(60.0),
        "{text}"
    );
    assert!(
        gauge(&text, "etcdadm_backup_drill_last_success_timestamp_seconds").is_some(),
        "{text}"
    );

    // A flipped byte in the first delta object: the next drill fails by its key.
    let listed = listing::listed(&bucket, &key).await.unwrap();
    let damaged_key = listed.iter().min().unwrap().key(&key);
    let mut damaged = bucket.get_object(&damaged_key, 64 << 20).await.unwrap();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 1;
    bucket.put_object(&damaged_key, damaged).await.unwrap();
    annotate_etcd_cluster(&client, "rd", names::DRILL_NOW_ANNOTATION, Some("second")).await;
    let failed = wait_for(&work, "a drill that failed naming the damaged delta", || async {
        let drill = last_drill(&snapshots, &name).await?;
        (drill.result == DrillResult::Failed && drill.time.0 > passed.time.0).then_some(drill)
    })
    .await;
    assert!(failed.message.contains(&damaged_key), "{failed:?}");
    assert!(failed.message.contains("damaged"), "{failed:?}");
    let said = events_about(&client, &name).await;
    for reason in ["DrillPassed", "DrillFailed"] {
        assert!(said.iter().any(|(r, _)| r == reason), "{reason} in {said:?}");
    }
    assert!(
        said.iter()
            .any(|(r, note)| r == "DrillFailed" && note.contains(&damaged_key)),
        "{said:?}"
    );

    // Each drill's throwaway etcd was killed and its scratch directory removed.
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "scratch directories left"
    );
    assert_eq!(
        processes_naming(&scratch),
        Vec::<String>::new(),
        "throwaway etcd left running"
    );

    // The controller's scraped values, fed to the shipped rules: the failure alerts, and the
    // last success (just now) is not too old.
    let text = scrape_until(&plane, &work, "etcdadm_backup_drill_failed", "1").await;
    alert_fires_on(&text, client.default_namespace(), "rd-etcd", &work);
    save_logs(&work, "restore_drill");
}

/// The command lines of the processes that name a path under `dir` (a drill's etcd names its
/// data directory; the controller names `dir` itself).
fn processes_naming(dir: &std::path::Path) -> Vec<String> {
    let dir = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|line| line.contains(&dir))
        .collect()
}

/// `status.lastDrill` of snapshot `name`, once it has one.
async fn last_drill(snapshots: &Api<EtcdadmSnapshot>, name: &str) -> Option<DrillStatus> {
    snapshots.get(name).await.ok()?.status?.last_drill
}

/// The controller's /metrics once the series `name` of this scenario's cluster reads `value`.
async fn scrape_until(plane: &etcdadm_sim::plane::Plane, work: &TempDir, name: &str, value: &str) -> String {
    wait_for(work, &format!("{name} {value} on /metrics"), || async {
        let text = plane.scrape_metrics(CONTROLLER).await.ok()?;
        let want: f64 = value.parse().ok()?;
        (gauge(&text, name) == Some(want)).then_some(text)
    })
    .await
}

/// The value of the series `name` of cluster `rd-etcd` in `text`.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(r#"name="rd-etcd""#))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// Run `promtool test rules` on config/prometheus/rules.yaml with the three drill series at the
/// values scraped in `text`: EtcdadmBackupDrillFailed fires for the cluster, and
/// EtcdadmBackupDrillTooOld does not (its last success is recent).
fn alert_fires_on(text: &str, namespace: &str, cluster: &str, work: &TempDir) {
    let rules_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/prometheus/rules.yaml");
    let rules: Value = serde_saphyr::from_str(&std::fs::read_to_string(rules_path).unwrap()).unwrap();
    let dir = work.path().join("drill-alerts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.yaml"), rules["spec"].to_string()).unwrap();
    let rule = rules["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "EtcdadmBackupDrillFailed")
        .unwrap();
    let render = |template: &str| {
        template
            .replace("{{ $labels.namespace }}", namespace)
            .replace("{{ $labels.name }}", cluster)
    };
    let series = |name: &str| {
        let value = gauge(text, name).unwrap_or_else(|| panic!("{name} not scraped:\n{text}"));
        json!({"series": format!(r#"{name}{{namespace="{namespace}",name="{cluster}"}}"#),
               "values": format!("{value}x5")})
    };
    // promtool's clock starts at 0: the scraped success time is in its future, never too old.
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                series("etcdadm_backup_drill_failed"),
                series("etcdadm_backup_drill_last_success_timestamp_seconds"),
                series("etcdadm_backup_drill_interval_seconds"),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "EtcdadmBackupDrillFailed", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "namespace": namespace, "name": cluster},
                    "exp_annotations": {
                        "summary": render(rule["annotations"]["summary"].as_str().unwrap()),
                        "description": render(rule["annotations"]["description"].as_str().unwrap()),
                    },
                }]},
                {"eval_time": "2m", "alertname": "EtcdadmBackupDrillTooOld", "exp_alerts": []},
            ],
        }],
    });
    std::fs::write(dir.join("tests.yaml"), tests.to_string()).unwrap();
    let said = run_promtool(&["test", "rules", "tests.yaml"], &dir);
    assert!(said.contains("SUCCESS"), "{said}");
}

/// `check`'s answer, polled by `demo::eventually` for at most [`TIMEOUT`].
async fn wait_for<T, F, Fut>(work: &TempDir, what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_until(work, what, TIMEOUT, check).await
}
