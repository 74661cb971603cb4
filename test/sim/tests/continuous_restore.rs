#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Restores from continuous backup end to end, with the real controller, real etcd machines and
//! a real store (SeaweedFS). A client writes without pause while every member of a cluster is
//! powered off at once; `recover: latest` brings it back from its newest full snapshot plus
//! every delta after it, holding every acknowledged write older than one interval (the figure
//! printed is the recovery point: the age of the newest acknowledged write missing). A new
//! cluster restored to a revision in the middle of the deltas holds exactly the keys the source
//! held at that revision. A delta object damaged in the store stops a restore by its key, with
//! nothing else created and the cluster never Ready. `SIM_RESTORE_KILL_CONTROLLER=1` loses the
//! controller with the members, for the worst recovery point (BENCHMARKS.md).

mod lifecycle_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use etcd_client::GetOptions;
use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::backup::delta::listing;
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::demo;
use etcdadm_sim::plane::Plane;
use etcdadm_sim_machines::Fault;
use kube::ResourceExt;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const BUCKET: &str = "etcd-backups";
const RECOVER: &str = "etcdcluster.cluster.x-k8s.io/recover";
/// `spec.backup.continuous.interval` of the scenario's cluster.
const INTERVAL: Duration = Duration::from_secs(5);

/// An acknowledged write: its key, its revision and the time it was acknowledged at.
type Acked = (String, i64, SystemTime);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cluster_recovers_every_write_but_the_last_seconds_and_a_restore_stops_at_any_revision() {
    let work = TempDir::new("sim-continuous-restore");
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    let mut plane = start_plane(93, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    let backup = json!({"store": {"s3": store}, "continuous": {"interval": "5s"}});
    create(&client, "pr", 3, false, json!({}), json!({"backup": backup})).await;
    let etcd = wait_settled(&client, "pr", 3, TIMEOUT, &work).await;
    let full = continuous_snapshot(&client, "pr", &work, TIMEOUT).await;
    let base = full.status.clone().unwrap().revision.unwrap();

    // A client writes without pause; halfway, the keys at one revision are noted.
    let tls = demo::etcd_tls(&client, client.default_namespace(), "pr")
        .await
        .unwrap()
        .unwrap();
    let url = client_url(&etcd, &leader(&etcd));
    let member = MemberClient::new(&url, &tls, Duration::from_secs(2)).unwrap();
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let writing = MemberClient::new(&url, &tls, Duration::from_secs(2)).unwrap();
    let writer = tokio::spawn(write_until_lost(writing, acked.clone()));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let middle = acked.lock().unwrap().last().unwrap().1;
    let mut kv = member.workload_client().await.unwrap();
    let at_middle = contents(&mut kv, Some(middle)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;

    // Every member lost at once; with `SIM_RESTORE_KILL_CONTROLLER=1` the controller too (the
    // recorder then loses what it received since its last upload: the worst recovery point).
    let kill_controller = std::env::var_os("SIM_RESTORE_KILL_CONTROLLER").is_some();
    if kill_controller {
        plane.kill_controller(CONTROLLER).await.unwrap();
    }
    for m in &etcd.status.clone().unwrap().members {
        plane.runtime.fault(&m.name, Fault::PowerOff).unwrap();
    }
    let lost_at = SystemTime::now();
    if kill_controller {
        plane.restart_controller(CONTROLLER).unwrap();
    }
    writer.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 100, "the client wrote {} keys", acked.len());

    annotate_etcd_cluster(&client, "pr", RECOVER, Some("latest")).await;
    let recovered = wait_recovered(&mut plane, "pr", &work).await;
    let last = recovered.status.clone().unwrap().last_recovery.unwrap();
    assert_eq!(last.source, format!("snapshot/{}", full.name_any()));
    let deltas = last.deltas.clone().expect("lastRecovery.deltas");
    assert!(deltas.objects >= 2 && deltas.to == "latest", "{deltas:?}");
    let tls = demo::etcd_tls(&client, client.default_namespace(), "pr")
        .await
        .unwrap()
        .unwrap();
    let restored = MemberClient::new(
        &client_url(&recovered, &leader(&recovered)),
        &tls,
        Duration::from_secs(5),
    )
    .unwrap();
    let held = contents(&mut restored.workload_client().await.unwrap(), None).await;
    let missing: Vec<&Acked> = acked.iter().filter(|(key, ..)| !held.contains_key(key)).collect();
    let ages = || {
        missing
            .iter()
            .map(|(_, _, at)| lost_at.duration_since(*at).unwrap_or_default())
    };
    println!(
        "recovery point: {} acknowledged writes of {} missing, acknowledged {:?} to {:?} before the loss; deltas {deltas:?}",
        missing.len(),
        acked.len(),
        ages().max(),
        ages().min(),
    );
    let older: Vec<&&Acked> = missing
        .iter()
        .filter(|(_, _, at)| lost_at.duration_since(*at).unwrap_or_default() > INTERVAL)
        .collect();
    assert!(
        older.is_empty(),
        "acknowledged writes older than one interval missing: {older:?}"
    );
    for (key, value) in &held {
        assert_eq!(value, &format!("value-{key}").into_bytes());
    }

    // A new cluster restored to the middle revision: exactly the keys of then.
    let to_middle = json!({"snapshot": {"name": full.name_any()}, "to": {"revision": middle}});
    create(&client, "pit", 1, false, json!({}), json!({"restore": to_middle})).await;
    let pit = wait_settled(&client, "pit", 1, TIMEOUT, &work).await;
    let from = pit
        .status
        .clone()
        .unwrap()
        .restored_from
        .unwrap_or_else(|| panic!("no restoredFrom: {:?}\n{}", pit.status, logs(&work)));
    let replayed = from.deltas.unwrap();
    assert_eq!(
        (replayed.to.clone(), replayed.revision),
        (format!("revision {middle}"), middle)
    );
    assert!(middle > base);
    let tls = demo::etcd_tls(&client, client.default_namespace(), "pit")
        .await
        .unwrap()
        .unwrap();
    let member = MemberClient::new(&client_url(&pit, &leader(&pit)), &tls, Duration::from_secs(5)).unwrap();
    let got = contents(&mut member.workload_client().await.unwrap(), None).await;
    assert_eq!(got.len(), at_middle.len(), "the key count at revision {middle}");
    assert_eq!(got, at_middle, "every key and value at revision {middle}");

    // A damaged delta stops a restore by its key: one member holding the snapshot alone, never
    // Ready, no other Machine.
    let key = object_key(&full, BUCKET);
    let names = listing::listed(&bucket, &key).await.unwrap();
    let damaged_key = names[1].key(&key);
    let mut damaged = bucket.get_object(&damaged_key, 64 << 20).await.unwrap();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x20;
    bucket.put_object(&damaged_key, damaged).await.unwrap();
    let latest = json!({"snapshot": {"name": full.name_any()}, "to": {"latest": true}});
    create(&client, "bad", 3, false, json!({}), json!({"restore": latest})).await;
    let said = wait_for(&work, "the damaged delta named", || async {
        events(&client, "bad")
            .await
            .into_iter()
            .find(|(reason, note)| reason == "RestoreDeltasUnusable" && note.contains(&damaged_key))
    })
    .await;
    assert!(said.1.contains("nothing of them was written"), "{}", said.1);
    let bad = etcd_api(&client).get("bad-etcd").await.unwrap();
    let (status, reason, message) = condition(&bad, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RestoreDeltasUnusable")
    );
    assert!(message.contains(&damaged_key), "{message}");
    assert!(bad.status.clone().unwrap().restored_from.is_none());
    assert_eq!(machines(&client, "bad").await.len(), 1, "no other member joins");
    save_logs(&work, "continuous_restore");
}

/// Put `w/NNNNN` = `value-w/NNNNN` through `member` until it stops answering, recording each
/// acknowledged write.
async fn write_until_lost(member: MemberClient, acked: Arc<Mutex<Vec<Acked>>>) {
    let mut kv = member.workload_client().await.unwrap();
    for i in 0.. {
        let key = format!("w/{i:05}");
        let put = tokio::time::timeout(
            Duration::from_secs(2),
            kv.put(key.clone(), format!("value-{key}"), None),
        )
        .await;
        let Ok(Ok(put)) = put else { return };
        let revision = put.header().unwrap().revision();
        acked.lock().unwrap().push((key, revision, SystemTime::now()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every key under `w/` and its value, at `revision` (None: now).
async fn contents(kv: &mut etcd_client::Client, revision: Option<i64>) -> BTreeMap<String, Vec<u8>> {
    let mut options = GetOptions::new().with_prefix();
    if let Some(revision) = revision {
        options = options.with_revision(revision);
    }
    kv.get("w/", Some(options))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (String::from_utf8(kv.key().to_vec()).unwrap(), kv.value().to_vec()))
        .collect()
}

/// The client URL of `member` in the status of `etcd`.
fn client_url(etcd: &EtcdadmCluster, member: &str) -> String {
    etcd.status
        .clone()
        .unwrap()
        .members
        .into_iter()
        .find(|m| m.name == member)
        .and_then(|m| m.client_url)
        .unwrap()
}

/// The cluster once its recovery finished (annotation gone, no recovery under way, three
/// members settled).
async fn wait_recovered(plane: &mut Plane, cluster: &str, work: &TempDir) -> EtcdadmCluster {
    let client = plane.client.clone();
    wait_for(work, "the recovery finished", || async {
        let etcd = etcd_api(&client).get(&format!("{cluster}-etcd")).await.ok()?;
        let under_way = etcd.status.as_ref().is_some_and(|s| s.recovery.is_some());
        if etcd.annotations().contains_key(RECOVER) || under_way {
            return None;
        }
        settled(&client, cluster, 3).await.ok()
    })
    .await
}

/// `check`'s answer, polled by `demo::eventually` for at most [`TIMEOUT`].
async fn wait_for<T, F, Fut>(work: &TempDir, what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_until(work, what, TIMEOUT, check).await
}
