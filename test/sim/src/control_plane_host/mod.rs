//! Control plane hosts real enough for the real KubeadmControlPlane: a Machine bootstrapped by
//! CABPK boots into what kubeadm and the kubelet would leave running, a real `kube-apiserver` on
//! the host's address storing in the cluster's external etcd (ours), registered in the workload
//! cluster as a Ready Node with its static pods' mirror pods, behind the cluster's load
//! balancer. Processes are stopped by PID when the host is powered off or the plane goes.
//!
//! Only what KCP and the Machine controller read is played: no controller manager, scheduler,
//! kubelet sync loop or container runs; their mirror pods say Running.

pub mod kubeadm;
pub mod kubelet;
pub mod port_forward;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tracing::{info, warn};

use etcdadm_shared::pki::IssuedCertificate;
use etcdadm_sim_machines::MachineState;

use crate::error::SimError;
use crate::load_balancer::{self, Backends, LoadBalancer};
use kubeadm::{API_SERVER_PORT, Role};
use port_forward::PortForward;

/// How long a host's API server may take to answer `/readyz` (a cold start on busy cores).
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a joining host waits for the cluster's `kubeadm-config` (kubeadm's discovery).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(250);

/// What a control plane host boots from.
pub struct HostSpec {
    /// The Machine's name: the host's and its Node's.
    pub machine: String,
    pub cluster: String,
    pub address: IpAddr,
    /// The bootstrap data CABPK rendered.
    pub user_data: String,
    /// The Machine's Kubernetes version (its kubelet's).
    pub version: String,
    pub provider_id: String,
}

/// What runs for a host, stopped together.
#[derive(Default)]
struct Processes {
    apiserver: Option<Child>,
    port_forward: Option<PortForward>,
    /// Powered off: nothing may start any more.
    off: bool,
}

