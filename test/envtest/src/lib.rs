//! A real kube-apiserver with its own etcd, for what only a real API server decides (CRD schemas
//! and CEL, admission, RBAC, server-side apply) and for the demo: found the envtest way, started
//! on free loopback ports with a directory of its own, stopped by PID. Nothing here panics: the
//! tests unwrap what it returns, the demo reports it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use etcdadm_shared::pki::{
    CertificateAuthority, IssuedCertificate, KeyType, LeafRequest, Usage, client_tls_config,
};

/// How to get a kube-apiserver when none is found.
pub const KUBE_APISERVER_INSTALL_HINT: &str = "kube-apiserver not found: run `.ci/setup` (it puts \
     one into target/envtest), or set KUBEBUILDER_ASSETS to a directory holding `kube-apiserver` \
     (the envtest layout, e.g. from `setup-envtest use 1.34.x -p path`)";

/// How to get the etcd the API server stores its objects in.
pub const ETCD_INSTALL_HINT: &str = "etcd not found: run `.ci/setup` (it links one into \
     target/envtest), or install it with `apt-get install etcd-server`, or set ETCD_BIN";

/// How long the API server may take to answer `/readyz` (etcd 3.4 and a cold start on two busy
/// cores take about 10 s).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What went wrong starting or talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary is not installed; the message says how to get it.
    #[error("{0}")]
    Missing(String),
    /// Files, ports, certificates or processes could not be set up.
    #[error("setting up kube-apiserver: {0}")]
    Setup(String),
    /// The API server did not come up; the message carries the end of its log.
    #[error("{0}")]
    NotReady(String),
    /// The API server refused or failed a request.
    #[error("{0}")]
    Request(String),
}

fn setup(what: &str) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| Error::Setup(format!("{what}: {e}"))
}

/// Where the envtest assets are: `$KUBEBUILDER_ASSETS`, else `target/envtest` of this checkout
/// (where `.ci/setup` installs them).
pub fn assets_dir() -> PathBuf {
    match std::env::var_os("KUBEBUILDER_ASSETS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/envtest");
            dir.canonicalize().unwrap_or(dir)
        }
    }
}

/// `<assets>/kube-apiserver`, or why there is none.
pub fn kube_apiserver_binary() -> Result<PathBuf, Error> {
    let binary = assets_dir().join("kube-apiserver");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(Error::Missing(format!(
            "{} is missing; {KUBE_APISERVER_INSTALL_HINT}",
            binary.display()
        )))
    }
}

/// The etcd for the API server: `$ETCD_BIN`, else `<assets>/etcd`, else `etcd` on PATH.
pub fn etcd_binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("ETCD_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Missing(format!(
                "ETCD_BIN={} is not a file; {ETCD_INSTALL_HINT}",
                path.display()
            )))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("etcd"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    std::iter::once(assets_dir().join("etcd"))
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::Missing(ETCD_INSTALL_HINT.to_string()))
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
    dir: PathBuf,
    /// A scratch directory of a test goes with the server; the demo's stays for its logs.
    remove_dir: bool,
}

impl std::fmt::Debug for KubeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApiServer")
            .field("url", &self.url)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        stop(&mut self.apiserver);
        stop(&mut self.etcd);
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGKILL by PID and reap; nothing in either process needs a clean shutdown.
fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn free_port() -> Result<u16, Error> {
    etcdadm_shared::testing::ports::free_port().map_err(|e| setup("choosing a free loopback port")(&e))
}

fn spawn_logged(program: &Path, args: &[String], log: &Path) -> Result<Child, Error> {
    let log_file = std::fs::File::create(log).map_err(|e| setup(&log.display().to_string())(&e))?;
    let stderr = log_file.try_clone().map_err(|e| setup("log file")(&e))?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(stderr)
        .spawn()
        .map_err(|e| setup(&format!("starting {}", program.display()))(&e))
}

/// The files the API server is started with.
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
}

