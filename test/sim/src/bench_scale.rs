//! `etcdadm-sim bench scale`: one etcdadm-controller keeping N established 3-member clusters
//! healthy, whose members are fake etcd responders, so the controller's own cost per cluster
//! is what is measured.
//!
//! Over 600 lines: the benchmark's phases in the order they run and the report they make, with
//! the fake members they measure against; one run reads top to bottom.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use crate::bench::{ChildUsage, usage_of};
use crate::error::SimError;
use crate::fake_etcd::{self, FakeCluster, ProbeLog};
use crate::plane::{
    ControllerPorts, InMemoryServer, NAMESPACE, http_get, serve_in_memory, spawn_controller_with_ports,
};

const MEMBERS: usize = 3;
const CONTROLLER: &str = "etcdadm-controller";
const BOOTSTRAP: &str = "etcdadm-bootstrap";
/// How long the bench waits for every cluster to be Ready before measuring anyway, per 1,000
/// clusters (at least this long in all).
const READY_WAIT: Duration = Duration::from_secs(300);

fn ready_wait(clusters: usize) -> Duration {
    READY_WAIT * u32::try_from(clusters.div_ceil(1000).max(1)).unwrap_or(u32::MAX)
}

/// The address of member `member` of cluster `cluster`: `127.<20 + c/250>.<c%250>.<member+1>`,
/// clear of the prefixes the tests use.
fn member_ip(cluster: usize, member: usize) -> IpAddr {
    let octet = |v: usize| u8::try_from(v).unwrap_or(u8::MAX);
    IpAddr::V4(Ipv4Addr::new(
        127,
        octet(20 + cluster / 250),
        octet(cluster % 250),
        octet(member + 1),
    ))
}

/// What `bench scale` runs.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    pub clusters: usize,
    /// The steady-state measurement window.
    pub window: Duration,
    /// The wait between the last cluster turning Ready and the window.
    pub settle: Duration,
    /// Passed to the controller as `--concurrency` when given.
    pub concurrency: Option<u16>,
    /// Also run etcdadm-bootstrap, with every member's EtcdadmConfig and data Secret in place.
    pub bootstrap: bool,
    /// After the takeover, run two controller replicas electing a leader and kill the leader.
    pub failover: bool,
}

/// A controller process the bench started, with its own log.
struct Running {
    child: tokio::process::Child,
    log: std::path::PathBuf,
    ports: ControllerPorts,
}

impl Running {
    fn start(
        work_dir: &Path,
        kubeconfig: &Path,
        name: &str,
        tag: &str,
        extra: &[String],
    ) -> Result<Running, SimError> {
        let log = work_dir.join(format!("{name}-{tag}.log"));
        let ports = ControllerPorts::choose()?;
        let child = spawn_controller_with_ports(name, kubeconfig, &log, Some(ports), extra, &[])?;
        Ok(Running { child, log, ports })
    }

