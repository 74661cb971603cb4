//! The throwaway etcd a drill restores into: etcd's own tool restores the downloaded snapshot
//! into a data directory of the drill's scratch directory, and one etcd process serves it on
//! 127.0.0.1, on ports the kernel chose, over mutual TLS with a CA made for this drill alone
//! (the copy holds every Secret of the workload cluster). Dropping it kills the process by its
//! PID and removes the scratch directory, whatever happened before.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};

/// How to get the binaries when none is found.
pub const INSTALL_HINT: &str = "restore drills run etcd and its restore tool (etcdutl, or etcdctl \
     for etcd 3.4) beside the controller: the provider image does not carry them; add the etcd \
     release's etcd and etcdutl of your clusters' minor version to the controller's container (a \
     derived image, or a volume) and point --drill-etcd-dir at their directory, or put them on PATH";

/// The etcd binaries a drill runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tools {
    pub etcd: PathBuf,
    /// `etcdutl` (3.5+), else `etcdctl` (3.4's `snapshot restore`).
    pub restore: PathBuf,
}

impl Tools {
    /// The binaries in `dir`, else on PATH; an error says what is missing and how to provide it.
    pub fn find(dir: Option<&Path>) -> Result<Tools, String> {
        let dirs: Vec<PathBuf> = match dir {
            Some(dir) => vec![dir.to_path_buf()],
            None => std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default(),
        };
        let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        let where_ = match dir {
            Some(dir) => format!("in {}", dir.display()),
            None => "on PATH".to_string(),
        };
        let etcd = find("etcd").ok_or_else(|| format!("no etcd binary {where_}; {INSTALL_HINT}"))?;
        let restore = find("etcdutl")
            .or_else(|| find("etcdctl"))
            .ok_or_else(|| format!("no etcdutl or etcdctl binary {where_}; {INSTALL_HINT}"))?;
        Ok(Tools { etcd, restore })
    }
}

/// Bounds of one throwaway etcd.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `snapshot restore` ends within this.
    pub restore: Duration,
    /// The process serves within this after it starts.
    pub start: Duration,
    /// Deadline of each call made to it.
    pub call: Duration,
}