/// A CA, the serving certificate, the admin client certificate and the ServiceAccount token
/// keys, written into `dir`.
fn credentials(dir: &Path) -> Result<(CertificateAuthority, IssuedCertificate, Files), Error> {
    let write = |name: &str, content: &str| {
        let path = dir.join(name);
        std::fs::write(&path, content)
            .map(|()| path)
            .map_err(|e| setup(name)(&e))
    };
    let ca = CertificateAuthority::generate("etcdadm-kube-ca").map_err(|e| setup("CA")(&e))?;
    let leaf = |common_name: &str, organizations: Vec<String>, usage: Usage| LeafRequest {
        common_name: common_name.into(),
        organizations,
        dns_names: vec!["localhost".into()],
        ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
        usage,
        validity: Duration::from_secs(24 * 3600),
        key_type: KeyType::EcdsaP256,
    };
    let server_usage = Usage {
        client: false,
        server: true,
    };
    let client_usage = Usage {
        client: true,
        server: false,
    };
    let serving = ca
        .issue(&leaf("kube-apiserver", vec![], server_usage))
        .map_err(|e| setup("serving certificate")(&e))?;
    let admin = ca
        .issue(&leaf(
            "etcdadm-admin",
            vec!["system:masters".into()],
            client_usage,
        ))
        .map_err(|e| setup("admin certificate")(&e))?;
    let sa_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| setup("service account key")(&e))?;
    let files = Files {
        ca: write("ca.crt", ca.cert_pem())?,
        cert: write("serving.crt", &serving.cert_pem)?,
        key: write("serving.key", &serving.key_pem)?,
        sa_key: write("sa.key", &sa_key.serialize_pem())?,
        sa_pub: write("sa.pub", &sa_key.public_key_pem())?,
    };
    Ok((ca, admin, files))
}

