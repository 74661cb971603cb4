#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Snapshots end to end with both real controller binaries, real etcd machines and a real S3
//! store (SeaweedFS): a Ready cluster of three backed up to a bucket, a client writes 1,000 keys,
//! `kubectl create` of an EtcdadmSnapshot ends Succeeded with the revision of the last write,
//! taken from a follower, and the object in the bucket is the snapshot file etcd reads back;
//! a second EtcdadmCluster created from such a snapshot (over https, the store's CA on the
//! node) has every key and is Ready, its revisions raised above the old cluster's (or the
//! documented fallback) and its control plane rolled once; a snapshot object altered after its
//! upload is refused by the first member's SHA-256 check before etcd starts; and a version
//! rollout of a backed-up cluster takes one before-change snapshot.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{ChecksumSource, EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir, etcd_binary};
use etcdadm_sim::demo;
use etcdadm_sim::plane::Plane;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use lifecycle_support::*;
use serde_json::json;
use sha2::{Digest, Sha256};

const TIMEOUT: Duration = Duration::from_secs(150);
const BUCKET: &str = "etcd-backups";

/// One scenario at a time in this binary: both share the machine's two cores with real etcd.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_snapshot_of_a_ready_cluster_holds_the_last_write() {
    let _turn = ONE_AT_A_TIME.lock().await;
    snapshot_scenario(None, 13).await;
}

/// The same on a real kube-apiserver, each controller acting as its own ServiceAccount with what
/// config/rbac grants it: a verb the snapshot controller lacks fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_scenario_passes_on_a_real_api_server_under_the_controllers_own_rbac() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = real_apiserver::start().await;
    snapshot_scenario(Some(&real), 14).await;
}

/// SeaweedFS (https with a CA of its own when `tls`, else plain http as an `insecure: true`
/// store) with the bucket [`BUCKET`], a plane, and its Ready cluster `b1` of `replicas` members
/// backed up to the bucket.
async fn backed_up_cluster(
    real: Option<&real_apiserver::RealApiServer>,
    prefix: u8,
    work: &TempDir,
    replicas: usize,
    tls: bool,
) -> (SeaweedFs, StoreClient, Plane, EtcdadmCluster) {
    let s3 = if tls {
        SeaweedFs::start_tls().await
    } else {
        SeaweedFs::start().await
    };
    let bucket = s3.create_bucket(BUCKET).await;
    let plane = start_plane_on(real, prefix, work, Duration::from_secs(1)).await;
    store_credentials(&plane.client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &plane.client,
        "b1",
        i32::try_from(replicas).unwrap(),
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    let etcd = wait_settled(&plane.client, "b1", replicas, TIMEOUT, work).await;
    (s3, bucket, plane, etcd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_created_from_a_snapshot_has_every_key_and_is_ready() {
    let _turn = ONE_AT_A_TIME.lock().await;
    restore_scenario(None, 15).await;
}

/// The same on a real kube-apiserver under the controllers' own RBAC (the restore Secret is
/// written and deleted by the controller, read by the bootstrap provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restore_scenario_passes_on_a_real_api_server_under_the_controllers_own_rbac() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = real_apiserver::start().await;
    restore_scenario(Some(&real), 16).await;
}

async fn restore_scenario(real: Option<&real_apiserver::RealApiServer>, prefix: u8) {
    let work = TempDir::new("sim-restore");
    let (_s3, _bucket, plane, source) = backed_up_cluster(real, prefix, &work, 1, true).await;
    let client = plane.client.clone();
    let (source_member, written) = write_keys(&client, "b1", &source, 1000).await;
    let taken = take_snapshot(&client, "b1", "b1-nightly", &work).await;
    let taken = taken.status.unwrap();
    assert_eq!(taken.revision, Some(written));
    // 50 further writes the snapshot does not hold: the old cluster's last revision.
    let mut source_kv = source_member.workload_client().await.unwrap();
    for i in 0..50 {
        source_kv.put(format!("late/{i:02}"), "lost", None).await.unwrap();
    }
    let old_last = source_member.local_revision().await.unwrap();
    assert_eq!(old_last, written + 50);

    // A new cluster of three from it, with a control plane: the first member restores, the
    // others join it.
    let started = Instant::now();
    create(
        &client,
        "r1",
        3,
        true,
        json!({}),
        json!({"restore": {"snapshot": {"name": "b1-nightly"}}}),
    )
    .await;
    let restored = wait_settled(&client, "r1", 3, TIMEOUT, &work).await;
    println!(
        "restored cluster Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let status = restored.status.clone().unwrap();
    let from = status.restored_from.clone().expect("status.restoredFrom");
    assert_eq!(from.snapshot.as_deref(), Some("b1-nightly"));
    assert_eq!(from.revision, Some(written));
    assert_eq!(from.location, taken.location);
    assert!(from.time.is_some());
    // The member checked the download against the SHA-256 the snapshot recorded.
    assert_eq!(from.sha256, taken.sha256);
    assert_eq!(from.sha256_source, Some(ChecksumSource::EtcdadmSnapshot));

    // Every key, through every member of the new cluster (which has a CA of its own).
    let tls = demo::etcd_tls(&client, client.default_namespace(), "r1")
        .await
        .unwrap()
        .unwrap();
    for m in &status.members {
        let url = m.client_url.as_deref().unwrap();
        let member = MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap();
        let mut kv = member.workload_client().await.unwrap();
        for i in 0..1000 {
            let got = kv.get(format!("app/{i:04}"), None).await.unwrap();
            let values: Vec<&str> = got.kvs().iter().map(|pair| pair.value_str().unwrap()).collect();
            assert_eq!(
                values,
                [format!("value-{i}")],
                "app/{i:04} read through {}",
                m.name
            );
        }
        assert!(member.local_revision().await.unwrap() >= written);
    }
    revisions_after_restore(&client, &work, &status, old_last).await;
    control_plane_rolled_once(&client, &work, "r1").await;
    let source_ids: Vec<_> = source
        .status
        .unwrap()
        .members
        .into_iter()
        .map(|m| m.member_id)
        .collect();
    assert!(
        status.members.iter().all(|m| !source_ids.contains(&m.member_id)),
        "new members, not the source's"
    );

    // The download URL is not kept, and never shows in a log; the restore is told.
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while secrets.get_opt("r1-etcd-restore").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the restore Secret is still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reasons: Vec<String> = events(&client, "r1")
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    for expected in ["RestoreSecretWritten", "Restored", "RestoreSecretDeleted"] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected} Event: {reasons:?}"
        );
    }
    for file in files_under(work.path()) {
        if file.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            assert!(
                !text.contains("X-Amz-Signature"),
                "{} shows the download URL",
                file.display()
            );
        }
    }
    save_logs(&work, "restore");
}

