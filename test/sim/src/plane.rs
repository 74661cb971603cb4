//! The running management plane of a demo or scenario: API server (in-memory, or a real one
//! through a kubeconfig), controller binaries, CAPI and KCP stand-ins, machines. Dropping it stops
//! everything.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::process::{Child, Command};

use etcdadm_sim_apiserver::{ApiServer, Served};
use etcdadm_sim_machines::network::Lab;
use etcdadm_sim_machines::{BuiltInRuntime, ExternalRuntime, MachineRuntime};

use crate::boot_delay::BootDelay;
use crate::capi::CapiStandIn;
use crate::control_plane_host::ControlPlaneHosts;
use crate::error::SimError;
use crate::infra::{BootSettings, Booting, SimInfra};
use crate::kcp::{KcpRecord, KcpStandIn};

/// Namespace the demo and the benches use; scenarios choose their own.
pub const NAMESPACE: &str = "default";

/// What the machines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Machines {
    /// The etcdadm stand-in, on loopback addresses `<ip_prefix>.N` (the fast tier).
    #[default]
    StandIn,
    /// The real etcdadm, each machine in a network namespace of its own on a bridge of this
    /// plane (`10.213.<lab>.N`, see `etcdadm_sim_machines::network`).
    RealEtcdadm { lab: u8 },
}

/// How to bring a plane up.
pub struct PlaneOptions {
    /// Logs, kubeconfig and machine roots go here.
    pub work_dir: PathBuf,
    /// Machines get `<ip_prefix>.N`; concurrent planes need different prefixes.
    pub ip_prefix: [u8; 3],
    /// A real API server to use instead of the in-memory one (its CRDs must be installed).
    pub kubeconfig: Option<PathBuf>,
    /// `--machine-runtime CMD`: machines booted by an external command.
    pub machine_runtime: Option<String>,
    /// What built-in machines run (ignored with `machine_runtime`); with
    /// [`Machines::RealEtcdadm`] machine addresses come from the lab, not `ip_prefix`.
    pub machines: Machines,
    /// Controller binaries (beside this executable) to start with `run`.
    pub controllers: Vec<&'static str>,
    /// Time the KCP stand-in takes to replace one of its machines during a rollout.
    pub kcp_rollout_step: Duration,
    /// Where the Clusters, Machines and the rest live; created if it does not exist. The plane's
    /// client has it as its default namespace.
    pub namespace: String,
    /// A kubeconfig of its own for a controller (by binary name), e.g. one that acts as the
    /// controller's ServiceAccount; the others use `kubeconfig`.
    pub controller_kubeconfigs: std::collections::BTreeMap<&'static str, PathBuf>,
    /// Extra flags for every controller's `run`.
    pub controller_args: Vec<String>,
    /// Extra flags for one controller's `run` (by binary name), e.g. its webhook server's port
    /// and certificate (a `--webhook-port` here replaces the default `--webhook-port=0`).
    pub controller_own_args: std::collections::BTreeMap<&'static str, Vec<String>>,
    /// Extra environment of every controller process (e.g. a crash test's exit point).
    pub controller_env: Vec<(String, String)>,
    /// Programs the image of [`Machines::RealEtcdadm`] machines carries besides etcdadm (e.g.
    /// an etcdutl that can raise a restored revision), on their PATH by file name.
    pub image_tools: Vec<PathBuf>,
    /// How long each Machine takes to boot (get its address and run its user data) once its
    /// bootstrap data exists.
    pub boot_delay: BootDelay,
    /// Who plays Cluster API: the stand-ins of this crate, or the real controllers, which the
    /// caller runs (see [`crate::real_capi`]); the sim's infrastructure provider runs either way.
    pub capi: Capi,
}

/// Who plays Cluster API's controllers for a plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Capi {
    /// [`CapiStandIn`] and [`KcpStandIn`] run in the plane.
    #[default]
    StandIn,
    /// The real CAPI, KubeadmControlPlane and kubeadm bootstrap managers run beside the plane.
    Real,
}

