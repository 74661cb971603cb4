//! Restore drill figures for BENCHMARKS.md: a one-member cluster filled with at least
//! `--size-mib` MiB (default 100) gets continuous backup and a drill every minute; after its
//! full snapshot a client makes `--events` writes (default 10,000, 100-byte values), and the
//! drill that restores the snapshot and every one of them is timed. Sampled every 100 ms while
//! it runs: the throwaway etcd's peak resident memory (VmHWM), the drill's scratch directory on
//! disk, and the controller's resident memory.
//!
//! `cargo build --workspace --bins && cargo bench --profile dev -p etcdadm-sim --bench drill`
//! (add `-- --size-mib 200 --events 20000` for other sizes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{DrillResult, EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir, etcd_tools_dir};
use etcdadm_sim::bench::{child_usage, usage_of};
use etcdadm_sim::bench_inputs::{fill_database, number_arg};
use etcdadm_sim::demo::etcd_tls;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster, create_store_secrets};
use etcdadm_sim::plane::{DEFAULT_KCP_ROLLOUT_STEP, Plane, PlaneOptions};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const MIB: u64 = 1 << 20;
const BUCKET: &str = "etcd-backups";

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// What one drill's scratch directory and its etcd came to at most.
#[derive(Clone, Copy, Debug, Default)]
struct Peak {
    disk: u64,
    etcd_hwm_kib: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let target = number_arg("--size-mib", 100).unwrap() * MIB;
    let events = number_arg("--events", 10_000).unwrap();
    let work = TempDir::new("bench-drill");
    let scratch = work.path().join("drills");
    std::fs::create_dir_all(&scratch).unwrap();
    let s3 = SeaweedFs::start().await;
    s3.create_bucket(BUCKET).await;
    let tools = etcd_tools_dir().unwrap_or_else(|hint| panic!("{hint}"));
    let plane = Plane::start(PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, 13],
        controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        controller_own_args: BTreeMap::from([(
            "etcdadm-controller",
            vec![
                format!("--drill-etcd-dir={}", tools.display()),
                format!("--drill-scratch-dir={}", scratch.display()),
            ],
        )]),
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
            extra_spec: json!({}),
        },
    )
    .await
    .unwrap();
    let clusters: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let url = wait(Duration::from_secs(120), "the cluster Ready", || async {
        let status = clusters.get("big-etcd").await.ok()?.status?;
        status.ready.then(|| status.members[0].client_url.clone())?
    })
    .await;

    // The full snapshot's data: 1 MiB values of distinct bytes.
    let tls = etcd_tls(&client, &namespace, "big").await.unwrap().unwrap();
    let member = MemberClient::new(&url, &tls, Duration::from_secs(30)).unwrap();
    let mut kv = member.workload_client().await.unwrap();
    fill_database(&member, &mut kv, target).await.unwrap();

    // Continuous backup and a drill every minute; the full snapshot first, then the writes.
    let backup = json!({"spec": {"backup": {"store": {"s3": serde_json::to_value(s3.store(BUCKET)).unwrap()},
        "continuous": {"interval": "5s"}, "verify": {"schedule": "* * * * *", "sampleKeys": 100}}}});
    clusters
        .patch("big-etcd", &PatchParams::default(), &Patch::Merge(&backup))
        .await
        .unwrap();
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let full = wait(Duration::from_secs(600), "the full snapshot", || async {
        let list = snapshots.list(&Default::default()).await.ok()?.items;
        list.into_iter().find(|s| s.phase() == SnapshotPhase::Succeeded)
    })
    .await;
    let name = full.metadata.name.clone().unwrap();
    let size = full.status.as_ref().unwrap().size.unwrap() as u64;
    let value = "v".repeat(100);
    for n in 0..events {
        kv.put(format!("app/{:05}", n % 1000), value.as_str(), None)
            .await
            .unwrap();
    }
    let written = member.local_revision().await.unwrap();

    // Sample until the drill reaching the last write is recorded.
    let before = child_usage("etcdadm-controller").expect("the controller runs");
    let mut peaks: BTreeMap<PathBuf, Peak> = BTreeMap::new();
    let mut last_dir = None;
    let mut controller_peak = before.rss_kib;
    let started = Instant::now();
    let drill = loop {
        for dir in std::fs::read_dir(&scratch).unwrap().flatten() {
            let peak = peaks.entry(dir.path()).or_default();
            peak.disk = peak.disk.max(disk_of(&dir.path()));
            peak.etcd_hwm_kib = peak.etcd_hwm_kib.max(etcd_hwm_under(&dir.path()));
            last_dir = Some(dir.path());
        }
        if let Some(usage) = child_usage("etcdadm-controller") {
            controller_peak = controller_peak.max(usage.rss_kib);
        }
        let drill = snapshots.get(&name).await.ok().and_then(|s| s.status?.last_drill);
        if let Some(drill) = drill.filter(|d| d.revision.is_some_and(|r| r >= written)) {
            break drill;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "no drill reached the last write within 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = Timestamp::now().duration_since(drill.time.0);
    assert_eq!(drill.result, DrillResult::Passed, "{drill:?}");
    let peak = last_dir.and_then(|d| peaks.get(&d).copied()).unwrap_or_default();
    println!(
        "command: cargo bench --profile dev -p etcdadm-sim --bench drill -- --size-mib {} --events {events}",
        target / MIB
    );
    println!(
        "full snapshot {:.0} MiB, {} delta objects, {events} events after it; drill {:?}: {} keys, {} sampled, revision {}",
        mib(size),
        drill.deltas.unwrap_or_default(),
        drill.result,
        drill.keys.unwrap_or_default(),
        drill.sampled.unwrap_or_default(),
        drill.revision.unwrap_or_default()
    );
    println!(
        "drill: {:.1} s from its start to its record; scratch directory peak {:.0} MiB; throwaway etcd peak RSS {:.0} MiB",
        took.as_secs_f64(),
        mib(peak.disk),
        peak.etcd_hwm_kib as f64 / 1024.0
    );
    println!(
        "etcdadm-controller: RSS {:.1} MiB before, peak {:.1} MiB sampled while drills ran",
        before.rss_kib as f64 / 1024.0,
        controller_peak as f64 / 1024.0
    );
    drop(plane);
}

/// Bytes of the files under `dir`.
fn disk_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => disk_of(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The peak resident memory (KiB) of an etcd process naming a path under `dir`.
fn etcd_hwm_under(dir: &Path) -> u64 {
    let dir = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            (cmdline.contains(&dir) && cmdline.contains("--listen-client-urls")).then_some(())?;
            usage_of(entry.file_name().to_str()?.parse().ok()?).map(|u| u.peak_rss_kib)
        })
        .max()
        .unwrap_or(0)
}

/// `check`'s answer, polled every 200 ms for at most `limit`.
async fn wait<T, F, Fut>(limit: Duration, what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(answer) = check().await {
            return answer;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