/// The restored cluster's revisions against `old_last`, the old cluster's last revision: with an
/// etcdutl that can bump (etcd 3.5.10+), above it, and a watch from it is told "compacted";
/// without one (etcd 3.4 here), the documented fallback: below it, `RevisionsBumped` False.
async fn revisions_after_restore(
    client: &Client,
    work: &TempDir,
    status: &etcdadm_shared::api::EtcdadmClusterStatus,
    old_last: i64,
) {
    let tls = demo::etcd_tls(client, client.default_namespace(), "r1")
        .await
        .unwrap()
        .unwrap();
    let url = status.members[0].client_url.as_deref().unwrap();
    let member = MemberClient::new(url, &tls, Duration::from_secs(5)).unwrap();
    let now = member.local_revision().await.unwrap();
    let from = status.restored_from.clone().unwrap();
    let (state, reason, message) =
        condition(&etcd_api(client).get("r1-etcd").await.unwrap(), "RevisionsBumped");
    match from.revision_bumped {
        Some(true) => {
            assert!(
                now > old_last,
                "revision {now} not above the old cluster's {old_last}"
            );
            assert_eq!(
                (state.as_str(), reason.as_str()),
                ("True", "RevisionsBumped"),
                "{message}"
            );
            let compacted = compact_revision_seen_from(&member, "app/", old_last).await;
            assert!(
                compacted >= old_last,
                "a watch from revision {old_last} was not told it is compacted"
            );
        }
        Some(false) => {
            assert!(now < old_last, "revision {now}: not the fallback");
            assert_eq!(
                (state.as_str(), reason.as_str()),
                ("False", "RevisionsNotBumped"),
                "{message}\n{}",
                logs(work)
            );
            assert!(message.contains("etcd 3.5.10"), "{message}");
            println!(
                "revisions not bumped (no etcdutl with --bump-revision here): restored at {now}, the old cluster was at {old_last}"
            );
        }
        None => panic!("status.restoredFrom does not say whether revisions were bumped: {from:?}"),
    }
}

