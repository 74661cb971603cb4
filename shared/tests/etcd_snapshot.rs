#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A real etcd member's snapshot streamed into a real S3 store (SeaweedFS), then restored by
//! etcd's own tool into a new member that must hold every key: the object is a snapshot file
//! etcd accepts, its size, SHA-256 and revision are what the store and etcd say they are.

use std::collections::BTreeMap;
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
    let stop = |cluster: &mut TlsEtcdCluster| cluster.stop(0);
    let restart = |cluster: &mut TlsEtcdCluster| cluster.restart(0);
    snapshot_through(Duration::from_secs(5), stop, Duration::from_secs(2), restart).await;
}

/// A member too busy to answer the snapshot's first call within its deadline (frozen here for
/// three deadlines) is asked again, not reported unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_waits_out_a_member_too_busy_to_answer_as_it_begins() {
    let freeze = |cluster: &mut TlsEtcdCluster| cluster.members[0].freeze(true);
    let thaw = |cluster: &mut TlsEtcdCluster| cluster.members[0].freeze(false);
    snapshot_through(Duration::from_secs(1), freeze, Duration::from_secs(3), thaw).await;
}

/// A snapshot of a one-member cluster holding one key, begun once `trouble` struck the member
/// (its client waiting `call_deadline` for each call) and `lasting` before `end` lifts it: it
/// must be stored, at that key's revision.
async fn snapshot_through(
    call_deadline: Duration,
    trouble: fn(&mut TlsEtcdCluster),
    lasting: Duration,
    end: fn(&mut TlsEtcdCluster),
) {
    let ca = ca();
    let mut cluster = TlsEtcdCluster::start(&ca, 1);
    let tls = EtcdTls::issued_by(&ca, "snapshot-test", Duration::from_secs(600)).unwrap();
    let member = MemberClient::new(&cluster.client_urls()[0], &tls, call_deadline).unwrap();
    wait_healthy(&member).await;
    let mut kv = member.workload_client().await.unwrap();
    kv.put("key/a", "value", None).await.unwrap();
    let written = member.local_revision().await.unwrap();
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("etcd-backups").await;
    let key = "default/c1-etcd/snap-troubled.db";
    let upload = store.create_multipart_upload(key).await.unwrap();

    trouble(&mut cluster);
    let snapshot = stream_to_store(&member, &store, key, &upload, StreamLimits::with_idle(IDLE));
    let lifted = async {
        tokio::time::sleep(lasting).await;
        tokio::task::block_in_place(|| end(&mut cluster));
    };
    let (stored, ()) = tokio::join!(snapshot, lifted);
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
    let (_restored, member) = restore_member(&ca, &tls, &file).await;
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

/// A member restored from `file` (a full snapshot) by etcd's own tool, started and healthy.
async fn restore_member(
    ca: &CertificateAuthority,
    tls: &EtcdTls,
    file: &Path,
) -> (EtcdMemberProcess, MemberClient) {
    let (tool, etcdutl) = snapshot_tool();
    let mut restored = EtcdMemberProcess::prepare(ca);
    let initial_cluster = restored.initial_cluster_entry();
    run(
        &tool,
        etcdutl,
        &[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            &format!("--data-dir={}", restored.data_dir.display()),
            &format!("--name={}", restored.name),
            &format!("--initial-cluster={initial_cluster}"),
            &format!("--initial-advertise-peer-urls={}", restored.peer_url),
        ],
    );
    restored.start(&initial_cluster, ClusterState::New);
    let member = MemberClient::new(&restored.client_url, tls, Duration::from_secs(5)).unwrap();
    wait_healthy(&member).await;
    (restored, member)
}

/// Every key and value `kv` holds (at `revision`, when given), and each key's lease.
async fn contents(kv: &mut etcd_client::Client, revision: Option<i64>) -> BTreeMap<Vec<u8>, (Vec<u8>, i64)> {
    let mut options = GetOptions::new().with_all_keys();
    if let Some(revision) = revision {
        options = options.with_revision(revision);
    }
    let all = kv.get(vec![0u8], Some(options)).await.unwrap();
    all.kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), (kv.value().to_vec(), kv.lease())))
        .collect()
}