impl Processes {
    fn stop(&mut self) {
        self.off = true;
        self.port_forward = None;
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Host {
    address: IpAddr,
    state: Arc<Mutex<MachineState>>,
    processes: Arc<Mutex<Processes>>,
    task: tokio::task::JoinHandle<()>,
}

/// Every control plane host and load balancer of a plane.
pub struct ControlPlaneHosts {
    work_dir: PathBuf,
    hosts: Mutex<BTreeMap<String, Host>>,
    balancers: Mutex<BTreeMap<String, LoadBalancer>>,
    pub backends: Backends,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ControlPlaneHosts {
    /// Hosts' roots go under `work_dir/machines/<machine>`.
    pub fn new(work_dir: &Path) -> Arc<ControlPlaneHosts> {
        Arc::new(ControlPlaneHosts {
            work_dir: work_dir.to_path_buf(),
            hosts: Mutex::default(),
            balancers: Mutex::default(),
            backends: Backends::default(),
        })
    }

    /// Boot `spec.machine` unless it is booting or running; progress shows in [`Self::state`].
    pub fn boot(&self, spec: HostSpec) {
        let mut hosts = lock(&self.hosts);
        if hosts.contains_key(&spec.machine) {
            return;
        }
        let state = Arc::new(Mutex::new(MachineState::Booting));
        let processes = Arc::new(Mutex::new(Processes::default()));
        let root = self.work_dir.join("machines").join(&spec.machine);
        let (machine, address) = (spec.machine.clone(), spec.address);
        let (state_of_task, processes_of_task) = (state.clone(), processes.clone());
        let backends = self.backends.clone();
        let task = tokio::spawn(async move {
            let name = spec.machine.clone();
            let outcome = boot(&spec, &root, &processes_of_task, &backends).await;
            let mut state = lock(&state_of_task);
            *state = match outcome {
                Ok(()) => {
                    info!(
                        machine = name,
                        "control plane host up: API server ready, Node registered"
                    );
                    MachineState::Running {
                        bootstrap_succeeded: true,
                    }
                }
                Err(e) => {
                    warn!(machine = name, error = %e, "control plane host failed to boot");
                    lock(&processes_of_task).stop();
                    MachineState::Failed {
                        reason: e.to_string(),
                    }
                }
            };
        });
        hosts.insert(
            machine,
            Host {
                address,
                state,
                processes,
                task,
            },
        );
    }

    /// How far `machine` got ([`MachineState::Off`] when unknown or powered off).
    pub fn state(&self, machine: &str) -> MachineState {
        lock(&self.hosts)
            .get(machine)
            .map_or(MachineState::Off, |h| lock(&h.state).clone())
    }

    /// The address of `machine` while it is on (booting, running or failed), as a cloud's API
    /// answers for an instance: how a provider finds it again after `clusterctl move`.
    pub fn address(&self, machine: &str) -> Option<IpAddr> {
        lock(&self.hosts).get(machine).map(|h| h.address)
    }

    /// Power `machine` off: out of the load balancer, its API server killed by PID.
    pub fn stop(&self, machine: &str) {
        self.backends.remove(machine);
        if let Some(host) = lock(&self.hosts).remove(machine) {
            host.task.abort();
            lock(&host.processes).stop();
            info!(machine, "control plane host powered off");
        }
    }

    /// Run `cluster`'s load balancer on `endpoint` (the SimCluster's `controlPlaneEndpoint`,
    /// `{host, port}`), unless it runs there already.
    pub async fn balance(&self, cluster: &str, endpoint: &serde_json::Value) {
        let host = endpoint["host"].as_str().and_then(|h| h.parse::<IpAddr>().ok());
        let port = endpoint["port"].as_u64().and_then(|p| u16::try_from(p).ok());
        let (Some(host), Some(port)) = (host, port) else {
            warn!(cluster, %endpoint, "no load balancer: the control plane endpoint is not an IP address and port");
            return;
        };
        let address = SocketAddr::new(host, port);
        if lock(&self.balancers)
            .get(cluster)
            .is_some_and(|b| b.address == address)
        {
            return;
        }
        match load_balancer::start(address, cluster, self.backends.clone()).await {
            Ok(balancer) => {
                info!(cluster, %address, "control plane load balancer listening");
                lock(&self.balancers).insert(cluster.to_string(), balancer);
            }
            Err(e) => warn!(cluster, %address, error = %e, "control plane load balancer"),
        }
    }

    /// Stop `cluster`'s load balancer (its SimCluster is gone).
    pub fn remove_balancer(&self, cluster: &str) {
        lock(&self.balancers).remove(cluster);
    }

    /// Stop every host and load balancer.
    pub fn shutdown(&self) {
        let machines: Vec<String> = lock(&self.hosts).keys().cloned().collect();
        for machine in machines {
            self.stop(&machine);
        }
        lock(&self.balancers).clear();
    }
}

/// kubeadm, then the kubelet: files, configuration, API server, registration.
async fn boot(
    spec: &HostSpec,
    root: &Path,
    processes: &Mutex<Processes>,
    backends: &Backends,
) -> Result<(), SimError> {
    std::fs::create_dir_all(root.join("var/log"))
        .map_err(|e| SimError::Setup(format!("{}: {e}", root.display())))?;
    let bootstrap = kubeadm::write_bootstrap(root, &spec.user_data, &spec.machine)?;
    let ca = kubeadm::cluster_ca(root)?;
    let admin = kubeadm::admin_certificate(&ca, "kubernetes-admin")?;
    let (text, endpoint) = match &bootstrap.role {
        Role::Init {
            cluster_configuration,
        } => {
            let parsed = kubeadm::parse_cluster_configuration(cluster_configuration)?;
            let endpoint = parsed["controlPlaneEndpoint"].as_str().map(String::from);
            (cluster_configuration.clone(), endpoint)
        }
        Role::Join { api_server_endpoint } => {
            let client =
                admin_client(&format!("https://{api_server_endpoint}"), ca.cert_pem(), &admin).await?;
            let text = discover(&client).await?;
            (text, Some(api_server_endpoint.clone()))
        }
    };
    let configuration = kubeadm::parse_cluster_configuration(&text)?;
    let endpoint_host = endpoint.as_deref().map(kubeadm::endpoint_host);
    kubeadm::write_serving_certificate(root, &ca, spec.address, endpoint_host)?;
    let args = kubeadm::api_server_args(root, spec.address, &configuration)?;
    start_api_server(root, &args, processes)?;
    let log = root.join("var/log/kube-apiserver.log");
    wait_ready(spec.address, ca.cert_pem(), &admin, processes, &log).await?;
    let client = admin_client(
        &format!("https://{}:{API_SERVER_PORT}", spec.address),
        ca.cert_pem(),
        &admin,
    )
    .await?;
    let served = port_forward::serve(spec.address, &spec.machine, &ca).await?;
    lock(processes).port_forward = Some(served);
    if matches!(bootstrap.role, Role::Init { .. }) {
        kubelet::upload_kubeadm_config(&client, &text).await?;
    }
    let facts = kubelet::NodeFacts {
        name: &spec.machine,
        provider_id: &spec.provider_id,
        address: spec.address,
        kubelet_version: &spec.version,
        node_registration: &bootstrap.node_registration,
    };
    let node = kubelet::register_node(&client, &facts).await?;
    kubelet::mirror_pods(&client, &facts, &node).await?;
    backends.add(
        &spec.cluster,
        &spec.machine,
        SocketAddr::new(spec.address, API_SERVER_PORT),
    );
    Ok(())
}

/// A client of the API server at `url` as `admin` (trusting the cluster CA).
pub async fn admin_client(url: &str, ca_pem: &str, admin: &IssuedCertificate) -> Result<Client, SimError> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "workload", "cluster": {"server": url, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64(&admin.cert_pem),
                                              "client-key-data": b64(&admin.key_pem)}}],
        "contexts": [{"name": "admin", "context": {"cluster": "workload", "user": "admin"}}],
        "current-context": "admin",
    }))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| SimError::Setup(format!("kubeconfig for {url}: {e}")))?;
    Client::try_from(config).map_err(|e| SimError::Setup(format!("client for {url}: {e}")))
}