/// The KubeadmControlPlane of `<cluster>` asked for exactly one rollout after the restore,
/// from the restore's time, and status records it.
async fn control_plane_rolled_once(client: &Client, work: &TempDir, cluster: &str) {
    let kcps = Api::<etcdadm_shared::api::capi::KubeadmControlPlane>::default_namespaced(client.clone());
    let name = format!("{cluster}-control-plane");
    let deadline = Instant::now() + Duration::from_secs(30);
    let etcd = loop {
        let etcd = etcd_api(client).get(&format!("{cluster}-etcd")).await.unwrap();
        let rolled = etcd
            .status
            .as_ref()
            .and_then(|s| s.restored_from.as_ref())
            .and_then(|r| r.control_plane_rollout.clone());
        if rolled.is_some() && kcps.get(&name).await.unwrap().rollout_after().is_some() {
            break etcd;
        }
        assert!(
            Instant::now() < deadline,
            "no control plane rollout after the restore\n{}",
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let the controller go round a few more times: still one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = etcd.status.unwrap().restored_from.unwrap();
    let after = kcps.get(&name).await.unwrap().rollout_after().unwrap();
    assert_eq!(
        Some(after),
        from.time.map(|t| t.0),
        "rolled from the restore's time"
    );
    assert_eq!(from.control_plane_rollout.map(|t| t.0), Some(after));
    let events = events(client, cluster).await;
    let requested = events
        .iter()
        .filter(|(reason, _)| reason == "ControlPlaneRolloutRequested")
        .count();
    assert_eq!(requested, 1, "{events:?}");
}

/// Every file under `dir`.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

async fn snapshot_scenario(real: Option<&real_apiserver::RealApiServer>, prefix: u8) {
    let work = TempDir::new("sim-snapshots");
    let (_s3, bucket, plane, etcd) = backed_up_cluster(real, prefix, &work, 3, false).await;
    let client = plane.client.clone();
    let members = etcd.status.clone().unwrap().members;
    let leader = members.iter().find(|m| m.is_leader).unwrap().name.clone();

    // A client writes 1,000 keys through one member.
    let (_, written) = write_keys(&client, "b1", &etcd, 1000).await;

    let started = Instant::now();
    let taken = take_snapshot(&client, "b1", "b1-before-upgrade", &work).await;
    println!("snapshot taken in {:.1}s", started.elapsed().as_secs_f64());
    let status = taken.status.unwrap();
    assert_eq!(status.revision, Some(written), "the revision of the last write");
    let from = status.member.clone().unwrap();
    assert_ne!(from, leader, "taken from a follower");
    assert!(members.iter().any(|m| m.name == from), "{from} is a member");

    let key = format!("{}/b1-etcd/b1-before-upgrade.db", client.default_namespace());
    assert_eq!(
        status.location.as_deref(),
        Some(format!("{BUCKET}/{key}").as_str())
    );
    let objects = bucket.list("").await.unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(
        (objects[0].key.as_str(), objects[0].size as i64),
        (key.as_str(), status.size.unwrap())
    );
    let body = reqwest::get(bucket.presigned_get(&key, Duration::from_secs(60)))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(format!("{:x}", Sha256::digest(&body)), status.sha256.unwrap());

    // etcd reads the file as a snapshot of that revision.
    let file = work.path().join("snapshot.db");
    std::fs::write(&file, &body).unwrap();
    let etcdctl = etcd_binary().unwrap().with_file_name("etcdctl");
    let output = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", file.to_str().unwrap(), "--write-out=json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["revision"].as_i64(), Some(written), "{report}");

    let snapshot_events: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::default_namespaced(client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("b1-before-upgrade"))
            .filter_map(|e| e.reason)
            .collect();
    for expected in ["Running", "Succeeded"] {
        assert!(
            snapshot_events.iter().any(|r| r == expected),
            "no {expected} Event on the snapshot: {snapshot_events:?}"
        );
    }
    save_logs(&work, "snapshots");
}

/// A version rollout of a backed-up cluster of three with a 10 MiB database: exactly one
/// before-change snapshot (labelled `before-rollout`) is taken, holding every write made before
/// the change, and no outdated Machine is deleted before it has Succeeded; then the rollout
/// goes on to the end. Prints how long the first removal waited for the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_rollout_with_a_store_takes_one_before_change_snapshot_and_proceeds() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let work = TempDir::new("sim-before-change");
    let s3 = SeaweedFs::start().await;
    let _bucket = s3.create_bucket(BUCKET).await;
    let plane = start_plane_on(None, 40, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    let version = |v: &str| json!({"cloudInitConfig": {"version": v}});
    create(
        &client,
        "b1",
        3,
        false,
        version("3.4.22"),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    let etcd = wait_settled(&client, "b1", 3, TIMEOUT, &work).await;

    // A 10 MiB database: 640 values of 16 KiB.
    let (member, _) = write_keys(&client, "b1", &etcd, 0).await;
    let mut kv = member.workload_client().await.unwrap();
    let value = "v".repeat(16 * 1024);
    for i in 0..640 {
        kv.put(format!("big/{i:04}"), value.clone(), None).await.unwrap();
    }
    let written = member.local_revision().await.unwrap();
    let old: std::collections::BTreeSet<String> = machine_names(&client, "b1").await;

    patch_spec(&client, "b1", json!({"etcdadmConfigSpec": version("3.4.23")})).await;
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let started = Instant::now();
    let mut snapshot_seen: Option<Instant> = None;
    let mut snapshot_done: Option<Instant> = None;
    let mut first_removal: Option<Instant> = None;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "rollout not done\n{}",
            logs(&work)
        );
        let before: Vec<EtcdadmSnapshot> = snapshots
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| {
                s.labels()
                    .contains_key(etcdadm_shared::names::SNAPSHOT_REASON_LABEL)
            })
            .collect();
        assert!(
            before.len() <= 1,
            "more than one before-change snapshot: {before:?}"
        );
        if let Some(s) = before.first() {
            snapshot_seen.get_or_insert_with(Instant::now);
            if s.phase() == SnapshotPhase::Succeeded {
                snapshot_done.get_or_insert_with(Instant::now);
            }
            assert_ne!(
                s.phase(),
                SnapshotPhase::Failed,
                "{:?}\n{}",
                s.status,
                logs(&work)
            );
        }
        let deleting_old = machines(&client, "b1")
            .await
            .into_iter()
            .any(|m| old.contains(&m.name_any()) && m.metadata.deletion_timestamp.is_some());
        let gone_old = !machine_names(&client, "b1").await.is_superset(&old);
        if (deleting_old || gone_old) && first_removal.is_none() {
            first_removal = Some(Instant::now());
            // The snapshot was listed before the Machines: it may have Succeeded in between, so
            // it is read again (an upload takes seconds; a removal that did not wait for it
            // finds it still running).
            let succeeded = snapshot_done.is_some()
                || snapshots
                    .list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|s| {
                        s.labels()
                            .contains_key(etcdadm_shared::names::SNAPSHOT_REASON_LABEL)
                            && s.phase() == SnapshotPhase::Succeeded
                    });
            assert!(
                succeeded,
                "an outdated Machine went before the snapshot Succeeded: {before:?}"
            );
            snapshot_done.get_or_insert_with(Instant::now);
        }
        if machine_names(&client, "b1").await.is_disjoint(&old) && settled(&client, "b1", 3).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rollout = started.elapsed();
    let before: Vec<EtcdadmSnapshot> = snapshots
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| {
            s.labels()
                .get(etcdadm_shared::names::SNAPSHOT_REASON_LABEL)
                .map(String::as_str)
                == Some("before-rollout")
        })
        .collect();
    assert_eq!(before.len(), 1, "{before:?}");
    let status = before[0].status.clone().unwrap();
    assert!(
        status.revision.unwrap() >= written,
        "{status:?} holds revision {written}"
    );
    let etcd = etcd_api(&client).get("b1-etcd").await.unwrap();
    assert_eq!(
        etcd.status.clone().unwrap().before_change,
        None,
        "the change is done"
    );
    let reasons: Vec<String> = events(&client, "b1").await.into_iter().map(|(r, _)| r).collect();
    assert!(reasons.iter().any(|r| r == "BeforeChangeSnapshot"), "{reasons:?}");
    let seen = snapshot_seen.unwrap();
    println!(
        "before-change snapshot of {} bytes: created {:.1}s into the rollout, Succeeded {:.2}s later; the first removal waited {:.2}s for it; rollout of 3 members {:.1}s",
        status.size.unwrap_or_default(),
        seen.duration_since(started).as_secs_f64(),
        snapshot_done.unwrap().duration_since(seen).as_secs_f64(),
        first_removal.unwrap().duration_since(seen).as_secs_f64(),
        rollout.as_secs_f64()
    );
    save_logs(&work, "before-change");
}