    fn usage(&self) -> Option<ChildUsage> {
        usage_of(self.child.id()?)
    }

    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// `etcdadm_reconcile` summed over its label sets, from the process's metrics.
    async fn reconciles(&self) -> f64 {
        let Ok((_, text)) = http_get(self.ports.diagnostics, "/metrics").await else {
            return 0.0;
        };
        text.lines()
            .filter(|l| l.starts_with("etcdadm_reconcile_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    fn leads(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|text| text.contains("acquired the lease"))
    }
}

/// API requests between two moments, by kind (`GET secrets`, `PATCH machines/status`, ...).
struct Requests(BTreeMap<String, u64>);

impl Requests {
    fn since(server: &etcdadm_sim_apiserver::ApiServer, before: &BTreeMap<String, u64>) -> Requests {
        let mut now = server.request_tally();
        for (kind, count) in now.iter_mut() {
            *count -= before.get(kind).copied().unwrap_or_default().min(*count);
        }
        now.retain(|_, count| *count > 0);
        Requests(now)
    }

    fn total(&self, writes: bool) -> u64 {
        self.0
            .iter()
            .filter(|(kind, _)| is_write(kind) == writes)
            .map(|(_, count)| count)
            .sum()
    }

    /// The kinds of writes (or reads) with their counts, most first.
    fn top(&self, writes: bool, most: usize) -> String {
        let mut kinds: Vec<(&String, &u64)> = self
            .0
            .iter()
            .filter(|(kind, _)| is_write(kind) == writes)
            .collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = kinds.iter().take(most).map(|(k, n)| format!("{k} {n}")).collect();
        if shown.is_empty() {
            "none".into()
        } else {
            shown.join(", ")
        }
    }

    /// Writes and reads per cluster, with the most frequent kinds of each.
    fn report(&self, clusters: usize) -> String {
        let per = |n: u64| n as f64 / clusters.max(1) as f64;
        format!(
            "writes {:.2} per cluster ({}); reads {:.2} per cluster ({})",
            per(self.total(true)),
            self.top(true, 6),
            per(self.total(false)),
            self.top(false, 6)
        )
    }
}

fn is_write(kind: &str) -> bool {
    ["POST ", "PUT ", "PATCH ", "DELETE "]
        .iter()
        .any(|verb| kind.starts_with(verb))
}

/// Seconds from `since` until each cluster had every member probed, polled until all had or
/// `limit` passed; `None` for a cluster that never was.
async fn first_rounds(
    log: &Mutex<ProbeLog>,
    fakes: &[FakeCluster],
    since: Instant,
    limit: Duration,
) -> Vec<Option<f64>> {
    loop {
        let rounds: Vec<Option<f64>> = match log.lock() {
            Ok(log) => fakes
                .iter()
                .map(|fake| {
                    fake.members
                        .iter()
                        .map(|(_, ip)| {
                            log.first
                                .get(ip)
                                .map(|t| t.saturating_duration_since(since).as_secs_f64())
                        })
                        .try_fold(0.0_f64, |latest, t| t.map(|t| latest.max(t)))
                })
                .collect(),
            Err(_) => vec![None; fakes.len()],
        };
        if rounds.iter().all(Option::is_some) || since.elapsed() >= limit {
            return rounds;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `median, p99, max` of the clusters' first rounds, and how many never had one.
fn rounds_report(rounds: &[Option<f64>]) -> String {
    let done: Vec<f64> = rounds.iter().flatten().copied().collect();
    let missing = rounds.len() - done.len();
    let mut sorted = done.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        sorted
            .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    format!(
        "first health round of every member: median {:.1} s, p99 {:.1} s, last {:.1} s; {} of {} clusters{}",
        at(0.5),
        at(0.99),
        at(1.0),
        done.len(),
        rounds.len(),
        if missing > 0 {
            format!(" ({missing} never within the limit)")
        } else {
            String::new()
        }
    )
}

/// How long a takeover may take before the bench reports what it got.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(300);

/// Measure one controller with `options.clusters` established clusters: adoption, steady state,
/// a cold takeover by a new process, and optionally a leader failover between two replicas.
pub async fn run_scale(work_dir: &Path, options: &ScaleOptions) -> Result<(), SimError> {
    // The benchmark's phases in the order they run, each timed where it happens: read top to bottom.
    let clusters = options.clusters;
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
    let _ = std::fs::remove_dir_all(work_dir);
    std::fs::create_dir_all(work_dir).map_err(|e| setup(&e))?;
    let InMemoryServer {
        server,
        served: _serving,
        kubeconfig,
    } = serve_in_memory(work_dir).await?;
    let client = server.client(NAMESPACE);

    // One CA for all clusters: the bench measures health checking, not CA generation.
    let ca = CertificateAuthority::generate("etcd-ca").map_err(|e| setup(&e))?;
    let fakes: Vec<FakeCluster> = (0..clusters)
        .map(|c| FakeCluster {
            members: (0..MEMBERS)
                .map(|m| (format!("scale-{c}-etcd-{m}"), member_ip(c, m)))
                .collect(),
        })
        .collect();
    let log = Arc::new(Mutex::new(ProbeLog::default()));
    fake_etcd::serve(&ca, &fakes, log.clone()).await?;
    seed_template(&client).await?;
    for (c, fake) in fakes.iter().enumerate() {
        seed_cluster(&client, &ca, c, fake, options.bootstrap).await?;
    }
    println!(
        "command: etcdadm-sim bench scale --clusters {clusters} --window-seconds {} --settle-seconds {}{}{}{}",
        options.window.as_secs(),
        options.settle.as_secs(),
        options
            .concurrency
            .map(|n| format!(" --concurrency {n}"))
            .unwrap_or_default(),
        if options.bootstrap { " --bootstrap" } else { "" },
        if options.failover { " --failover" } else { "" },
    );
    println!("{clusters} clusters × {MEMBERS} fake members, health interval 10 s");
    let controller_args: Vec<String> = options
        .concurrency
        .map(|n| format!("--concurrency={n}"))
        .into_iter()
        .collect();

    // 1. A controller finds the seeded clusters and makes them its own.
    let tally = server.request_tally();
    let started = Instant::now();
    let mut controller = Running::start(work_dir, &kubeconfig, CONTROLLER, "first", &controller_args)?;
    let bootstrap = match options.bootstrap {
        true => Some(Running::start(work_dir, &kubeconfig, BOOTSTRAP, "only", &[])?),
        false => None,
    };
    // Wait for every cluster to be Ready, but not forever: an overloaded controller is measured
    // too, and the report says how many it got to. Counted from a watch: listing 3,000 clusters
    // every second made the sim side serialize 30 MB of JSON a second beside the controller.
    let api: Api<EtcdadmCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let (clusters_seen, writer) = reflector::store::<EtcdadmCluster>();
    let watching = tokio::spawn(
        reflector(writer, watcher(api, watcher::Config::default())).for_each(|_| std::future::ready(())),
    );
    let mut ready = 0;
    let mut by_minute = Vec::new();
    while ready < clusters && started.elapsed() < ready_wait(clusters) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ready = clusters_seen
            .state()
            .iter()
            .filter(|e| e.status.as_ref().is_some_and(|s| s.ready))
            .count();
        if started.elapsed() >= Duration::from_secs(60 * (by_minute.len() as u64 + 1)) {
            by_minute.push(ready.to_string());
        }
    }
    watching.abort();
    println!(
        "adoption of the seeded objects: {ready} Ready {:.1} s after start (at each full minute: \
         {}); {}",
        started.elapsed().as_secs_f64(),
        if by_minute.is_empty() {
            "-".to_string()
        } else {
            by_minute.join(", ")
        },
        Requests::since(&server, &tally).report(clusters)
    );

    // 2. Steady state: let the start-up burst pass, then watch a quiet window.
    tokio::time::sleep(options.settle).await;
    if let Ok(mut log) = log.lock() {
        log.reset();
    }
    let before = (controller.usage(), usage_of(std::process::id()));
    let bootstrap_before = match &bootstrap {
        Some(b) => Some((b.usage(), b.reconciles().await)),
        None => None,
    };
    let tally = server.request_tally();
    tokio::time::sleep(options.window).await;
    let window = Requests::since(&server, &tally);
    let after = (controller.usage(), usage_of(std::process::id()));
    let (gaps, spanning, probed, health_calls, member_list_calls) = match log.lock() {
        Ok(log) => (
            log.gaps().to_vec(),
            log.spanning_gaps().to_vec(),
            log.probed.len(),
            log.health_calls,
            log.member_list_calls,
        ),
        Err(_) => (vec![], vec![], 0, 0, 0),
    };
    let seconds = options.window.as_secs_f64();
    println!(
        "health-check interval achieved per member: {}; {probed} of {} members probed in the window",
        percentiles(&gaps),
        clusters * MEMBERS
    );
    println!(
        "  the gaps that began before the window (the warm-up's backlog): {}",
        percentiles(&spanning)
    );
    println!(
        "asked of the members per second: /health {:.1}, MemberList {:.1}",
        health_calls as f64 / seconds,
        member_list_calls as f64 / seconds
    );
    println!("{CONTROLLER}: {}", usage_line(before.0, after.0, seconds));
    println!(
        "sim side (in-memory API server, fake members, this bench; one process): {}",
        usage_line(before.1, after.1, seconds)
    );
    if let (Some(b), Some((usage, reconciles))) = (&bootstrap, bootstrap_before) {
        println!(
            "{BOOTSTRAP}: {}; {:.1} reconciles per second",
            usage_line(usage, b.usage(), seconds),
            (b.reconciles().await - reconciles) / seconds
        );
    }
    println!(
        "API requests against the sim API server: {:.1} per second; over the window: {}",
        (window.total(true) + window.total(false)) as f64 / seconds,
        window.report(clusters)
    );

    // 3. Takeover: the controller dies; a new process starts cold over established clusters.
    controller.kill().await;
    if let Ok(mut log) = log.lock() {
        log.reset();
    }
    let tally = server.request_tally();
    let started = Instant::now();
    let mut controller = Running::start(work_dir, &kubeconfig, CONTROLLER, "takeover", &controller_args)?;
    let rounds = first_rounds(&log, &fakes, started, TAKEOVER_LIMIT).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!("takeover by a new process: {}", rounds_report(&rounds));
    println!(
        "takeover requests, from start to 10 s after the last first round: {}",
        Requests::since(&server, &tally).report(clusters)
    );

    // 4. Failover: two replicas elect a leader; the leader is killed.
    if options.failover {
        controller.kill().await;
        let mut args = controller_args.clone();
        args.extend([
            "--leader-elect".to_string(),
            format!("--leader-election-namespace={NAMESPACE}"),
        ]);
        let mut replicas = vec![
            Running::start(work_dir, &kubeconfig, CONTROLLER, "replica-a", &args)?,
            Running::start(work_dir, &kubeconfig, CONTROLLER, "replica-b", &args)?,
        ];
        if let Ok(mut log) = log.lock() {
            log.reset();
        }
        let first = first_rounds(&log, &fakes, Instant::now(), TAKEOVER_LIMIT).await;
        let Some(leader) = replicas.iter().position(Running::leads) else {
            return Err(SimError::Setup("no replica acquired the lease".into()));
        };
        println!("failover: replica {} leads ({})", leader, rounds_report(&first));
        tokio::time::sleep(Duration::from_secs(10)).await;
        if let Ok(mut log) = log.lock() {
            log.reset();
        }
        let killed = Instant::now();
        replicas[leader].kill().await;
        let rounds = first_rounds(&log, &fakes, killed, TAKEOVER_LIMIT).await;
        println!(
            "failover (leader SIGKILLed, lease duration 15 s, from the kill): {}",
            rounds_report(&rounds)
        );
        for mut replica in replicas {
            replica.kill().await;
        }
    } else {
        controller.kill().await;
    }
    if let Some(mut bootstrap) = bootstrap {
        bootstrap.kill().await;
    }
    Ok(())
}

/// CPU between two readings of one process and its RSS at the second.
fn usage_line(before: Option<ChildUsage>, after: Option<ChildUsage>, seconds: f64) -> String {
    match (before, after) {
        (Some(b), Some(a)) => format!(
            "CPU {:.2} s per minute ({:.3} cores), RSS {:.1} MiB, peak RSS {:.1} MiB",
            (a.cpu_seconds - b.cpu_seconds) * 60.0 / seconds,
            (a.cpu_seconds - b.cpu_seconds) / seconds,
            a.rss_kib as f64 / 1024.0,
            a.peak_rss_kib as f64 / 1024.0
        ),
        _ => "exited during the window".into(),
    }
}

/// `median, p99, max` of gaps in seconds.
fn percentiles(gaps: &[f64]) -> String {
    if gaps.is_empty() {
        return "no member was probed twice".into();
    }
    let mut sorted = gaps.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:.2} s, p90 {:.2} s, p99 {:.2} s, max {:.2} s over {} gaps",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        sorted.len()
    )
}

/// The infrastructure template every seeded EtcdadmCluster names: without it each cluster is
/// reported as missing its template and read afresh at every round, which no healthy
/// installation does.
async fn seed_template(client: &Client) -> Result<(), SimError> {
    let templates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &crate::capi::sim_machine_template_resource(),
    );
    let template: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate",
        "metadata": {"name": "scale", "namespace": NAMESPACE},
        "spec": {"template": {"spec": {}}},
    }))?;
    templates.create(&Default::default(), &template).await?;
    Ok(())
}

