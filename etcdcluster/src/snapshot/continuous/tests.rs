//! Tests of `continuous`: what records, and when a full snapshot is wanted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use serde_json::{Value, json};

const NOW: &str = "2026-11-28T10:07:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn member(name: &str, leader: bool, healthy: bool) -> Value {
    json!({"name": name, "machineRef": {"name": name}, "memberID": format!("{name}-id"),
           "clientURL": format!("https://{name}:2379"), "healthy": healthy, "isLeader": leader})
}

fn cluster(extra: Value) -> EtcdadmCluster {
    let mut value = json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1-etcd", "namespace": "default"},
        "spec": {"infrastructureTemplate": {},
                 "backup": {"store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                             "credentialsSecretRef": {"name": "s3"}}},
                            "continuous": {"interval": "10s"}}},
        "status": {"members": [member("m1", true, true), member("m2", false, true), member("m3", false, false)]},
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

fn snapshot(name: &str, status: Value, annotations: Value) -> EtcdadmSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"clusterName": "c1-etcd"}, "status": status,
    }))
    .unwrap()
}

fn succeeded(name: &str, revision: i64, deltas: Value) -> EtcdadmSnapshot {
    snapshot(
        name,
        json!({"phase": "Succeeded", "revision": revision, "location": format!("snaps/default/c1-etcd/{name}.db"),
               "store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                "credentialsSecretRef": {"name": "s3"}}},
               "deltas": deltas}),
        json!({}),
    )
}

#[test]
fn the_newest_snapshot_is_followed_from_a_healthy_follower() {
    let snapshots = [
        succeeded("old", 100, Value::Null),
        succeeded("new", 250, json!({"count": 3, "lastRevision": 300})),
        snapshot("failed", json!({"phase": "Failed"}), json!({})),
    ];
    let r = recording(&cluster(json!({})), &snapshots).unwrap();
    assert_eq!(
        (
            r.snapshot.as_str(),
            r.key.as_str(),
            r.base,
            r.member.member.as_str(),
            r.interval
        ),
        (
            "new",
            "default/c1-etcd/new.db",
            250,
            "m2",
            Duration::from_secs(10)
        )
    );
    assert_eq!(full_snapshot_wanted(&cluster(json!({})), &snapshots, now()), None);
}

#[test]
fn nothing_records_when_it_should_not() {
    let followed = [succeeded("s1", 100, Value::Null)];
    let cases: Vec<(&str, EtcdadmCluster, Vec<EtcdadmSnapshot>)> = vec![
        (
            "off",
            cluster(json!({"spec": {"backup": {"continuous": null}}})),
            followed.to_vec(),
        ),
        (
            "no store",
            cluster(json!({"spec": {"backup": null}})),
            followed.to_vec(),
        ),
        ("no snapshot yet", cluster(json!({})), vec![]),
        (
            "being deleted",
            cluster(json!({"metadata": {"deletionTimestamp": NOW}})),
            followed.to_vec(),
        ),
        (
            "paused",
            cluster(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
            followed.to_vec(),
        ),
        (
            "no healthy member",
            cluster(json!({"status": {"members": [member("m1", true, false)]}})),
            followed.to_vec(),
        ),
        (
            "its deltas ended",
            cluster(json!({})),
            vec![succeeded(
                "s1",
                100,
                json!({"count": 2, "lastRevision": 140, "ended": "Compacted"}),
            )],
        ),
    ];
    for (case, c, snapshots) in cases {
        assert_eq!(recording(&c, &snapshots), None, "{case}");
    }
}

#[test]
fn a_full_snapshot_is_wanted_with_none_to_follow_and_after_a_compaction_at_most_every_ten_minutes() {
    let compacted = succeeded(
        "s1",
        100,
        json!({"count": 2, "lastRevision": 140, "ended": "Compacted"}),
    );
    let superseded = succeeded("s0", 50, json!({"ended": "Superseded"}));
    let recent = |at: &str| {
        snapshot(
            "c",
            json!({"phase": "Failed"}),
            json!({FOR_CONTINUOUS_ANNOTATION: at}),
        )
    };
    let name = Some("c1-etcd-continuous-20261128100700".to_string());
    let cases: Vec<(&str, EtcdadmCluster, Vec<EtcdadmSnapshot>, Option<String>)> = vec![
        ("none to follow", cluster(json!({})), vec![], name.clone()),
        (
            "only failed ones",
            cluster(json!({})),
            vec![snapshot("f", json!({"phase": "Failed"}), json!({}))],
            name.clone(),
        ),
        (
            "the newest compacted",
            cluster(json!({})),
            vec![superseded.clone(), compacted.clone()],
            name.clone(),
        ),
        (
            "the newest followed",
            cluster(json!({})),
            vec![succeeded("s2", 200, Value::Null), compacted.clone()],
            None,
        ),
        (
            "one created 5 minutes ago",
            cluster(json!({})),
            vec![compacted.clone(), recent("2026-11-28T10:02:00Z")],
            None,
        ),
        (
            "one created 11 minutes ago",
            cluster(json!({})),
            vec![compacted.clone(), recent("2026-11-28T09:56:00Z")],
            name.clone(),
        ),
        (
            "one unfinished",
            cluster(json!({})),
            vec![snapshot("p", json!({}), json!({}))],
            None,
        ),
        (
            "off",
            cluster(json!({"spec": {"backup": {"continuous": null}}})),
            vec![],
            None,
        ),
        (
            "paused",
            cluster(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
            vec![],
            None,
        ),
    ];
    for (case, c, snapshots, expected) in cases {
        assert_eq!(full_snapshot_wanted(&c, &snapshots, now()), expected, "{case}");
    }
}
