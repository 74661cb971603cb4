//! A real kube-apiserver set up the way the provider is installed: our CRDs, Cluster API's own
//! Cluster, Machine and KubeadmControlPlane CRDs and the sim's infrastructure kinds, the RBAC of
//! config/rbac (cluster-wide) or of config/namespaced (granted in the watched namespaces only),
//! and each controller acting as its own ServiceAccount (by impersonation), so a verb missing
//! from a role shows. The demo runs on it, and so do the scenarios that must pass where the API
//! server decides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;

use etcdadm_envtest::{KubeApiServer, read_crds};

use crate::error::SimError;
use crate::plane::PlaneOptions;

/// The provider's namespace, where config/rbac puts the ServiceAccounts and the Lease Role.
pub const PROVIDER_NAMESPACE: &str = "etcdadm-system";

/// Each controller binary and the ServiceAccount config/rbac gives it.
pub const IDENTITIES: [(&str, &str); 2] = [
    ("etcdadm-bootstrap", "etcdadm-bootstrap-manager"),
    ("etcdadm-controller", "etcdadm-controller-manager"),
];

/// Who applies the CRDs and the RBAC (server-side apply's field manager).
const FIELD_MANAGER: &str = "etcdadm-sim";

/// A running real API server ready for a plane; stopped when dropped.
pub struct RealApiServer {
    pub server: KubeApiServer,
    controller_kubeconfigs: BTreeMap<&'static str, PathBuf>,
    /// The managers' environment as their Deployments set it (the namespaced install's
    /// WATCH_NAMESPACE).
    controller_env: Vec<(String, String)>,
}

/// The variable config/namespaced leaves for clusterctl: the watched namespace.
const WATCH_NAMESPACE_VARIABLE: &str = "${ETCDADM_WATCH_NAMESPACE}";

/// The kinds of config/namespaced the sim installs: its RBAC (the managers run as processes).
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn setup(e: impl std::fmt::Display) -> SimError {
    SimError::Setup(e.to_string())
}

impl RealApiServer {
    /// Start kube-apiserver in a scratch directory (removed with it), install the CRDs and
    /// config/rbac.
    pub async fn start() -> Result<RealApiServer, SimError> {
        RealApiServer::prepare(KubeApiServer::start().await.map_err(setup)?, &[]).await
    }

    /// [`RealApiServer::start`] with `dir` for its data, logs and kubeconfigs (kept).
    pub async fn start_in(dir: &Path) -> Result<RealApiServer, SimError> {
        RealApiServer::prepare(KubeApiServer::start_in(dir).await.map_err(setup)?, &[]).await
    }

    /// [`RealApiServer::start`] with the namespaced install (`kubectl kustomize
    /// config/namespaced`) watching `watched`: its RBAC, the RoleBindings in each watched
    /// namespace (as an overlay for several namespaces has them), and the managers'
    /// WATCH_NAMESPACE from their Deployments, naming them all.
    pub async fn start_namespaced(watched: &[String]) -> Result<RealApiServer, SimError> {
        if watched.is_empty() {
            return Err(SimError::Setup(
                "a namespaced install watches at least one namespace".into(),
            ));
        }
        RealApiServer::prepare(KubeApiServer::start().await.map_err(setup)?, watched).await
    }

    /// `watched` empty: config/rbac as it is (cluster-wide); else the namespaced install.
    async fn prepare(server: KubeApiServer, watched: &[String]) -> Result<RealApiServer, SimError> {
        let mut crds = read_crds(&crate::crd_dir()).map_err(setup)?;
        crds.extend(capi_crds()?);
        // The sim's own kinds: its infrastructure provider's (CAPI's come from CAPI itself).
        crds.extend(
            etcdadm_sim_apiserver::shipped_crds()
                .into_iter()
                .filter(|crd| crd.spec.group == crate::infra::GROUP),
        );
        server
            .install_crds(&crds)
            .await
            .map_err(|e| SimError::Setup(format!("the API server refused CRDs: {e}")))?;
        let client = server.client().await.map_err(setup)?;
        crate::plane::ensure_namespace(&client, PROVIDER_NAMESPACE).await?;
        let controller_env = if watched.is_empty() {
            apply_kustomization(&client, &repo("config/rbac")).await?;
            vec![]
        } else {
            install_namespaced(&client, watched).await?
        };
        let mut controller_kubeconfigs = BTreeMap::new();
        for (binary, account) in IDENTITIES {
            let user = service_account(account);
            let groups = [
                "system:serviceaccounts",
                "system:serviceaccounts:etcdadm-system",
                "system:authenticated",
            ];
            let kubeconfig = server.impersonating_kubeconfig(&user, &groups).map_err(setup)?;
            controller_kubeconfigs.insert(binary, kubeconfig);
        }
        Ok(RealApiServer {
            server,
            controller_kubeconfigs,
            controller_env,
        })
    }

    /// A client acting as `binary`'s ServiceAccount, as the controller does: for what its RBAC
    /// lets it do.
    pub async fn controller_client(&self, binary: &str) -> Result<kube::Client, SimError> {
        let path = self
            .controller_kubeconfigs
            .get(binary)
            .ok_or_else(|| SimError::Setup(format!("no identity for {binary}")))?;
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(setup)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(setup)?;
        kube::Client::try_from(config).map_err(setup)
    }

