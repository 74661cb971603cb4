//! What the snapshot controller does next for one EtcdadmCluster, decided purely from the cluster
//! and its snapshots as just read. One step at a time, in this order: interrupted attempts are
//! cleaned up, the oldest Pending snapshot is taken (or failed, or told what it waits for),
//! retention removes what it keeps no longer (`retention`), and the schedule creates the next
//! snapshot.
//!
//! "No snapshot during a membership change" is read from what the EtcdadmCluster controller
//! records (see [`membership_change`]); "one in flight per cluster" holds because one reconcile
//! per cluster runs at a time and takes a snapshot within it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::cluster::condition::{PAUSED, RESIZE_COMPLETED};
use etcdadm_shared::api::conditions::{self, ConditionStatus, READY};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, S3Store, SnapshotPhase};
use etcdadm_shared::api::{EtcdadmCluster, MemberStatus};
use etcdadm_shared::cron::Schedule;
use etcdadm_shared::manager::reconcile::WAIT_REQUEUE;
use etcdadm_shared::names;
use etcdadm_shared::validation::validate_store;

/// Annotation of a scheduled snapshot: the schedule time it was created for (RFC 3339).
pub const SCHEDULED_FOR_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/scheduled-for";
/// Attempts of one snapshot before a controller restart during each of them fails it.
pub const MAX_ATTEMPTS: i32 = 3;

/// Condition and Event reasons of the plan's own decisions.
pub mod reason {
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const CLUSTER_DELETING: &str = "ClusterDeleting";
    pub const NO_BACKUP_STORE: &str = "NoBackupStore";
    pub const INVALID_STORE: &str = "InvalidStore";
    pub const PAUSED: &str = "Paused";
    pub const MEMBERSHIP_CHANGING: &str = "WaitingForMembershipChange";
    pub const NO_HEALTHY_MEMBER: &str = "WaitingForHealthyMember";
    pub const MEMBER_NOT_FOUND: &str = "MemberNotFound";
    pub const TOO_MANY_ATTEMPTS: &str = "TooManyAttempts";
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    pub const WAITING_FOR_SLOT: &str = "WaitingForSnapshotSlot";
}

/// The cluster and its snapshots, at `now`, and the snapshots a restore or recovery of any
/// cluster in the namespace names (retention keeps those).
pub struct Observed<'a> {
    pub cluster: &'a EtcdadmCluster,
    pub snapshots: &'a [EtcdadmSnapshot],
    pub now: Timestamp,
    pub referenced: &'a [String],
}

/// The member a snapshot is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Member (Machine) name.
    pub member: String,
    pub client_url: String,
    pub etcd_version: Option<String>,
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing now; look again after `requeue` (the next schedule time, or a waiting snapshot).
    Idle { requeue: Option<Duration> },
    /// A Running snapshot no reconcile is taking: the controller stopped during it. Abort its
    /// upload, then run it again (`retry`) or fail it.
    Interrupted { snapshot: String, retry: bool },
    /// The snapshot cannot be taken, for a reason an operator must fix.
    Fail {
        snapshot: String,
        reason: &'static str,
        message: String,
    },
    /// The oldest Pending snapshot waits; say why on it.
    Wait {
        snapshot: String,
        reason: &'static str,
        message: String,
    },
    /// Take the snapshot from `target` into `store`.
    Take {
        snapshot: String,
        target: Target,
        store: S3Store,
    },
    /// Delete a snapshot beyond retention, and its object (`store`, key) when it has one.
    Retire {
        snapshot: String,
        object: Option<(S3Store, String)>,
    },
    /// Create the snapshot the schedule asks for at `tick`.
    Schedule { name: String, tick: Timestamp },
    /// `spec.backup.schedule` does not parse (admission refuses it; this object bypassed it).
    InvalidSchedule { message: String },
}

