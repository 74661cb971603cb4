//! The clusterctl local repository a real-CAPI plane is installed from, built the way each
//! project releases its components: Cluster API's core, kubeadm bootstrap and kubeadm control
//! plane from their kustomize trees (`kubectl kustomize`, as their release does), ours from
//! `config/default` (what `hack/release.sh` publishes), and the sim's infrastructure provider,
//! whose components are its CRDs (with the contract label) and the role CAPI aggregates.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::error::SimError;

/// The Cluster API release the binaries in `target/capi` are.
pub const CAPI_VERSION: &str = "v1.13.4";
/// This repository's provider release (`clusterctl-settings.json`'s `nextVersion`).
pub const ETCDADM_VERSION: &str = "v0.1.0";
/// The sim's infrastructure provider's release.
pub const SIM_VERSION: &str = "v0.1.0";

/// Where `.ci/setup` unpacks Cluster API (`CAPI_DIR` overrides).
pub fn capi_dir() -> PathBuf {
    std::env::var_os("CAPI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/capi"))
}

/// How to get Cluster API when it is missing.
pub const CAPI_INSTALL_HINT: &str = "Cluster API v1.13.4 not found in target/capi: run `.ci/setup` \
     (it unpacks the managers, clusterctl and their config trees from ../shared/tools/capi, \
     checked by SHA-256), or set CAPI_DIR to a directory laid out the same way";

/// A path under [`capi_dir`], which must exist.
pub fn capi_file(relative: &str) -> Result<PathBuf, SimError> {
    let path = capi_dir().join(relative);
    if path.exists() {
        Ok(path)
    } else {
        Err(SimError::Setup(format!(
            "{}: {CAPI_INSTALL_HINT}",
            path.display()
        )))
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The repository and the clusterctl configuration that points at it.
pub struct Repository {
    /// `clusterctl.yaml`, for `--config`.
    pub config: PathBuf,
}

/// One provider in the repository: clusterctl's name and type, its directory and components.
struct Provider {
    name: &'static str,
    kind: &'static str,
    directory: &'static str,
    version: &'static str,
    components_file: &'static str,
}

const PROVIDERS: [Provider; 5] = [
    Provider {
        name: "cluster-api",
        kind: "CoreProvider",
        directory: "cluster-api",
        version: CAPI_VERSION,
        components_file: "core-components.yaml",
    },
    Provider {
        name: "kubeadm",
        kind: "BootstrapProvider",
        directory: "bootstrap-kubeadm",
        version: CAPI_VERSION,
        components_file: "bootstrap-components.yaml",
    },
    Provider {
        name: "kubeadm",
        kind: "ControlPlaneProvider",
        directory: "control-plane-kubeadm",
        version: CAPI_VERSION,
        components_file: "control-plane-components.yaml",
    },
    Provider {
        name: "etcdadm",
        kind: "BootstrapProvider",
        directory: "bootstrap-etcdadm",
        version: ETCDADM_VERSION,
        components_file: "bootstrap-components.yaml",
    },
    Provider {
        name: "sim",
        kind: "InfrastructureProvider",
        directory: "infrastructure-sim",
        version: SIM_VERSION,
        components_file: "infrastructure-components.yaml",
    },
];

/// `kubectl kustomize dir`.
pub(crate) fn kustomize(dir: &Path) -> Result<String, SimError> {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| {
            SimError::Setup(format!(
                "kubectl kustomize {}: {e}; install kubectl",
                dir.display()
            ))
        })?;
    if !output.status.success() {
        return Err(SimError::Setup(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    String::from_utf8(output.stdout).map_err(|e| SimError::Setup(format!("kustomize output: {e}")))
}

/// The sim's infrastructure components: a namespace, its CRDs labelled with the contract they
/// implement, and the ClusterRole Cluster API's managers aggregate to reach them.
fn sim_components() -> Result<String, SimError> {
    let mut documents =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sim-system"}})];
    for crd in etcdadm_sim_apiserver::shipped_crds() {
        let mut crd = serde_json::to_value(crd)?;
        if crd["spec"]["group"] != crate::infra::GROUP {
            continue;
        }
        crd["metadata"]["labels"] =
            json!({ format!("cluster.x-k8s.io/{}", crate::infra::VERSION): crate::infra::VERSION });
        documents.push(crd);
    }
    documents.push(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "sim-aggregated-manager-role",
                     "labels": {"cluster.x-k8s.io/aggregate-to-manager": "true"}},
        "rules": [{"apiGroups": [crate::infra::GROUP],
                   "resources": ["simclusters", "simclusters/status", "simmachines", "simmachines/status",
                                 "simmachinetemplates"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    }));
    let texts: Result<Vec<String>, _> = documents.iter().map(serde_json::to_string).collect();
    Ok(texts?.join("\n---\n"))
}

fn metadata(contracts: &[(u32, u32, &str)]) -> String {
    let series: Vec<Value> = contracts
        .iter()
        .map(|(major, minor, contract)| json!({"major": major, "minor": minor, "contract": contract}))
        .collect();
    json!({"apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3", "kind": "Metadata", "releaseSeries": series})
        .to_string()
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SimError::Setup(format!("{}: {e}", parent.display())))?;
    }
    std::fs::write(path, text).map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))
}

/// Build the repository under `dir` and the configuration naming each provider's components.
pub fn build(dir: &Path) -> Result<Repository, SimError> {
    let capi_metadata = std::fs::read_to_string(capi_file("metadata.yaml")?)
        .map_err(|e| SimError::Setup(format!("target/capi/metadata.yaml: {e}")))?;
    let our_metadata = std::fs::read_to_string(repo_root().join("metadata.yaml"))
        .map_err(|e| SimError::Setup(format!("metadata.yaml: {e}")))?;
    let mut entries = vec![];
    for provider in &PROVIDERS {
        let (components, provider_metadata) = match provider.directory {
            "cluster-api" => (kustomize(&capi_file("config/default")?)?, capi_metadata.clone()),
            "bootstrap-kubeadm" => (
                kustomize(&capi_file("bootstrap/kubeadm/config/default")?)?,
                capi_metadata.clone(),
            ),
            "control-plane-kubeadm" => (
                kustomize(&capi_file("controlplane/kubeadm/config/default")?)?,
                capi_metadata.clone(),
            ),
            "bootstrap-etcdadm" => (
                kustomize(&repo_root().join("config/default"))?,
                our_metadata.clone(),
            ),
            _ => (sim_components()?, metadata(&[(0, 1, "v1beta2")])),
        };
        let release = dir.join(provider.directory).join(provider.version);
        let components_path = release.join(provider.components_file);
        write(&components_path, &components)?;
        write(&release.join("metadata.yaml"), &provider_metadata)?;
        entries.push(json!({"name": provider.name, "type": provider.kind,
                            "url": components_path.display().to_string()}));
    }
    let config = dir.join("clusterctl.yaml");
    write(&config, &json!({ "providers": entries }).to_string())?;
    Ok(Repository { config })
}

/// The `clusterctl init` arguments that install every provider of the repository.
pub fn init_args() -> Vec<String> {
    vec![
        format!("--core=cluster-api:{CAPI_VERSION}"),
        format!("--bootstrap=kubeadm:{CAPI_VERSION},etcdadm:{ETCDADM_VERSION}"),
        format!("--control-plane=kubeadm:{CAPI_VERSION}"),
        format!("--infrastructure=sim:{SIM_VERSION}"),
    ]
}
