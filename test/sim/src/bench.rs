//! `etcdadm-sim bench`: figures measured with the sim's own clock, split so that what the
//! controllers add can be told apart from what etcd itself takes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::names;

use crate::demo::etcd_tls;
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster};
use crate::plane::{DEFAULT_KCP_ROLLOUT_STEP, NAMESPACE, Plane, PlaneOptions};

const POLL: Duration = Duration::from_millis(50);

/// When each step of one member's life was first seen, from the start of the run.
#[derive(Clone, Debug, Default)]
struct MemberTimes {
    created: Option<Duration>,
    address: Option<Duration>,
    healthy: Option<Duration>,
}

/// One create-to-Ready run.
#[derive(Clone, Debug)]
pub struct CreateRun {
    pub total: Duration,
    /// Sum over members of (Machine has an address → its etcd answers `/health` healthy):
    /// boot, cloud-init, etcdadm and etcd start, none of which the controllers do.
    pub etcd_start_sum: Duration,
    /// Member i healthy → Machine i+1 created.
    pub next_machine_gaps: Vec<Duration>,
    /// Last member healthy → `status.ready`.
    pub last_healthy_to_ready: Duration,
    /// `status.ready` → KubeadmControlPlane unpaused with the endpoints.
    pub ready_to_kcp: Duration,
}

/// Create an EtcdadmCluster of `members` on a fresh plane and time each step.
pub async fn create_to_ready(
    work_dir: &Path,
    members: i32,
    timeout: Duration,
) -> Result<CreateRun, SimError> {
    let _ = std::fs::remove_dir_all(work_dir);
    let plane = Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, 9],
        kubeconfig: None,
        machine_runtime: None,
        controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await?;
    let client = plane.client.clone();
    let spec = ManagedCluster {
        name: "bench",
        replicas: members,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        health_check: Value::Null,
        with_kcp: true,
        extra_spec: Value::Null,
    };
    let start = Instant::now();
    create_managed_cluster(&client, NAMESPACE, &spec).await?;
    let mut times: BTreeMap<String, MemberTimes> = BTreeMap::new();
    let mut tls: Option<EtcdTls> = None;
    let mut ready_at = None;
    let kcp_at = loop {
        let now = start.elapsed();
        if now > timeout {
            return Err(SimError::Timeout(format!(
                "bench cluster of {members} not Ready after {timeout:?}"
            )));
        }
        if tls.is_none() {
            tls = etcd_tls(&client, NAMESPACE, "bench").await?;
        }
        observe_members(&client, tls.as_ref(), &mut times, now).await?;
        if ready_at.is_none() {
            let etcd = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
                .get("bench-etcd")
                .await?;
            if etcd.status.is_some_and(|s| s.ready) {
                ready_at = Some(now);
            }
        }
        if let Some(ready) = ready_at
            && kcp_unpaused(&client).await?
        {
            break (ready, now);
        }
        tokio::time::sleep(POLL).await;
    };
    drop(plane);
    let (ready, kcp) = kcp_at;
    let mut ordered: Vec<&MemberTimes> = times.values().collect();
    ordered.sort_by_key(|t| t.created);
    let etcd_start_sum = ordered
        .iter()
        .filter_map(|t| Some(t.healthy?.saturating_sub(t.address?)))
        .sum();
    let next_machine_gaps = ordered
        .windows(2)
        .filter_map(|w| Some(w[1].created?.saturating_sub(w[0].healthy?)))
        .collect();
    let last_healthy = ordered.iter().filter_map(|t| t.healthy).max().unwrap_or_default();
    Ok(CreateRun {
        total: ready,
        etcd_start_sum,
        next_machine_gaps,
        last_healthy_to_ready: ready.saturating_sub(last_healthy),
        ready_to_kcp: kcp.saturating_sub(ready),
    })
}

async fn observe_members(
    client: &Client,
    tls: Option<&EtcdTls>,
    times: &mut BTreeMap<String, MemberTimes>,
    now: Duration,
) -> Result<(), SimError> {
    let machines = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
        .list(&Default::default())
        .await?;
    for machine in machines.items {
        let entry = times.entry(machine.name_any()).or_default();
        entry.created.get_or_insert(now);
        let Some(address) = machine.etcd_address() else {
            continue;
        };
        entry.address.get_or_insert(now);
        if entry.healthy.is_some() {
            continue;
        }
        let Some(tls) = tls else { continue };
        let Ok(member) = MemberClient::new(&names::client_url(address), tls, Duration::from_millis(500))
        else {
            continue;
        };
        if member.health().await.is_ok_and(|h| h.healthy) {
            entry.healthy = Some(now);
        }
    }
    Ok(())
}

async fn kcp_unpaused(client: &Client) -> Result<bool, SimError> {
    let kcp = Api::<KubeadmControlPlane>::namespaced(client.clone(), NAMESPACE)
        .get("bench-control-plane")
        .await?;
    let paused = kcp.annotations().contains_key(names::PAUSED_ANNOTATION);
    Ok(!paused
        && matches!(kcp.etcd(), ControlPlaneEtcd::External(e) if !e.iter().any(|u| u.contains("placeholder"))))
}

/// Median, minimum and maximum of `values` in seconds, as `median (min–max)`.
pub fn spread(values: &[Duration]) -> String {
    let mut secs: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
    secs.sort_by(f64::total_cmp);
    match (secs.first(), secs.last()) {
        (Some(min), Some(max)) => format!("{:.2} s ({min:.2}–{max:.2})", secs[secs.len() / 2]),
        _ => "-".into(),
    }
}

