//! The README demo: an API server (a real kube-apiserver when one is installed, else the sim's
//! in-memory one), both real controller binaries, the CAPI stand-ins, and three process machines
//! that form a real etcd cluster through `etcdadm init` and learner joins.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::etcd::{EtcdTls, MemberClient, member_id_hex};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use crate::boot_delay::BootDelay;
use crate::capi::sim_machine_resource;
use crate::demo_webhooks::{self, DemoWebhooks};
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster};
use crate::plane::{DEFAULT_KCP_ROLLOUT_STEP, Machines, NAMESPACE, Plane, PlaneOptions};
use crate::real_apiserver::{IDENTITIES, RealApiServer, service_account};
use etcdadm_sim_machines::real_etcdadm;

/// Options of `etcdadm-sim demo`.
pub struct DemoOptions {
    pub members: usize,
    pub work_dir: PathBuf,
    pub etcd_version: Option<String>,
    pub timeout: Duration,
    /// Exit once ready instead of running until Ctrl-C.
    pub exit_when_ready: bool,
    /// Which API server to start, unless `kubeconfig` names one that runs already.
    pub api_server: ApiServerChoice,
    /// Use this API server instead of starting one.
    pub kubeconfig: Option<PathBuf>,
    /// External machine runtime command (`--machine-runtime`).
    pub machine_runtime: Option<String>,
    /// Machines get `<ip_prefix>.N`.
    pub ip_prefix: [u8; 3],
    /// What the built-in machines run (`--machines`).
    pub machines: Machines,
    /// How long each Machine takes to boot (`--boot-delay`).
    pub boot_delay: BootDelay,
}

/// The lab (`10.213.<lab>.0/24`) of the demo's real-etcdadm machines.
pub const DEMO_LAB: u8 = 1;

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            members: 3,
            work_dir: PathBuf::from("out/sim"),
            etcd_version: None,
            timeout: Duration::from_secs(180),
            exit_when_ready: true,
            api_server: ApiServerChoice::Auto,
            kubeconfig: None,
            machine_runtime: None,
            ip_prefix: [127, 0, 1],
            machines: Machines::StandIn,
            boot_delay: BootDelay::None,
        }
    }
}

/// Which API server the demo starts (`--api-server`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiServerChoice {
    /// A real kube-apiserver when one is found the envtest way, else the in-memory one.
    Auto,
    /// A real kube-apiserver, or an error saying how to install one.
    Real,
    /// The sim's in-memory API server.
    Memory,
}
/// Create a standalone etcd cluster (Cluster + N Machines with EtcdadmConfigs, no EtcdadmCluster).
pub async fn create_standalone_cluster(
    client: &Client,
    ns: &str,
    cluster: &str,
    members: usize,
    version: Option<&str>,
) -> Result<(), SimError> {
    let pp = PostParams::default();
    let cluster_obj: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": cluster, "namespace": ns},
        "spec": {}
    }))?;
    Api::<Cluster>::namespaced(client.clone(), ns)
        .create(&pp, &cluster_obj)
        .await?;
    let sims: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &sim_machine_resource());
    for i in 0..members {
        let name = format!("{cluster}-etcd-{i}");
        // The machines carry the etcdadm stand-in; there is nothing to download (and no internet).
        let mut spec = json!({"etcdadmBuiltin": true});
        if let Some(version) = version {
            spec["cloudInitConfig"] = json!({"version": version});
        }
        let config: EtcdadmConfig = serde_json::from_value(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
            "metadata": {"name": name, "namespace": ns, "labels": {names::CLUSTER_NAME_LABEL: cluster}},
            "spec": spec
        }))?;
        Api::<EtcdadmConfig>::namespaced(client.clone(), ns)
            .create(&pp, &config)
            .await?;
        let sim: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachine",
            "metadata": {"name": name, "namespace": ns}, "spec": {}
        }))?;
        sims.create(&pp, &sim).await?;
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": ns, "labels": {names::CLUSTER_NAME_LABEL: cluster}},
            "spec": {"clusterName": cluster, "version": "v1.33.0",
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": name}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachine", "name": name}}
        }))?;
        Api::<Machine>::namespaced(client.clone(), ns)
            .create(&pp, &machine)
            .await?;
    }
    Ok(())
}

