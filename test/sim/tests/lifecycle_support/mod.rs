#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]
//! What the lifecycle scenarios share: a plane with both controller binaries, watchers that
//! record membership (from etcd) and Machines (from the API) on one clock, a client writing and
//! reading through the etcd endpoints every 50 ms, seeded randomness, and waits that explain
//! themselves when they time out.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::names;
use etcdadm_shared::pki::IssuedCertificate;
use etcdadm_shared::testing::{SeaweedFs, TempDir, mtls_http_client};
use etcdadm_sim::demo;
use etcdadm_sim::history::{History, MachineLog, MachineRecorder, RECORD_EVERY, Recorder};
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster, create_store_secrets};
use etcdadm_sim::plane::{Plane, PlaneOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

pub mod real_apiserver;
pub mod real_etcdadm;

pub const CONTROLLER: &str = "etcdadm-controller";

/// Health checks fast enough for tests: a member is remediated 5 s after it went bad.
pub fn fast_health() -> Value {
    json!({"interval": "1s", "timeout": "1s", "unhealthyAfter": "5s"})
}

pub async fn start_plane(prefix: u8, work: &TempDir, kcp_rollout_step: Duration) -> Plane {
    start_plane_on(None, prefix, work, kcp_rollout_step).await
}

/// A namespace of this scenario's own (prefix and process), so runs sharing an API server
/// (`SIM_KUBECONFIG`) never see each other's objects.
pub fn scenario_namespace(prefix: u8) -> String {
    format!("sim-{prefix}-{}", std::process::id())
}

/// [`start_plane`] on `real` when given (a real kube-apiserver, controllers under their own
/// RBAC), else on the in-memory server or `SIM_KUBECONFIG`'s.
pub async fn start_plane_on(
    real: Option<&real_apiserver::RealApiServer>,
    prefix: u8,
    work: &TempDir,
    kcp_rollout_step: Duration,
) -> Plane {
    let options = plane_options(prefix, work, kcp_rollout_step);
    let options = match real {
        Some(real) => real.plane_options(options),
        None => options,
    };
    Plane::start(options).await.unwrap()
}

/// What [`start_plane`] starts, for a scenario that changes something first.
pub fn plane_options(prefix: u8, work: &TempDir, kcp_rollout_step: Duration) -> PlaneOptions {
    PlaneOptions {
        work_dir: work.path().to_path_buf(),
        ip_prefix: [127, 0, prefix],
        kubeconfig: std::env::var_os("SIM_KUBECONFIG").map(Into::into),
        machine_runtime: None,
        controllers: vec!["etcdadm-bootstrap", CONTROLLER],
        kcp_rollout_step,
        namespace: scenario_namespace(prefix),
        ..Default::default()
    }
}

/// The last lines of both controllers' logs, for failure messages, after any refusal by the API
/// server (a missing RBAC verb shows there first).
pub fn logs(work: &TempDir) -> String {
    ["etcdadm-controller.log", "etcdadm-bootstrap.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(work.path().join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let forbidden = real_apiserver::forbidden_lines(&text);
            format!(
                "--- {f}: refused by the API server\n{forbidden}\n--- {f} (last 60 lines, newest first)\n{}\n",
                tail.join("\n")
            )
        })
        .collect()
}

pub fn etcd_api(client: &Client) -> Api<EtcdadmCluster> {
    Api::default_namespaced(client.clone())
}

pub async fn create(
    client: &Client,
    name: &str,
    replicas: i32,
    with_kcp: bool,
    config_spec: Value,
    extra_spec: Value,
) {
    create_managed_cluster(
        client,
        client.default_namespace(),
        &ManagedCluster {
            name,
            replicas,
            zones: &["zone-a", "zone-b", "zone-c"],
            config_spec,
            health_check: fast_health(),
            with_kcp,
            extra_spec,
        },
    )
    .await
    .unwrap();
}

/// The Secret [`CREDENTIALS_SECRET`] with `s3`'s access key, which a `spec.backup.store` names,
/// and for an https server the Secret [`CA_SECRET`] with its CA.
pub async fn store_credentials(client: &Client, s3: &SeaweedFs) {
    create_store_secrets(client, s3).await.unwrap();
}

