//! `etcdadm-sim bench rollout`: the longest time a client waits for a write across a 3-member
//! rolling replacement, over many runs side by side (as the test suite runs its scenarios), so
//! that what a rollout costs writers is a distribution, not one lucky or unlucky run; with
//! `--ca-rotation`, across a whole etcd CA rotation (three rolls) instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::contract::ca::ca_from_secret;
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use k8s_openapi::api::core::v1::Secret;

use crate::demo::{etcd_tls, machine_urls};
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster};
use crate::plane::{DEFAULT_KCP_ROLLOUT_STEP, NAMESPACE, Plane, PlaneOptions};

/// Loopback prefixes `127.0.<BASE + slot>.N`: no scenario uses them.
const PREFIX_BASE: u8 = 120;
const CLUSTER: &str = "roll";
const TIMEOUT: Duration = Duration::from_secs(600);
/// The client's pace and its patience with one request, as the sim scenarios' writer.
const WRITE_EVERY: Duration = Duration::from_millis(50);
const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// What is rolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// An `etcdSettings` change: one roll.
    Settings,
    /// The `rotate-ca` annotation: three rolls, the writer holding an identity from each CA.
    CaRotation,
}

/// The `rotate-ca` value a run asks for.
const ROTATION_REQUEST: &str = "bench";

/// TLS settings the writer uses, swapped once a rotation's next CA exists.
type SharedTls = Arc<Mutex<Arc<rustls::ClientConfig>>>;

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RolloutRun {
    /// From the spec change to every old Machine gone with the cluster Ready.
    pub wall: Duration,
    /// The longest time between two acknowledged writes while the rollout ran.
    pub max_gap: Duration,
    pub writes: usize,
}

/// What the writer keeps while it runs.
#[derive(Default)]
struct Writes {
    acked: usize,
    last: Option<Instant>,
    max_gap: Duration,
}

/// A client writing a new key every 50 ms through whichever member URL works (pinned until it
/// fails, as etcd's own client does), recording the longest time between acknowledgements.
async fn write_until(
    stop: Arc<AtomicBool>,
    urls: Arc<Mutex<Vec<String>>>,
    tls: SharedTls,
    writes: Arc<Mutex<Writes>>,
) {
    let mut pinned = 0usize;
    let mut clients: Vec<(String, MemberClient)> = Vec::new();
    let mut config = tls.lock().await.clone();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = tls.lock().await.clone();
        if !Arc::ptr_eq(&now, &config) {
            clients.clear();
            config = now;
        }
        let list = urls.lock().await.clone();
        if list.is_empty() {
            tokio::time::sleep(WRITE_EVERY).await;
            continue;
        }
        let url = list[pinned % list.len()].clone();
        if !clients.iter().any(|(u, _)| *u == url)
            && let Ok(c) = MemberClient::with_config(&url, config.clone(), OP_TIMEOUT)
        {
            clients.push((url.clone(), c));
        }
        let client = clients.iter().find(|(u, _)| *u == url).map(|(_, c)| c);
        i += 1;
        let put = async {
            etcdadm_sim_machines::network::guard(&url).ok()?;
            let mut etcd = client?.workload_client().await.ok()?;
            etcd.put(format!("/bench/{i:08}"), format!("value-{i}"), None)
                .await
                .ok()
        };
        match tokio::time::timeout(OP_TIMEOUT, put).await {
            Ok(Some(_)) => {
                let now = Instant::now();
                let mut w = writes.lock().await;
                if let Some(last) = w.last {
                    w.max_gap = w.max_gap.max(now - last);
                }
                w.last = Some(now);
                w.acked += 1;
            }
            _ => pinned += 1,
        }
        tokio::time::sleep(WRITE_EVERY).await;
    }
}