    /// `options` pointed at this server: the stand-ins and the scenario as admin (they play
    /// CAPI), each controller as its ServiceAccount, electing its leader in the provider's
    /// namespace as it does when installed.
    pub fn plane_options(&self, options: PlaneOptions) -> PlaneOptions {
        PlaneOptions {
            kubeconfig: Some(self.server.kubeconfig().to_path_buf()),
            controller_kubeconfigs: self.controller_kubeconfigs.clone(),
            controller_args: vec![
                "--leader-elect".into(),
                format!("--leader-election-namespace={PROVIDER_NAMESPACE}"),
            ],
            controller_env: [options.controller_env, self.controller_env.clone()].concat(),
            ..options
        }
    }
}

/// Cluster API v1.13's own Cluster, Machine and KubeadmControlPlane CRDs (schemas, defaults,
/// validation; served at v1beta2, with no conversion webhook here): the stand-ins write their
/// objects through the schemas the real controllers' objects have.
fn capi_crds() -> Result<
    Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    SimError,
> {
    let files = [
        "config/crd/bases/cluster.x-k8s.io_clusters.yaml",
        "config/crd/bases/cluster.x-k8s.io_machines.yaml",
        "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
    ];
    files
        .iter()
        .map(|file| {
            let path = crate::real_capi::repository::capi_file(file)?;
            let text = std::fs::read_to_string(&path)
                .map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))?;
            serde_saphyr::from_str(&text).map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))
        })
        .collect()
}

/// Install config/namespaced's RBAC watching `watched` (each created): its documents without the
/// variable once, those with it (the RoleBindings) once per watched namespace. Returns the
/// managers' environment from the Deployments: WATCH_NAMESPACE naming every watched namespace.
async fn install_namespaced(
    client: &kube::Client,
    watched: &[String],
) -> Result<Vec<(String, String)>, SimError> {
    let built = crate::real_capi::repository::kustomize(&repo("config/namespaced"))?;
    let documents: Vec<Value> = serde_saphyr::from_multiple(&built)
        .map_err(|e| SimError::Setup(format!("config/namespaced: {e}")))?;
    for namespace in watched {
        crate::plane::ensure_namespace(client, namespace).await?;
    }
    let kind = |d: &Value| d["kind"].as_str().unwrap_or_default().to_string();
    for document in documents
        .iter()
        .filter(|d| RBAC_KINDS.contains(&kind(d).as_str()))
    {
        let text = document.to_string();
        if !text.contains(WATCH_NAMESPACE_VARIABLE) {
            apply_document(client, document).await?;
            continue;
        }
        for namespace in watched {
            let substituted: Value = serde_json::from_str(&text.replace(WATCH_NAMESPACE_VARIABLE, namespace))
                .map_err(|e| SimError::Setup(format!("config/namespaced: {e}")))?;
            apply_document(client, &substituted).await?;
        }
    }
    let mut env = BTreeMap::new();
    for deployment in documents.iter().filter(|d| kind(d) == "Deployment") {
        let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
        let value = deployment
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "WATCH_NAMESPACE")
            .and_then(|e| e["value"].as_str())
            .ok_or_else(|| {
                SimError::Setup(format!(
                    "config/namespaced: Deployment {name} sets no WATCH_NAMESPACE"
                ))
            })?;
        env.insert(
            "WATCH_NAMESPACE".to_string(),
            value.replace(WATCH_NAMESPACE_VARIABLE, &watched.join(",")),
        );
    }
    if env.is_empty() {
        return Err(SimError::Setup("config/namespaced has no Deployments".into()));
    }
    Ok(env.into_iter().collect())
}

/// `system:serviceaccount:<provider namespace>:<account>`.
pub fn service_account(account: &str) -> String {
    format!("system:serviceaccount:{PROVIDER_NAMESPACE}:{account}")
}

/// Server-side apply every object of the kustomization in `dir`, as `kubectl apply -k` would.
/// Only a plain list of `resources` is understood; anything else in the kustomization is
/// refused by name rather than applied half-way.
pub async fn apply_kustomization(client: &kube::Client, dir: &Path) -> Result<(), SimError> {
    let file = dir.join("kustomization.yaml");
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))
    };
    let kustomization: Value = serde_saphyr::from_str(&read(&file)?)
        .map_err(|e| SimError::Setup(format!("{}: {e}", file.display())))?;
    let keys = kustomization.as_object().map(|o| o.keys().collect::<Vec<_>>());
    if let Some(other) = keys
        .unwrap_or_default()
        .into_iter()
        .find(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "resources"))
    {
        return Err(SimError::Setup(format!(
            "{}: `{other}` is not understood here (only `resources`); apply it with `kubectl apply -k`",
            file.display()
        )));
    }
    let resources = kustomization["resources"].as_array().cloned().unwrap_or_default();
    for resource in resources.iter().filter_map(Value::as_str) {
        let path = dir.join(resource);
        let documents: Vec<Value> = serde_saphyr::from_multiple(&read(&path)?)
            .map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))?;
        for document in documents.iter().filter(|d| d.is_object()) {
            apply_document(client, document)
                .await
                .map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(())
}

async fn apply_document(client: &kube::Client, document: &Value) -> Result<(), SimError> {
    let text = |pointer: &str| {
        document
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (group, version) = match text("/apiVersion").split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", text("/apiVersion")),
    };
    let gvk = GroupVersionKind::gvk(group, version, text("/kind"));
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = Some(text("/metadata/namespace")).filter(|n| !n.is_empty());
            Api::namespaced_with(client.clone(), namespace.unwrap_or("default"), &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(text("/metadata/name"), &params, &Patch::Apply(document))
        .await?;
    Ok(())
}

/// Lines of a controller log that show the API server refusing it (403), for failure messages:
/// a missing RBAC verb shows up here first.
pub fn forbidden_lines(log: &str) -> String {
    log.lines()
        // "forbidden" in any case: a bare "403" also matches timestamps.
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n")
}
