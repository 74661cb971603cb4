//! A real kube-apiserver for a scenario, set up the way the provider is installed: our CRDs and
//! the sim's, the RBAC of config/rbac, and each controller acting as its own ServiceAccount, so a
//! verb missing from a ClusterRole fails the scenario.

use std::collections::BTreeMap;
use std::path::PathBuf;

use etcdadm_shared::testing::{KubeApiServer, read_crds};
use etcdadm_sim::plane::PlaneOptions;

/// The provider's namespace, where config/rbac puts the ServiceAccounts and the Lease Role.
const PROVIDER_NAMESPACE: &str = "etcdadm-system";

/// Each controller binary and the ServiceAccount config/rbac gives it.
const IDENTITIES: [(&str, &str); 2] = [
    ("etcdadm-bootstrap", "etcdadm-bootstrap-manager"),
    ("etcdadm-controller", "etcdadm-controller-manager"),
];

/// A running real API server ready for a plane; stopped when dropped.
pub struct RealApiServer {
    pub server: KubeApiServer,
    controller_kubeconfigs: BTreeMap<&'static str, PathBuf>,
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// Run kubectl against `server`; panics with its output when it fails.
fn kubectl(server: &KubeApiServer, args: &[&str]) {
    let output = server
        .kubectl()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    assert!(
        output.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl RealApiServer {
    /// Start kube-apiserver, install the CRDs and config/rbac.
    pub async fn start() -> RealApiServer {
        let server = KubeApiServer::start().await;
        let mut crds = read_crds(&repo("config/crd/bases"));
        crds.extend(etcdadm_sim_apiserver::shipped_crds());
        if let Err(problems) = server.install_crds(&crds).await {
            panic!("the real API server refused CRDs:\n{problems}");
        }
        kubectl(&server, &["create", "namespace", PROVIDER_NAMESPACE]);
        let rbac = repo("config/rbac");
        kubectl(
            &server,
            &["apply", "--server-side", "-k", &rbac.display().to_string()],
        );
        let controller_kubeconfigs = IDENTITIES
            .iter()
            .map(|(binary, account)| {
                let user = format!("system:serviceaccount:{PROVIDER_NAMESPACE}:{account}");
                let groups = [
                    "system:serviceaccounts",
                    "system:serviceaccounts:etcdadm-system",
                    "system:authenticated",
                ];
                (*binary, server.impersonating_kubeconfig(&user, &groups))
            })
            .collect();
        RealApiServer {
            server,
            controller_kubeconfigs,
        }
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
            ..options
        }
    }
}

/// Lines of a controller log that show the API server refusing it (403), for failure messages:
/// a missing RBAC verb shows up here first.
pub fn forbidden_lines(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("403") || l.contains("forbidden") || l.contains("Forbidden"))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n")
}
