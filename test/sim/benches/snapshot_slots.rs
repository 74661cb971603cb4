//! The memory bound of snapshots for BENCHMARKS.md: `--clusters` one-member clusters (default
//! 4), each database filled to `--size-mib` MiB (default 64), all snapshotted at once by one
//! `etcdadm-controller` run with `--max-concurrent-snapshots <--slots>` (default 2). Prints the
//! most snapshots seen Running at once, the time until all Succeeded, and the controller's peak
//! RSS (VmHWM) before and after.
//!
//! `cargo build --release --workspace --bins && cargo bench -p etcdadm-sim --bench snapshot_slots`
//! (add `-- --slots 4` to see what a slot costs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::bench::usage_of;
use etcdadm_sim::bench_inputs::{fill_database, number_arg};
use etcdadm_sim::demo::etcd_tls;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster, create_store_secrets};
use etcdadm_sim::plane::{DEFAULT_KCP_ROLLOUT_STEP, Plane, PlaneOptions, spawn_controller_with_ports};
use kube::api::{Api, PostParams};
use serde_json::json;

const MIB: u64 = 1 << 20;
const BUCKET: &str = "etcd-backups";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (clusters, size, slots) = (
        number_arg("--clusters", 4).unwrap(),
        number_arg("--size-mib", 64).unwrap() * MIB,
        number_arg("--slots", 2).unwrap(),
    );
    let work = TempDir::new("bench-snapshot-slots");
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let plane = Plane::start(PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, 24],
        controllers: vec!["etcdadm-bootstrap"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut controller = spawn_controller_with_ports(
        "etcdadm-controller",
        &work.path().join("kubeconfig"),
        &work.path().join("etcdadm-controller.log"),
        None,
        &[format!("--max-concurrent-snapshots={slots}")],
        &[],
    )
    .unwrap();
    let client = plane.client.clone();
    let namespace = client.default_namespace().to_string();
    create_store_secrets(&client, &s3).await.unwrap();
    let names: Vec<String> = (0..clusters).map(|i| format!("s{i}")).collect();
    for name in &names {
        create_managed_cluster(
            &client,
            &namespace,
            &ManagedCluster {
                name,
                replicas: 1,
                zones: &[],
                config_spec: json!({}),
                health_check: json!({"interval": "2s", "timeout": "2s", "unhealthyAfter": "5m"}),
                with_kcp: false,
                extra_spec: json!({"backup": {"store": {"s3": serde_json::to_value(s3.store(BUCKET)).unwrap()}}}),
            },
        )
        .await
        .unwrap();
    }

    // Each database filled with 1 MiB values of distinct bytes until it holds `size`.
    let etcd_clusters: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    for name in &names {
        let deadline = Instant::now() + Duration::from_secs(300);
        let url = loop {
            let status = etcd_clusters
                .get(&format!("{name}-etcd"))
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            if status.ready {
                break status.members[0].client_url.clone().unwrap();
            }
            assert!(Instant::now() < deadline, "{name} was not Ready within 300 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let tls = etcd_tls(&client, &namespace, name).await.unwrap().unwrap();
        let member = MemberClient::new(&url, &tls, Duration::from_secs(30)).unwrap();
        let mut kv = member.workload_client().await.unwrap();
        fill_database(&member, &mut kv, size).await.unwrap();
    }
    println!("{clusters} clusters of at least {} MiB each", size / MIB);

    let pid = controller.id().expect("the controller runs");
    let before = usage_of(pid).expect("the controller runs");
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let started = Instant::now();
    for name in &names {
        let request: EtcdadmSnapshot = serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
            "metadata": {"name": format!("{name}-bench")}, "spec": {"clusterName": format!("{name}-etcd")},
        }))
        .unwrap();
        snapshots.create(&PostParams::default(), &request).await.unwrap();
    }
    let mut most_running = 0;
    let mut peak_sampled = before.rss_kib;
    loop {
        let listed = snapshots.list(&Default::default()).await.unwrap().items;
        let running = listed
            .iter()
            .filter(|s| s.phase() == SnapshotPhase::Running)
            .count();
        most_running = most_running.max(running);
        if let Some(failed) = listed.iter().find(|s| s.phase() == SnapshotPhase::Failed) {
            panic!("a snapshot failed: {:?}", failed.status);
        }
        if let Some(usage) = usage_of(pid) {
            peak_sampled = peak_sampled.max(usage.rss_kib);
        }
        if listed
            .iter()
            .filter(|s| s.phase() == SnapshotPhase::Succeeded)
            .count()
            == names.len()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1200),
            "not all snapshots within 20 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = usage_of(pid).expect("the controller runs");
    println!(
        "--max-concurrent-snapshots={slots}: at most {most_running} Running at once; all {clusters} \
         Succeeded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "etcdadm-controller: RSS {:.1} MiB before, peak {:.1} MiB sampled, VmHWM {:.1} MiB before \
         and {:.1} MiB after; CPU {:.1} s",
        before.rss_kib as f64 / 1024.0,
        peak_sampled as f64 / 1024.0,
        before.peak_rss_kib as f64 / 1024.0,
        after.peak_rss_kib as f64 / 1024.0,
        after.cpu_seconds - before.cpu_seconds
    );
    let _ = controller.start_kill();
    let _ = controller.wait().await;
    drop(plane);
}