/// A Cluster with provisioned infrastructure, its CA Secret, an EtcdadmCluster of three and
/// three Machines with the fake members' addresses: an established cluster as the controller
/// would find it after a restart. `with_configs`: each Machine also has its EtcdadmConfig, ready,
/// and the data Secret, as the bootstrap controller would find them.
async fn seed_cluster(
    client: &Client,
    ca: &CertificateAuthority,
    index: usize,
    fake: &FakeCluster,
    with_configs: bool,
) -> Result<(), SimError> {
    let cluster = format!("scale-{index}");
    let etcd = format!("{cluster}-etcd");
    let params = PatchParams::default();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    clusters
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": cluster}, "spec": {},
            }))?,
        )
        .await?;
    let provisioned = json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
    clusters
        .patch_status(&cluster, &params, &Patch::Merge(&provisioned))
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": names::ca_secret_name(&cluster),
                     "labels": {names::CLUSTER_NAME_LABEL: cluster}},
        "stringData": {names::TLS_CERT_KEY: ca.cert_pem(), names::TLS_KEY_KEY: ca.key_pem()},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&Default::default(), &secret)
        .await?;
    let etcd_cluster = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": etcd, "labels": {names::CLUSTER_NAME_LABEL: cluster}},
                "spec": {"replicas": MEMBERS, "healthCheck": {"interval": "10s"},
                         "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                                                    "kind": "SimMachineTemplate", "name": "scale"}},
            }))?,
        )
        .await?;
    let uid = etcd_cluster.uid().unwrap_or_default();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, ip) in &fake.members {
        let mut bootstrap = json!({"dataSecretName": name});
        if with_configs {
            bootstrap["configRef"] =
                json!({"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": name});
        }
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name,
                         "labels": {names::CLUSTER_NAME_LABEL: cluster, names::ETCD_CLUSTER_LABEL: etcd},
                         "ownerReferences": [{"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1",
                                              "kind": "EtcdadmCluster", "name": etcd, "uid": uid,
                                              "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"clusterName": cluster,
                     "bootstrap": bootstrap,
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "SimMachine", "name": name}},
        }))?;
        let machine = machines.create(&Default::default(), &machine).await?;
        let status = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": ip.to_string()}],
            "phase": "Provisioned",
            "initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
        }});
        machines
            .patch_status(name, &params, &Patch::Merge(&status))
            .await?;
        if with_configs {
            seed_config(client, &cluster, &machine).await?;
        }
    }
    Ok(())
}

