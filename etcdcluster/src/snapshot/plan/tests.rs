//! Tests of `plan`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use serde_json::{Value, json};

const NOW: &str = "2026-11-24T10:07:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn member(name: &str, leader: bool) -> Value {
    json!({"name": name, "machineRef": {"name": name}, "memberID": format!("{name}-id"),
           "clientURL": format!("https://{name}:2379"), "healthy": true, "isLeader": leader,
           "lastHealthyTime": "2026-11-24T10:06:30Z", "etcdVersion": "3.4.23"})
}

fn cluster(extra: Value) -> EtcdadmCluster {
    let mut value = json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1-etcd", "namespace": "default", "generation": 2,
                     "creationTimestamp": "2026-11-24T08:00:00Z"},
        "spec": {"infrastructureTemplate": {},
                 "backup": {"store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                             "forcePathStyle": true, "credentialsSecretRef": {"name": "s3"}}}}},
        "status": {"observedGeneration": 2,
                   "conditions": [{"type": "ResizeCompleted", "status": "True", "reason": "ResizeCompleted",
                                   "lastTransitionTime": "2026-11-24T09:00:00Z"}],
                   "members": [member("m1", true), member("m2", false), member("m3", false)]},
    });
    json_patch::merge(&mut value, &extra);
    serde_json::from_value(value).unwrap()
}

fn snapshot(name: &str, created: &str, status: Value) -> EtcdadmSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"clusterName": "c1-etcd"}, "status": status,
    }))
    .unwrap()
}

fn succeeded(name: &str, completed: &str) -> EtcdadmSnapshot {
    snapshot(
        name,
        completed,
        json!({"phase": "Succeeded", "completionTime": completed, "location": format!("snaps/k/{name}.db"),
               "store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true, "bucket": "snaps",
                                "credentialsSecretRef": {"name": "s3"}}}}),
    )
}

fn step(cluster: &EtcdadmCluster, snapshots: &[EtcdadmSnapshot]) -> Step {
    plan(&Observed {
        cluster,
        snapshots,
        now: now(),
        referenced: &[],
        continuous_snapshot: None,
    })
}

#[test]
fn a_pending_snapshot_is_taken_from_a_follower() {
    let c = cluster(json!({}));
    let pending = [snapshot("s1", "2026-11-24T10:00:00Z", json!({}))];
    let Step::Take {
        snapshot,
        target,
        store,
    } = step(&c, &pending)
    else {
        panic!("{:?}", step(&c, &pending));
    };
    assert_eq!(snapshot, "s1");
    assert_eq!(
        target.member, "m2",
        "the first follower by name, never the leader"
    );
    assert_eq!(target.client_url, "https://m2:2379");
    assert_eq!(target.etcd_version.as_deref(), Some("3.4.23"));
    assert_eq!(store.bucket, "snaps");
    // With the leader as the only healthy member, the leader.
    let c = cluster(
        json!({"status": {"members": [member("m1", true), {"name": "m2", "machineRef": {"name": "m2"},
        "memberID": "2", "healthy": false, "lastHealthyTime": "2026-11-24T10:00:00Z"}]}}),
    );
    assert!(matches!(step(&c, &pending), Step::Take { target, .. } if target.member == "m1"));
}

#[test]
fn a_snapshot_of_a_named_member_is_taken_without_quorum_or_a_settled_membership() {
    // Two of three down and the membership unsettled: the survivor m3 is still read.
    let c = cluster(json!({"status": {"conditions": [], "members": [
        merged(member("m1", true), json!({"healthy": false})),
        merged(member("m2", false), json!({"healthy": false})),
        merged(member("m3", false), json!({"healthy": false}))]}}));
    let mut named = snapshot("s1", "2026-11-24T10:00:00Z", json!({}));
    named.spec.member = Some("m3".into());
    let Step::Take { target, .. } = step(&c, std::slice::from_ref(&named)) else {
        panic!("{:?}", step(&c, &[named]));
    };
    assert_eq!(target.member, "m3");
    assert_eq!(target.client_url, "https://m3:2379");
    named.spec.member = Some("m9".into());
    let Step::Fail { reason, message, .. } = step(&c, std::slice::from_ref(&named)) else {
        panic!("{:?}", step(&c, &[named]));
    };
    assert_eq!(reason, super::reason::MEMBER_NOT_FOUND);
    assert!(
        message.starts_with("spec.member: ") && message.contains("m9"),
        "{message}"
    );
}

#[test]
fn the_oldest_pending_snapshot_goes_first() {
    let c = cluster(json!({}));
    let pending = [
        snapshot("b-newer", "2026-11-24T10:05:00Z", json!({})),
        snapshot("a-older", "2026-11-24T10:01:00Z", json!({"phase": "Pending"})),
    ];
    assert!(matches!(step(&c, &pending), Step::Take { snapshot, .. } if snapshot == "a-older"));
}

