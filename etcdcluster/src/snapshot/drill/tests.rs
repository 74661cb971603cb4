//! Tests of `drill`: when a drill is due, which snapshot it drills, and what a comparison says.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use serde_json::{Value, json};

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn cluster(extra: Value) -> EtcdadmCluster {
    let mut value = json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1-etcd", "namespace": "default", "creationTimestamp": "2026-11-28T09:00:00Z"},
        "spec": {"infrastructureTemplate": {},
                 "backup": {"store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                             "credentialsSecretRef": {"name": "s3"}}},
                            "verify": {"schedule": "0 * * * *"}}},
        "status": {"members": [
            {"name": "m1", "machineRef": {"name": "m1"}, "clientURL": "https://m1:2379", "healthy": true, "isLeader": true},
            {"name": "m2", "machineRef": {"name": "m2"}, "clientURL": "https://m2:2379", "healthy": true}]},
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

fn snapshot(name: &str, revision: i64, drilled: Option<&str>) -> EtcdadmSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterName": "c1-etcd"},
        "status": {"phase": "Succeeded", "revision": revision, "location": format!("snaps/c1/{name}.db"),
                   "store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                    "credentialsSecretRef": {"name": "s3"}}},
                   "sha256": "ab".repeat(32), "size": 4096, "deltas": {"count": 2, "lastRevision": revision + 10},
                   "lastDrill": drilled.map(|t| json!({"time": t, "result": "Passed", "message": ""}))},
    }))
    .unwrap()
}

fn pending(name: &str) -> EtcdadmSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"clusterName": "c1-etcd"},
    }))
    .unwrap()
}

/// The snapshot a due drill drills and the tick it is for; else how long until the next look.
type Decision = Result<(String, String), Option<u64>>;

fn decide(cluster: &EtcdadmCluster, snapshots: &[EtcdadmSnapshot], now: &str) -> Decision {
    match due(cluster, snapshots, at(now)) {
        Due::Now(d) => Ok((d.snapshot, d.tick.to_string())),
        Due::Later { next } => Err(next.map(|d| d.as_secs())),
    }
}

#[test]
fn a_drill_asked_for_now_runs_once_per_value() {
    let asked = |token: &str| {
        cluster(json!({"metadata": {"annotations": {"etcdcluster.cluster.x-k8s.io/drill-now": token}}}))
    };
    let mut answered = snapshot("new", 200, Some("2026-11-28T10:40:00Z"));
    if let Some(drill) = answered.status.as_mut().and_then(|s| s.last_drill.as_mut()) {
        drill.requested = Some("first".into());
    }
    // Between two schedule times: asked, it runs now, on the newest snapshot, for that value.
    let Due::Now(drill) = due(
        &asked("first"),
        &[snapshot("new", 200, None)],
        at("2026-11-28T10:30:00Z"),
    ) else {
        panic!("asked for a drill now")
    };
    assert_eq!(
        (drill.snapshot.as_str(), drill.tick, drill.requested.as_deref()),
        ("new", at("2026-11-28T10:30:00Z"), Some("first"))
    );
    // Answered: the schedule again; a new value, a new drill.
    assert_eq!(
        decide(
            &asked("first"),
            std::slice::from_ref(&answered),
            "2026-11-28T10:50:00Z"
        ),
        Err(Some(600))
    );
    assert!(matches!(
        due(&asked("second"), &[answered], at("2026-11-28T10:50:00Z")),
        Due::Now(d) if d.requested.as_deref() == Some("second")
    ));
}