/// Run `create_to_ready` `runs` times for each size and print the table.
pub async fn run_create(work_dir: &Path, sizes: &[i32], runs: usize) -> Result<(), SimError> {
    println!(
        "create-to-Ready, {runs} runs per size (median (min–max)); command: etcdadm-sim bench create --runs {runs}"
    );
    println!(
        "{:<8} {:<22} {:<22} {:<10} {:<24} {:<22} {:<22}",
        "members",
        "create→Ready",
        "Σ etcd start",
        "ratio",
        "healthy→next Machine",
        "last healthy→Ready",
        "Ready→KCP unpaused"
    );
    for &members in sizes {
        let mut results = vec![];
        for run in 0..runs {
            let dir = work_dir.join(format!("create-{members}-{run}"));
            results.push(create_to_ready(&dir, members, Duration::from_secs(300)).await?);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let pick = |f: &dyn Fn(&CreateRun) -> Duration| results.iter().map(f).collect::<Vec<_>>();
        let ratios: Vec<f64> = results
            .iter()
            .map(|r| r.total.as_secs_f64() / r.etcd_start_sum.as_secs_f64().max(0.001))
            .collect();
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let gaps: Vec<Duration> = results.iter().flat_map(|r| r.next_machine_gaps.clone()).collect();
        println!(
            "{:<8} {:<22} {:<22} {:<10} {:<24} {:<22} {:<22}",
            members,
            spread(&pick(&|r| r.total)),
            spread(&pick(&|r| r.etcd_start_sum)),
            format!("{:.2}", sorted.get(sorted.len() / 2).copied().unwrap_or_default()),
            spread(&gaps),
            spread(&pick(&|r| r.last_healthy_to_ready)),
            spread(&pick(&|r| r.ready_to_kcp)),
        );
    }
    Ok(())
}

/// The 1-minute load average, as `uptime` prints it (`?` where there is no /proc): printed
/// beside a figure, since these machines are shared and have 2 cores.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}

/// What one of our child processes uses.
#[derive(Clone, Copy, Debug)]
pub struct ChildUsage {
    pub rss_kib: u64,
    /// The most it was ever resident (`VmHWM`).
    pub peak_rss_kib: u64,
    /// User plus system CPU since it started.
    pub cpu_seconds: f64,
}

/// Usage of our child process whose name starts with `prefix`.
pub fn child_usage(prefix: &str) -> Option<ChildUsage> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let (comm, fields) = stat_fields(&std::fs::read_to_string(entry.path().join("stat")).ok()?)?;
        (fields.get(1) == Some(&me) && prefix.starts_with(&comm)).then_some(())?;
        usage_of(entry.file_name().to_str()?.parse().ok()?)
    })
}

/// Usage of process `pid` (`std::process::id()` for this one), while it lives.
pub fn usage_of(pid: u32) -> Option<ChildUsage> {
    let dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let (_, fields) = stat_fields(&std::fs::read_to_string(dir.join("stat")).ok()?)?;
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_default()
    };
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    };
    Some(ChildUsage {
        rss_kib: kib("VmRSS:"),
        peak_rss_kib: kib("VmHWM:"),
        // utime and stime are fields 14 and 15 of stat; the fields kept start at field 3.
        cpu_seconds: (ticks(11) + ticks(12)) as f64 / 100.0,
    })
}

/// `comm` and the fields after it of a `/proc/<pid>/stat` line (`pid (comm) state ppid ...`):
/// comm may hold spaces, so the fields start after the last ')'.
fn stat_fields(stat: &str) -> Option<(String, Vec<String>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(').map(|(_, c)| c).unwrap_or_default();
    Some((
        comm.to_string(),
        rest.split_whitespace().map(String::from).collect(),
    ))
}

/// Idle footprint of both managers with `clusters` EtcdadmClusters whose Cluster does not exist
/// (they are watched and reconciled, but create nothing).
pub async fn run_idle(work_dir: &Path, clusters: usize, settle: Duration) -> Result<(), SimError> {
    let _ = std::fs::remove_dir_all(work_dir);
    let plane = Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, 9],
        kubeconfig: None,
        machine_runtime: None,
        controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await?;
    let client = plane.client.clone();
    let api: Api<EtcdadmCluster> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..clusters {
        let etcd: EtcdadmCluster = serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": format!("idle-{i}"), "labels": {names::CLUSTER_NAME_LABEL: format!("absent-{i}")}},
            "spec": {"replicas": 3, "infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"}},
        }))?;
        api.create(&Default::default(), &etcd).await?;
    }
    tokio::time::sleep(settle).await;
    let before: Vec<Option<ChildUsage>> = ["etcdadm-bootstrap", "etcdadm-controller"]
        .iter()
        .map(|n| child_usage(n))
        .collect();
    let requests_before = plane
        .server
        .as_ref()
        .map(|s| s.request_count())
        .unwrap_or_default();
    let window = Duration::from_secs(60);
    tokio::time::sleep(window).await;
    let requests = plane
        .server
        .as_ref()
        .map(|s| s.request_count())
        .unwrap_or_default()
        - requests_before;
    for (i, name) in ["etcdadm-bootstrap", "etcdadm-controller"].iter().enumerate() {
        match (before[i], child_usage(name)) {
            (Some(b), Some(a)) => println!(
                "{name}: {clusters} clusters, RSS {:.1} MiB (peak {:.1} MiB), CPU {:.2} s per minute",
                a.rss_kib as f64 / 1024.0,
                a.peak_rss_kib as f64 / 1024.0,
                (a.cpu_seconds - b.cpu_seconds) * 60.0 / window.as_secs_f64()
            ),
            _ => println!("{name}: not running"),
        }
    }
    println!(
        "API requests from both managers and the stand-ins: {:.1} per second",
        requests as f64 / window.as_secs_f64()
    );
    drop(plane);
    Ok(())
}
