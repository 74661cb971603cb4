#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Snapshots end to end with both real controller binaries, real etcd machines and a real S3
//! store (SeaweedFS): a Ready cluster of three backed up to a bucket, a client writes 1,000 keys,
//! `kubectl create` of an EtcdadmSnapshot ends Succeeded with the revision of the last write,
//! taken from a follower, and the object in the bucket is the snapshot file etcd reads back.

mod lifecycle_support;

use std::time::{Duration, Instant};

use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{CREDENTIALS_SECRET, SeaweedFs, TempDir, etcd_binary};
use etcdadm_sim::demo;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
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
    let real = real_apiserver::RealApiServer::start().await;
    snapshot_scenario(Some(&real), 14).await;
}

async fn credentials_secret(client: &Client, s3: &SeaweedFs) {
    let data = s3
        .credentials_secret_data()
        .into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(CREDENTIALS_SECRET.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::default_namespaced(client.clone())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn snapshot_scenario(real: Option<&real_apiserver::RealApiServer>, prefix: u8) {
    let work = TempDir::new("sim-snapshots");
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    let plane = start_plane_on(real, prefix, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    credentials_secret(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        "b1",
        3,
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}}}),
    )
    .await;
    let etcd = wait_settled(&client, "b1", 3, TIMEOUT, &work).await;
    let members = etcd.status.clone().unwrap().members;
    let leader = members.iter().find(|m| m.is_leader).unwrap().name.clone();

    // A client writes 1,000 keys through one member.
    let tls = demo::etcd_tls(&client, client.default_namespace(), "b1")
        .await
        .unwrap()
        .unwrap();
    let url = members[0].client_url.clone().unwrap();
    let member = MemberClient::new(&url, &tls, Duration::from_secs(5)).unwrap();
    let mut kv = member.etcd_client().await.unwrap();
    for i in 0..1000 {
        kv.put(format!("app/{i:04}"), format!("value-{i}"), None)
            .await
            .unwrap();
    }
    let written = member.local_revision().await.unwrap();

    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());
    let requested: EtcdadmSnapshot = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": "b1-before-upgrade"}, "spec": {"clusterName": "b1-etcd"},
    }))
    .unwrap();
    snapshots
        .create(&PostParams::default(), &requested)
        .await
        .unwrap();
    let started = Instant::now();
    let taken = loop {
        let current = snapshots.get("b1-before-upgrade").await.unwrap();
        match current.phase() {
            SnapshotPhase::Succeeded => break current,
            SnapshotPhase::Failed => panic!("snapshot failed: {:?}\n{}", current.status, logs(&work)),
            _ if started.elapsed() > Duration::from_secs(60) => {
                panic!(
                    "snapshot not taken within 60 s: {:?}\n{}",
                    current.status,
                    logs(&work)
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
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