#[test]
fn a_drill_is_due_once_per_schedule_time_on_the_newest_snapshot() {
    let plain = cluster(json!({}));
    let paused = cluster(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": "true"}}}));
    let unverified = cluster(json!({"spec": {"backup": {"verify": null}}}));
    let every_minute = cluster(json!({"spec": {"backup": {"verify": {"schedule": "* * * * *"}}}}));
    let no_healthy_member = cluster(json!({"status": {"members": [
        {"name": "m1", "machineRef": {"name": "m1"}, "clientURL": "https://m1:2379", "healthy": false}]}}));
    let two = [snapshot("old", 100, None), snapshot("new", 200, None)];
    let drilled_at_10 = [
        snapshot("old", 100, Some("2026-11-28T10:00:05Z")),
        snapshot("new", 200, None),
    ];
    let only_pending = [pending("p")];
    let now_drill = |s: &str, t: &str| Ok((s.to_string(), t.to_string()));
    let cases: Vec<(&str, &EtcdadmCluster, &[EtcdadmSnapshot], &str, Decision)> = vec![
        (
            "the first tick after creation drills the newest",
            &plain,
            &two,
            "2026-11-28T10:30:00Z",
            now_drill("new", "2026-11-28T10:00:00Z"),
        ),
        (
            "before the first tick after creation",
            &plain,
            &two,
            "2026-11-28T09:30:00Z",
            Err(Some(1800)),
        ),
        (
            "drilled since the last tick",
            &plain,
            &drilled_at_10,
            "2026-11-28T10:59:00Z",
            Err(Some(60)),
        ),
        (
            "the next tick after a drill",
            &plain,
            &drilled_at_10,
            "2026-11-28T11:00:00Z",
            now_drill("new", "2026-11-28T11:00:00Z"),
        ),
        (
            "missed ticks collapse into the latest",
            &plain,
            &drilled_at_10,
            "2026-11-28T14:10:00Z",
            now_drill("new", "2026-11-28T14:00:00Z"),
        ),
        (
            "every minute",
            &every_minute,
            &drilled_at_10,
            "2026-11-28T10:01:30Z",
            now_drill("new", "2026-11-28T10:01:00Z"),
        ),
        (
            "no snapshot to drill yet: looked at again",
            &plain,
            &[],
            "2026-11-28T10:30:00Z",
            Err(Some(1800)),
        ),
        (
            "a pending snapshot is not drilled",
            &plain,
            &only_pending,
            "2026-11-28T10:30:00Z",
            Err(Some(1800)),
        ),
        (
            "no healthy member to compare with",
            &no_healthy_member,
            &two,
            "2026-11-28T10:30:00Z",
            Err(Some(1800)),
        ),
        (
            "verify unset",
            &unverified,
            &two,
            "2026-11-28T10:30:00Z",
            Err(None),
        ),
        ("paused", &paused, &two, "2026-11-28T10:30:00Z", Err(None)),
    ];
    for (name, cluster, snapshots, now, want) in cases {
        assert_eq!(decide(cluster, snapshots, now), want, "{name}");
    }
}

#[test]
fn a_drill_carries_what_the_snapshot_recorded() {
    let Due::Now(drill) = due(
        &cluster(json!({"spec": {"backup": {"verify": {"sampleKeys": 7}}}})),
        &[snapshot("new", 200, None)],
        at("2026-11-28T10:30:00Z"),
    ) else {
        panic!("due");
    };
    assert_eq!(drill.key, "c1/new.db");
    assert_eq!(drill.base, 200);
    assert_eq!(drill.recorded, Some(210));
    assert_eq!(drill.sha256, "ab".repeat(32));
    assert_eq!(drill.size, 4096);
    assert_eq!(drill.member.member, "m2", "a follower, as snapshots are read");
    assert_eq!(drill.sample_keys, 7);
    let defaulted = match due(
        &cluster(json!({})),
        &[snapshot("new", 200, None)],
        at("2026-11-28T10:30:00Z"),
    ) {
        Due::Now(d) => d.sample_keys,
        other => panic!("{other:?}"),
    };
    assert_eq!(defaulted, 100);
}

fn sample(key: &str, restored: &str, source: Option<&str>) -> Sample {
    Sample {
        key: key.into(),
        restored: restored.into(),
        source: source.map_or(Source::Absent, |v| Source::Value(v.into())),
    }
}

#[test]
fn the_comparison_names_the_first_difference() {
    let same = [sample("a", "1", Some("1")), sample("b", "2", Some("2"))];
    let cases = [
        ("same", 2, 2, same.to_vec(), Verdict::Same),
        ("no samples", 0, 0, vec![], Verdict::Same),
        (
            "a key fewer",
            3,
            2,
            same.to_vec(),
            Verdict::Count {
                source: 3,
                restored: 2,
            },
        ),
        (
            "a key more",
            2,
            3,
            same.to_vec(),
            Verdict::Count {
                source: 2,
                restored: 3,
            },
        ),
        (
            "a value differs",
            2,
            2,
            vec![sample("a", "1", Some("1")), sample("b", "x", Some("2"))],
            Verdict::Value { key: "b".into() },
        ),
        (
            "a key the source lacks",
            2,
            2,
            vec![sample("a", "1", None), sample("b", "x", Some("2"))],
            Verdict::Extra { key: "a".into() },
        ),
        (
            "the source's value over the answer cap",
            1,
            1,
            vec![Sample {
                key: "big".into(),
                restored: "small".into(),
                source: Source::OverCap,
            }],
            Verdict::Value { key: "big".into() },
        ),
        (
            "an empty value is a value",
            1,
            1,
            vec![sample("a", "", Some("0"))],
            Verdict::Value { key: "a".into() },
        ),
    ];
    for (name, source, restored, samples, want) in cases {
        assert_eq!(compare(source, restored, &samples), want, "{name}");
    }
}

#[test]
fn outcomes_say_what_failed() {
    let (result, message) = Verdict::Value {
        key: "/registry/x".into(),
    }
    .outcome(42, 3);
    assert_eq!(result, DrillResult::Failed);
    assert!(
        message.contains("/registry/x") && message.contains("42"),
        "{message}"
    );
    let (result, message) = Verdict::Count {
        source: 5,
        restored: 4,
    }
    .outcome(42, 3);
    assert_eq!(result, DrillResult::Failed);
    assert!(message.contains("4 keys, the source 5"), "{message}");
    let (result, message) = Verdict::Same.outcome(42, 3);
    assert_eq!(result, DrillResult::Passed);
    assert!(message.contains("3 sampled keys"), "{message}");
}

#[test]
fn samples_spread_evenly_over_the_keys() {
    let cases: [(u64, usize, Vec<u64>); 6] = [
        (0, 100, vec![]),
        (3, 100, vec![0, 1, 2]),
        (10, 5, vec![0, 2, 4, 6, 8]),
        (10, 3, vec![0, 3, 6]),
        (7, 1, vec![0]),
        (u64::MAX, 2, vec![0, u64::MAX / 2]),
    ];
    for (total, wanted, want) in cases {
        assert_eq!(sample_positions(total, wanted), want, "{total} {wanted}");
    }
    let many = sample_positions(1_000_000, 1000);
    assert_eq!(many.len(), 1000);
    assert!(many.windows(2).all(|w| w[1] - w[0] == 1000));
}

#[test]
fn keys_print_readably_and_bounded() {
    assert_eq!(printable(b"/registry/pods/a"), "/registry/pods/a");
    assert_eq!(printable(b"a\nb"), "a\\nb");
    assert_eq!(printable(&[0xff, 0x00]), "0xff00");
    let long = printable(&[b'k'; 1000]);
    assert_eq!(long.len(), 259);
}

#[test]
fn the_answer_cap_is_told_from_other_errors() {
    assert!(over_cap(
        "grpc request error: code: 'Unknown error', message: \"length limit exceeded\", source: LengthLimitError"
    ));
    assert!(!over_cap("connection refused"));
}

#[test]
fn a_compacted_source_is_named_as_such() {
    let compacted = source_unreadable(
        "grpc status: etcdserver: mvcc: required revision has been compacted",
        42,
    );
    assert!(compacted.contains("compacted revision 42"), "{compacted}");
    assert!(compacted.contains("nothing is concluded"), "{compacted}");
    let unreachable = source_unreadable("connection refused", 42);
    assert_eq!(
        unreachable,
        "reading the source cluster at revision 42: connection refused"
    );
}
