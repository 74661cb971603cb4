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
    /// The full snapshot continuous backup needs (`continuous::full_snapshot_wanted`).
    pub continuous_snapshot: Option<String>,
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
    /// Create the full snapshot continuous backup needs (none to follow, or deltas compacted).
    ContinuousSnapshot { name: String },
    /// `spec.backup.schedule` does not parse (admission refuses it; this object bypassed it).
    InvalidSchedule { message: String },
}

pub fn plan(o: &Observed) -> Step {
    // The rules in the order they win (interrupted, pending, retention, continuous, schedule): one list.
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

    if let Some(name) = o.continuous_snapshot.clone() {
        return Step::ContinuousSnapshot { name };
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
    named_after(cluster, &format!("-{}", tick.strftime("%Y%m%d%H%M")))
}

/// `<cluster><suffix>`, the cluster's name cut so the whole is a name of at most 253 characters.
pub fn named_after(cluster: &str, suffix: &str) -> String {
    let base: String = cluster.chars().take(253 - suffix.len()).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

/// Oldest first, ties by name.
fn age_key(s: &EtcdadmSnapshot) -> (Option<Timestamp>, String) {
    (s.metadata.creation_timestamp.as_ref().map(|t| t.0), s.name_any())
}

#[cfg(test)]
mod tests;
