//! What `kubeadm init`/`join` does on a control plane host before its kubelet starts the static
//! pods, as far as a real kube-apiserver on the cluster's external etcd needs: the bootstrap
//! data's `write_files` land in the host's root, the kubeadm configuration is read (init: the
//! ClusterConfiguration beside it; join: the cluster's `kubeadm-config`), and the API server's
//! serving certificate is issued from the cluster CA written there.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use etcdadm_shared::pki::{CertificateAuthority, IssuedCertificate, KeyType, LeafRequest, Usage};
use etcdadm_sim_machines::cloud_config::parse_user_data;
use etcdadm_sim_machines::write_files::{resolve_under, write_entry};

use crate::error::SimError;

/// Where CABPK's cloud-init puts kubeadm's configuration for an init and for a join.
const INIT_CONFIG: &str = "/run/kubeadm/kubeadm.yaml";
const JOIN_CONFIG: &str = "/run/kubeadm/kubeadm-join-config.yaml";
/// kubeadm's PKI directory on a host.
const PKI: &str = "/etc/kubernetes/pki";
/// The port kubeadm's API server listens on unless the configuration says otherwise.
pub const API_SERVER_PORT: u16 = 6443;

fn failed(e: impl std::fmt::Display) -> SimError {
    SimError::Setup(e.to_string())
}

/// What the host learned from its bootstrap data.
pub struct Bootstrap {
    /// `init` carries the ClusterConfiguration document to upload; `join` the endpoint to read
    /// the cluster's from.
    pub role: Role,
    /// `nodeRegistration` of the Init- or JoinConfiguration (name, taints, ...).
    pub node_registration: Value,
}

pub enum Role {
    Init { cluster_configuration: String },
    Join { api_server_endpoint: String },
}

/// Write the user data's files under `root` (its `/`) and read the kubeadm configuration. The
/// Jinja hostname variables are answered with `hostname`, as cloud-init does with the Machine's.
pub fn write_bootstrap(root: &Path, user_data: &str, hostname: &str) -> Result<Bootstrap, SimError> {
    let config = parse_user_data(user_data, hostname).map_err(failed)?;
    for file in &config.write_files {
        write_entry(root, file).map_err(failed)?;
    }
    let read = |path: &str| {
        let on_host = resolve_under(root, path).map_err(failed)?;
        Ok::<_, SimError>(std::fs::read_to_string(on_host).ok())
    };
    let (text, init) = match (read(INIT_CONFIG)?, read(JOIN_CONFIG)?) {
        (Some(text), _) => (text, true),
        (None, Some(text)) => (text, false),
        (None, None) => {
            return Err(SimError::Setup(format!(
                "the bootstrap data writes neither {INIT_CONFIG} nor {JOIN_CONFIG}: not kubeadm's"
            )));
        }
    };
    let documents = documents(&text)?;
    let find = |kind: &str| documents.iter().find(|(_, d)| d["kind"] == kind);
    let role = if init {
        let (raw, _) = find("ClusterConfiguration")
            .ok_or_else(|| SimError::Setup(format!("{INIT_CONFIG} has no ClusterConfiguration")))?;
        Role::Init {
            cluster_configuration: raw.clone(),
        }
    } else {
        let (_, join) = find("JoinConfiguration")
            .ok_or_else(|| SimError::Setup(format!("{JOIN_CONFIG} has no JoinConfiguration")))?;
        let endpoint = join
            .pointer("/discovery/bootstrapToken/apiServerEndpoint")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                SimError::Setup(
                    "the JoinConfiguration names no discovery.bootstrapToken.apiServerEndpoint".into(),
                )
            })?;
        Role::Join {
            api_server_endpoint: endpoint.to_string(),
        }
    };
    let kind = if init {
        "InitConfiguration"
    } else {
        "JoinConfiguration"
    };
    let node_registration = find(kind)
        .map(|(_, d)| d["nodeRegistration"].clone())
        .unwrap_or(Value::Null);
    Ok(Bootstrap {
        role,
        node_registration,
    })
}

/// Each YAML document of `text`: its raw text and its parsed value.
fn documents(text: &str) -> Result<Vec<(String, Value)>, SimError> {
    let mut raw = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            raw.push(String::new());
        } else if let Some(last) = raw.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    raw.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| {
            let value: Value = serde_saphyr::from_str(&d)
                .map_err(|e| SimError::Setup(format!("kubeadm configuration does not parse: {e}")))?;
            Ok((d, value))
        })
        .collect()
}

/// Parse a ClusterConfiguration document (YAML or JSON).
pub fn parse_cluster_configuration(text: &str) -> Result<Value, SimError> {
    serde_saphyr::from_str(text)
        .map_err(|e| SimError::Setup(format!("ClusterConfiguration does not parse: {e}")))
}

/// The cluster CA kubeadm finds in the host's PKI directory.
pub fn cluster_ca(root: &Path) -> Result<CertificateAuthority, SimError> {
    let read = |file: &str| {
        let path = on_host(root, &format!("{PKI}/{file}"))?;
        std::fs::read_to_string(&path).map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))
    };
    CertificateAuthority::from_pem(&read("ca.crt")?, &read("ca.key")?)
        .map_err(|e| SimError::Setup(format!("the cluster CA in {PKI}: {e}")))
}