/// Machine `machine`'s EtcdadmConfig, labelled as the EtcdadmCluster controller labels it, owned
/// by it and ready, with its data Secret: what the bootstrap controller leaves behind once a
/// member has its user data.
async fn seed_config(client: &Client, cluster: &str, machine: &Machine) -> Result<(), SimError> {
    let name = machine.name_any();
    let labels = machine.labels();
    let configs: Api<EtcdadmConfig> = Api::namespaced(client.clone(), NAMESPACE);
    let config = configs
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
                "metadata": {"name": name, "labels": labels,
                             "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                                                  "name": name, "uid": machine.uid().unwrap_or_default(),
                                                  "controller": true, "blockOwnerDeletion": true}]},
                "spec": {},
            }))?,
        )
        .await?;
    let status = json!({"status": {"ready": true, "dataSecretName": name,
                                   "initialization": {"dataSecretCreated": true}}});
    configs
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {names::CLUSTER_NAME_LABEL: cluster},
                     "ownerReferences": [{"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
                                          "name": name, "uid": config.uid().unwrap_or_default(),
                                          "controller": true, "blockOwnerDeletion": true}]},
        "type": names::CLUSTER_SECRET_TYPE,
        "stringData": {names::DATA_SECRET_VALUE_KEY: "#cloud-config\n", names::DATA_SECRET_FORMAT_KEY: "cloud-config"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&Default::default(), &secret)
        .await?;
    Ok(())
}