/// Continuous backup on real etcd and a real store: a full snapshot, then a recorder uploading
/// deltas every 200 ms while a client puts, overwrites, deletes, writes two keys in one
/// transaction and puts a key with a lease. A member restored from the snapshot plus every
/// delta holds exactly what the source holds at the end, one restored to a revision in the
/// middle of the deltas exactly what it held then; a damaged delta is refused by its checksum
/// and a missing one as a gap, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_after_a_full_snapshot_restore_to_the_latest_write_or_to_a_revision() {
    use etcdadm_shared::backup::delta::{self, chain, listing, record, replay};

    let ca = ca();
    let source = TlsEtcdCluster::start(&ca, 1);
    let tls = EtcdTls::issued_by(&ca, "delta-test", Duration::from_secs(600)).unwrap();
    let member = MemberClient::new(&source.client_urls()[0], &tls, Duration::from_secs(5)).unwrap();
    wait_healthy(&member).await;
    let mut kv = member.workload_client().await.unwrap();
    for i in 0..100 {
        kv.put(format!("key/{i:04}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("etcd-backups").await;
    let key = "default/c1-etcd/full.db";
    let upload = store.create_multipart_upload(key).await.unwrap();
    let full = stream_to_store(&member, &store, key, &upload, StreamLimits::with_idle(IDLE))
        .await
        .unwrap();

    let uploaded = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let recorder = {
        let (store, uploaded) = (store.clone(), uploaded.clone());
        let mut watching = member.workload_client().await.unwrap();
        tokio::spawn(async move {
            let recorder = record::Recorder {
                store: &store,
                snapshot_key: key,
                base: full.revision,
                limits: record::RecordLimits {
                    interval: Duration::from_millis(200),
                    max_bytes: record::MAX_DELTA_BYTES,
                },
            };
            let mut tell = |name| uploaded.lock().unwrap().push(name);
            recorder
                .run(&mut watching, None, &mut tell, async {
                    let _ = stopped.await;
                })
                .await
        })
    };
    let lease = kv.lease_grant(600, None).await.unwrap().id();
    let mut middle = 0;
    for i in 0..200 {
        match i % 5 {
            0 => drop(
                kv.put(format!("new/{i:04}"), format!("v{i}"), None)
                    .await
                    .unwrap(),
            ),
            1 => drop(
                kv.put(format!("key/{:04}", i % 100), format!("again-{i}"), None)
                    .await
                    .unwrap(),
            ),
            2 => drop(
                kv.delete(format!("key/{:04}", (i * 7) % 100), None)
                    .await
                    .unwrap(),
            ),
            3 => drop(
                kv.txn(etcd_client::Txn::new().and_then(vec![
                    etcd_client::TxnOp::put(format!("txn/{i:04}/a"), "a", None),
                    etcd_client::TxnOp::put(format!("txn/{i:04}/b"), "b", None),
                ]))
                .await
                .unwrap(),
            ),
            _ => drop(
                kv.put(
                    format!("leased/{i:04}"),
                    "held",
                    Some(etcd_client::PutOptions::new().with_lease(lease)),
                )
                .await
                .unwrap(),
            ),
        }
        if i == 99 {
            middle = member.local_revision().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last = member.local_revision().await.unwrap();
    // Stopped once the last write is uploaded (the watch may trail the writes on a busy machine).
    let uploaded_to = || {
        uploaded
            .lock()
            .unwrap()
            .last()
            .map_or(0, |n: &chain::DeltaName| n.last)
    };
    for _ in 0..600 {
        if uploaded_to() >= last {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    let ended = recorder.await.unwrap().unwrap();
    assert_eq!(ended, record::Ended::Stopped { reached: last });
    let names: Vec<chain::DeltaName> = uploaded.lock().unwrap().clone();
    assert!(
        names.len() >= 3,
        "deltas every 200 ms over 2 s of writes: {names:?}"
    );
    let listed = listing::listed(&store, key).await.unwrap();
    assert_eq!(listed, names, "what was told uploaded is what the store lists");

    let body = store.get_object(key, full.size).await.unwrap();
    let dir = TempDir::new("etcdadm-test-delta-restore");
    let file = dir.path().join("full.db");
    std::fs::write(&file, &body).unwrap();
    let mut source_kv = member.workload_client().await.unwrap();
    for (target, at) in [
        (chain::Target::Latest, last),
        (chain::Target::Revision(middle), middle),
    ] {
        let verified = replay::verify(&store, key, full.revision, Some(last), target)
            .await
            .unwrap();
        assert_eq!(verified.revision, at, "{target:?}: the revision the deltas reach");
        let (_process, restored) = restore_member(&ca, &tls, &file).await;
        let mut restored_kv = restored.workload_client().await.unwrap();
        let replayed = replay::replay(&store, key, full.revision, &verified, &mut restored_kv)
            .await
            .unwrap();
        assert_eq!(replayed.events, verified.events);
        let expected = contents(&mut source_kv, Some(at)).await;
        let got = contents(&mut restored_kv, None).await;
        assert_eq!(
            got.len(),
            expected.len(),
            "{target:?}: the key count at revision {at}"
        );
        assert_eq!(
            got, expected,
            "{target:?}: every key, value and lease at revision {at}"
        );
    }

    // A damaged delta stops the restore by name before anything is written; a missing one is
    // a gap the plan names.
    let second = listed[1].key(key);
    let mut damaged = store.get_object(&second, 64 << 20).await.unwrap();
    let at = damaged.len() / 2;
    damaged[at] ^= 1;
    store.put_object(&second, damaged.clone()).await.unwrap();
    match replay::verify(&store, key, full.revision, Some(last), chain::Target::Latest).await {
        Err(replay::ReplayError::Damaged { key: named, error }) => {
            assert_eq!(named, second);
            assert_eq!(error, delta::DeltaError::Checksum);
        }
        other => panic!("a damaged delta must stop the restore by name: {other:?}"),
    }
    store.delete_object(&second).await.unwrap();
    let remaining: Vec<chain::DeltaName> = listed
        .iter()
        .copied()
        .filter(|n| n.seq != listed[1].seq)
        .collect();
    assert_eq!(
        chain::plan(full.revision, &remaining, Some(last), chain::Target::Latest),
        Err(chain::ChainError::Gap {
            seq: listed[2].seq,
            first: listed[2].first,
            expected: listed[0].last + 1,
        })
    );
    assert!(matches!(
        replay::verify(&store, key, full.revision, Some(last), chain::Target::Latest).await,
        Err(replay::ReplayError::Chain(chain::ChainError::Gap { .. }))
    ));
}