/// The client URLs of `cluster`'s Machines that have an address.
pub async fn machine_urls(client: &Client, ns: &str, cluster: &str) -> Result<Vec<String>, SimError> {
    let machines: Api<Machine> = Api::namespaced(client.clone(), ns);
    let selector = format!("{}={cluster}", names::CLUSTER_NAME_LABEL);
    let list = machines
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(list
        .items
        .iter()
        .filter_map(|m| m.etcd_address().map(names::client_url))
        .collect())
}

/// TLS material for talking to `cluster`'s etcd: a short-lived client cert from its CA.
pub async fn etcd_tls(client: &Client, ns: &str, cluster: &str) -> Result<Option<EtcdTls>, SimError> {
    let Some(ca) = etcd_ca(client, ns, cluster).await? else {
        return Ok(None);
    };
    EtcdTls::issued_by(&ca, "etcdadm-sim", Duration::from_secs(3600))
        .map(Some)
        .map_err(|e| SimError::Setup(format!("client certificate: {e}")))
}

/// The etcd CA of `cluster` in `ns`, key included; `None` before it exists.
pub async fn etcd_ca(
    client: &Client,
    ns: &str,
    cluster: &str,
) -> Result<Option<CertificateAuthority>, SimError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let Some(secret) = secrets.get_opt(&names::ca_secret_name(cluster)).await? else {
        return Ok(None);
    };
    let get = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .unwrap_or_default()
    };
    CertificateAuthority::from_pem(&get(names::TLS_CERT_KEY), &get(names::TLS_KEY_KEY))
        .map(Some)
        .map_err(|e| SimError::Setup(format!("etcd CA: {e}")))
}

/// Members of the etcd cluster as seen through `url`, by name; `None` if unreachable.
pub async fn member_names(url: &str, tls: &EtcdTls) -> Option<Vec<String>> {
    etcdadm_sim_machines::network::guard(url).ok()?;
    let member = MemberClient::new(url, tls, Duration::from_secs(3)).ok()?;
    let members = member.member_list().await.ok()?;
    Some(
        members
            .iter()
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .collect(),
    )
}

/// One row of the demo's member table.
pub struct MemberRow {
    pub name: String,
    pub url: String,
    pub member_id: String,
    pub leader: bool,
    pub healthy: bool,
    pub db_size: u64,
}

/// Ask every member at `urls` for its health and status.
pub async fn member_table(urls: &[String], tls: &EtcdTls) -> Vec<MemberRow> {
    let mut rows = vec![];
    for url in urls {
        if etcdadm_sim_machines::network::guard(url).is_err() {
            continue;
        }
        let Ok(member) = MemberClient::new(url, tls, Duration::from_secs(3)) else {
            continue;
        };
        let healthy = member.health().await.is_ok_and(|h| h.healthy);
        let status = member.status().await.ok();
        let name = match (member.member_list().await, &status) {
            (Ok(list), Some(status)) => list
                .into_iter()
                .find(|m| m.id == status.member_id)
                .map(|m| m.name),
            _ => None,
        };
        rows.push(MemberRow {
            name: name.unwrap_or_else(|| "?".into()),
            url: url.clone(),
            member_id: status
                .as_ref()
                .map(|s| member_id_hex(s.member_id))
                .unwrap_or_else(|| "?".into()),
            leader: status.as_ref().is_some_and(|s| s.is_leader()),
            healthy,
            db_size: status.as_ref().map(|s| s.db_size).unwrap_or_default(),
        });
    }
    rows
}

