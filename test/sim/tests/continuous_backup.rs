#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Continuous backup end to end with the real controller, real etcd machines and a real store
//! (SeaweedFS): a cluster with `spec.backup.continuous` gets a full snapshot of its own, then
//! every write a client makes lands in delta objects beside it, named in order, each a whole
//! chain link, recorded on the snapshot's status; a newer snapshot takes over (the old one's
//! deltas end `Superseded`), and retention deleting the old snapshot deletes its deltas too.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::Duration;

use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::backup::delta::{self, chain, listing};
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use kube::ResourceExt;
use kube::api::Api;
use lifecycle_support::*;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(150);
const BUCKET: &str = "etcd-backups";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_lands_in_deltas_after_the_newest_snapshot_and_goes_with_it() {
    let work = TempDir::new("sim-continuous-backup");
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    let plane = start_plane(91, &work, Duration::from_secs(1)).await;
    let client = plane.client.clone();
    store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    create(
        &client,
        "cb",
        3,
        false,
        json!({}),
        json!({"backup": {"store": {"s3": store}, "continuous": {"interval": "5s"}, "retention": {"keep": 1}}}),
    )
    .await;
    let etcd = wait_settled(&client, "cb", 3, TIMEOUT, &work).await;
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(client.clone());

    // The controller takes the full snapshot the deltas follow.
    let first = continuous_snapshot(&client, "cb", &work, TIMEOUT).await;
    let base = first.status.clone().unwrap().revision.unwrap();
    let key = object_key(&first, BUCKET);

    let (member, written) = write_keys(&client, "cb", &etcd, 300).await;
    let recorded = wait_for(&work, "deltas up to the last write", || async {
        let s = snapshots.get(&first.name_any()).await.unwrap();
        let deltas = s.status.and_then(|st| st.deltas)?;
        (deltas.last_revision >= written).then_some(deltas)
    })
    .await;
    let names = listed(&bucket, &key).await;
    assert_eq!(
        names.len() as i64,
        recorded.count,
        "the status counts what the store lists"
    );
    let chain = chain::plan(base, &names, Some(recorded.last_revision), chain::Target::Latest).unwrap();
    let mut keys = BTreeSet::new();
    for name in &chain.deltas {
        let bytes = bucket.get_object(&name.key(&key), 64 << 20).await.unwrap();
        let decoded = delta::decode(&bytes).unwrap();
        assert_eq!(decoded.base, base);
        keys.extend(
            decoded
                .events
                .iter()
                .map(|e| String::from_utf8(e.key.clone()).unwrap()),
        );
    }
    let expected: BTreeSet<String> = (0..300).map(|i| format!("app/{i:04}")).collect();
    assert_eq!(keys, expected, "every acknowledged write is in the deltas");

    // A newer snapshot takes over; retention (keep 1) deletes the old one with its deltas.
    take_snapshot(&client, "cb", "cb-newer", &work).await;
    wait_for(&work, "the old snapshot and its deltas gone", || async {
        let gone = snapshots.get_opt(&first.name_any()).await.unwrap().is_none();
        (gone && listed(&bucket, &key).await.is_empty()).then_some(())
    })
    .await;
    assert!(
        bucket.list(&key).await.unwrap().is_empty(),
        "the old snapshot's object went too"
    );
    let mut kv = member.workload_client().await.unwrap();
    kv.put("after/newer", "x", None).await.unwrap();
    let newer = snapshots.get("cb-newer").await.unwrap();
    let newer_key = object_key(&newer, BUCKET);
    wait_for(&work, "deltas after the newer snapshot", || async {
        let names = listed(&bucket, &newer_key).await;
        (!names.is_empty()).then_some(())
    })
    .await;
    let said = events(&client, "cb").await;
    assert!(
        said.iter()
            .any(|(reason, _)| reason == "SnapshotForContinuousBackup"),
        "{said:?}"
    );
    let on_snapshots = events_about(&client, &first.name_any()).await;
    assert!(
        on_snapshots
            .iter()
            .any(|(reason, _)| reason == "ContinuousBackupStarted"),
        "{on_snapshots:?}"
    );
    assert!(
        on_snapshots
            .iter()
            .any(|(reason, note)| reason == "ContinuousBackupEnded" && note.contains("Superseded")),
        "{on_snapshots:?}"
    );
    save_logs(&work, "continuous_backup");
}

/// The delta objects the store lists after the snapshot at `key`.
async fn listed(bucket: &StoreClient, key: &str) -> Vec<chain::DeltaName> {
    listing::listed(bucket, key).await.unwrap()
}

/// `check`'s answer, polled by `demo::eventually` for at most [`TIMEOUT`].
async fn wait_for<T, F, Fut>(work: &TempDir, what: &str, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_until(work, what, TIMEOUT, check).await
}