#[test]
fn nothing_is_taken_during_a_membership_change() {
    let pending = [snapshot("s1", "2026-11-24T10:00:00Z", json!({}))];
    let joining = json!({"name": "m4", "machineRef": {"name": "m4"}, "memberID": "4", "healthy": false});
    for (what, c, words) in [
        (
            "stale status",
            cluster(json!({"metadata": {"generation": 3}})),
            "generation 3",
        ),
        (
            "resizing",
            cluster(
                json!({"status": {"conditions": [{"type": "ResizeCompleted", "status": "False",
                "reason": "ScalingUp", "message": "3 Machines for 5 replicas", "lastTransitionTime": NOW}]}}),
            ),
            "ScalingUp",
        ),
        (
            "a joining member",
            cluster(json!({"status": {"members": [member("m1", true), member("m2", false), joining]}})),
            "member m4 is joining",
        ),
        (
            "a Machine not yet a member",
            cluster(
                json!({"status": {"members": [member("m1", true), {"name": "m4", "machineRef": {"name": "m4"}}]}}),
            ),
            "Machine m4 is not an etcd member yet",
        ),
        (
            "a learner",
            cluster(
                json!({"status": {"members": [member("m1", true), merged(member("m2", false), json!({"isLearner": true}))]}}),
            ),
            "member m2 is a learner",
        ),
        (
            "a member without a Machine",
            cluster(
                json!({"status": {"members": [member("m1", true), {"name": "abc", "memberID": "abc", "healthy": true,
                "lastHealthyTime": NOW}]}}),
            ),
            "runs on no Machine",
        ),
    ] {
        match step(&c, &pending) {
            Step::Wait { reason, message, .. } => {
                assert_eq!(reason, reason::MEMBERSHIP_CHANGING, "{what}");
                assert!(message.contains(words), "{what}: {message}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A before-change snapshot does not wait for the resize it precedes, but for joins.
    let mut before = snapshot("s1", "2026-11-24T10:00:00Z", json!({}));
    before.metadata.labels = Some(
        [(
            names::SNAPSHOT_REASON_LABEL.to_string(),
            "before-scale-down".to_string(),
        )]
        .into(),
    );
    let resizing = cluster(
        json!({"status": {"conditions": [{"type": "ResizeCompleted", "status": "False",
        "reason": "ScalingDown", "message": "5 Machines for 3 replicas", "lastTransitionTime": NOW}]}}),
    );
    assert!(matches!(
        step(&resizing, std::slice::from_ref(&before)),
        Step::Take { .. }
    ));
    let joining_too =
        cluster(json!({"status": {"conditions": [], "members": [member("m1", true), joining.clone()]}}));
    assert!(
        matches!(step(&joining_too, &[before]), Step::Wait { reason, .. } if reason == reason::MEMBERSHIP_CHANGING)
    );
    // A member that was healthy and is down is no membership change.
    let down = merged(member("m3", false), json!({"healthy": false}));
    let c = cluster(json!({"status": {"members": [member("m1", true), member("m2", false), down]}}));
    assert!(matches!(step(&c, &pending), Step::Take { .. }));
}

fn merged(mut base: Value, patch: Value) -> Value {
    json_patch::merge(&mut base, &patch);
    base
}

#[test]
fn a_snapshot_waits_once_then_the_rest_of_the_plan_goes_on() {
    let c = cluster(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}));
    let pending = snapshot("s1", "2026-11-24T10:00:00Z", json!({}));
    let Step::Wait { reason, message, .. } = step(&c, std::slice::from_ref(&pending)) else {
        panic!()
    };
    assert_eq!(reason, reason::PAUSED);
    let told = snapshot(
        "s1",
        "2026-11-24T10:00:00Z",
        json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False", "reason": reason,
               "message": message, "lastTransitionTime": NOW}]}),
    );
    assert_eq!(
        step(&c, &[told]),
        Step::Idle {
            requeue: Some(WAIT_REQUEUE)
        }
    );
    let c = cluster(json!({"status": {"members": [merged(member("m1", true), json!({"healthy": false}))]}}));
    assert!(matches!(step(&c, &[pending]), Step::Wait { reason, .. } if reason == reason::NO_HEALTHY_MEMBER));
}

