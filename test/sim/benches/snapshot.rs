//! Snapshot figures for BENCHMARKS.md: throughput of an on-demand snapshot of a database of at
//! least `--size-mib` MiB (default 256) into SeaweedFS, and the peak RSS of the
//! `etcdadm-controller` process that takes it, next to the rates at which the member alone
//! streams its snapshot (read and dropped) and the store alone takes as many bytes (a multipart
//! upload from memory) on the same machine.
//!
//! `cargo build --release --workspace --bins && cargo bench -p etcdadm-sim --bench snapshot`
//! (add `-- --size-mib 512` for another size).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::store::MultipartWriter;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::bench::child_usage;
use etcdadm_sim::bench_inputs::{fill_database, number_arg};
use etcdadm_sim::demo::etcd_tls;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster, create_store_secrets};
use etcdadm_sim::plane::{DEFAULT_KCP_ROLLOUT_STEP, Plane, PlaneOptions};
use kube::api::{Api, PostParams};
use serde_json::json;

const MIB: u64 = 1 << 20;
const BUCKET: &str = "etcd-backups";

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let target = number_arg("--size-mib", 256).unwrap() * MIB;
    let work = TempDir::new("bench-snapshot");
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    let plane = Plane::start(PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, 12],
        controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await
    .unwrap();
    let client = plane.client.clone();
    let namespace = client.default_namespace().to_string();
    create_store_secrets(&client, &s3).await.unwrap();
    create_managed_cluster(
        &client,
        &namespace,
        &ManagedCluster {
            name: "big",
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
    let clusters: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = loop {
        let etcd = clusters.get("big-etcd").await.unwrap();
        let status = etcd.status.unwrap_or_default();
        if status.ready {
            break status.members[0].client_url.clone().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the cluster was not Ready within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Fill the database with 1 MiB values of distinct bytes until it holds `target`.
    let tls = etcd_tls(&client, &namespace, "big").await.unwrap().unwrap();
    let member = MemberClient::new(&url, &tls, Duration::from_secs(30)).unwrap();
    let mut kv = member.workload_client().await.unwrap();
    let filling = Instant::now();
    let i = fill_database(&member, &mut kv, target).await.unwrap();
    let db_size = member.status().await.unwrap().db_size;
    println!(
        "database: {:.0} MiB ({i} values of 1 MiB) written in {:.0} s",
        mib(db_size),
        filling.elapsed().as_secs_f64()
    );

    // The member alone: its snapshot stream read and dropped by this process.
    let started = Instant::now();
    let mut stream = member.snapshot(Duration::from_secs(30)).await.unwrap();
    let mut streamed = 0u64;
    while let Some(piece) = stream.next().await.unwrap() {
        streamed += piece.len() as u64;
    }
    let raw = started.elapsed();
    println!(
        "etcd alone: {:.0} MiB streamed in {:.1} s: {:.0} MiB/s",
        mib(streamed),
        raw.as_secs_f64(),
        mib(streamed) / raw.as_secs_f64()
    );

    // The store alone: as many bytes, a part at a time from memory, then deleted.
    let started = Instant::now();
    let upload = bucket.create_multipart_upload("alone.db").await.unwrap();
    let mut writer = MultipartWriter::new(&bucket, "alone.db", &upload);
    let chunk = vec![7u8; 32 * 1024];
    let mut written = 0;
    while written < streamed {
        writer.write(&chunk).await.unwrap();
        written += chunk.len() as u64;
    }
    writer.complete().await.unwrap();
    let alone = started.elapsed();
    bucket.delete_object("alone.db").await.unwrap();
    println!(
        "SeaweedFS alone: {:.0} MiB uploaded in {:.1} s: {:.0} MiB/s",
        mib(written),
        alone.as_secs_f64(),
        mib(written) / alone.as_secs_f64()
    );

    let before = child_usage("etcdadm-controller").expect("the controller runs");
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let request: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": "big-bench"}, "spec": {"clusterName": "big-etcd"},
    }))
    .unwrap();
    snapshots.create(&PostParams::default(), &request).await.unwrap();
    let created = Instant::now();
    let mut running_seen = None;
    let mut peak_sampled = before.rss_kib;
    let taken = loop {
        let current = snapshots.get("big-bench").await.unwrap();
        if let Some(usage) = child_usage("etcdadm-controller") {
            peak_sampled = peak_sampled.max(usage.rss_kib);
        }
        match current.phase() {
            SnapshotPhase::Running if running_seen.is_none() => running_seen = Some(Instant::now()),
            SnapshotPhase::Succeeded => break current,
            SnapshotPhase::Failed => panic!("the snapshot failed: {:?}", current.status),
            _ => {}
        }
        assert!(
            created.elapsed() < Duration::from_secs(600),
            "no snapshot within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let done = Instant::now();
    let after = child_usage("etcdadm-controller").expect("the controller runs");
    let status = taken.status.unwrap();
    let size = status.size.unwrap() as u64;
    let running_for = done - running_seen.unwrap_or(created);
    let objects = bucket.list("").await.unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].size, size);
    println!(
        "snapshot: {:.0} MiB into SeaweedFS in {:.1} s from Running ({:.1} s from creation): {:.0} MiB/s",
        mib(size),
        running_for.as_secs_f64(),
        (done - created).as_secs_f64(),
        mib(size) / running_for.as_secs_f64()
    );
    println!(
        "etcdadm-controller: RSS {:.1} MiB before, peak {:.1} MiB sampled during the snapshot, \
         VmHWM {:.1} MiB before and {:.1} MiB after; CPU {:.1} s for the snapshot",
        before.rss_kib as f64 / 1024.0,
        peak_sampled as f64 / 1024.0,
        before.peak_rss_kib as f64 / 1024.0,
        after.peak_rss_kib as f64 / 1024.0,
        after.cpu_seconds - before.cpu_seconds
    );
    drop(plane);
}