/// `kubeadm join`'s discovery: the cluster's ClusterConfiguration, once it can be read.
async fn discover(client: &Client) -> Result<String, SimError> {
    let deadline = Instant::now() + DISCOVERY_TIMEOUT;
    loop {
        match kubelet::cluster_configuration(client).await {
            Ok(Some(text)) => return Ok(text),
            Ok(None) | Err(_) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            Ok(None) => {
                return Err(SimError::Timeout(
                    "the cluster has no kube-system/kubeadm-config".into(),
                ));
            }
            Err(e) => {
                return Err(SimError::Timeout(format!(
                    "reading the cluster's kubeadm-config: {e}"
                )));
            }
        }
    }
}

fn start_api_server(root: &Path, args: &[String], processes: &Mutex<Processes>) -> Result<(), SimError> {
    let binary = etcdadm_envtest::kube_apiserver_binary().map_err(|e| SimError::Setup(e.to_string()))?;
    let log = root.join("var/log/kube-apiserver.log");
    let file = std::fs::File::create(&log).map_err(|e| SimError::Setup(format!("{}: {e}", log.display())))?;
    let stderr = file.try_clone().map_err(|e| SimError::Setup(e.to_string()))?;
    let mut processes = lock(processes);
    if processes.off {
        return Err(SimError::Setup("powered off while booting".into()));
    }
    let child = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .spawn()
        .map_err(|e| SimError::Setup(format!("starting kube-apiserver: {e}")))?;
    processes.apiserver = Some(child);
    Ok(())
}

/// Wait until the host's API server answers `/readyz` with 200, failing early if it exits.
async fn wait_ready(
    address: IpAddr,
    ca_pem: &str,
    admin: &IssuedCertificate,
    processes: &Mutex<Processes>,
    log: &Path,
) -> Result<(), SimError> {
    let tls = etcdadm_shared::pki::client_tls_config(ca_pem, &admin.cert_pem, &admin.key_pem)
        .map_err(|e| SimError::Setup(format!("admin TLS: {e}")))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let exited = lock(processes)
            .apiserver
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten());
        if let Some(status) = exited {
            return Err(SimError::Setup(format!(
                "kube-apiserver exited with {status}; its log ends:\n{}",
                log_tail(log)
            )));
        }
        if readyz(&connector, address).await.is_ok_and(|code| code == 200) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SimError::Timeout(format!(
                "kube-apiserver on {address} not ready within {READY_TIMEOUT:?}; its log ends:\n{}",
                log_tail(log)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The status code of `GET /readyz` on `address` (a plain request: a client library would log
/// every 500 of a starting API server as an error).
async fn readyz(connector: &tokio_rustls::TlsConnector, address: IpAddr) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect((address, API_SERVER_PORT)).await?;
    let name = rustls::pki_types::ServerName::IpAddress(address.into());
    let mut tls = connector.connect(name, tcp).await?;
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut head = [0u8; 12];
    tls.read_exact(&mut head).await?;
    String::from_utf8_lossy(&head[9..12])
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("status line: {e}")))
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