/// The voting members' client URLs as the Machines report them, refreshed every second.
async fn follow_urls(client: Client, urls: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(list) = machine_urls(&client, NAMESPACE, CLUSTER).await {
            *urls.lock().await = list;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn machine_names(client: &Client) -> Result<Vec<String>, SimError> {
    let selector = format!("{}={CLUSTER}", names::CLUSTER_NAME_LABEL);
    let list = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(list.items.iter().map(ResourceExt::name_any).collect())
}

/// Ready with three members, none of them on a Machine of `old`.
async fn settled_without(client: &Client, old: &[String]) -> Result<bool, SimError> {
    let etcd = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
        .get(&format!("{CLUSTER}-etcd"))
        .await?;
    let status = etcd.status.unwrap_or_default();
    let machines = machine_names(client).await?;
    Ok(status.ready
        && status.members.len() == 3
        && status.members.iter().all(|m| m.healthy && !old.contains(&m.name))
        && machines.len() == 3
        && machines.iter().all(|m| !old.contains(m)))
}

/// The CA Secret `name` of the cluster as a CA, once it exists and is usable.
async fn read_ca(client: &Client, name: &str) -> Result<Option<CertificateAuthority>, SimError> {
    let secret = Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .get_opt(name)
        .await?;
    Ok(secret.and_then(|s| ca_from_secret(&s, NAMESPACE, name).ok()))
}

/// Once the rotation's next CA exists, the writer holds an identity from each CA.
async fn follow_next_ca(client: Client, current: CertificateAuthority, tls: SharedTls) {
    loop {
        if let Ok(Some(next)) = read_ca(&client, &names::next_ca_secret_name(CLUSTER)).await
            && let Ok(both) = EtcdTls::issued_by_each(&[&current, &next], "bench", Duration::from_secs(3600))
        {
            *tls.lock().await = both;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rotation asked for is done: the CA Secret is marked for it and the next CA's is gone.
async fn rotated(client: &Client) -> Result<bool, SimError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let marked = secrets
        .get_opt(&names::ca_secret_name(CLUSTER))
        .await?
        .is_some_and(|s| {
            s.annotations()
                .get(names::CA_ROTATED_FOR_ANNOTATION)
                .map(String::as_str)
                == Some(ROTATION_REQUEST)
        });
    Ok(marked
        && secrets
            .get_opt(&names::next_ca_secret_name(CLUSTER))
            .await?
            .is_none())
}

async fn wait_for(
    what: &str,
    client: &Client,
    old: &[String],
    change: Option<Change>,
) -> Result<(), SimError> {
    let start = Instant::now();
    while !(settled_without(client, old).await?
        && (change != Some(Change::CaRotation) || rotated(client).await?))
    {
        if start.elapsed() > TIMEOUT {
            return Err(SimError::Timeout(format!("{what} after {TIMEOUT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Create a 3-member cluster (no control plane), then roll it with `change` while a client
/// writes; the longest write gap during the rollout.
pub async fn rollout(work_dir: &Path, slot: u8, change: Change) -> Result<RolloutRun, SimError> {
    let _ = std::fs::remove_dir_all(work_dir);
    let plane = Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, PREFIX_BASE.saturating_add(slot)],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        ..Default::default()
    })
    .await?;
    let client = plane.client.clone();
    create_managed_cluster(
        &client,
        NAMESPACE,
        &ManagedCluster {
            name: CLUSTER,
            replicas: 3,
            zones: &["zone-a", "zone-b", "zone-c"],
            config_spec: json!({}),
            health_check: Value::Null,
            with_kcp: false,
            extra_spec: Value::Null,
        },
    )
    .await?;
    wait_for("3 members not Ready", &client, &[], None).await?;
    let tls = etcd_tls(&client, NAMESPACE, CLUSTER)
        .await?
        .ok_or_else(|| SimError::Setup("no etcd CA".into()))?;
    let tls: SharedTls = Arc::new(Mutex::new(
        tls.client_config()
            .map_err(|e| SimError::Setup(format!("client certificate: {e}")))?,
    ));
    let current = read_ca(&client, &names::ca_secret_name(CLUSTER))
        .await?
        .ok_or_else(|| SimError::Setup("no etcd CA".into()))?;
    let old = machine_names(&client).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let urls = Arc::new(Mutex::new(machine_urls(&client, NAMESPACE, CLUSTER).await?));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let follower = tokio::spawn(follow_urls(client.clone(), urls.clone(), stop.clone()));
    let ca_follower = tokio::spawn(follow_next_ca(client.clone(), current, tls.clone()));
    let writer = tokio::spawn(write_until(stop.clone(), urls, tls, writes.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let patch = match change {
        Change::Settings => {
            json!({"spec": {"etcdadmConfigSpec": {"etcdSettings": {"snapshot-count": 50000}}}})
        }
        Change::CaRotation => {
            json!({"metadata": {"annotations": {names::ROTATE_CA_ANNOTATION: ROTATION_REQUEST}}})
        }
    };
    Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
        .patch(
            &format!("{CLUSTER}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    let outcome = wait_for("the rollout did not finish", &client, &old, Some(change)).await;
    let wall = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = writer.await;
    follower.abort();
    ca_follower.abort();
    drop(plane);
    outcome?;
    let w = writes.lock().await;
    Ok(RolloutRun {
        wall,
        max_gap: w.max_gap,
        writes: w.acked,
    })
}

/// `median, p95, max` of `values` (nearest rank).
pub fn distribution(values: &[Duration]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = |p: f64| {
        let at = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
        sorted.get(at).map_or(0.0, Duration::as_secs_f64)
    };
    format!(
        "median {:.2} s, p95 {:.2} s, max {:.2} s over {} runs",
        rank(0.5),
        rank(0.95),
        rank(1.0),
        sorted.len()
    )
}

/// `runs` rollouts, `parallel` at a time; prints each run and the distribution of the longest
/// write gaps.
pub async fn run_rollout(
    work_dir: &Path,
    runs: usize,
    parallel: usize,
    change: Change,
) -> Result<(), SimError> {
    let (what, flag) = match change {
        Change::Settings => ("rolling replacement (etcdSettings change", ""),
        Change::CaRotation => ("etcd CA rotation (three rolls", " --ca-rotation"),
    };
    println!(
        "3-member {what}, no control plane) under a client writing every 50 ms, {parallel} at a time; \
         command: etcdadm-sim bench rollout --runs {runs} --parallel {parallel}{flag}"
    );
    let parallel = parallel.clamp(1, 16);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut slots = Vec::new();
    for slot in 0..parallel {
        let (next, work_dir): (_, PathBuf) = (next.clone(), work_dir.to_path_buf());
        slots.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let run = next.fetch_add(1, Ordering::SeqCst);
                if run >= runs {
                    return done;
                }
                let dir = work_dir.join(format!("rollout-{run}"));
                let result = rollout(&dir, u8::try_from(slot).unwrap_or(0), change).await;
                match &result {
                    Ok(r) => {
                        println!(
                            "run {run:>2}: rolled in {:>5.1} s, {} writes, longest write gap {:.2} s",
                            r.wall.as_secs_f64(),
                            r.writes,
                            r.max_gap.as_secs_f64()
                        );
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    Err(e) => println!("run {run:>2}: failed: {e} (logs in {})", dir.display()),
                }
                done.push(result);
            }
        }));
    }
    let mut gaps = Vec::new();
    let mut failed = 0;
    for slot in slots {
        for result in slot.await.unwrap_or_default() {
            match result {
                Ok(r) => gaps.push(r.max_gap),
                Err(_) => failed += 1,
            }
        }
    }
    println!(
        "longest write gap per run: {}; {failed} runs failed",
        distribution(&gaps)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distribution_is_nearest_rank() {
        let values: Vec<Duration> = (1..=20).map(|s| Duration::from_millis(s * 100)).collect();
        assert_eq!(
            distribution(&values),
            "median 1.00 s, p95 1.90 s, max 2.00 s over 20 runs"
        );
        assert_eq!(
            distribution(&[Duration::from_millis(300)]),
            "median 0.30 s, p95 0.30 s, max 0.30 s over 1 runs"
        );
    }
}
