//! The kubelet of a real-CAPI plane: each provider Deployment `clusterctl init` created runs as
//! one process of the binary its image holds, with the arguments and environment the
//! Deployment gives its container, acting as the Deployment's ServiceAccount (by impersonation,
//! so RBAC decides what it may do), its webhook certificate Secret as its certificate directory.
//! Only the listen addresses are chosen here (free ports on 127.0.0.1), and stopped by PID.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::process::{Child, Command};

use etcdadm_envtest::KubeApiServer;

use super::repository::capi_file;
use crate::error::SimError;
use crate::plane::{ControllerPorts, http_get, sibling_binary};

/// The binary each provider Deployment's image holds, and the name of its log.
const BINARIES: [(&str, Binary, &str); 5] = [
    (
        "capi-controller-manager",
        Binary::Capi("manager"),
        "capi-controller-manager.log",
    ),
    (
        "capi-kubeadm-bootstrap-controller-manager",
        Binary::Capi("kubeadm-bootstrap-manager"),
        "capi-kubeadm-bootstrap-controller-manager.log",
    ),
    (
        "capi-kubeadm-control-plane-controller-manager",
        Binary::Capi("kubeadm-control-plane-manager"),
        "capi-kubeadm-control-plane-controller-manager.log",
    ),
    (
        "etcdadm-bootstrap-manager",
        Binary::Ours("etcdadm-bootstrap"),
        "etcdadm-bootstrap.log",
    ),
    (
        "etcdadm-controller-manager",
        Binary::Ours("etcdadm-controller"),
        "etcdadm-controller.log",
    ),
];

#[derive(Clone, Copy)]
enum Binary {
    /// Unpacked into target/capi by `.ci/setup`.
    Capi(&'static str),
    /// Built beside the sim.
    Ours(&'static str),
}

/// The listen flags the kubelet sets itself; the Deployment's values are dropped.
const ADDRESS_FLAGS: [&str; 5] = [
    "--diagnostics-address",
    "--health-addr",
    "--webhook-port",
    "--webhook-cert-dir",
    "--metrics-bind-addr",
];

/// One running provider Deployment.
pub struct Pod {
    pub deployment: String,
    pub namespace: String,
    /// The labels of its pod template, which Services select.
    pub labels: BTreeMap<String, String>,
    pub webhook_port: u16,
    pub ports: ControllerPorts,
    pub log: PathBuf,
    child: Child,
}

impl Pod {
    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.reverse();
        tail.join("\n")
    }

    /// SIGKILL and reap.
    pub async fn stop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

fn free_port() -> Result<u16, SimError> {
    etcdadm_shared::testing::ports::free_port().map_err(|e| SimError::Setup(format!("choosing a port: {e}")))
}

/// The Deployment's container arguments with the listen flags set here. Cluster API's
/// managers find the namespace of their leader-election Lease only in the ServiceAccount
/// mount of a pod: each runs as its Deployment's one replica, without `--leader-elect`.
fn arguments(
    deployment: &Deployment,
    binary: Binary,
    webhook_port: u16,
    cert_dir: &Path,
    ports: ControllerPorts,
) -> Vec<String> {
    let container = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first());
    let mut args: Vec<String> = container
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !ADDRESS_FLAGS.iter().any(|flag| a.starts_with(flag)))
        .filter(|a| !(matches!(binary, Binary::Capi(_)) && a.starts_with("--leader-elect")))
        .collect();
    args.extend([
        format!("--diagnostics-address={}", ports.diagnostics),
        format!("--health-addr={}", ports.health),
        format!("--webhook-port={webhook_port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ]);
    args
}

/// The container's environment: plain values, and the downward API's namespace and name.
fn environment(deployment: &Deployment, namespace: &str) -> Vec<(String, String)> {
    let container = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first());
    let pod_name = format!("{}-sim", deployment.name_any());
    container
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|var| {
            let value = match (
                &var.value,
                var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()),
            ) {
                (Some(value), _) => value.clone(),
                (None, Some(field)) if field.field_path == "metadata.namespace" => namespace.to_string(),
                (None, Some(field)) if field.field_path == "metadata.name" => pod_name.clone(),
                (None, Some(field)) if field.field_path == "metadata.uid" => format!("{pod_name}-uid"),
                _ => return None,
            };
            Some((var.name, value))
        })
        .collect()
}