fn print_table(rows: &[MemberRow]) {
    println!(
        "{:<16} {:<26} {:<18} {:<7} {:<8} {:>9}",
        "NAME", "CLIENT URL", "MEMBER ID", "LEADER", "HEALTHY", "DB BYTES"
    );
    for r in rows {
        println!(
            "{:<16} {:<26} {:<18} {:<7} {:<8} {:>9}",
            r.name, r.url, r.member_id, r.leader, r.healthy, r.db_size
        );
    }
}

/// The demo's cluster: `demo`, its EtcdadmCluster `demo-etcd`.
const CLUSTER: &str = "demo";

/// A running demo: its API server, the plane on it and the cluster applied there. Dropping it
/// stops the controllers and every machine, then the API server it started.
pub struct Demo {
    // Field order is drop order: the plane goes before the API server it talks to.
    pub plane: Plane,
    real: Option<RealApiServer>,
    /// The admission webhooks, served and registered on a real kube-apiserver.
    webhooks: Option<DemoWebhooks>,
    /// Which API server, in words.
    pub api_server: String,
    started: Instant,
    applied: Instant,
    timeout: Duration,
}

/// What `--api-server` comes to, given whether a kube-apiserver was found.
#[derive(Debug, PartialEq)]
enum Decision {
    Real(PathBuf),
    /// The in-memory one; why not a real one when `auto` looked for it.
    Memory(Option<String>),
    /// `real` asked for and none found: the message says how to install one.
    Missing(String),
}

fn decide(choice: ApiServerChoice, found: Result<PathBuf, String>) -> Decision {
    match (choice, found) {
        (ApiServerChoice::Memory, _) => Decision::Memory(None),
        (ApiServerChoice::Auto, Err(missing)) => Decision::Memory(Some(missing)),
        (ApiServerChoice::Real, Err(missing)) => Decision::Missing(missing),
        (ApiServerChoice::Auto | ApiServerChoice::Real, Ok(binary)) => Decision::Real(binary),
    }
}

/// The real kube-apiserver `choice` asks for, `None` for the in-memory one (and why, when
/// `Auto` found none).
async fn choose_real(
    choice: ApiServerChoice,
    work_dir: &Path,
) -> Result<(Option<RealApiServer>, Option<String>), SimError> {
    let found = etcdadm_envtest::kube_apiserver_binary().map_err(|e| e.to_string());
    match decide(choice, found) {
        Decision::Memory(why) => Ok((None, why)),
        Decision::Missing(hint) => Err(SimError::Setup(hint)),
        Decision::Real(binary) => {
            println!(
                "starting kube-apiserver ({}) with its own etcd, our CRDs and config/rbac",
                binary.display()
            );
            let real = RealApiServer::start_in(&work_dir.join("kube-apiserver")).await?;
            Ok((Some(real), None))
        }
    }
}