impl Default for PlaneOptions {
    fn default() -> Self {
        PlaneOptions {
            work_dir: PathBuf::from("out/sim"),
            ip_prefix: [127, 0, 1],
            kubeconfig: None,
            machine_runtime: None,
            machines: Machines::StandIn,
            controllers: vec!["etcdadm-bootstrap", "etcdadm-controller"],
            kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
            namespace: NAMESPACE.into(),
            controller_kubeconfigs: Default::default(),
            controller_args: vec![],
            controller_own_args: Default::default(),
            controller_env: vec![],
            image_tools: vec![],
            boot_delay: BootDelay::None,
            capi: Capi::StandIn,
        }
    }
}

/// The KCP stand-in's default pace: one control plane machine every 2 s.
pub const DEFAULT_KCP_ROLLOUT_STEP: Duration = Duration::from_secs(2);

pub struct Plane {
    /// The in-memory API server, unless a kubeconfig was given.
    pub server: Option<ApiServer>,
    served: Option<Served>,
    pub url: String,
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub runtime: Arc<dyn MachineRuntime>,
    /// The real-etcdadm machines' network, when they have one.
    pub lab: Option<Arc<Lab>>,
    /// The built-in runtime (also [`Plane::runtime`]), for what only it can do (run a command
    /// on a machine, read what its etcd runs with); `None` with an external runtime.
    pub built_in: Option<Arc<BuiltInRuntime>>,
    pub kcp_record: Arc<Mutex<KcpRecord>>,
    /// Control plane hosts and their load balancers (real CAPI only).
    pub control_plane: Option<Arc<ControlPlaneHosts>>,
    pub namespace: String,
    settings: BootSettings,
    controller_kubeconfigs: std::collections::BTreeMap<&'static str, PathBuf>,
    controller_args: Vec<String>,
    controller_own_args: std::collections::BTreeMap<&'static str, Vec<String>>,
    controller_env: Vec<(String, String)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Running controller processes by binary name.
    controllers: Vec<(String, Child)>,
    /// Where each controller started by [`Plane::start`] serves its probes and `/metrics`.
    ports: std::collections::BTreeMap<String, ControllerPorts>,
    work_dir: PathBuf,
}

impl Drop for Plane {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(hosts) = &self.control_plane {
            hosts.shutdown();
        }
        for (_, child) in &mut self.controllers {
            let _ = child.start_kill();
        }
        // The controllers talk to the machines' subnets: they must be gone before the bridge is.
        for (_, child) in &self.controllers {
            if let Some(pid) = child.id() {
                wait_gone(pid);
            }
        }
        drop(self.served.take());
    }
}

