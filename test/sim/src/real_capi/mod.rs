//! A management cluster run by the real Cluster API v1.13 (docs/capi.md): a real kube-apiserver,
//! `clusterctl init` of the real core, kubeadm bootstrap and kubeadm control plane providers,
//! of ours and of the sim's infrastructure provider from a local repository built as each
//! project releases, and every provider Deployment running as a process under its own
//! ServiceAccount with its admission and conversion webhooks served. What cannot run here is
//! stood in, and only that: cert-manager and the service network (`cert_manager`), the
//! kubelet (`kubelet`), and kube-controller-manager's garbage collector and ClusterRole
//! aggregation (`controller_manager`). A [`crate::plane::Plane`] on it runs the sim's infrastructure provider
//! and its machines.
//!
//! CAPI's managers serve webhooks on every interface, so a real-CAPI plane only starts inside
//! a network namespace of its own ([`crate::netns`]).

pub mod cert_manager;
pub mod controller_manager;
pub mod kubelet;
pub mod repository;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use etcdadm_envtest::KubeApiServer;

use crate::error::SimError;
use crate::plane::{Capi, PlaneOptions};
use kubelet::Pod;

/// How long every provider may take to be ready once started (two busy cores, five managers).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The management cluster; everything it started stops when it is dropped.
pub struct RealCapi {
    pub server: KubeApiServer,
    pub client: kube::Client,
    /// The providers' processes.
    pub pods: Vec<Pod>,
    /// The clusterctl configuration of the local repository.
    pub clusterctl_config: PathBuf,
    work_dir: PathBuf,
    controller_manager: tokio::task::JoinHandle<()>,
}

impl Drop for RealCapi {
    fn drop(&mut self) {
        self.controller_manager.abort();
    }
}

fn setup(e: impl std::fmt::Display) -> SimError {
    SimError::Setup(e.to_string())
}

impl RealCapi {
    /// Start the API server in `work_dir/apiserver`, install every provider with `clusterctl
    /// init`, stand in for cert-manager and the service network, start every provider and wait
    /// until each is ready. Logs go to `work_dir/<deployment>.log` (ours: `etcdadm-*.log`).
    pub async fn start(work_dir: &Path) -> Result<RealCapi, SimError> {
        if !crate::netns::inside() {
            return Err(SimError::Setup(
                "a real-CAPI plane starts only in a network namespace of its own (its managers \
                 serve webhooks on every interface): run the test through netns::run_isolated"
                    .into(),
            ));
        }
        std::fs::create_dir_all(work_dir).map_err(setup)?;
        let server = KubeApiServer::start_in(&work_dir.join("apiserver"))
            .await
            .map_err(setup)?;
        server
            .install_crds(&cert_manager::crds())
            .await
            .map_err(|e| SimError::Setup(format!("cert-manager's CRDs: {e}")))?;
        let client = server.client().await.map_err(setup)?;
        let repository = repository::build(&work_dir.join("repository"))?;
        clusterctl_init(&server, &repository.config, work_dir).await?;
        controller_manager::aggregate_cluster_roles(&client).await?;
        let controller_manager =
            tokio::spawn(controller_manager::run(client.clone(), Duration::from_secs(1)));
        let issued = cert_manager::issue_all(&client).await?;
        let (mut pods, services) = kubelet::start_all(&client, &server, work_dir).await?;
        cert_manager::inject_and_route(&client, &issued, &services).await?;
        kubelet::wait_ready(&mut pods, READY_TIMEOUT).await?;
        Ok(RealCapi {
            server,
            client,
            pods,
            clusterctl_config: repository.config,
            work_dir: work_dir.to_path_buf(),
            controller_manager,
        })
    }

    /// `options` on this cluster: the scenario and the sim's infrastructure provider act as
    /// admin; Cluster API and our controllers are already running, installed by clusterctl.
    pub fn plane_options(&self, options: PlaneOptions) -> PlaneOptions {
        PlaneOptions {
            kubeconfig: Some(self.server.kubeconfig().to_path_buf()),
            controllers: vec![],
            capi: Capi::Real,
            work_dir: self.work_dir.clone(),
            ..options
        }
    }

    /// `clusterctl` with this cluster's kubeconfig and the repository's configuration.
    pub fn clusterctl(&self) -> Result<tokio::process::Command, SimError> {
        clusterctl_command(&self.server, &self.clusterctl_config, &self.work_dir)
    }

    /// The last lines of every provider's log, for failure messages.
    pub fn logs(&self) -> String {
        self.pods
            .iter()
            .map(|pod| format!("--- {}\n{}", pod.deployment, pod.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// clusterctl from target/capi, on `server`, reading `config`; its own home in `work_dir` so
/// no overrides or caches of the machine's user are read, and no version check over the network.
fn clusterctl_command(
    server: &KubeApiServer,
    config: &Path,
    work_dir: &Path,
) -> Result<tokio::process::Command, SimError> {
    let home = work_dir.join("clusterctl-home");
    std::fs::create_dir_all(&home).map_err(setup)?;
    let mut command = tokio::process::Command::new(repository::capi_file("clusterctl")?);
    command
        .arg(format!("--kubeconfig={}", server.kubeconfig().display()))
        .arg(format!("--config={}", config.display()))
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    Ok(command)
}

async fn clusterctl_init(server: &KubeApiServer, config: &Path, work_dir: &Path) -> Result<(), SimError> {
    let output = clusterctl_command(server, config, work_dir)?
        .arg("init")
        .args(repository::init_args())
        .output()
        .await
        .map_err(setup)?;
    let log = [output.stdout.as_slice(), output.stderr.as_slice()].concat();
    std::fs::write(work_dir.join("clusterctl-init.log"), &log).map_err(setup)?;
    if !output.status.success() {
        return Err(SimError::Setup(format!(
            "clusterctl init failed: {}",
            String::from_utf8_lossy(&log)
        )));
    }
    Ok(())
}