/// Where a drill works: a scratch directory removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new directory under `parent`, named after `name` (its first 64 characters: a file
    /// name has at most 255 bytes, an object name 253 characters).
    pub fn new(parent: &Path, name: &str) -> std::io::Result<Scratch> {
        let short: String = name.chars().take(64).collect();
        let path = parent.join(format!(
            "etcdadm-drill-{}-{short}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(Scratch(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running throwaway etcd holding the restored snapshot.
pub struct Throwaway {
    child: Child,
    pub client: MemberClient,
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        // By PID, SIGKILL: nothing of it is kept. `kill_on_drop` reaps it too.
        let _ = self.child.start_kill();
    }
}

/// Ports taken before etcd bound them are tried again on new ones this many times in all.
const PORT_ATTEMPTS: usize = 3;

/// Restore `snapshot` (a file in `scratch`) with etcd's tool and serve it from a throwaway
/// etcd with room for `quota` bytes.
pub async fn restore_and_start(
    tools: &Tools,
    scratch: &Scratch,
    snapshot: &Path,
    quota: u64,
    limits: Limits,
) -> Result<Throwaway, String> {
    let tls_dir = scratch.path().join("tls");
    std::fs::create_dir_all(&tls_dir).map_err(|e| format!("creating {}: {e}", tls_dir.display()))?;
    // RSA keys take a while to make: off the runtime's threads.
    let tls_files = tls_dir.clone();
    let tls = tokio::task::spawn_blocking(move || make_tls(&tls_files))
        .await
        .map_err(|e| format!("making the drill's certificates: {e}"))??;
    let mut last = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let data = scratch.path().join("data");
        let _ = std::fs::remove_dir_all(&data);
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        restore(tools, snapshot, &data, &peer_url, limits.restore).await?;
        let client_url = format!("https://127.0.0.1:{client_port}");
        let log_path = scratch.path().join("etcd.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("creating the etcd log: {e}"))?;
        let err_log = log.try_clone().map_err(|e| e.to_string())?;
        let mut child = Command::new(&tools.etcd)
            .args([
                "--name=drill".to_string(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=drill={peer_url}"),
                format!("--quota-backend-bytes={quota}"),
                "--client-cert-auth=true".to_string(),
                format!("--trusted-ca-file={}", tls_dir.join("ca.crt").display()),
                format!("--cert-file={}", tls_dir.join("server.crt").display()),
                format!("--key-file={}", tls_dir.join("server.key").display()),
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}; {INSTALL_HINT}", tools.etcd.display()))?;
        let client = MemberClient::new(&client_url, &tls, limits.call).map_err(|e| e.to_string())?;
        match serving(&mut child, &client, limits.start).await {
            Ok(()) => return Ok(Throwaway { child, client }),
            Err(problem) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                if !log.contains("address already in use") {
                    return Err(format!("{problem}; its log ends: {}", tail(&log)));
                }
                last = problem;
            }
        }
    }
    Err(format!(
        "the throwaway etcd found its ports taken {PORT_ATTEMPTS} times: {last}"
    ))
}

/// The drill's CA, the server certificate for 127.0.0.1 in `dir`, and a client identity.
fn make_tls(dir: &Path) -> Result<EtcdTls, String> {
    let problem = |e: &dyn std::fmt::Display| format!("making the drill's certificates: {e}");
    let ca = CertificateAuthority::generate("etcdadm-restore-drill").map_err(|e| problem(&e))?;
    let server = ca
        .issue(&LeafRequest::member(
            "drill",
            vec!["localhost".into()],
            vec![std::net::IpAddr::from([127, 0, 0, 1])],
        ))
        .map_err(|e| problem(&e))?;
    for (file, pem) in [
        ("ca.crt", ca.cert_pem()),
        ("server.crt", server.cert_pem.as_str()),
        ("server.key", server.key_pem.as_str()),
    ] {
        std::fs::write(dir.join(file), pem).map_err(|e| problem(&e))?;
    }
    EtcdTls::issued_by(&ca, "etcdadm-restore-drill", Duration::from_secs(24 * 3600)).map_err(|e| problem(&e))
}

/// A port on 127.0.0.1 the kernel chose (free when it was asked).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("choosing a port on 127.0.0.1: {e}"))
}

/// `snapshot restore` of `snapshot` into `data`, within `deadline`.
async fn restore(
    tools: &Tools,
    snapshot: &Path,
    data: &Path,
    peer_url: &str,
    deadline: Duration,
) -> Result<(), String> {
    let mut command = Command::new(&tools.restore);
    command
        .args([
            "snapshot".to_string(),
            "restore".to_string(),
            snapshot.display().to_string(),
            format!("--data-dir={}", data.display()),
            "--name=drill".to_string(),
            format!("--initial-cluster=drill={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
        ])
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let tool = tools.restore.display();
    let output = tokio::time::timeout(deadline, command.output())
        .await
        .map_err(|_| format!("{tool} snapshot restore did not finish within {deadline:?}"))?
        .map_err(|e| format!("running {tool}: {e}; {INSTALL_HINT}"))?;
    if !output.status.success() {
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        return Err(format!(
            "{tool} snapshot restore failed ({}): {}",
            output.status,
            tail(&said)
        ));
    }
    Ok(())
}

/// Until the process answers a status call, or it exits, or `deadline` passes.
async fn serving(child: &mut Child, client: &MemberClient, deadline: Duration) -> Result<(), String> {
    let wait = async {
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the throwaway etcd exited with {status}"));
            }
            if client.status().await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(deadline, wait)
        .await
        .map_err(|_| format!("the throwaway etcd did not serve within {deadline:?}"))?
}

/// The last 600 characters of `text`, on one line.
fn tail(text: &str) -> String {
    let text = text.trim();
    let start = text.char_indices().rev().nth(599).map_or(0, |(at, _)| at);
    text[start..].replace('\n', " | ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_scratch_directory_of_the_longest_name_is_made_and_removed() {
        let parent = std::env::temp_dir();
        let scratch = Scratch::new(&parent, &"s".repeat(253)).unwrap();
        let path = scratch.path().to_path_buf();
        assert!(path.is_dir());
        std::fs::write(path.join("file"), "x").unwrap();
        drop(scratch);
        assert!(!path.exists());
    }

    #[test]
    fn missing_binaries_say_how_to_provide_them() {
        let empty = std::env::temp_dir().join(format!("drill-no-tools-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let said = Tools::find(Some(&empty)).unwrap_err();
        assert!(said.starts_with("no etcd binary in"), "{said}");
        assert!(said.contains("--drill-etcd-dir"), "{said}");
        std::fs::write(empty.join("etcd"), "").unwrap();
        let said = Tools::find(Some(&empty)).unwrap_err();
        assert!(said.starts_with("no etcdutl or etcdctl binary in"), "{said}");
        std::fs::write(empty.join("etcdctl"), "").unwrap();
        let found = Tools::find(Some(&empty)).unwrap();
        assert_eq!(
            found.restore,
            empty.join("etcdctl"),
            "3.4's etcdctl when no etcdutl"
        );
        std::fs::write(empty.join("etcdutl"), "").unwrap();
        assert_eq!(Tools::find(Some(&empty)).unwrap().restore, empty.join("etcdutl"));
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn a_tail_is_the_end_on_one_line() {
        assert_eq!(tail("a\nb\n"), "a | b");
        let long = "x".repeat(1000);
        assert_eq!(tail(&long).len(), 600);
    }
}