pub fn plan(o: &Observed) -> Step {
    let cluster = o.cluster;
    let mut unfinished: Vec<&EtcdadmSnapshot> =
        o.snapshots.iter().filter(|s| !s.phase().is_finished()).collect();
    unfinished.sort_by_key(|s| age_key(s));

    if let Some(running) = unfinished.iter().find(|s| s.phase() == SnapshotPhase::Running) {
        let attempts = running.status.as_ref().and_then(|s| s.attempts).unwrap_or(1);
        return Step::Interrupted {
            snapshot: running.name_any(),
            retry: attempts < MAX_ATTEMPTS,
        };
    }

    let mut waiting = false;
    if let Some(head) = unfinished.first() {
        let snapshot = head.name_any();
        match next_for_pending(cluster, head) {
            Pending::Take { target, store } => {
                return Step::Take {
                    snapshot,
                    target,
                    store: *store,
                };
            }
            Pending::Fail(reason, message) => {
                return Step::Fail {
                    snapshot,
                    reason,
                    message,
                };
            }
            Pending::Wait(reason, message) => {
                if !says(head, reason, &message) {
                    return Step::Wait {
                        snapshot,
                        reason,
                        message,
                    };
                }
                waiting = true;
            }
        }
    }

    if let Some(old) = super::retention::doomed(cluster, o.snapshots, o.now, o.referenced) {
        return Step::Retire {
            snapshot: old.name_any(),
            object: (old.phase() == SnapshotPhase::Succeeded)
                .then(|| object_of(old))
                .flatten(),
        };
    }

    let mut requeue = waiting.then_some(WAIT_REQUEUE);
    if let Some(expression) = cluster.spec.backup.as_ref().and_then(|b| b.schedule.as_deref()) {
        let schedule = match Schedule::parse(expression) {
            Ok(schedule) => schedule,
            Err(e) => {
                return Step::InvalidSchedule {
                    message: format!("spec.backup.schedule: {e}"),
                };
            }
        };
        if unfinished.is_empty()
            && cluster.metadata.deletion_timestamp.is_none()
            && let Some(tick) = due_tick(o, &schedule)
        {
            return Step::Schedule {
                name: scheduled_name(&cluster.name_any(), tick),
                tick,
            };
        }
        if let Some(next) = schedule.next_after(o.now) {
            let until = o.now.duration_until(next).unsigned_abs();
            requeue = Some(requeue.map_or(until, |r| r.min(until)));
        }
    }
    Step::Idle { requeue }
}

enum Pending {
    Take { target: Target, store: Box<S3Store> },
    Fail(&'static str, String),
    Wait(&'static str, String),
}

/// What the oldest Pending snapshot of `cluster` gets.
fn next_for_pending(cluster: &EtcdadmCluster, snapshot: &EtcdadmSnapshot) -> Pending {
    let name = cluster.name_any();
    if cluster.metadata.deletion_timestamp.is_some() {
        return Pending::Fail(
            reason::CLUSTER_DELETING,
            format!("EtcdadmCluster {name} is being deleted"),
        );
    }
    let Some(backup) = &cluster.spec.backup else {
        return Pending::Fail(
            reason::NO_BACKUP_STORE,
            format!(
                "EtcdadmCluster {name} has no spec.backup.store: set one, then create the snapshot again"
            ),
        );
    };
    let problems = validate_store(&backup.store.s3, "spec.backup.store.s3");
    if !problems.is_empty() {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Pending::Fail(
            reason::INVALID_STORE,
            format!("EtcdadmCluster {name}: {}", listed.join("; ")),
        );
    }
    if is_paused(cluster) {
        return Pending::Wait(
            reason::PAUSED,
            format!("EtcdadmCluster {name} or its Cluster is paused"),
        );
    }
    if let Some(machine) = &snapshot.spec.member {
        return match named_member(cluster, machine) {
            Some(target) => Pending::Take {
                target,
                store: Box::new(backup.store.s3.clone()),
            },
            None => Pending::Fail(
                reason::MEMBER_NOT_FOUND,
                format!(
                    "spec.member: EtcdadmCluster {name} records no member with a client URL for Machine {machine}"
                ),
            ),
        };
    }
    // A before-change snapshot is made while no membership change is in flight, and the change
    // it precedes waits for it: the resize that change is (ResizeCompleted False) is not waited
    // for, joining members still are.
    let before_change = snapshot.labels().contains_key(names::SNAPSHOT_REASON_LABEL);
    if let Some(change) = membership_change(cluster, before_change) {
        return Pending::Wait(reason::MEMBERSHIP_CHANGING, change);
    }
    match pick_member(cluster) {
        Some(target) => Pending::Take {
            target,
            store: Box::new(backup.store.s3.clone()),
        },
        None => Pending::Wait(
            reason::NO_HEALTHY_MEMBER,
            format!("EtcdadmCluster {name} has no healthy voting member to read the snapshot from"),
        ),
    }
}

pub fn is_paused(cluster: &EtcdadmCluster) -> bool {
    cluster.annotations().contains_key(names::PAUSED_ANNOTATION)
        || cluster
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, PAUSED))
}

/// Why a membership change may be under way, from the EtcdadmCluster's status; `None` when the
/// membership is settled. The EtcdadmCluster controller adds and removes members only through
/// Machines it creates and deletes, and records both in its status, so the membership is settled
/// when that status is of the current spec, `ResizeCompleted` is True (as many Machines as
/// replicas, none being deleted) and every member entry is a started voting member with a
/// Machine that has been healthy (a joining member has never been). A member that was healthy
/// and is down is no change: a snapshot from another member is exactly what is wanted then.
pub fn membership_change(cluster: &EtcdadmCluster, resizing_allowed: bool) -> Option<String> {
    let Some(status) = &cluster.status else {
        return Some("the EtcdadmCluster has no status yet".into());
    };
    if status.observed_generation != cluster.metadata.generation {
        return Some(format!(
            "the EtcdadmCluster controller has not acted on generation {} yet",
            cluster.metadata.generation.unwrap_or_default()
        ));
    }
    match conditions::find(&status.conditions, RESIZE_COMPLETED) {
        Some(c) if c.status == ConditionStatus::True || resizing_allowed => {}
        Some(c) => {
            return Some(format!(
                "{RESIZE_COMPLETED} is {:?} ({}): {}",
                c.status,
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default()
            ));
        }
        None => {
            return Some(format!(
                "the EtcdadmCluster has no {RESIZE_COMPLETED} condition yet"
            ));
        }
    }
    status.members.iter().find_map(|m| {
        if m.is_learner {
            Some(format!("member {} is a learner", m.name))
        } else if m.machine_ref.is_none() {
            Some(format!(
                "member {} runs on no Machine and is to be removed",
                m.name
            ))
        } else if m.member_id.is_none() {
            Some(format!("Machine {} is not an etcd member yet", m.name))
        } else if m.last_healthy_time.is_none() {
            Some(format!("member {} is joining (never healthy yet)", m.name))
        } else {
            None
        }
    })
}

