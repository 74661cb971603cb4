//! A real kube-apiserver (with its own etcd) for the tests of everything the API server decides:
//! CRD schemas and CEL, admission, RBAC, server-side apply. The envtest convention locates it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use super::{TempDir, etcd_binary, mtls_http_client};
use crate::pki::{CertificateAuthority, IssuedCertificate, KeyType, LeafRequest, Usage};

/// How to get a kube-apiserver when none is found.
pub const KUBE_APISERVER_INSTALL_HINT: &str = "kube-apiserver not found: run `.ci/setup` (it puts \
     one into target/envtest), or set KUBEBUILDER_ASSETS to a directory holding `kube-apiserver` \
     (the envtest layout, e.g. from `setup-envtest use 1.34.x -p path`)";

/// `$KUBEBUILDER_ASSETS/kube-apiserver`, else the one `.ci/setup` installs in `target/envtest`.
pub fn kube_apiserver_binary() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("KUBEBUILDER_ASSETS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/envtest"),
    };
    let binary = dir.join("kube-apiserver");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!(
            "{} is missing; {KUBE_APISERVER_INSTALL_HINT}",
            binary.display()
        ))
    }
}

/// etcd and kube-apiserver on free loopback ports, each with its own directory, stopped by PID
/// when dropped. Authorization is RBAC; the admin identity is in `system:masters`.
pub struct KubeApiServer {
    url: String,
    kubeconfig: PathBuf,
    ca_pem: String,
    admin: IssuedCertificate,
    etcd: Child,
    apiserver: Child,
    dir: TempDir,
}

impl std::fmt::Debug for KubeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("choose a free loopback port")
}

fn spawn_logged(program: &Path, args: &[String], log: &Path) -> Child {
    let log_file = std::fs::File::create(log).expect("create log file");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("clone log handle"))
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

impl KubeApiServer {
    /// Start etcd and kube-apiserver and wait until `/readyz` answers `ok`. Panics with an install
    /// hint when a binary is missing, and with the server's log when it does not become ready.
    pub async fn start() -> KubeApiServer {
        let apiserver_bin = kube_apiserver_binary().unwrap_or_else(|hint| panic!("{hint}"));
        let etcd_bin = etcd_binary().unwrap_or_else(|hint| panic!("{hint}"));
        let dir = TempDir::new("etcdadm-test-kube-apiserver");
        let write = |name: &str, content: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write apiserver file");
            path
        };

        let ca = CertificateAuthority::generate("etcdadm-test-kube-ca").expect("generate CA");
        let leaf = |common_name: &str, organizations: Vec<String>, usage: Usage| LeafRequest {
            common_name: common_name.into(),
            organizations,
            dns_names: vec!["localhost".into()],
            ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
            usage,
            validity: Duration::from_secs(24 * 3600),
            key_type: KeyType::EcdsaP256,
        };
        let serving = ca
            .issue(&leaf(
                "kube-apiserver",
                vec![],
                Usage {
                    client: false,
                    server: true,
                },
            ))
            .expect("issue serving certificate");
        let admin = ca
            .issue(&leaf(
                "etcdadm-test-admin",
                vec!["system:masters".into()],
                Usage {
                    client: true,
                    server: false,
                },
            ))
            .expect("issue admin certificate");
        let sa_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .expect("generate service account key");
        let ca_file = write("ca.crt", ca.cert_pem());
        let cert_file = write("serving.crt", &serving.cert_pem);
        let key_file = write("serving.key", &serving.key_pem);
        let sa_key_file = write("sa.key", &sa_key.serialize_pem());
        let sa_pub_file = write("sa.pub", &sa_key.public_key_pem());