/// A snapshot object replaced after its upload by another valid etcd snapshot (with its own
/// correct etcd checksum, and the metadata keeping the original SHA-256, as an attacker with
/// write access to the bucket could): clusters restored from the EtcdadmSnapshot, from the store
/// and key alone, and from the store and key with the SHA-256 given, each refuse it (at the
/// SHA-256 check, or, where the controller knows the snapshot's size and the replacement is
/// larger, at the download, which takes no more than that) and never run etcdadm or start etcd. The same bytes as a foreign object
/// nobody recorded a SHA-256 for restore with one the controller computed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_altered_after_its_upload_is_refused_before_etcd_starts() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let work = TempDir::new("sim-tampered");
    let (s3, bucket, plane, source) = backed_up_cluster(None, 23, &work, 1, true).await;
    let client = plane.client.clone();
    write_keys(&client, "b1", &source, 100).await;
    let nightly = take_snapshot(&client, "b1", "b1-nightly", &work)
        .await
        .status
        .unwrap();
    write_keys(&client, "b1", &source, 300).await;
    let later = take_snapshot(&client, "b1", "b1-later", &work)
        .await
        .status
        .unwrap();
    let recorded = nightly.sha256.clone().unwrap();
    assert_ne!(later.sha256, nightly.sha256);

    // The attacker: b1-later's bytes under b1-nightly's key, its metadata saying the old hash.
    let key = |status: &etcdadm_shared::api::snapshot::EtcdadmSnapshotStatus| {
        status
            .location
            .clone()
            .unwrap()
            .strip_prefix(&format!("{BUCKET}/"))
            .unwrap()
            .to_string()
    };
    let (nightly_key, later_key) = (key(&nightly), key(&later));
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(s3.ca_pem().unwrap().as_bytes()).unwrap())
        .build()
        .unwrap();
    let replacement = trusting
        .get(bucket.presigned_get(&later_key, Duration::from_secs(60)))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let upload = bucket.create_multipart_upload(&nightly_key).await.unwrap();
    let mut writer = etcdadm_shared::store::MultipartWriter::new(&bucket, &nightly_key, &upload);
    writer.write(&replacement).await.unwrap();
    let size = writer.complete().await.unwrap();
    assert!(bucket.record_sha256(&nightly_key, size, &recorded).await.unwrap());
    let head = bucket.head_object(&nightly_key).await.unwrap();
    assert_eq!(head.sha256.as_deref(), Some(recorded.as_str()));
    let tampered = format!("{:x}", Sha256::digest(&replacement));
    assert_ne!(tampered, recorded);

    // A foreign object: the same bytes under a key of their own, no SHA-256 recorded anywhere.
    let foreign_key = "imported/plain.db";
    let upload = bucket.create_multipart_upload(foreign_key).await.unwrap();
    let mut writer = etcdadm_shared::store::MultipartWriter::new(&bucket, foreign_key, &upload);
    writer.write(&replacement).await.unwrap();
    writer.complete().await.unwrap();

    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    for (cluster, restore) in [
        ("r1", json!({"snapshot": {"name": "b1-nightly"}})),
        (
            "r2",
            json!({"snapshot": {"store": {"s3": store}, "key": nightly_key}}),
        ),
        (
            "r3",
            json!({"snapshot": {"store": {"s3": store}, "key": nightly_key, "sha256": recorded}}),
        ),
        (
            "r4",
            json!({"snapshot": {"store": {"s3": store}, "key": foreign_key}}),
        ),
    ] {
        create(&client, cluster, 1, false, json!({}), json!({"restore": restore})).await;
    }
    // With nothing recorded, the controller reads the object once and the member checks that.
    let computed = wait_settled(&client, "r4", 1, TIMEOUT, &work).await;
    let from = computed.status.unwrap().restored_from.unwrap();
    assert_eq!(from.sha256.as_deref(), Some(tampered.as_str()));
    assert_eq!(from.sha256_source, Some(ChecksumSource::Computed));

    for (cluster, from) in [
        ("r1", "from the EtcdadmSnapshot"),
        ("r2", "from the object's metadata"),
        ("r3", "from spec.restore.snapshot.sha256"),
    ] {
        let machine = wait_for_first_machine(&client, cluster).await;
        let root = work.path().join("machines").join(&machine);
        let output = wait_for_runcmd(&root, &work).await;
        let file = root.join("var/lib/etcd-restore/snapshot.db");
        // The size the controller gave the node (the EtcdadmSnapshot's, or the object's when it
        // read it): the node downloads no more.
        let restore_secret = Api::<Secret>::default_namespaced(client.clone())
            .get(&format!("{cluster}-etcd-restore"))
            .await
            .unwrap();
        let limit = restore_secret
            .data
            .unwrap_or_default()
            .get(etcdadm_shared::names::RESTORE_SIZE_KEY)
            .map(|size| {
                String::from_utf8(size.0.clone())
                    .unwrap()
                    .parse::<usize>()
                    .unwrap()
            });
        if limit.is_some_and(|limit| replacement.len() > limit) {
            assert!(
                output.contains("Maximum file size exceeded"),
                "{cluster}: the download of a larger file than {limit:?} bytes was not refused:\n{output}"
            );
            let partial = std::fs::read(&file).unwrap_or_default();
            assert!(Some(partial.len()) <= limit, "{cluster}");
            println!("{cluster}: the larger replacement refused at the download");
        } else {
            downloaded_and_refused_by_the_check(&client, cluster, &output, &file, &tampered).await;
        }
        for never in ["etc/etcd/etcd.env", "run/cluster-api/bootstrap-success.complete"] {
            assert!(
                !root.join(never).exists(),
                "{cluster}: {never} exists: etcdadm ran"
            );
        }
        let etcd = etcd_api(&client).get(&format!("{cluster}-etcd")).await.unwrap();
        let status = etcd.status.unwrap_or_default();
        assert!(
            status.members.iter().all(|m| m.member_id.is_none()),
            "{cluster}: {:?}",
            status.members
        );
        assert!(!status.initialized && status.restored_from.is_none(), "{cluster}");
        let written = events(&client, cluster)
            .await
            .into_iter()
            .find(|(reason, _)| reason == "RestoreSecretWritten")
            .map(|(_, note)| note)
            .unwrap();
        assert!(
            written.contains(&format!("{recorded} ({from})")),
            "{cluster}: {written}"
        );
    }
    save_logs(&work, "tampered");
}