/// The member of Machine `machine`, healthy or not: a survivor of a lost quorum answers a
/// snapshot from its own backend.
fn named_member(cluster: &EtcdadmCluster, machine: &str) -> Option<Target> {
    let members = cluster.status.as_ref().map(|s| s.members.as_slice())?;
    members
        .iter()
        .find(|m| m.machine_ref.as_ref().is_some_and(|r| r.name == machine))
        .and_then(|m| {
            Some(Target {
                member: m.name.clone(),
                client_url: m.client_url.clone()?,
                etcd_version: m.etcd_version.clone(),
            })
        })
}

/// A healthy voting member with a Machine, a follower when there is one (the leader is busiest),
/// by name among equals.
pub fn pick_member(cluster: &EtcdadmCluster) -> Option<Target> {
    let members = cluster.status.as_ref().map(|s| s.members.as_slice())?;
    let mut candidates: Vec<&MemberStatus> = members
        .iter()
        .filter(|m| m.healthy && !m.is_learner && m.machine_ref.is_some() && m.client_url.is_some())
        .collect();
    candidates.sort_by_key(|m| (m.is_leader, m.name.clone()));
    candidates.first().map(|m| Target {
        member: m.name.clone(),
        client_url: m.client_url.clone().unwrap_or_default(),
        etcd_version: m.etcd_version.clone(),
    })
}

/// Whether the snapshot's Ready condition already says this.
pub fn says(snapshot: &EtcdadmSnapshot, reason: &str, message: &str) -> bool {
    snapshot
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, READY))
        .is_some_and(|c| c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(message))
}

/// The store and key of a snapshot's object, from its status.
pub fn object_of(snapshot: &EtcdadmSnapshot) -> Option<(S3Store, String)> {
    let status = snapshot.status.as_ref()?;
    let store = status.store.as_ref()?.s3.clone();
    let key = status
        .location
        .as_deref()?
        .strip_prefix(&format!("{}/", store.bucket))?
        .to_string();
    Some((store, key))
}

/// The latest schedule time that has passed and has no snapshot yet: after the newest scheduled
/// snapshot's time, or after the cluster's creation when there is none. Times missed while the
/// controller was away collapse into one snapshot.
fn due_tick(o: &Observed, schedule: &Schedule) -> Option<Timestamp> {
    let newest_scheduled = o
        .snapshots
        .iter()
        .filter_map(|s| s.annotations().get(SCHEDULED_FOR_ANNOTATION))
        .filter_map(|t| t.parse::<Timestamp>().ok())
        .max();
    let since = newest_scheduled
        .or_else(|| o.cluster.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(o.now);
    schedule.last_at_or_before(o.now).filter(|tick| *tick > since)
}

/// `<cluster>-<yyyymmddhhmm>`: one name per schedule time, so creating it twice is harmless.
pub fn scheduled_name(cluster: &str, tick: Timestamp) -> String {
    let stamp = tick.strftime("%Y%m%d%H%M").to_string();
    let room = 253 - stamp.len() - 1;
    let base: String = cluster.chars().take(room).collect();
    format!("{}-{stamp}", base.trim_end_matches(['-', '.']))
}

/// Oldest first, ties by name.
fn age_key(s: &EtcdadmSnapshot) -> (Option<Timestamp>, String) {
    (s.metadata.creation_timestamp.as_ref().map(|t| t.0), s.name_any())
}

#[cfg(test)]
mod tests {
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
        let c =
            cluster(json!({"status": {"members": [merged(member("m1", true), json!({"healthy": false}))]}}));
        assert!(
            matches!(step(&c, &[pending]), Step::Wait { reason, .. } if reason == reason::NO_HEALTHY_MEMBER)
        );
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
        assert!(
            matches!(step(&broken, &[]), Step::InvalidSchedule { message } if message.contains("minute"))
        );
    }

    #[test]
    fn scheduled_names_fit_an_object_name() {
        let tick: Timestamp = "2026-01-02T03:04:00Z".parse().unwrap();
        assert_eq!(scheduled_name("c1-etcd", tick), "c1-etcd-202601020304");
        let long = "x".repeat(300);
        assert_eq!(scheduled_name(&long, tick).len(), 253);
    }
}