impl Demo {
    /// Start the API server (as `options` choose), the plane and both controllers, and apply a
    /// Cluster whose KubeadmControlPlane uses an EtcdadmCluster of `options.members` spread over
    /// three failure domains. Prints what it started.
    pub async fn start(options: &DemoOptions) -> Result<Demo, SimError> {
        // The demo's start in the order a user sees it printed: API server, plane, cluster.
        let started = Instant::now();
        let work_dir = &options.work_dir;
        std::fs::create_dir_all(work_dir)
            .map_err(|e| SimError::Setup(format!("{}: {e}", work_dir.display())))?;
        let plane_options = PlaneOptions {
            work_dir: work_dir.clone(),
            ip_prefix: options.ip_prefix,
            kubeconfig: options.kubeconfig.clone(),
            machine_runtime: options.machine_runtime.clone(),
            machines: options.machines,
            controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
            kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
            boot_delay: options.boot_delay,
            ..Default::default()
        };
        let (real, no_real) = match options.kubeconfig {
            Some(_) => (None, None),
            None => choose_real(options.api_server, work_dir).await?,
        };
        // A real kube-apiserver calls admission webhooks: the managers serve them, as installed.
        let webhooks = real
            .as_ref()
            .map(|_| DemoWebhooks::prepare(work_dir))
            .transpose()?;
        let plane_options = match &real {
            Some(real) => {
                // The admin kubeconfig where the in-memory server's would be, for kubectl.
                let kubeconfig = work_dir.join("kubeconfig");
                std::fs::copy(real.server.kubeconfig(), &kubeconfig)
                    .map_err(|e| SimError::Setup(format!("{}: {e}", kubeconfig.display())))?;
                PlaneOptions {
                    kubeconfig: Some(kubeconfig),
                    controller_own_args: webhooks
                        .as_ref()
                        .map(DemoWebhooks::controller_args)
                        .unwrap_or_default(),
                    ..real.plane_options(plane_options)
                }
            }
            None => plane_options,
        };
        let plane = Plane::start(plane_options).await?;
        if let Some(webhooks) = &webhooks {
            webhooks.register(&plane.client).await?;
            let ports: Vec<String> = webhooks
                .ports
                .iter()
                .map(|(binary, port)| format!("{binary} on https://127.0.0.1:{port}"))
                .collect();
            println!(
                "admission webhooks: config/webhook registered, served by {} (serving certificate in {})",
                ports.join(", "),
                webhooks.cert_dir.display()
            );
        }
        let api_server = match (&real, &options.kubeconfig) {
            (Some(real), _) => {
                let version = plane
                    .client
                    .apiserver_version()
                    .await
                    .map(|v| v.git_version)
                    .unwrap_or_else(|_| "(version unknown)".into());
                let identities: Vec<String> = IDENTITIES
                    .iter()
                    .map(|(binary, account)| format!("{binary} as {}", service_account(account)))
                    .collect();
                format!(
                    "a real kube-apiserver {version} at {} with its own etcd (data and logs in {}); \
                     RBAC from config/rbac, {}",
                    real.server.url(),
                    real.server.dir().display(),
                    identities.join(", ")
                )
            }
            (None, Some(path)) => format!("the one of {} at {}", path.display(), plane.url),
            (None, None) => {
                let why = no_real.map(|why| format!(" ({why})")).unwrap_or_default();
                format!("the sim's in-memory API server at {}{why}", plane.url)
            }
        };
        println!("API server: {api_server}");
        println!(
            "API server, controllers and CAPI stand-ins up {:.1}s after the start",
            started.elapsed().as_secs_f64()
        );
        println!("export KUBECONFIG={}", plane.kubeconfig.display());
        println!("logs and machine roots: {}", work_dir.display());

        let config_spec = match (options.machines, &options.etcd_version) {
            (Machines::RealEtcdadm { .. }, Some(version)) if version != real_etcdadm::ETCD_VERSION => {
                return Err(SimError::Setup(format!(
                    "real-etcdadm machines install etcd {} (the local release archive), not {version}",
                    real_etcdadm::ETCD_VERSION
                )));
            }
            (Machines::RealEtcdadm { .. }, _) => real_etcdadm::config_spec().map_err(SimError::Setup)?,
            (Machines::StandIn, Some(version)) => json!({"cloudInitConfig": {"version": version}}),
            (Machines::StandIn, None) => json!({}),
        };
        let replicas =
            i32::try_from(options.members).map_err(|_| SimError::Setup("--members is too large".into()))?;
        let applied = Instant::now();
        create_managed_cluster(
            &plane.client,
            NAMESPACE,
            &ManagedCluster {
                name: CLUSTER,
                replicas,
                zones: &["zone-a", "zone-b", "zone-c"],
                config_spec,
                health_check: Value::Null,
                with_kcp: true,
                extra_spec: Value::Null,
            },
        )
        .await?;
        println!(
            "applied Cluster {CLUSTER}, KubeadmControlPlane {CLUSTER}-control-plane, EtcdadmCluster \
             {CLUSTER}-etcd (replicas {replicas})"
        );
        Ok(Demo {
            plane,
            real,
            webhooks,
            api_server,
            started,
            applied,
            timeout: options.timeout,
        })
    }

    /// The kubeconfig of the demo's API server (admin).
    pub fn kubeconfig(&self) -> &Path {
        &self.plane.kubeconfig
    }