/// The tampered file downloaded whole and refused by the SHA-256 check.
async fn downloaded_and_refused_by_the_check(
    client: &Client,
    cluster: &str,
    output: &str,
    file: &std::path::Path,
    tampered: &str,
) {
    assert!(
        output.contains("/var/lib/etcd-restore/snapshot.db: FAILED"),
        "{cluster}: the check did not refuse the file:\n{output}"
    );
    let downloaded = std::fs::read(file).unwrap();
    // How long the URL had been presigned when the machine used it (BENCHMARKS.md).
    let secret = Api::<Secret>::default_namespaced(client.clone())
        .get(&format!("{cluster}-etcd-restore"))
        .await
        .unwrap();
    let written: k8s_openapi::jiff::Timestamp =
        secret.metadata.annotations.unwrap()["etcdcluster.cluster.x-k8s.io/restore-url-written"]
            .parse()
            .unwrap();
    let fetched =
        k8s_openapi::jiff::Timestamp::try_from(std::fs::metadata(file).unwrap().modified().unwrap()).unwrap();
    println!(
        "{cluster}: the download URL was used {:.1} s after it was presigned",
        fetched.duration_since(written).as_secs_f64()
    );
    assert_eq!(
        format!("{:x}", Sha256::digest(&downloaded)),
        tampered,
        "{cluster}"
    );
}

/// The name of the first Machine of `<cluster>-etcd`, once it exists.
async fn wait_for_first_machine(client: &Client, cluster: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(machine) = machines(client, cluster).await.first() {
            return machine.metadata.name.clone().unwrap();
        }
        assert!(Instant::now() < deadline, "{cluster}: no Machine");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cloud-init output of the machine at `root`, once its runcmd finished.
async fn wait_for_runcmd(root: &std::path::Path, work: &TempDir) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let log = std::fs::read_to_string(root.join("sim/machine.log")).unwrap_or_default();
        if log.contains("runcmd exit codes") {
            return std::fs::read_to_string(root.join("var/log/cloud-init-output.log")).unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "{}: runcmd did not finish\n{log}\n{}",
            root.display(),
            logs(work)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