/// Wait (up to 10 s) until process `pid` is dead (a zombie holds no sockets).
fn wait_gone(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, None | Some('Z' | 'X')) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Plane {
    pub async fn start(options: PlaneOptions) -> Result<Plane, SimError> {
        // Everything the plane starts, in start order, each stopped by the Plane it returns.
        let work_dir = &options.work_dir;
        std::fs::create_dir_all(work_dir)
            .map_err(|e| SimError::Setup(format!("{}: {e}", work_dir.display())))?;
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
        let (server, served, url, kubeconfig, client) = match &options.kubeconfig {
            Some(path) => {
                let config = Kubeconfig::read_from(path).map_err(|e| setup(&e))?;
                let mut config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| setup(&e))?;
                config.default_namespace = options.namespace.clone();
                let url = config.cluster_url.to_string();
                let client = Client::try_from(config).map_err(|e| setup(&e))?;
                (None, None, url, path.clone(), client)
            }
            None => {
                let InMemoryServer {
                    server,
                    served,
                    kubeconfig,
                } = serve_in_memory(work_dir).await?;
                let client = server.client(&options.namespace);
                let url = served.url.clone();
                (Some(server), Some(served), url, kubeconfig, client)
            }
        };
        ensure_namespace(&client, &options.namespace).await?;
        let mut controllers = vec![];
        let mut ports = std::collections::BTreeMap::new();
        for name in &options.controllers {
            let chosen = ControllerPorts::choose()?;
            let log = work_dir.join(format!("{name}.log"));
            let own = options.controller_kubeconfigs.get(name).unwrap_or(&kubeconfig);
            let args = args_of(&options.controller_args, &options.controller_own_args, name);
            let child =
                spawn_controller_with_ports(name, own, &log, Some(chosen), &args, &options.controller_env)?;
            ports.insert(name.to_string(), chosen);
            controllers.push((name.to_string(), child));
        }
        let mut lab = None;
        let mut ip_prefix = options.ip_prefix;
        let built_in = match (&options.machine_runtime, options.machines) {
            (Some(_), _) => None,
            (None, Machines::StandIn) => Some(Arc::new(BuiltInRuntime::new(sibling_binary(
                "etcdadm-sim-machine",
            )?))),
            (None, Machines::RealEtcdadm { lab: id }) => {
                let etcdadm = etcdadm_sim_machines::real_etcdadm::etcdadm_binary().map_err(|e| setup(&e))?;
                let created = Arc::new(Lab::create(id).map_err(|e| setup(&e))?);
                let [a, b] = etcdadm_sim_machines::network::PRIMARY_NET;
                ip_prefix = [a, b, id];
                lab = Some(created.clone());
                Some(Arc::new(BuiltInRuntime::real_etcdadm(
                    sibling_binary("etcdadm-sim-machine")?,
                    etcdadm,
                    created,
                    options.image_tools.clone(),
                )))
            }
        };
        let runtime: Arc<dyn MachineRuntime> = match (&options.machine_runtime, &built_in) {
            (Some(command), _) => Arc::new(ExternalRuntime::new(command).map_err(|e| setup(&e))?),
            (None, Some(built_in)) => built_in.clone(),
            (None, None) => return Err(SimError::Setup("no machine runtime".into())),
        };
        let settings = BootSettings::default();
        let control_plane = (options.capi == Capi::Real).then(|| ControlPlaneHosts::new(work_dir));
        let infra = SimInfra {
            client: client.clone(),
            namespace: options.namespace.clone(),
            runtime: runtime.clone(),
            work_dir: work_dir.clone(),
            ip_prefix,
            settings: settings.clone(),
            boot_delay: options.boot_delay,
            booting: Mutex::new(Booting::new(options.boot_delay)),
            control_plane: control_plane.clone(),
        };
        let mut tasks = vec![tokio::spawn(infra.run())];
        let kcp = KcpStandIn::new(client.clone(), &options.namespace, options.kcp_rollout_step);
        let kcp_record = kcp.record.clone();
        if options.capi == Capi::StandIn {
            let capi = CapiStandIn {
                client: client.clone(),
                namespace: options.namespace.clone(),
            };
            tasks.push(tokio::spawn(capi.run()));
            tasks.push(tokio::spawn(kcp.run()));
        }
        Ok(Plane {
            server,
            served,
            url,
            client,
            kubeconfig,
            runtime,
            lab,
            built_in,
            kcp_record,
            control_plane,
            namespace: options.namespace.clone(),
            settings,
            controller_kubeconfigs: options.controller_kubeconfigs.clone(),
            controller_args: options.controller_args.clone(),
            controller_own_args: options.controller_own_args.clone(),
            controller_env: options.controller_env.clone(),
            tasks,
            controllers,
            ports,
            work_dir: options.work_dir,
        })
    }

    /// Machines booted from now on get member certificates valid for `validity` (`None`: back
    /// to etcdadm's 365 days), e.g. members whose certificates expire in 20 days, then their
    /// replacements with fresh ones.
    pub fn set_member_certificate_validity(&self, validity: Option<Duration>) {
        *self
            .settings
            .member_certificate_validity
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = validity;
    }

    /// Machines booted from now on have a second interface holding their default route, while
    /// the Machine reports the first interface's address (real-etcdadm machines only).
    pub fn set_default_route_on_second_interface(&self, enabled: bool) {
        self.settings
            .default_route_on_second_interface
            .store(enabled, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `/metrics` text of controller `name` (started by [`Plane::start`]).
    pub async fn scrape_metrics(&self, name: &str) -> Result<String, SimError> {
        Ok(http_get(self.ports_of(name)?.diagnostics, "/metrics").await?.1)
    }

    /// Status code and body of controller `name`'s `/readyz`.
    pub async fn readyz(&self, name: &str) -> Result<(u16, String), SimError> {
        http_get(self.ports_of(name)?.health, "/readyz").await
    }

    fn ports_of(&self, name: &str) -> Result<ControllerPorts, SimError> {
        self.ports
            .get(name)
            .copied()
            .ok_or_else(|| SimError::Setup(format!("{name} was not started by this plane")))
    }

    /// SIGKILL the controller `name` (a crash: no shutdown path runs) and reap it.
    pub async fn kill_controller(&mut self, name: &str) -> Result<(), SimError> {
        let (_, child) = self
            .controllers
            .iter_mut()
            .find(|(n, _)| n == name)
            .ok_or_else(|| SimError::Setup(format!("no controller {name} in this plane")))?;
        // tokio's start_kill sends SIGKILL.
        child
            .start_kill()
            .map_err(|e| SimError::Setup(format!("killing {name}: {e}")))?;
        child
            .wait()
            .await
            .map_err(|e| SimError::Setup(format!("reaping {name}: {e}")))?;
        Ok(())
    }

    /// Start the controller `name` again (after [`Plane::kill_controller`]); its log continues.
    pub fn restart_controller(&mut self, name: &str) -> Result<(), SimError> {
        let own = self
            .controller_kubeconfigs
            .iter()
            .find(|(n, _)| **n == name)
            .map_or(&self.kubeconfig, |(_, path)| path);
        let log = self.work_dir.join(format!("{name}.log"));
        let args = args_of(&self.controller_args, &self.controller_own_args, name);
        let child = spawn_controller_with_ports(name, own, &log, None, &args, &self.controller_env)?;
        match self.controllers.iter_mut().find(|(n, _)| n == name) {
            Some((_, slot)) => *slot = child,
            None => self.controllers.push((name.to_string(), child)),
        }
        Ok(())
    }

    /// The process ID of the controller `name` while it runs.
    pub fn controller_pid(&self, name: &str) -> Option<u32> {
        self.controllers.iter().find(|(n, _)| n == name)?.1.id()
    }

    /// Whether the controller `name` is running.
    pub fn controller_running(&mut self, name: &str) -> bool {
        self.controllers
            .iter_mut()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, child)| matches!(child.try_wait(), Ok(None)))
    }
}