/// Merge-patch the EtcdadmCluster `<cluster>-etcd`'s spec.
pub async fn patch_spec(client: &Client, cluster: &str, spec: Value) {
    etcd_api(client)
        .patch(
            &format!("{cluster}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

pub async fn machines(client: &Client, cluster: &str) -> Vec<Machine> {
    let selector = format!("{}={cluster}-etcd", names::ETCD_CLUSTER_LABEL);
    Api::<Machine>::default_namespaced(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// `(status, reason, message)` of condition `type_`.
pub fn condition(etcd: &EtcdadmCluster, type_: &str) -> (String, String, String) {
    let status = serde_json::to_value(etcd.status.clone().unwrap_or_default()).unwrap();
    let found = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null);
    let text = |k: &str| found[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

/// The cluster settled at `replicas`: Ready for the current generation, every Machine an up to
/// date healthy member, none being deleted, no leftovers, and (with a KCP) the control plane on
/// the current endpoints with its rollout finished.
pub async fn settled(client: &Client, cluster: &str, replicas: usize) -> Result<EtcdadmCluster, String> {
    let etcd = etcd_api(client)
        .get(&format!("{cluster}-etcd"))
        .await
        .map_err(|e| e.to_string())?;
    let status = etcd.status.clone().unwrap_or_default();
    let machines = machines(client, cluster).await;
    let member_names: Vec<&str> = status
        .members
        .iter()
        .filter(|m| m.healthy && m.machine_ref.is_some())
        .map(|m| m.name.as_str())
        .collect();
    let (ready, ..) = condition(&etcd, "Ready");
    let (_, _, ready_message) = condition(&etcd, "Ready");
    // Each Machine's user data ran to its end (its bootstrap succeeded), so a read of every
    // member meets no member still starting.
    let names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    let booting = etcdadm_sim::infra::bootstrap_not_done(client, client.default_namespace(), &names)
        .await
        .map_err(|e| e.to_string())?;
    let state = format!(
        "ready={} generation={:?}/{:?} updated={:?} members={:?} machines={:?} bootstrap not done={booting:?} Ready: {ready_message}",
        status.ready,
        status.observed_generation,
        etcd.metadata.generation,
        status.updated_replicas,
        member_names,
        machines
            .iter()
            .map(|m| format!(
                "{}{}",
                m.name_any(),
                if m.is_deleting() { "(deleting)" } else { "" }
            ))
            .collect::<Vec<_>>()
    );
    let done = status.ready
        && ready == "True"
        && status.observed_generation == etcd.metadata.generation
        && status.updated_replicas == Some(replicas as i32)
        && status.members.len() == replicas
        && member_names.len() == replicas
        && machines.len() == replicas
        && machines.iter().all(|m| !m.is_deleting())
        && booting.is_empty()
        && condition(&etcd, "MachinesSpecUpToDate").0 == "True";
    if !done {
        return Err(state);
    }
    let leftovers = leftover_count(client, cluster, &machines).await;
    if leftovers > 0 {
        return Err(format!("{leftovers} leftover configs or infra machines; {state}"));
    }
    if let Some(kcp) = kcp(client, cluster).await {
        let ControlPlaneEtcd::External(mut endpoints) = kcp.etcd() else {
            return Err("KCP lost etcd.external".into());
        };
        endpoints.sort();
        if endpoints.join(",") != status.endpoints || !kcp.rollout_complete() {
            return Err(format!(
                "KCP endpoints {endpoints:?} (rollout complete: {}) vs {}; {state}",
                kcp.rollout_complete(),
                status.endpoints
            ));
        }
    }
    Ok(etcd)
}

/// EtcdadmConfigs and SimMachines of the cluster that belong to no Machine.
async fn leftover_count(client: &Client, cluster: &str, machines: &[Machine]) -> usize {
    let selector = format!("{}={cluster}-etcd", names::ETCD_CLUSTER_LABEL);
    let params = ListParams::default().labels(&selector);
    let configs = Api::<etcdadm_shared::api::EtcdadmConfig>::default_namespaced(client.clone())
        .list(&params)
        .await
        .unwrap()
        .items;
    let sims = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        client.default_namespace(),
        &etcdadm_sim::capi::sim_machine_resource(),
    )
    .list(&params)
    .await
    .unwrap()
    .items;
    let names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    configs
        .iter()
        .map(|c| c.name_any())
        .chain(sims.iter().map(|s| s.name_any()))
        .filter(|n| !names.contains(n))
        .count()
}

/// The name of the member `etcd`'s status last saw leading.
pub fn leader(etcd: &EtcdadmCluster) -> String {
    let members = etcd
        .status
        .as_ref()
        .map(|s| s.members.as_slice())
        .unwrap_or_default();
    members
        .iter()
        .find(|m| m.is_leader)
        .unwrap_or_else(|| panic!("no leader in {members:?}"))
        .name
        .clone()
}

pub async fn kcp(client: &Client, cluster: &str) -> Option<KubeadmControlPlane> {
    Api::<KubeadmControlPlane>::default_namespaced(client.clone())
        .get_opt(&format!("{cluster}-control-plane"))
        .await
        .unwrap()
}

/// Wait until [`settled`]; panics with the last state and the logs.
pub async fn wait_settled(
    client: &Client,
    cluster: &str,
    replicas: usize,
    timeout: Duration,
    work: &TempDir,
) -> EtcdadmCluster {
    let deadline = Instant::now() + timeout;
    loop {
        match settled(client, cluster, replicas).await {
            Ok(etcd) => return etcd,
            Err(state) if Instant::now() > deadline => {
                panic!(
                    "{cluster} not settled at {replicas} after {timeout:?}: {state}\n{}",
                    logs(work)
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Membership (from etcd) and Machines (from the API), recorded on one clock.
pub struct Watchers {
    pub started: Instant,
    recorder: Recorder,
    machines: MachineRecorder,
    refresher: tokio::task::JoinHandle<()>,
}

impl Watchers {
    pub async fn start(client: &Client, cluster: &str) -> Watchers {
        let tls = demo::eventually("etcd CA", Duration::from_secs(60), || async {
            Ok(demo::etcd_tls(client, client.default_namespace(), cluster)
                .await?
                .ok_or_else(|| "no CA yet".to_string()))
        })
        .await
        .unwrap();
        let tls = Arc::new(Mutex::new(Some(tls.client_config().unwrap())));
        Watchers::following(client, cluster, tls, Duration::from_secs(2)).await
    }

    /// [`Watchers::start`] reading etcd with TLS settings the scenario may swap (a CA rotation's
    /// client of both CAs), passing over a member that does not answer within `patience`.
    pub async fn following(
        client: &Client,
        cluster: &str,
        tls: Arc<Mutex<Option<Arc<rustls::ClientConfig>>>>,
        patience: Duration,
    ) -> Watchers {
        let urls = Arc::new(Mutex::new(Vec::<String>::new()));
        let polled = urls.clone();
        let started = Instant::now();
        let recorder = Recorder::following(
            started,
            tls,
            move || polled.lock().unwrap().clone(),
            RECORD_EVERY,
            patience,
        );
        let selector = format!("{}={cluster}-etcd", names::ETCD_CLUSTER_LABEL);
        let machines = MachineRecorder::start(
            client.clone(),
            client.default_namespace(),
            &selector,
            started,
            Duration::from_millis(100),
        );
        let (client, cluster) = (client.clone(), cluster.to_string());
        let refresher = tokio::spawn(async move {
            loop {
                if let Ok(found) = demo::machine_urls(&client, client.default_namespace(), &cluster).await {
                    // Rotate so one stopped member does not make every poll wait for it.
                    let mut found = found;
                    let shift = (started.elapsed().as_millis() / 200) as usize;
                    if !found.is_empty() {
                        let n = shift % found.len();
                        found.rotate_left(n);
                    }
                    *urls.lock().unwrap() = found;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Watchers {
            started,
            recorder,
            machines,
            refresher,
        }
    }

    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn history(&self) -> History {
        self.recorder.snapshot()
    }

    pub fn machines(&self) -> MachineLog {
        self.machines.snapshot()
    }

    pub fn finish(self) -> (History, MachineLog) {
        self.refresher.abort();
        (self.recorder.finish(), self.machines.finish())
    }
}

/// The membership safety rules on what etcd and the API recorded.
pub fn assert_safe(history: &History, machines: &MachineLog) {
    assert!(
        history.max_pending_joins() <= 1,
        "two joins in flight: {history:#?}"
    );
    assert!(
        history.max_changes_per_step() <= 1,
        "two membership changes at once: {history:#?}"
    );
    assert!(history.max_learners() <= 1, "two learners at once: {history:#?}");
    let twice = history.names_with_several_ids();
    assert!(twice.is_empty(), "a Machine's member was added twice: {twice:?}");
    let outliving = history.machines_outliving_members(machines);
    assert!(
        outliving.is_empty(),
        "Machines gone before their members: {outliving:?}\n{history:#?}\n{machines:#?}"
    );
}

/// A tiny seeded generator (splitmix64): runs are reproducible from their seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, max]`.
    pub fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.next_u64() % (max + 1))
    }
}

/// What the client saw.
#[derive(Clone, Debug, Default)]
pub struct WorkloadReport {
    pub acked: usize,
    /// Longest time between two acknowledged writes, and when it ended.
    pub max_gap: Duration,
    pub max_gap_at: Duration,
    pub failed_attempts: usize,
    pub endpoint_switches: usize,
    /// Acknowledged writes missing or different when read back.
    pub lost: Vec<String>,
}

/// A client writing a new key and reading it back every 50 ms through whichever endpoint of
/// `endpoints` works (pinned until it fails, as etcd's own client does), like an apiserver.
pub struct Workload {
    /// The client it writes with: swapped when the control plane is rolled onto new
    /// certificates (`Workload::follow_control_plane_rollouts`).
    http: Arc<Mutex<reqwest::Client>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<WorkloadReport>,
}

const PREFIX: &str = "/lifecycle/";
const OP_TIMEOUT: Duration = Duration::from_secs(1);

fn b64(text: &str) -> Value {
    serde_json::to_value(ByteString(text.as_bytes().to_vec())).unwrap()
}

fn unb64(value: &Value) -> Option<String> {
    let bytes: ByteString = serde_json::from_value(value.clone()).ok()?;
    String::from_utf8(bytes.0).ok()
}

impl Workload {
    /// TLS from the KCP's Secrets (`<cluster>-etcd`, `<cluster>-apiserver-etcd-client`), else a
    /// client certificate minted from the etcd CA.
    pub async fn start(
        client: &Client,
        cluster: &str,
        endpoints: Arc<Mutex<Vec<String>>>,
        started: Instant,
    ) -> Workload {
        let secrets: Api<Secret> = Api::default_namespaced(client.clone());
        let text = |s: &Secret, k: &str| String::from_utf8(s.data.as_ref().unwrap()[k].0.clone()).unwrap();
        let (ca_pem, cert) = match (
            secrets
                .get_opt(&names::kcp_etcd_ca_secret_name(cluster))
                .await
                .unwrap(),
            secrets
                .get_opt(&names::apiserver_client_secret_name(cluster))
                .await
                .unwrap(),
        ) {
            (Some(ca), Some(leaf)) => (
                text(&ca, names::TLS_CERT_KEY),
                IssuedCertificate {
                    cert_pem: text(&leaf, names::TLS_CERT_KEY),
                    key_pem: text(&leaf, names::TLS_KEY_KEY),
                    not_after: std::time::SystemTime::now() + Duration::from_secs(3600),
                },
            ),
            _ => {
                let tls = demo::etcd_tls(client, client.default_namespace(), cluster)
                    .await
                    .unwrap()
                    .unwrap();
                (
                    tls.ca_pem.clone(),
                    IssuedCertificate {
                        cert_pem: tls.cert_pem,
                        key_pem: tls.key_pem,
                        not_after: std::time::SystemTime::now() + Duration::from_secs(3600),
                    },
                )
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let http = Arc::new(Mutex::new(mtls_http_client(&ca_pem, &cert)));
        let writer = http.clone();
        let task = tokio::spawn(async move {
            let post = |url: String, body: Value| {
                let http = writer.lock().unwrap().clone();
                async move {
                    // No traffic to a lab's subnet once its bridge is gone.
                    etcdadm_sim_machines::network::guard(&url)?;
                    let send = http.post(url).json(&body).send();
                    let response = tokio::time::timeout(OP_TIMEOUT, send)
                        .await
                        .map_err(|_| "timed out".to_string())?
                        .map_err(|e| e.to_string())?;
                    let status = response.status();
                    let text = tokio::time::timeout(OP_TIMEOUT, response.text())
                        .await
                        .map_err(|_| "timed out".to_string())?
                        .map_err(|e| e.to_string())?;
                    if !status.is_success() {
                        return Err(format!("{status}: {text}"));
                    }
                    serde_json::from_str::<Value>(&text).map_err(|e| e.to_string())
                }
            };
            let mut report = WorkloadReport::default();
            let mut acked: Vec<(String, String)> = Vec::new();
            let mut pinned: Option<String> = None;
            let mut last_ack = Instant::now();
            let mut i = 0u64;
            let pick =
                |pinned: &mut Option<String>, skip: bool, report: &mut WorkloadReport| -> Option<String> {
                    let list = endpoints.lock().unwrap().clone();
                    if list.is_empty() {
                        return None;
                    }
                    let current = pinned.as_ref().and_then(|p| list.iter().position(|e| e == p));
                    let next = match (current, skip) {
                        (Some(at), false) => at,
                        (Some(at), true) => (at + 1) % list.len(),
                        (None, _) => 0,
                    };
                    if current != Some(next) {
                        report.endpoint_switches += 1;
                    }
                    *pinned = Some(list[next].clone());
                    pinned.clone()
                };
            while !stopping.load(Ordering::Relaxed) {
                i += 1;
                let key = format!("{PREFIX}{i:08}");
                let value = format!("value-{i}");
                // Write until acknowledged, failing over between endpoints.
                let mut skip = false;
                loop {
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    let Some(url) = pick(&mut pinned, skip, &mut report) else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    match post(
                        format!("{url}/v3/kv/put"),
                        json!({"key": b64(&key), "value": b64(&value)}),
                    )
                    .await
                    {
                        Ok(_) => {
                            let gap = last_ack.elapsed();
                            if !acked.is_empty() && gap > report.max_gap {
                                report.max_gap = gap;
                                report.max_gap_at = started.elapsed();
                            }
                            last_ack = Instant::now();
                            acked.push((key.clone(), value.clone()));
                            break;
                        }
                        Err(_) => {
                            report.failed_attempts += 1;
                            skip = true;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                // Read it back (linearizable) through the same endpoint, or the next.
                for _ in 0..3 {
                    let Some(url) = pick(&mut pinned, false, &mut report) else {
                        break;
                    };
                    match post(format!("{url}/v3/kv/range"), json!({"key": b64(&key)})).await {
                        Ok(answer) => {
                            let got = answer["kvs"][0]["value"].clone();
                            if acked.last().map(|(k, _)| k) == Some(&key)
                                && unb64(&got).as_deref() != Some(value.as_str())
                            {
                                report
                                    .lost
                                    .push(format!("{key}: read {got} right after writing {value}"));
                            }
                            break;
                        }
                        Err(_) => {
                            report.failed_attempts += 1;
                            let _ = pick(&mut pinned, true, &mut report);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Every acknowledged write must still be there.
            let prefix_end = format!("{}0", PREFIX.trim_end_matches('/'));
            let body = json!({"key": b64(PREFIX), "range_end": b64(&prefix_end)});
            let mut stored = None;
            for _ in 0..20 {
                let list = endpoints.lock().unwrap().clone();
                for url in list {
                    if let Ok(answer) = post(format!("{url}/v3/kv/range"), body.clone()).await {
                        stored = Some(answer);
                        break;
                    }
                }
                if stored.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let Some(stored) = stored else {
                report.lost.push("no endpoint answered the final read".into());
                return report;
            };
            let found: std::collections::BTreeMap<String, String> = stored["kvs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|kv| Some((unb64(&kv["key"])?, unb64(&kv["value"])?)))
                .collect();
            for (key, value) in &acked {
                if found.get(key) != Some(value) {
                    report
                        .lost
                        .push(format!("{key}: {:?} instead of {value}", found.get(key)));
                }
            }
            report.acked = acked.len();
            report
        });
        Workload { http, stop, task }
    }

    /// Write, from now on, with what the control plane is given (`<cluster>-etcd`,
    /// `<cluster>-apiserver-etcd-client`) each time the KubeadmControlPlane `<cluster>-control-plane`
    /// is asked for a rollout (`spec.rollout.after` moves): as its API servers would once
    /// replaced. Until then the client keeps the certificates it has.
    pub fn follow_control_plane_rollouts(
        &self,
        client: &Client,
        cluster: &str,
    ) -> tokio::task::JoinHandle<()> {
        let (client, cluster, http) = (client.clone(), cluster.to_string(), self.http.clone());
        tokio::spawn(async move {
            let secrets: Api<Secret> = Api::default_namespaced(client.clone());
            let text = |s: &Secret, k: &str| String::from_utf8(s.data.as_ref()?.get(k)?.0.clone()).ok();
            let mut seen = kcp(&client, &cluster).await.and_then(|k| k.rollout_after());
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let after = kcp(&client, &cluster).await.and_then(|k| k.rollout_after());
                if after == seen {
                    continue;
                }
                let (Ok(Some(ca)), Ok(Some(leaf))) = (
                    secrets.get_opt(&names::kcp_etcd_ca_secret_name(&cluster)).await,
                    secrets
                        .get_opt(&names::apiserver_client_secret_name(&cluster))
                        .await,
                ) else {
                    continue;
                };
                let (Some(ca_pem), Some(cert_pem), Some(key_pem)) = (
                    text(&ca, names::TLS_CERT_KEY),
                    text(&leaf, names::TLS_CERT_KEY),
                    text(&leaf, names::TLS_KEY_KEY),
                ) else {
                    continue;
                };
                let cert = IssuedCertificate {
                    cert_pem,
                    key_pem,
                    not_after: std::time::SystemTime::now() + Duration::from_secs(3600),
                };
                *http.lock().unwrap() = mtls_http_client(&ca_pem, &cert);
                seen = after;
            }
        })
    }

    pub async fn finish(self) -> WorkloadReport {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Keep `endpoints` on what the KubeadmControlPlane `<cluster>-control-plane` lists (as a
/// control plane Machine created now would be given).
pub fn follow_kcp_endpoints(
    client: &Client,
    cluster: &str,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let endpoints = Arc::new(Mutex::new(Vec::new()));
    let shared = endpoints.clone();
    let (client, cluster) = (client.clone(), cluster.to_string());
    let task = tokio::spawn(async move {
        loop {
            if let Some(kcp) = kcp(&client, &cluster).await
                && let ControlPlaneEtcd::External(list) = kcp.etcd()
            {
                *shared.lock().unwrap() = list;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (endpoints, task)
}

/// Every change of what `pick` reads from `<cluster>-etcd`, in order, from a watch: a state that
/// lasts less than a poll's interval is seen too. The first value is the one the watch lists.
pub fn follow_etcd_cluster<T>(
    client: &Client,
    cluster: &str,
    pick: impl Fn(EtcdadmCluster) -> T + Send + 'static,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<T>,
    tokio::task::JoinHandle<()>,
)
where
    T: PartialEq + Clone + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let (tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let config = watcher::Config::default().fields(&format!("metadata.name={cluster}-etcd"));
    let stream = watcher(etcd_api(client), config).applied_objects();
    let task = tokio::spawn(async move {
        tokio::pin!(stream);
        let mut last = None;
        while let Some(event) = stream.next().await {
            let Ok(etcd) = event else { continue };
            let now = pick(etcd);
            if last.as_ref() != Some(&now) {
                last = Some(now.clone());
                if tx.send(now).is_err() {
                    return;
                }
            }
        }
    });
    (changes, task)
}

/// Keep `endpoints` on the EtcdadmCluster's `status.endpoints` (a client without a KCP).
pub fn follow_status_endpoints(
    client: &Client,
    cluster: &str,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let endpoints = Arc::new(Mutex::new(Vec::new()));
    let shared = endpoints.clone();
    let (client, cluster) = (client.clone(), cluster.to_string());
    let task = tokio::spawn(async move {
        loop {
            if let Ok(etcd) = etcd_api(&client).get(&format!("{cluster}-etcd")).await {
                let list: Vec<String> = etcd
                    .status
                    .unwrap_or_default()
                    .endpoints
                    .split(',')
                    .filter(|e| !e.is_empty())
                    .map(String::from)
                    .collect();
                if !list.is_empty() {
                    *shared.lock().unwrap() = list;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (endpoints, task)
}

/// Names of the Events of the EtcdadmCluster `<cluster>-etcd` with their notes.
pub async fn events(client: &Client, cluster: &str) -> Vec<(String, String)> {
    events_about(client, &format!("{cluster}-etcd")).await
}

/// The reasons and notes of the Events about the object `name` (of any kind).
pub async fn events_about(client: &Client, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(client.clone());
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// With `SIM_LOG_DIR` set, copy the controllers' logs and the machines' cloud-init output there
/// (as `<scenario>-<file>`): the work directory goes with the test.
pub fn save_logs(work: &TempDir, scenario: &str) {
    etcdadm_sim::saved_logs::save(work.path(), scenario);
}

/// The longest a rolling replacement of three members may take.
pub const ROLL_TIMEOUT: Duration = Duration::from_secs(180);
/// The longest a client may wait for an acknowledged write.
pub const MAX_WRITE_GAP: Duration = Duration::from_secs(2);

pub async fn machine_names(client: &kube::Client, cluster: &str) -> BTreeSet<String> {
    machines(client, cluster)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect()
}

/// A client certificate for etcd issued by `ca`, valid ten minutes.
pub fn client_tls(ca: &etcdadm_shared::pki::CertificateAuthority) -> etcdadm_shared::etcd::EtcdTls {
    etcdadm_shared::etcd::EtcdTls::issued_by(ca, "bench", Duration::from_secs(600)).unwrap()
}

/// What a rolling replacement took and what the client saw.
pub struct Outcome {
    pub wall: Duration,
    pub peak_members: usize,
    pub kcp_writes: usize,
    pub max_gap: Duration,
}

/// Change the spec with `patch`, keep a client busy meanwhile, wait until every Machine was
/// replaced; check the membership rules and what the client saw.
pub async fn roll(
    plane: &etcdadm_sim::plane::Plane,
    work: &TempDir,
    watchers: &Watchers,
    cluster: &str,
    with_kcp: bool,
    patch: Value,
) -> Outcome {
    let client = &plane.client;
    let old = machine_names(client, cluster).await;
    let (endpoints, follower) = if with_kcp {
        follow_kcp_endpoints(client, cluster)
    } else {
        follow_status_endpoints(client, cluster)
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = Workload::start(client, cluster, endpoints, watchers.started).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kcp_before = plane.kcp_record.lock().unwrap().endpoint_changes.len();
    let t0 = watchers.now();
    let started = Instant::now();
    patch_spec(client, cluster, patch).await;
    let deadline = Instant::now() + ROLL_TIMEOUT;
    loop {
        let etcd = wait_settled(client, cluster, old.len(), ROLL_TIMEOUT, work).await;
        let now = machine_names(client, cluster).await;
        if now.is_disjoint(&old) {
            let status = etcd.status.unwrap();
            assert!(status.members.iter().all(|m| !old.contains(&m.name)));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old Machines remain: {now:?}\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    let t1 = watchers.now();
    // Let the KCP stand-in take its last look, and the client a few more writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = workload.finish().await;
    follower.abort();
    let kcp_writes = plane.kcp_record.lock().unwrap().endpoint_changes.len() - kcp_before;
    // The recorder polls etcd every 100 ms through the Machines it knows; on a loaded machine its
    // latest read may still predate the last removal: give it a few seconds to see the end.
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline
        && !watchers
            .history()
            .last()
            .is_some_and(|s| s.names().is_disjoint(&old))
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let history = watchers.history();
    let machine_log = watchers.machines();
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );
    assert!(report.acked > 50, "the client hardly wrote: {report:?}");
    assert!(
        report.max_gap < MAX_WRITE_GAP,
        "the client waited {:?} for a write (at {:?}): {report:?}\n{history:#?}\n{}",
        report.max_gap,
        report.max_gap_at,
        logs(work)
    );
    for name in &old {
        let life = &machine_log.lives[name];
        assert!(life.gone.is_some(), "old Machine {name} not gone");
    }
    let last: BTreeSet<String> = history.last().unwrap().names();
    assert!(last.is_disjoint(&old), "old members remain in etcd: {last:?}");
    assert_safe(&history, &machine_log);
    // Every new member ran with its settings from its first start: none was restarted after
    // its join (a restart right after a join costs the grown cluster a member).
    if let Some(runtime) = plane.built_in.as_ref() {
        for name in machine_names(client, cluster).await {
            assert_eq!(
                runtime.etcd_starts(&name).unwrap(),
                1,
                "{name}'s etcd was started more than once\n{}",
                logs(work)
            );
        }
    }
    let peak_members = history.max_size_between(t0, t1);
    println!(
        "{cluster}: rolled {} members in {:.1}s; peak {peak_members} members; {kcp_writes} KCP endpoint updates; client: {} writes, longest gap {:?}, {} failed attempts, {} endpoint switches",
        old.len(),
        wall.as_secs_f64(),
        report.acked,
        report.max_gap,
        report.failed_attempts,
        report.endpoint_switches
    );
    Outcome {
        wall,
        peak_members,
        kcp_writes,
        max_gap: report.max_gap,
    }
}

/// Every member that joined after the first was first seen as a learner and later as a voter.
pub fn assert_learner_joins(history: &etcdadm_sim::history::History, joined: usize) {
    let joins = history.joins();
    let promoted = joins
        .iter()
        .filter(|(_, learner, voter)| *learner && *voter)
        .count();
    assert_eq!(
        (joins.len(), promoted),
        (joined, joined),
        "every join must be a learner add, then its promotion: {joins:?}\n{history:#?}"
    );
}

/// The snapshot `name`, once Succeeded (a Failed one or a minute's wait fails the test).
pub async fn wait_succeeded(snapshots: &Api<EtcdadmSnapshot>, name: &str, work: &TempDir) -> EtcdadmSnapshot {
    let started = Instant::now();
    loop {
        let current = snapshots.get(name).await.unwrap();
        match current.phase() {
            SnapshotPhase::Succeeded => return current,
            SnapshotPhase::Failed => panic!("snapshot failed: {:?}\n{}", current.status, logs(work)),
            _ if started.elapsed() > Duration::from_secs(60) => {
                panic!(
                    "snapshot not taken within 60 s: {:?}\n{}",
                    current.status,
                    logs(work)
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// An on-demand snapshot `name` of the EtcdadmCluster `<cluster>-etcd`, once Succeeded.
pub async fn take_snapshot(client: &Client, cluster: &str, name: &str, work: &TempDir) -> EtcdadmSnapshot {
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let requested: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name}, "spec": {"clusterName": format!("{cluster}-etcd")},
    }))
    .unwrap();
    snapshots
        .create(&PostParams::default(), &requested)
        .await
        .unwrap();
    wait_succeeded(&snapshots, name, work).await
}

/// The etcd revision after a client wrote `count` keys `app/NNNN` through the first member
/// `etcd` lists.
pub async fn write_keys(
    client: &Client,
    cluster: &str,
    etcd: &EtcdadmCluster,
    count: usize,
) -> (MemberClient, i64) {
    let tls = demo::etcd_tls(client, client.default_namespace(), cluster)
        .await
        .unwrap()
        .unwrap();
    let url = etcd.status.clone().unwrap().members[0]
        .client_url
        .clone()
        .unwrap();
    etcdadm_sim_machines::network::guard(&url).unwrap();
    let member = MemberClient::new(&url, &tls, Duration::from_secs(5)).unwrap();
    let mut kv = member.workload_client().await.unwrap();
    for i in 0..count {
        kv.put(format!("app/{i:04}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    let written = member.local_revision().await.unwrap();
    (member, written)
}

/// What a watch of `prefix` from `revision`, opened on `member`, is told about compaction: the
/// compact revision of its first answer that names one or cancels the watch (0 if it was
/// cancelled for another reason). Panics if the watch ends unanswered.
pub async fn compact_revision_seen_from(member: &MemberClient, prefix: &str, revision: i64) -> i64 {
    let mut kv = member.workload_client().await.unwrap();
    let options = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision);
    let mut stream = kv.watch(prefix, Some(options)).await.unwrap();
    loop {
        let answer = stream
            .message()
            .await
            .unwrap()
            .expect("the watch ended unanswered");
        if answer.compact_revision() > 0 || answer.canceled() {
            return answer.compact_revision();
        }
    }
}

/// `check`'s answer, polled by `demo::eventually` for at most `timeout`; a timeout panics with
/// what was waited for and the controllers' logs.
pub async fn wait_until<T, F, Fut>(work: &TempDir, what: &str, timeout: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    demo::eventually(what, timeout, || {
        let checked = check();
        async move { Ok(checked.await.ok_or_else(|| "not yet".to_string())) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(work)))
}

/// Set (or with `None` remove) the annotation `key` of the EtcdadmCluster `<cluster>-etcd`.
pub async fn annotate_etcd_cluster(client: &Client, cluster: &str, key: &str, value: Option<&str>) {
    etcd_api(client)
        .patch(
            &format!("{cluster}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// The object key of a Succeeded snapshot in `bucket` (its location without the bucket).
pub fn object_key(snapshot: &EtcdadmSnapshot, bucket: &str) -> String {
    let location = snapshot.status.clone().unwrap().location.unwrap();
    location.strip_prefix(&format!("{bucket}/")).unwrap().to_string()
}

/// The full snapshot continuous backup takes for `cluster` (`<cluster>-etcd-continuous-<time>`),
/// once Succeeded, waited for at most `timeout`.
pub async fn continuous_snapshot(
    client: &Client,
    cluster: &str,
    work: &TempDir,
    timeout: Duration,
) -> EtcdadmSnapshot {
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let prefix = format!("{cluster}-etcd-continuous-");
    wait_until(work, "a full snapshot for continuous backup", timeout, || async {
        let list = snapshots.list(&Default::default()).await.unwrap().items;
        list.into_iter()
            .find(|s| s.phase() == SnapshotPhase::Succeeded && s.name_any().starts_with(&prefix))
    })
    .await
}