/// The webhook certificate Secret the Deployment mounts, written into `dir`.
async fn certificate_dir(
    client: &Client,
    deployment: &Deployment,
    namespace: &str,
    dir: &Path,
) -> Result<(), SimError> {
    let secret_name = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.volumes.as_ref())
        .and_then(|volumes| {
            volumes
                .iter()
                .find_map(|v| v.secret.as_ref()?.secret_name.clone())
        })
        .ok_or_else(|| {
            SimError::Setup(format!(
                "Deployment {} mounts no certificate Secret",
                deployment.name_any()
            ))
        })?;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(&secret_name)
        .await?;
    std::fs::create_dir_all(dir).map_err(|e| SimError::Setup(format!("{}: {e}", dir.display())))?;
    for (key, value) in secret.data.unwrap_or_default() {
        std::fs::write(dir.join(&key), &value.0).map_err(|e| SimError::Setup(format!("{key}: {e}")))?;
    }
    Ok(())
}

/// Start every provider Deployment in the cluster, each as its ServiceAccount; returns the pods
/// and, per `<namespace>/<Service>`, the webhook port serving it.
pub async fn start_all(
    client: &Client,
    server: &KubeApiServer,
    work_dir: &Path,
) -> Result<(Vec<Pod>, BTreeMap<String, u16>), SimError> {
    let deployments: Api<Deployment> = Api::all(client.clone());
    let mut pods = vec![];
    for deployment in deployments.list(&ListParams::default()).await?.items {
        let name = deployment.name_any();
        let Some((_, binary, log_name)) = BINARIES.iter().find(|(d, ..)| *d == name) else {
            continue;
        };
        let namespace = deployment.namespace().unwrap_or_default();
        let account = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let user = format!("system:serviceaccount:{namespace}:{account}");
        let groups = [
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
            "system:authenticated",
        ];
        let kubeconfig = server
            .impersonating_kubeconfig(&user, &groups)
            .map_err(|e| SimError::Setup(e.to_string()))?;
        let cert_dir = work_dir.join("pods").join(&name).join("serving-certs");
        certificate_dir(client, &deployment, &namespace, &cert_dir).await?;
        let program = match binary {
            Binary::Capi(file) => capi_file(file)?,
            Binary::Ours(file) => sibling_binary(file)?,
        };
        let webhook_port = free_port()?;
        let ports = ControllerPorts::choose()?;
        let log = work_dir.join(log_name);
        let log_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| SimError::Setup(format!("{}: {e}", log.display())))?;
        let stderr = log_file.try_clone().map_err(|e| SimError::Setup(e.to_string()))?;
        let child = Command::new(&program)
            .args(arguments(&deployment, *binary, webhook_port, &cert_dir, ports))
            .envs(environment(&deployment, &namespace))
            .env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("SIM_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SimError::Setup(format!("starting {}: {e}", program.display())))?;
        let labels = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        pods.push(Pod {
            deployment: name,
            namespace,
            labels,
            webhook_port,
            ports,
            log,
            child,
        });
    }
    let services = service_ports(client, &pods).await?;
    Ok((pods, services))
}

/// Which pod serves each Service: the one whose labels its selector matches.
async fn service_ports(client: &Client, pods: &[Pod]) -> Result<BTreeMap<String, u16>, SimError> {
    let mut ports = BTreeMap::new();
    for service in Api::<Service>::all(client.clone())
        .list(&Default::default())
        .await?
        .items
    {
        let namespace = service.namespace().unwrap_or_default();
        let selector = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        if selector.is_empty() {
            continue;
        }
        let serving = pods
            .iter()
            .find(|p| p.namespace == namespace && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v)));
        if let Some(pod) = serving {
            ports.insert(format!("{namespace}/{}", service.name_any()), pod.webhook_port);
        }
    }
    Ok(ports)
}

/// Wait until every pod answers `/readyz` (its caches synced and its webhook server started).
pub async fn wait_ready(pods: &mut [Pod], timeout: Duration) -> Result<(), SimError> {
    let deadline = Instant::now() + timeout;
    for pod in pods.iter_mut() {
        loop {
            if let Ok(Some(status)) = pod.child.try_wait() {
                return Err(SimError::Setup(format!(
                    "{} exited with {status}; its log ends:\n{}",
                    pod.deployment,
                    pod.log_tail(20)
                )));
            }
            let health: SocketAddr = pod.ports.health;
            if matches!(http_get(health, "/readyz").await, Ok((200, _))) {
                break;
            }
            if Instant::now() > deadline {
                return Err(SimError::Setup(format!(
                    "{} not ready within {timeout:?}; its log ends:\n{}",
                    pod.deployment,
                    pod.log_tail(20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