/// The flags of controller `name`: every controller's, then its own.
fn args_of(
    every: &[String],
    own: &std::collections::BTreeMap<&'static str, Vec<String>>,
    name: &str,
) -> Vec<String> {
    let mine = own.iter().find(|(n, _)| **n == name).map(|(_, a)| a.as_slice());
    [every, mine.unwrap_or_default()].concat()
}

/// Create namespace `name` unless it exists (a real API server has only the usual ones).
pub(crate) async fn ensure_namespace(client: &Client, name: &str) -> Result<(), SimError> {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let namespace = k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&Default::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(SimError::Setup(format!("creating namespace {name}: {e}"))),
    }
}

/// A controller binary built next to this one (`cargo build --workspace --bins`).
pub fn sibling_binary(name: &str) -> Result<PathBuf, SimError> {
    let exe = std::env::current_exe().map_err(|e| SimError::Setup(format!("locating myself: {e}")))?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Test executables live one level deeper (target/debug/deps).
    [dir.join(name), dir.join("..").join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            SimError::Setup(format!(
                "{name} not found next to {}; run `cargo build --workspace --bins` first",
                exe.display()
            ))
        })
}

/// Start a controller binary's `run` against the plane at `kubeconfig`, appending to `log`.
pub fn spawn_controller(name: &str, kubeconfig: &Path, log: &Path) -> Result<Child, SimError> {
    spawn_controller_with_ports(name, kubeconfig, log, None, &[], &[])
}