    /// Whether the demo runs on a real kube-apiserver it started.
    pub fn on_real_api_server(&self) -> bool {
        self.real.is_some()
    }

    /// Whether the demo's API server calls the admission webhooks.
    pub fn webhooks_registered(&self) -> bool {
        self.webhooks.is_some()
    }

    /// Remove the webhook configurations: the API server then admits as a cluster without the
    /// webhooks does (the managers keep serving them, unasked).
    pub async fn unregister_webhooks(&mut self) -> Result<(), SimError> {
        if self.webhooks.take().is_some() {
            demo_webhooks::unregister(&self.plane.client).await?;
        }
        Ok(())
    }

    /// Wait until etcd is Ready and the KubeadmControlPlane was given its endpoints and
    /// unpaused, printing the progress, the times, the member table and the Machines; returns
    /// the create-to-Ready time.
    pub async fn wait_ready(&self) -> Result<Duration, SimError> {
        let client = &self.plane.client;
        let etcd = wait_for_etcd_ready(client, &format!("{CLUSTER}-etcd"), self.timeout).await?;
        let ready = self.applied.elapsed();
        println!(
            "EtcdadmCluster {CLUSTER}-etcd Ready {:.1}s after it was applied ({:.1}s after the start)",
            ready.as_secs_f64(),
            self.started.elapsed().as_secs_f64()
        );
        let kcp = wait_for_kcp_unpaused(client, &format!("{CLUSTER}-control-plane"), self.timeout).await?;
        println!(
            "KubeadmControlPlane unpaused {:.1}s after it was applied, with etcd endpoints {}",
            self.applied.elapsed().as_secs_f64(),
            kcp.join(",")
        );
        let status = etcd.status.unwrap_or_default();
        let urls: Vec<String> = status
            .endpoints
            .split(',')
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect();
        if let Some(tls) = etcd_tls(client, NAMESPACE, CLUSTER).await? {
            print_table(&member_table(&urls, &tls).await);
        }
        let machines = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
            .list(&Default::default())
            .await?
            .items;
        for machine in machines {
            let zone = machine.spec.failure_domain.clone().unwrap_or_default();
            println!(
                "Machine {} in {zone}: {}",
                machine.name_any(),
                machine.etcd_address().unwrap_or("-")
            );
        }
        Ok(ready)
    }
}

