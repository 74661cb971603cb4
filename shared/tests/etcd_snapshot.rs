#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A real etcd member's snapshot streamed into a real S3 store (SeaweedFS), then restored by
//! etcd's own tool into a new member that must hold every key: the object is a snapshot file
//! etcd accepts, its size, SHA-256 and revision are what the store and etcd say they are.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etcd_client::GetOptions;
use etcdadm_shared::backup::{StreamLimits, stream_to_store};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::testing::{
    ClusterState, ETCD_INSTALL_HINT, EtcdMemberProcess, SeaweedFs, TempDir, TlsEtcdCluster, etcd_binary,
};
use sha2::{Digest, Sha256};

const IDLE: Duration = Duration::from_secs(10);

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate("etcd-ca").unwrap()
}

/// etcd's snapshot tool beside the etcd binary: `etcdutl` (3.5+), else `etcdctl` (3.4).
fn snapshot_tool() -> (PathBuf, bool) {
    let etcd = etcd_binary().unwrap_or_else(|hint| panic!("{hint}"));
    let dir = etcd.parent().unwrap().to_path_buf();
    for (name, is_etcdutl) in [("etcdutl", true), ("etcdctl", false)] {
        let path = dir.join(name);
        if path.is_file() {
            return (path, is_etcdutl);
        }
    }
    panic!(
        "neither etcdutl nor etcdctl next to {}; {ETCD_INSTALL_HINT} (Debian: apt-get install etcd-client)",
        etcd.display()
    );
}

fn run(tool: &Path, etcdutl: bool, args: &[&str]) -> String {
    let mut command = Command::new(tool);
    if !etcdutl {
        command.env("ETCDCTL_API", "3");
    }
    let output = command.args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?}: {}",
        tool.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

async fn wait_healthy(member: &MemberClient) {
    for _ in 0..100 {
        if member.health().await.is_ok_and(|h| h.healthy) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} never became healthy", member.endpoint());
}

/// A member restarting when the snapshot begins (as one does just after its join, to apply its
/// environment file) is waited for, not reported unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_waits_out_a_member_restarting_as_it_begins() {
    let ca = ca();
    let mut cluster = TlsEtcdCluster::start(&ca, 1);
    let tls = EtcdTls::issued_by(&ca, "snapshot-test", Duration::from_secs(600)).unwrap();
    let member = MemberClient::new(&cluster.client_urls()[0], &tls, Duration::from_secs(5)).unwrap();
    wait_healthy(&member).await;
    let mut kv = member.workload_client().await.unwrap();
    kv.put("key/a", "value", None).await.unwrap();
    let written = member.local_revision().await.unwrap();
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("etcd-backups").await;
    let key = "default/c1-etcd/snap-restart.db";
    let upload = store.create_multipart_upload(key).await.unwrap();

    cluster.stop(0);
    let snapshot = stream_to_store(&member, &store, key, &upload, StreamLimits::with_idle(IDLE));
    let restart = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::block_in_place(|| cluster.restart(0));
    };
    let (stored, ()) = tokio::join!(snapshot, restart);
    let stored = stored.unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    assert_eq!(stored.revision, written);
}

#[tokio::test]
async fn a_followers_snapshot_lands_in_s3_and_restores_every_key() {
    let ca = ca();
    let cluster = TlsEtcdCluster::start(&ca, 3);
    let tls = EtcdTls::issued_by(&ca, "snapshot-test", Duration::from_secs(600)).unwrap();
    let members: Vec<MemberClient> = cluster
        .client_urls()
        .iter()
        .map(|url| MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap())
        .collect();
    for member in &members {
        wait_healthy(member).await;
    }
    let mut kv = members[0].workload_client().await.unwrap();
    for i in 0..1000 {
        kv.put(format!("key/{i:04}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    // A follower, caught up with the last write.
    let mut follower = None;
    for member in &members {
        if !member.status().await.unwrap().is_leader() {
            follower = Some(member);
        }
    }
    let follower = follower.unwrap();
    let written = members[0].local_revision().await.unwrap();
    for _ in 0..100 {
        if follower.local_revision().await.unwrap() == written {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(follower.local_revision().await.unwrap(), written);

    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("etcd-backups").await;
    let key = "default/c1-etcd/snap-1.db";
    let upload = store.create_multipart_upload(key).await.unwrap();
    let stored = stream_to_store(follower, &store, key, &upload, StreamLimits::with_idle(IDLE))
        .await
        .unwrap();

    assert_eq!(stored.revision, written, "the revision after the last write");
    assert!(stored.revision_exact, "no write landed while the snapshot began");
    let listed = store.list("default/").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].size), (key, stored.size));
    let body = reqwest::get(store.presigned_get(key, Duration::from_secs(60)))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len() as u64, stored.size);
    assert_eq!(format!("{:x}", Sha256::digest(&body)), stored.sha256);
    let (database, trailer) = body.split_at(body.len() - 32);
    assert_eq!(format!("{:x}", Sha256::digest(database)), stored.database_sha256);
    assert_eq!(
        trailer,
        &Sha256::digest(database)[..],
        "etcd's checksum ends the file"
    );
    assert_eq!(database.len() % 4096, 0, "a bbolt database is whole pages");

    // etcd's own reading of the file, then a restore without --skip-hash-check.
    let dir = TempDir::new("etcdadm-test-restore");
    let file = dir.path().join("snapshot.db");
    std::fs::write(&file, &body).unwrap();
    let (tool, etcdutl) = snapshot_tool();
    let file_arg = file.to_str().unwrap();
    let status = run(
        &tool,
        etcdutl,
        &["snapshot", "status", file_arg, "--write-out=json"],
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["revision"].as_i64(), Some(stored.revision), "{status}");
    let mut restored = EtcdMemberProcess::prepare(&ca);
    let initial_cluster = restored.initial_cluster_entry();
    run(
        &tool,
        etcdutl,
        &[
            "snapshot",
            "restore",
            file_arg,
            &format!("--data-dir={}", restored.data_dir.display()),
            &format!("--name={}", restored.name),
            &format!("--initial-cluster={initial_cluster}"),
            &format!("--initial-advertise-peer-urls={}", restored.peer_url),
        ],
    );
    restored.start(&initial_cluster, ClusterState::New);
    let member = MemberClient::new(&restored.client_url, &tls, Duration::from_secs(5)).unwrap();
    wait_healthy(&member).await;
    let mut kv = member.workload_client().await.unwrap();
    let all = kv
        .get("key/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.kvs().len(), 1000, "every key is back");
    for (i, kv) in all.kvs().iter().enumerate() {
        assert_eq!(kv.key_str().unwrap(), format!("key/{i:04}"));
        assert_eq!(kv.value_str().unwrap(), format!("value-{i}"));
    }
    assert_eq!(member.local_revision().await.unwrap(), stored.revision);
}