/// The in-memory API server with our CRDs, served on loopback.
pub struct InMemoryServer {
    pub server: ApiServer,
    /// Serving stops when this is dropped.
    pub served: Served,
    /// A kubeconfig for it, in the work directory.
    pub kubeconfig: PathBuf,
}

/// Start the in-memory API server with the CRDs of `config/crd/bases` and the sim's own, on a
/// free loopback port, and write its kubeconfig into `work_dir`.
pub async fn serve_in_memory(work_dir: &Path) -> Result<InMemoryServer, SimError> {
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
    let server = ApiServer::new();
    server.load_crds_dir(&crate::crd_dir()).map_err(|e| setup(&e))?;
    let served = server
        .serve(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| setup(&e))?;
    let kubeconfig = work_dir.join("kubeconfig");
    ApiServer::write_kubeconfig(&served.url, &kubeconfig).map_err(|e| setup(&e))?;
    Ok(InMemoryServer {
        server,
        served,
        kubeconfig,
    })
}

/// Where a controller serves its probes and its metrics.
#[derive(Clone, Copy, Debug)]
pub struct ControllerPorts {
    pub health: SocketAddr,
    pub diagnostics: SocketAddr,
}

impl ControllerPorts {
    /// Two free loopback ports.
    pub fn choose() -> Result<ControllerPorts, SimError> {
        let free = || {
            etcdadm_shared::testing::ports::free_port()
                .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
                .map_err(|e| SimError::Setup(format!("choosing a port: {e}")))
        };
        let health = free()?;
        let mut diagnostics = free()?;
        while diagnostics == health {
            diagnostics = free()?;
        }
        Ok(ControllerPorts { health, diagnostics })
    }
}

/// [`spawn_controller`] on the given ports (any free ones when `None`), with `extra` flags.
pub fn spawn_controller_with_ports(
    name: &str,
    kubeconfig: &Path,
    log: &Path,
    ports: Option<ControllerPorts>,
    extra: &[String],
    env: &[(String, String)],
) -> Result<Child, SimError> {
    let binary = sibling_binary(name)?;
    let (health, diagnostics) = match ports {
        Some(p) => (p.health.to_string(), p.diagnostics.to_string()),
        None => ("127.0.0.1:0".to_string(), "127.0.0.1:0".to_string()),
    };
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| SimError::Setup(format!("opening {}: {e}", log.display())))?;
    let stderr = log.try_clone().map_err(|e| SimError::Setup(e.to_string()))?;
    // Several managers share the loopback: no fixed ports, and no webhooks unless `extra` gives
    // a port (the sim API server calls none; the demo registers them on a real one).
    let webhooks = extra.iter().any(|a| a.starts_with("--webhook-port"));
    Command::new(&binary)
        .arg("run")
        // Metrics are scraped over loopback by the sim itself, whose API server reviews no
        // tokens: plain HTTP.
        .args([
            format!("--health-addr={health}"),
            format!("--diagnostics-address={diagnostics}"),
            "--insecure-diagnostics".to_string(),
        ])
        .args((!webhooks).then(|| "--webhook-port=0".to_string()))
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", kubeconfig)
        // `SIM_CONTROLLER_LOG` overrides the controllers' log filter (e.g. `info,etcdadm_etcdcluster=debug`).
        .env(
            "RUST_LOG",
            std::env::var("SIM_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SimError::Setup(format!("starting {}: {e}", binary.display())))
}

/// A plain HTTP GET on loopback: status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), SimError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |e: std::io::Error| SimError::Setup(format!("GET http://{addr}{path}: {e}"));
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(failed)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(failed)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(failed)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| SimError::Setup(format!("GET http://{addr}{path}: no status in {head:?}")))?;
    Ok((code, body.to_string()))
}
