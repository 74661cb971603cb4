//! The running management plane of a demo or scenario: API server (in-memory, or a real one
//! through a kubeconfig), controller binaries, CAPI and KCP stand-ins, machines. Dropping it stops
//! everything.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::process::{Child, Command};

use etcdadm_sim_apiserver::{ApiServer, Served};
use etcdadm_sim_machines::{BuiltInRuntime, ExternalRuntime, MachineRuntime};

use crate::capi::CapiStandIn;
use crate::error::SimError;
use crate::kcp::{KcpRecord, KcpStandIn};

/// Namespace the demo and scenarios use.
pub const NAMESPACE: &str = "default";

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
    /// Controller binaries (beside this executable) to start with `run`.
    pub controllers: Vec<&'static str>,
    /// Time the KCP stand-in takes to replace one of its machines during a rollout.
    pub kcp_rollout_step: Duration,
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
    pub kcp_record: Arc<Mutex<KcpRecord>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Running controller processes by binary name.
    controllers: Vec<(String, Child)>,
    /// Where each controller started by [`Plane::start`] serves `/metrics`.
    metrics_addrs: std::collections::BTreeMap<String, std::net::SocketAddr>,
    work_dir: PathBuf,
}

impl Drop for Plane {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for (_, child) in &mut self.controllers {
            let _ = child.start_kill();
        }
        drop(self.served.take());
    }
}

impl Plane {
    pub async fn start(options: PlaneOptions) -> Result<Plane, SimError> {
        let work_dir = &options.work_dir;
        std::fs::create_dir_all(work_dir)
            .map_err(|e| SimError::Setup(format!("{}: {e}", work_dir.display())))?;
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
        let (server, served, url, kubeconfig, client) = match &options.kubeconfig {
            Some(path) => {
                let config = Kubeconfig::read_from(path).map_err(|e| setup(&e))?;
                let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| setup(&e))?;
                let url = config.cluster_url.to_string();
                let client = Client::try_from(config).map_err(|e| setup(&e))?;
                (None, None, url, path.clone(), client)
            }
            None => {
                let server = ApiServer::new();
                server.load_crds_dir(&crate::crd_dir()).map_err(|e| setup(&e))?;
                let served = server
                    .serve(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
                    .await
                    .map_err(|e| setup(&e))?;
                let kubeconfig = work_dir.join("kubeconfig");
                ApiServer::write_kubeconfig(&served.url, &kubeconfig).map_err(|e| setup(&e))?;
                let client = server.client(NAMESPACE);
                let url = served.url.clone();
                (Some(server), Some(served), url, kubeconfig, client)
            }
        };
        let mut controllers = vec![];
        let mut metrics_addrs = std::collections::BTreeMap::new();
        for name in &options.controllers {
            // A free port of our choosing, so scenarios can scrape the controller's metrics.
            let diagnostics = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| SimError::Setup(format!("choosing a metrics port: {e}")))?;
            let log = work_dir.join(format!("{name}.log"));
            let child = spawn_controller_with_metrics(name, &kubeconfig, &log, Some(diagnostics))?;
            metrics_addrs.insert(name.to_string(), diagnostics);
            controllers.push((name.to_string(), child));
        }
        let runtime: Arc<dyn MachineRuntime> = match &options.machine_runtime {
            Some(command) => Arc::new(ExternalRuntime::new(command).map_err(|e| setup(&e))?),
            None => Arc::new(BuiltInRuntime::new(sibling_binary("etcdadm-sim-machine")?)),
        };
        let capi = CapiStandIn {
            client: client.clone(),
            namespace: NAMESPACE.into(),
            runtime: runtime.clone(),
            work_dir: work_dir.clone(),
            ip_prefix: options.ip_prefix,
        };
        let kcp = KcpStandIn::new(client.clone(), NAMESPACE, options.kcp_rollout_step);
        let kcp_record = kcp.record.clone();
        let tasks = vec![tokio::spawn(capi.run()), tokio::spawn(kcp.run())];
        Ok(Plane {
            server,
            served,
            url,
            client,
            kubeconfig,
            runtime,
            kcp_record,
            tasks,
            controllers,
            metrics_addrs,
            work_dir: options.work_dir,
        })
    }

    /// The `/metrics` text of controller `name` (started by [`Plane::start`]).
    pub async fn scrape_metrics(&self, name: &str) -> Result<String, SimError> {
        let addr = self
            .metrics_addrs
            .get(name)
            .ok_or_else(|| SimError::Setup(format!("{name} was not started by this plane")))?;
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| SimError::Setup(format!("connecting to {name}'s metrics at {addr}: {e}")))?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut response = String::new();
        let io = async {
            stream.write_all(request.as_bytes()).await?;
            stream.read_to_string(&mut response).await
        };
        io.await
            .map_err(|e| SimError::Setup(format!("reading {name}'s metrics: {e}")))?;
        Ok(response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or(response))
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
        let child = spawn_controller(name, &self.kubeconfig, &self.work_dir.join(format!("{name}.log")))?;
        match self.controllers.iter_mut().find(|(n, _)| n == name) {
            Some((_, slot)) => *slot = child,
            None => self.controllers.push((name.to_string(), child)),
        }
        Ok(())
    }

    /// Whether the controller `name` is running.
    pub fn controller_running(&mut self, name: &str) -> bool {
        self.controllers
            .iter_mut()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, child)| matches!(child.try_wait(), Ok(None)))
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
    spawn_controller_with_metrics(name, kubeconfig, log, None)
}

/// [`spawn_controller`], serving `/metrics` on `diagnostics` when given.
pub fn spawn_controller_with_metrics(
    name: &str,
    kubeconfig: &Path,
    log: &Path,
    diagnostics: Option<std::net::SocketAddr>,
) -> Result<Child, SimError> {
    let binary = sibling_binary(name)?;
    let diagnostics = match diagnostics {
        Some(addr) => format!("--diagnostics-address={addr}"),
        None => "--diagnostics-address=127.0.0.1:0".into(),
    };
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| SimError::Setup(format!("opening {}: {e}", log.display())))?;
    let stderr = log.try_clone().map_err(|e| SimError::Setup(e.to_string()))?;
    Command::new(&binary)
        .arg("run")
        // Several managers share the loopback: no fixed ports, and no webhooks (the sim API
        // server does not call admission webhooks).
        .args([
            "--health-addr=127.0.0.1:0",
            diagnostics.as_str(),
            "--webhook-port=0",
        ])
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
