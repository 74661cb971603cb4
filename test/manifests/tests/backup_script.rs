#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! templates/backup/etcd-backup.sh against a real three-member etcd cluster over mutual TLS, run
//! once per member as the timer would: exactly one snapshot per round, taken by the leader,
//! valid, restorable, and pruned to the retention count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use etcdadm_manifest_tests::{find_tool, repo_root};
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};
use etcdadm_shared::testing::{TempDir, TlsEtcdCluster};

const ETCDCTL_HINT: &str = "install it with `apt-get install etcd-client` (Debian/Ubuntu; .ci/setup \
    does this), or put any etcdctl >= 3.4 on PATH, or set ETCDCTL to its path";

struct Fixture {
    cluster: TlsEtcdCluster,
    etcdctl: PathBuf,
    dir: TempDir,
}

impl Fixture {
    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }
    fn cert_file(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }
    fn key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }
    fn destination(&self) -> PathBuf {
        self.dir.path().join("snapshots")
    }

    /// etcdctl with the test client certificate against `endpoint`.
    fn etcdctl(&self, endpoint: &str, args: &[&str]) -> Output {
        Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .arg(format!("--cacert={}", self.ca_file().display()))
            .arg(format!("--cert={}", self.cert_file().display()))
            .arg(format!("--key={}", self.key_file().display()))
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    /// (MemberID, Leader) of one member, from its own status (decimal, as etcdctl prints).
    fn status(&self, endpoint: &str) -> Option<(String, String)> {
        let out = self.etcdctl(endpoint, &["endpoint", "status", "--write-out=fields"]);
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
                .map(|v| v.trim().to_string())
        };
        Some((field("MemberID")?, field("Leader")?))
    }

    /// The leader's member ID once every member agrees on one.
    fn wait_for_leader(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let statuses: Vec<_> = self
                .cluster
                .client_urls()
                .iter()
                .map(|u| self.status(u))
                .collect();
            let leaders: BTreeSet<_> = statuses.iter().flatten().map(|(_, l)| l.clone()).collect();
            if statuses.iter().all(Option::is_some) && leaders.len() == 1 {
                let leader = leaders.into_iter().next().unwrap();
                if leader != "0" {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader agreed on; logs:\n{}",
                self.cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One timer tick: the script on every member, as the member's own systemd would run it.
    /// Returns each member's (member ID, stdout).
    fn run_round(&self, round: usize, retention: u32) -> Vec<(String, String)> {
        let script = repo_root().join("templates/backup/etcd-backup.sh");
        let mut results = Vec::new();
        for (i, url) in self.cluster.client_urls().iter().enumerate() {
            let env_file = self.dir.path().join(format!("backup-{round}-{i}.env"));
            let env = format!(
                "ETCD_BACKUP_DESTINATION='{dest}'\nETCD_BACKUP_RETENTION='{retention}'\n\
                 ETCD_BACKUP_ENDPOINT='{url}'\nETCD_BACKUP_CACERT='{ca}'\nETCD_BACKUP_CERT='{cert}'\n\
                 ETCD_BACKUP_KEY='{key}'\nETCD_BACKUP_ETCDCTL='{etcdctl}'\n\
                 ETCD_BACKUP_WORK_DIR='{work}'\nETCD_BACKUP_CREDENTIALS_FILE='{creds}'\n",
                dest = self.destination().display(),
                ca = self.ca_file().display(),
                cert = self.cert_file().display(),
                key = self.key_file().display(),
                etcdctl = self.etcdctl.display(),
                work = self.dir.path().join(format!("work-{i}")).display(),
                creds = self.dir.path().join("no-credentials.env").display(),
            );
            std::fs::write(&env_file, env).unwrap();
            let out = Command::new("sh")
                .arg(&script)
                .arg(&env_file)
                .output()
                .expect("run sh");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "round {round}, member {i}: the script failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let (member_id, _) = self.status(url).unwrap();
            results.push((member_id, stdout));
        }
        results
    }

    /// Snapshot file names at the destination (everything, so leftovers would show).
    fn snapshots(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.destination())
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn assert_valid_and_restorable(&self, snapshot: &Path, restore_dir: &Path) {
        let status = Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "status", "--write-out=json"])
            .arg(snapshot)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(status.status.success(), "snapshot status failed: {text}");
        let parsed: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert!(
            parsed["totalKey"].as_u64().unwrap() >= 2,
            "the snapshot holds the keys: {parsed}"
        );

        let restore = Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg(format!("--data-dir={}", restore_dir.display()))
            .args([
                "--name=restored",
                "--initial-cluster=restored=https://127.0.0.1:2380",
                "--initial-advertise-peer-urls=https://127.0.0.1:2380",
            ])
            .output()
            .unwrap();
        assert!(
            restore.status.success(),
            "snapshot restore failed: {}",
            String::from_utf8_lossy(&restore.stderr)
        );
        assert!(
            restore_dir.join("member/snap/db").is_file(),
            "restored data dir has a db"
        );
    }
}