impl KubeApiServer {
    /// Start in a scratch directory of its own (removed when the server is dropped) and wait
    /// until `/readyz` answers.
    pub async fn start() -> Result<KubeApiServer, Error> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "etcdadm-kube-apiserver-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        KubeApiServer::launch(&dir, true).await
    }

    /// Start with `dir` (emptied first, kept afterwards: logs, etcd data, kubeconfigs) and wait
    /// until `/readyz` answers.
    pub async fn start_in(dir: &Path) -> Result<KubeApiServer, Error> {
        KubeApiServer::launch(dir, false).await
    }

    async fn launch(dir: &Path, remove_dir: bool) -> Result<KubeApiServer, Error> {
        let apiserver_bin = kube_apiserver_binary()?;
        let etcd_bin = etcd_binary()?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| setup(&dir.display().to_string())(&e))?;
        let (ca, admin, files) = credentials(dir)?;
        let (etcd_client, etcd_peer, secure) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let mut etcd = spawn_logged(
            &etcd_bin,
            &[
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
            ],
            &dir.join("etcd.log"),
        )?;
        let path = |p: &Path| p.display().to_string();
        let apiserver = spawn_logged(
            &apiserver_bin,
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={secure}"),
                format!("--tls-cert-file={}", path(&files.cert)),
                format!("--tls-private-key-file={}", path(&files.key)),
                format!("--client-ca-file={}", path(&files.ca)),
                format!("--service-account-key-file={}", path(&files.sa_pub)),
                format!("--service-account-signing-key-file={}", path(&files.sa_key)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                "--service-cluster-ip-range=10.96.0.0/12".into(),
                "--authorization-mode=RBAC".into(),
                format!("--cert-dir={}", path(&dir.join("certs"))),
            ],
            &dir.join("kube-apiserver.log"),
        );
        let apiserver = match apiserver {
            Ok(child) => child,
            Err(e) => {
                stop(&mut etcd);
                return Err(e);
            }
        };
        let server = KubeApiServer {
            url: format!("https://127.0.0.1:{secure}"),
            kubeconfig: dir.join("kubeconfig"),
            ca_pem: ca.cert_pem().to_string(),
            admin,
            etcd,
            apiserver,
            dir: dir.to_path_buf(),
            remove_dir,
        };
        let yaml = server.kubeconfig_yaml(None)?;
        std::fs::write(&server.kubeconfig, yaml).map_err(|e| setup("kubeconfig")(&e))?;
        server.wait_ready().await
    }

    async fn wait_ready(mut self) -> Result<KubeApiServer, Error> {
        // A plain HTTPS client: kube's logs every refused attempt as an error.
        let tls = client_tls_config(&self.ca_pem, &self.admin.cert_pem, &self.admin.key_pem)
            .map_err(|e| setup("admin TLS")(&e))?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| setup("HTTPS client")(&e))?;
        let readyz = format!("{}/readyz", self.url);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = [("etcd", &mut self.etcd), ("kube-apiserver", &mut self.apiserver)]
                .into_iter()
                .find_map(|(name, child)| child.try_wait().ok().flatten().map(|status| (name, status)));
            if let Some((name, status)) = exited {
                return Err(Error::NotReady(format!(
                    "{name} exited with {status} before the API server was ready; log:\n{}",
                    self.log()
                )));
            }
            if let Ok(response) = http.get(&readyz).send().await
                && response.status().is_success()
            {
                return Ok(self);
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(format!(
                    "kube-apiserver not ready within {READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The last lines of the API server's and etcd's logs, for failure messages.
    pub fn log(&self) -> String {
        ["kube-apiserver.log", "etcd.log"]
            .iter()
            .map(|file| {
                let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
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

    /// Its directory: logs (`kube-apiserver.log`, `etcd.log`), etcd data, kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (`system:masters`), for clients in other processes and kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig whose requests impersonate `user` (e.g.
    /// `system:serviceaccount:etcdadm-system:etcdadm-controller-manager`) with `groups`, so what
    /// it may do is exactly what RBAC grants that identity.
    pub fn impersonating_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf, Error> {
        let file = user.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let path = self.dir.join(format!("kubeconfig-{file}"));
        std::fs::write(&path, self.kubeconfig_yaml(Some((user, groups)))?)
            .map_err(|e| setup(&path.display().to_string())(&e))?;
        Ok(path)
    }

    fn kubeconfig_yaml(&self, impersonate: Option<(&str, &[&str])>) -> Result<String, Error> {
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
            "clusters": [{"name": "envtest", "cluster": {
                "server": self.url,
                "certificate-authority-data": b64(&self.ca_pem),
            }}],
            "users": [{"name": "envtest", "user": user}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest"}}],
            "current-context": "envtest",
        });
        serde_json::to_string_pretty(&config).map_err(|e| setup("kubeconfig")(&e))
    }

    /// An admin client.
    pub async fn client(&self) -> Result<kube::Client, Error> {
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
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await?);
        let params = PatchParams::apply("etcdadm-envtest").force();
        let mut problems = vec![];
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(crd)).await {
                problems.push(format!("{name}: refused: {e}"));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Request(problems.join("\n")));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            loop {
                let current = api
                    .get(&name)
                    .await
                    .map_err(|e| Error::Request(format!("{name}: {e}")))?;
                let conditions = current.status.and_then(|s| s.conditions).unwrap_or_default();
                if conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::Request(format!(
                        "{name}: not Established within 30 s: {conditions:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

/// A client from a kubeconfig file (as a controller process would build it).
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client, Error> {
    let failed =
        |e: &dyn std::fmt::Display| Error::Setup(format!("client from {}: {e}", kubeconfig.display()));
    let config = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| failed(&e))?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .map_err(|e| failed(&e))?;
    kube::Client::try_from(config).map_err(|e| failed(&e))
}

/// Every CRD in the YAML files of `dir` (one per file, as config/crd/bases holds them), sorted by
/// file name.
pub fn read_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let unreadable =
        |path: &Path, e: &dyn std::fmt::Display| Error::Setup(format!("{}: {e}", path.display()));
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| unreadable(dir, &e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|e| unreadable(path, &e))?;
            serde_saphyr::from_str(&text).map_err(|e| unreadable(path, &e))
        })
        .collect()
}