#[test]
fn snapshots_fail_without_a_usable_store_or_while_the_cluster_goes() {
    let pending = [snapshot("s1", "2026-11-24T10:00:00Z", json!({}))];
    let mut no_backup = cluster(json!({}));
    no_backup.spec.backup = None;
    assert!(
        matches!(step(&no_backup, &pending), Step::Fail { reason, .. } if reason == reason::NO_BACKUP_STORE)
    );
    let bad = cluster(json!({"spec": {"backup": {"store": {"s3": {"bucket": "Bad_Bucket"}}}}}));
    match step(&bad, &pending) {
        Step::Fail { reason, message, .. } => {
            assert_eq!(reason, reason::INVALID_STORE);
            assert!(message.contains("spec.backup.store.s3.bucket"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let deleting = cluster(json!({"metadata": {"deletionTimestamp": NOW}}));
    assert!(
        matches!(step(&deleting, &pending), Step::Fail { reason, .. } if reason == reason::CLUSTER_DELETING)
    );
}

#[test]
fn a_running_snapshot_found_by_a_reconcile_was_interrupted() {
    let c = cluster(json!({}));
    let running = |attempts: i32| {
        snapshot(
            "s1",
            "2026-11-24T10:00:00Z",
            json!({"phase": "Running", "attempts": attempts, "uploadID": "u"}),
        )
    };
    assert_eq!(
        step(
            &c,
            &[running(1), snapshot("s2", "2026-11-24T10:01:00Z", json!({}))]
        ),
        Step::Interrupted {
            snapshot: "s1".into(),
            retry: true
        }
    );
    assert_eq!(
        step(&c, &[running(MAX_ATTEMPTS)]),
        Step::Interrupted {
            snapshot: "s1".into(),
            retry: false
        }
    );
}

#[test]
fn retention_retires_the_oldest_beyond_keep_with_its_object() {
    let c = cluster(json!({"spec": {"backup": {"retention": {"keep": 2}}}}));
    let snapshots = [
        succeeded("s-b", "2026-11-24T09:00:00Z"),
        succeeded("s-a", "2026-11-24T08:00:00Z"),
        succeeded("s-c", "2026-11-24T10:00:00Z"),
        snapshot("f-1", "2026-11-24T07:00:00Z", json!({"phase": "Failed"})),
    ];
    match step(&c, &snapshots) {
        Step::Retire { snapshot, object } => {
            assert_eq!(snapshot, "s-a");
            let (store, key) = object.unwrap();
            assert_eq!((store.bucket.as_str(), key.as_str()), ("snaps", "k/s-a.db"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(step(&c, &snapshots[..2]), Step::Idle { requeue: None });
    let failures: Vec<EtcdadmSnapshot> = (0..3)
        .map(|i| {
            snapshot(
                &format!("f-{i}"),
                &format!("2026-11-24T0{i}:00:00Z"),
                json!({"phase": "Failed"}),
            )
        })
        .collect();
    assert_eq!(
        step(&c, &failures),
        Step::Retire {
            snapshot: "f-0".into(),
            object: None
        }
    );
}

#[test]
fn the_schedule_creates_one_snapshot_for_the_latest_time_missed() {
    let c = cluster(json!({"spec": {"backup": {"schedule": "*/5 * * * *"}}}));
    // Created at 08:00, nothing scheduled yet, now 10:07: one snapshot, for 10:05.
    let Step::Schedule { name, tick } = step(&c, &[]) else {
        panic!("{:?}", step(&c, &[]))
    };
    assert_eq!(tick.to_string(), "2026-11-24T10:05:00Z");
    assert_eq!(name, "c1-etcd-202611241005");
    // Once it exists (whatever its phase), the next one is due at 10:10.
    let mut made = succeeded(&name, "2026-11-24T10:06:00Z");
    made.metadata.annotations = Some([(SCHEDULED_FOR_ANNOTATION.to_string(), tick.to_string())].into());
    assert_eq!(
        step(&c, &[made.clone()]),
        Step::Idle {
            requeue: Some(Duration::from_secs(180))
        }
    );
    // While any snapshot is unfinished, none is added.
    let later = plan(&Observed {
        cluster: &c,
        snapshots: &[
            made,
            snapshot("manual", "2026-11-24T10:09:00Z", json!({"phase": "Pending"})),
        ],
        now: "2026-11-24T10:11:00Z".parse().unwrap(),
        referenced: &[],
        continuous_snapshot: None,
    });
    assert!(
        matches!(later, Step::Wait { .. } | Step::Take { .. }),
        "{later:?}"
    );
    // A cluster created after the last schedule time waits for the next one.
    let young = cluster(json!({"metadata": {"creationTimestamp": "2026-11-24T10:06:00Z"},
                               "spec": {"backup": {"schedule": "*/5 * * * *"}}}));
    assert_eq!(
        step(&young, &[]),
        Step::Idle {
            requeue: Some(Duration::from_secs(180))
        }
    );
    let broken = cluster(json!({"spec": {"backup": {"schedule": "61 * * * *"}}}));
    assert!(matches!(step(&broken, &[]), Step::InvalidSchedule { message } if message.contains("minute")));
}

#[test]
fn scheduled_names_fit_an_object_name() {
    let tick: Timestamp = "2026-01-02T03:04:00Z".parse().unwrap();
    assert_eq!(scheduled_name("c1-etcd", tick), "c1-etcd-202601020304");
    let long = "x".repeat(300);
    assert_eq!(scheduled_name(&long, tick).len(), 253);
}

#[test]
fn the_full_snapshot_continuous_backup_needs_comes_after_a_pending_one() {
    let c = cluster(json!({}));
    let observed = |snapshots: &[EtcdadmSnapshot]| {
        plan(&Observed {
            cluster: &c,
            snapshots,
            now: now(),
            referenced: &[],
            continuous_snapshot: Some("c1-etcd-continuous-20261124100700".into()),
        })
    };
    assert_eq!(
        observed(&[]),
        Step::ContinuousSnapshot {
            name: "c1-etcd-continuous-20261124100700".into()
        }
    );
    let pending = [snapshot("s1", "2026-11-24T10:00:00Z", json!({}))];
    assert!(
        matches!(observed(&pending), Step::Take { .. }),
        "{:?}",
        observed(&pending)
    );
}