fn fixture() -> Fixture {
    let etcdctl = find_tool("etcdctl", "ETCDCTL", ETCDCTL_HINT).unwrap_or_else(|e| panic!("{e}"));
    let ca = CertificateAuthority::generate("etcd-backup-test-ca").unwrap();
    let cluster = TlsEtcdCluster::start(&ca, 3);
    let client = ca
        .issue(&LeafRequest::in_memory_client(
            "etcd-backup",
            Duration::from_secs(3600),
        ))
        .unwrap();
    let dir = TempDir::new("etcdadm-backup-script");
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
    std::fs::write(dir.path().join("client.crt"), &client.cert_pem).unwrap();
    std::fs::write(dir.path().join("client.key"), &client.key_pem).unwrap();
    Fixture {
        cluster,
        etcdctl,
        dir,
    }
}

#[test]
fn one_verified_restorable_snapshot_per_round_from_the_leader_pruned_to_retention() {
    let f = fixture();
    let leader = f.wait_for_leader();
    let first_url = f.cluster.client_urls()[0].clone();
    for (key, value) in [("/backup-test/a", "1"), ("/backup-test/b", "2")] {
        let put = f.etcdctl(&first_url, &["put", key, value]);
        assert!(
            put.status.success(),
            "put: {}",
            String::from_utf8_lossy(&put.stderr)
        );
    }

    // Round 1: only the leader acts; one snapshot, named after it, valid and restorable.
    let results = f.run_round(1, 5);
    for (member, stdout) in &results {
        if *member == leader {
            assert!(stdout.contains("is the leader"), "leader {member}: {stdout}");
        } else {
            assert!(stdout.contains("nothing to do"), "follower {member}: {stdout}");
        }
    }
    let after_first = f.snapshots();
    assert_eq!(after_first.len(), 1, "one snapshot per round: {after_first:?}");
    let first = &after_first[0];
    assert!(
        first.starts_with("etcd-snapshot-") && first.ends_with(&format!("-{leader}.db")),
        "{first}"
    );
    f.assert_valid_and_restorable(&f.destination().join(first), &f.dir.path().join("restore-1"));

    // Round 2: a second snapshot next to the first.
    f.run_round(2, 5);
    let after_second = f.snapshots();
    assert_eq!(after_second.len(), 2, "{after_second:?}");
    assert!(after_second.contains(first));

    // Round 3 with retention 2: the oldest goes, the two newest stay.
    f.run_round(3, 2);
    let after_third = f.snapshots();
    assert_eq!(after_third.len(), 2, "{after_third:?}");
    assert!(
        !after_third.contains(first),
        "the oldest snapshot was pruned: {after_third:?}"
    );
    assert!(after_third.contains(&after_second[1]));
    let newest = after_third.iter().max().unwrap();
    assert!(!after_second.contains(newest), "the newest one is from round 3");
    f.assert_valid_and_restorable(&f.destination().join(newest), &f.dir.path().join("restore-3"));

    // Nothing half-written left behind, and the work directories are cleaned up.
    for i in 0..3 {
        let work = f.dir.path().join(format!("work-{i}"));
        if let Ok(entries) = std::fs::read_dir(&work) {
            let left: Vec<_> = entries.map(|e| e.unwrap().file_name()).collect();
            assert!(
                left.is_empty(),
                "work dir {} not cleaned: {left:?}",
                work.display()
            );
        }
    }
}

#[test]
fn a_bad_configuration_fails_loudly_and_writes_nothing() {
    let dir = TempDir::new("etcdadm-backup-bad-config");
    let script = repo_root().join("templates/backup/etcd-backup.sh");
    for (env, expected) in [
        (
            "ETCD_BACKUP_RETENTION='3'\n",
            "ETCD_BACKUP_DESTINATION is not set",
        ),
        (
            "ETCD_BACKUP_DESTINATION='/nonexistent'\nETCD_BACKUP_RETENTION='many'\n",
            "must be a number",
        ),
    ] {
        let env_file = dir.path().join("backup.env");
        std::fs::write(&env_file, env).unwrap();
        let out = Command::new("sh").arg(&script).arg(&env_file).output().unwrap();
        assert!(!out.status.success(), "{env:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{env:?}: {stderr}");
    }
    let out = Command::new("sh")
        .arg(&script)
        .arg(dir.path().join("missing.env"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}