        let (etcd_client, etcd_peer, secure) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd = spawn_logged(
            &etcd_bin,
            &[
                format!("--data-dir={}", dir.path().join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
            ],
            &dir.path().join("etcd.log"),
        );
        let path = |p: &Path| p.display().to_string();
        let apiserver = spawn_logged(
            &apiserver_bin,
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={secure}"),
                format!("--tls-cert-file={}", path(&cert_file)),
                format!("--tls-private-key-file={}", path(&key_file)),
                format!("--client-ca-file={}", path(&ca_file)),
                format!("--service-account-key-file={}", path(&sa_pub_file)),
                format!("--service-account-signing-key-file={}", path(&sa_key_file)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                "--service-cluster-ip-range=10.96.0.0/12".into(),
                "--authorization-mode=RBAC".into(),
                format!("--cert-dir={}", path(&dir.path().join("certs"))),
            ],
            &dir.path().join("kube-apiserver.log"),
        );
        let url = format!("https://127.0.0.1:{secure}");
        let kubeconfig = dir.path().join("kubeconfig");
        let mut server = KubeApiServer {
            url,
            kubeconfig,
            ca_pem: ca.cert_pem().to_string(),
            admin,
            etcd,
            apiserver,
            dir,
        };
        std::fs::write(&server.kubeconfig, server.kubeconfig_yaml(None)).expect("write kubeconfig");
        server.wait_ready(Duration::from_secs(60)).await;
        server
    }

    async fn wait_ready(&mut self, timeout: Duration) {
        let http = mtls_http_client(&self.ca_pem, &self.admin);
        let deadline = Instant::now() + timeout;
        loop {
            let exited = [("etcd", &mut self.etcd), ("kube-apiserver", &mut self.apiserver)]
                .into_iter()
                .find_map(|(name, child)| child.try_wait().ok().flatten().map(|status| (name, status)));
            if let Some((name, status)) = exited {
                panic!(
                    "{name} exited with {status} before the API server was ready; log:\n{}",
                    self.log()
                );
            }
            if let Ok(response) = http.get(format!("{}/readyz", self.url)).send().await
                && response.status().is_success()
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "kube-apiserver not ready within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The last lines of the API server's and etcd's logs, for failure messages.
    pub fn log(&self) -> String {
        ["kube-apiserver.log", "etcd.log"]
            .iter()
            .map(|file| {
                let text = std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("--- {file} (last 40 lines)\n{tail}\n")
            })
            .collect()
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin kubeconfig (`system:masters`), for clients in other processes and kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig whose requests impersonate `user` (e.g.
    /// `system:serviceaccount:etcdadm-system:etcdadm-controller-manager`) with `groups`, so what
    /// it may do is exactly what RBAC grants that identity.
    pub fn impersonating_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        let file = user.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let path = self.dir.path().join(format!("kubeconfig-{file}"));
        std::fs::write(&path, self.kubeconfig_yaml(Some((user, groups)))).expect("write kubeconfig");
        path
    }

    fn kubeconfig_yaml(&self, impersonate: Option<(&str, &[&str])>) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut user = serde_json::json!({
            "client-certificate-data": b64(&self.admin.cert_pem),
            "client-key-data": b64(&self.admin.key_pem),
        });
        if let Some((name, groups)) = impersonate {
            user["as"] = name.into();
            user["as-groups"] = groups.iter().map(|g| g.to_string()).collect::<Vec<_>>().into();
        }
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url,
                "certificate-authority-data": b64(&self.ca_pem),
            }}],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        });
        serde_json::to_string_pretty(&config).expect("kubeconfig serializes")
    }

    /// An admin client.
    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig).await
    }

    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new("kubectl");
        command.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        command
    }

    /// Apply every CRD by server-side apply and wait until each is Established. The error names
    /// each CRD the server refused or did not establish, with the server's message.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<(), String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        let params = PatchParams::apply("etcdadm-tests").force();
        let mut problems = vec![];
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(crd)).await {
                problems.push(format!("{name}: refused: {e}"));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            loop {
                let current = api.get(&name).await.map_err(|e| format!("{name}: {e}"))?;
                let conditions = current.status.and_then(|s| s.conditions).unwrap_or_default();
                if conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{name}: not Established within 30 s: {conditions:?}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// A client from a kubeconfig file (as a controller process would build it).
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .expect("kubeconfig to client config");
    kube::Client::try_from(config).expect("client from kubeconfig")
}

/// Every CRD in the YAML files of `dir` (one per file, as config/crd/bases holds them).
pub fn read_crds(dir: &Path) -> Vec<CustomResourceDefinition> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).expect("read CRD file");
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
        })
        .collect()
}