/// What a failed demo test shows: each controller's and the API server's refusals (RBAC) and
/// the last 30 lines of its log, newest first, from the demo's work directory.
pub fn failure_logs(work: &Path) -> String {
    [
        "etcdadm-controller.log",
        "etcdadm-bootstrap.log",
        "kube-apiserver/kube-apiserver.log",
    ]
    .iter()
    .map(|f| {
        let text = std::fs::read_to_string(work.join(f)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        format!(
            "--- {f}: refused\n{}\n--- {f} (last 30 lines, newest first)\n{}\n",
            crate::real_apiserver::forbidden_lines(&text),
            tail.join("\n")
        )
    })
    .collect()
}

/// Run the demo: [`Demo::start`], [`Demo::wait_ready`], then (without `exit_when_ready`) until
/// Ctrl-C. Ctrl-C at any point stops everything it started, by PID.
pub async fn run(options: DemoOptions) -> Result<(), SimError> {
    let demo = async {
        let demo = Demo::start(&options).await?;
        demo.wait_ready().await?;
        if !options.exit_when_ready {
            println!("running; Ctrl-C stops the plane, every machine and the API server it started");
            std::future::pending::<()>().await;
        }
        Ok::<(), SimError>(())
    };
    tokio::select! {
        result = demo => result,
        _ = tokio::signal::ctrl_c() => {
            println!("interrupted: stopping the plane, every machine and the API server it started");
            Ok(())
        }
    }
}

/// Poll `get` every 250 ms until it yields a value; time out naming `what` and the last state.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut get: F) -> Result<T, SimError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<T, String>, SimError>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match get().await? {
            Ok(value) => return Ok(value),
            Err(state) => state,
        };
        if Instant::now() > deadline {
            return Err(SimError::Timeout(format!(
                "{what} after {timeout:?}; last: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Wait for `status.ready` of EtcdadmCluster `name`, printing each new state.
pub async fn wait_for_etcd_ready(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<EtcdadmCluster, SimError> {
    let api: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let deadline = Instant::now() + timeout;
    let mut shown = String::new();
    loop {
        let etcd = api.get(name).await?;
        let status = etcd.status.clone().unwrap_or_default();
        if status.ready {
            return Ok(etcd);
        }
        let state = summary(&status);
        if state != shown {
            println!("  {state}");
            shown = state;
        }
        if Instant::now() > deadline {
            return Err(SimError::Timeout(format!(
                "EtcdadmCluster {name} not Ready after {timeout:?}: {shown}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Member health and the Ready condition in one line.
fn summary(status: &EtcdadmClusterStatus) -> String {
    let healthy = status.members.iter().filter(|m| m.healthy).count();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    let condition = ready.map(|c| {
        format!(
            "; Ready={:?} {}: {}",
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        )
    });
    format!(
        "{healthy}/{} members healthy{}",
        status.members.len(),
        condition.unwrap_or_default()
    )
}

/// Wait until KubeadmControlPlane `name` is unpaused with external etcd endpoints other than the
/// placeholder; returns them.
pub async fn wait_for_kcp_unpaused(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<Vec<String>, SimError> {
    let api: Api<KubeadmControlPlane> = Api::default_namespaced(client.clone());
    eventually(
        &format!("KubeadmControlPlane {name} not unpaused"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let kcp = api.get(name).await?;
                let paused = kcp.annotations().contains_key(names::PAUSED_ANNOTATION);
                Ok(match kcp.etcd() {
                    ControlPlaneEtcd::External(endpoints)
                        if !paused && !endpoints.iter().any(|e| e.contains("placeholder")) =>
                    {
                        Ok(endpoints)
                    }
                    other => Err(format!("paused={paused} etcd={other:?}")),
                })
            }
        },
    )
    .await
}

/// Wait until every one of `members` Machines of `cluster` answers with a member list of
/// `members` names; returns their client URLs.
pub async fn wait_for_members(
    client: &Client,
    cluster: &str,
    members: usize,
    timeout: Duration,
) -> Result<Vec<String>, SimError> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        if Instant::now() > deadline {
            return Err(SimError::Timeout(format!(
                "no {members}-member etcd cluster after {timeout:?}; last: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let urls = machine_urls(client, client.default_namespace(), cluster).await?;
        let Some(tls) = etcd_tls(client, client.default_namespace(), cluster).await? else {
            continue;
        };
        let mut agreed = 0;
        for url in &urls {
            if let Some(names) = member_names(url, &tls).await
                && names.len() == members
            {
                agreed += 1;
            }
        }
        let line = format!(
            "{} machines have an address, {agreed} of them see all {members} members",
            urls.len()
        );
        if line != last {
            println!("{line}");
            last = line;
        }
        if agreed == members {
            return Ok(urls);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn auto_takes_a_real_api_server_when_found_and_says_why_not_otherwise() {
        let found = || Ok(PathBuf::from("target/envtest/kube-apiserver"));
        let missing = || Err("kube-apiserver not found: run .ci/setup".to_string());
        let real = Decision::Real(PathBuf::from("target/envtest/kube-apiserver"));
        assert_eq!(decide(ApiServerChoice::Auto, found()), real);
        assert_eq!(decide(ApiServerChoice::Real, found()), real);
        assert_eq!(decide(ApiServerChoice::Memory, found()), Decision::Memory(None));
        assert_eq!(
            decide(ApiServerChoice::Auto, missing()),
            Decision::Memory(Some("kube-apiserver not found: run .ci/setup".into()))
        );
        assert_eq!(
            decide(ApiServerChoice::Real, missing()),
            Decision::Missing("kube-apiserver not found: run .ci/setup".into())
        );
    }
}