fn on_host(root: &Path, path: &str) -> Result<PathBuf, SimError> {
    resolve_under(root, path).map_err(failed)
}

/// A client certificate of the cluster CA for `name` in group `system:masters` (what kubeadm
/// writes into `admin.conf`).
pub fn admin_certificate(ca: &CertificateAuthority, name: &str) -> Result<IssuedCertificate, SimError> {
    ca.issue(&LeafRequest {
        common_name: name.to_string(),
        organizations: vec!["system:masters".into()],
        dns_names: vec![],
        ips: vec![],
        usage: Usage {
            client: true,
            server: false,
        },
        validity: Duration::from_secs(365 * 24 * 3600),
        key_type: KeyType::EcdsaP256,
    })
    .map_err(|e| SimError::Setup(format!("admin certificate: {e}")))
}

/// Issue `apiserver.crt`/`apiserver.key` (CN `kube-apiserver`, which KCP looks for) for the
/// host's address, the control plane endpoint's host, 127.0.0.1 and the in-cluster names.
pub fn write_serving_certificate(
    root: &Path,
    ca: &CertificateAuthority,
    address: IpAddr,
    endpoint_host: Option<&str>,
) -> Result<(), SimError> {
    let mut dns_names: Vec<String> = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    let mut ips = vec![address, IpAddr::from([127, 0, 0, 1])];
    match endpoint_host.map(|h| (h, h.parse::<IpAddr>())) {
        Some((_, Ok(ip))) => ips.push(ip),
        Some((name, Err(_))) => dns_names.push(name.to_string()),
        None => {}
    }
    let leaf = ca
        .issue(&LeafRequest {
            common_name: "kube-apiserver".into(),
            organizations: vec![],
            dns_names,
            ips,
            usage: Usage {
                client: false,
                server: true,
            },
            validity: Duration::from_secs(365 * 24 * 3600),
            key_type: KeyType::Rsa2048,
        })
        .map_err(|e| SimError::Setup(format!("API server certificate: {e}")))?;
    for (file, content) in [
        ("apiserver.crt", &leaf.cert_pem),
        ("apiserver.key", &leaf.key_pem),
    ] {
        let path = on_host(root, &format!("{PKI}/{file}"))?;
        std::fs::write(&path, content).map_err(|e| SimError::Setup(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// The `kube-apiserver` flags kubeadm's static pod manifest would give, for `address` on the
/// host rooted at `root`, storing in the external etcd of `cluster_configuration`.
pub fn api_server_args(
    root: &Path,
    address: IpAddr,
    cluster_configuration: &Value,
) -> Result<Vec<String>, SimError> {
    let external = &cluster_configuration["etcd"]["external"];
    let endpoints: Vec<&str> = external["endpoints"]
        .as_array()
        .map(|e| e.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if endpoints.is_empty() {
        return Err(SimError::Setup(
            "the ClusterConfiguration has no etcd.external.endpoints (only external etcd is played here)"
                .into(),
        ));
    }
    let file = |key: &str| -> Result<String, SimError> {
        let path = external[key]
            .as_str()
            .ok_or_else(|| SimError::Setup(format!("etcd.external.{key} is missing")))?;
        Ok(on_host(root, path)?.display().to_string())
    };
    let pki = |name: &str| on_host(root, &format!("{PKI}/{name}")).map(|p| p.display().to_string());
    let service_subnet = cluster_configuration
        .pointer("/networking/serviceSubnet")
        .and_then(Value::as_str)
        .unwrap_or("10.96.0.0/12");
    Ok(vec![
        format!("--advertise-address={address}"),
        format!("--bind-address={address}"),
        format!("--secure-port={API_SERVER_PORT}"),
        format!("--etcd-servers={}", endpoints.join(",")),
        format!("--etcd-cafile={}", file("caFile")?),
        format!("--etcd-certfile={}", file("certFile")?),
        format!("--etcd-keyfile={}", file("keyFile")?),
        format!("--client-ca-file={}", pki("ca.crt")?),
        format!("--tls-cert-file={}", pki("apiserver.crt")?),
        format!("--tls-private-key-file={}", pki("apiserver.key")?),
        format!("--service-account-key-file={}", pki("sa.pub")?),
        format!("--service-account-signing-key-file={}", pki("sa.key")?),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-cluster-ip-range={service_subnet}"),
        format!("--requestheader-client-ca-file={}", pki("front-proxy-ca.crt")?),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--allow-privileged=true".into(),
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        format!(
            "--cert-dir={}",
            on_host(root, "/var/lib/kube-apiserver")?.display()
        ),
    ])
}

/// The host part of `host:port`.
pub fn endpoint_host(endpoint: &str) -> &str {
    endpoint.rsplit_once(':').map_or(endpoint, |(host, _)| host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_their_text() {
        let text = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\netcd:\n  external:\n    endpoints: [https://a:2379]\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nnodeRegistration:\n  name: m1\n";
        let docs = documents(text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].1["kind"], "ClusterConfiguration");
        assert!(docs[0].0.contains("endpoints: [https://a:2379]"));
        assert!(!docs[0].0.contains("InitConfiguration"));
        assert_eq!(docs[1].1["nodeRegistration"]["name"], "m1");
        assert_eq!(endpoint_host("127.0.42.1:6443"), "127.0.42.1");
    }
}
