//! The status patches of a snapshot's transitions, computed purely from its current status: JSON
//! merge patches, so fields a transition clears are sent as null.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use etcdadm_shared::api::conditions::{self, Condition, NewCondition, READY, Severity};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, S3Store, SnapshotPhase, SnapshotStore};
use etcdadm_shared::backup::StoredSnapshot;

use super::plan::Target;

/// Condition reasons of a snapshot's own progress.
pub const RUNNING: &str = "Running";
pub const SUCCEEDED: &str = "Succeeded";
pub const RETRYING: &str = "Retrying";

fn conditions_with(snapshot: &EtcdadmSnapshot, condition: NewCondition, now: &Time) -> Vec<Condition> {
    let mut list = snapshot
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions::set(&mut list, condition, snapshot.metadata.generation, now);
    list
}

fn patch(status: Value) -> Value {
    json!({ "status": status })
}

/// Still Pending, and why.
pub fn waiting(snapshot: &EtcdadmSnapshot, reason: &str, message: &str, now: &Time) -> Value {
    let condition = NewCondition::false_(READY, Severity::Info, reason, message);
    patch(json!({
        "phase": SnapshotPhase::Pending,
        "conditions": conditions_with(snapshot, condition, now),
    }))
}

/// Streaming from `target` into the upload `upload_id` of `location` (attempt `attempt`).
pub fn running(
    snapshot: &EtcdadmSnapshot,
    target: &Target,
    store: &S3Store,
    location: &str,
    upload_id: &str,
    now: &Time,
) -> Value {
    let attempt = snapshot.status.as_ref().and_then(|s| s.attempts).unwrap_or(0) + 1;
    let message = format!(
        "streaming member {} into {location} (attempt {attempt})",
        target.member
    );
    let condition = NewCondition::false_(READY, Severity::Info, RUNNING, message);
    patch(json!({
        "phase": SnapshotPhase::Running,
        "member": target.member,
        "etcdVersion": target.etcd_version,
        "store": SnapshotStore { s3: store.clone() },
        "location": location,
        "uploadID": upload_id,
        "attempts": attempt,
        "startTime": now,
        "completionTime": null,
        "conditions": conditions_with(snapshot, condition, now),
    }))
}

/// In the store and checked.
pub fn succeeded(snapshot: &EtcdadmSnapshot, stored: &StoredSnapshot, now: &Time) -> Value {
    let mut message = format!(
        "{} bytes, SHA-256 {}, revision {}",
        stored.size, stored.sha256, stored.revision
    );
    if !stored.revision_exact {
        message.push_str(" (at least: writes landed while the snapshot began)");
    }
    if !stored.sha256_in_metadata {
        message.push_str(
            "; the SHA-256 is not in the object's metadata: a restore naming only the store and \
             key computes it",
        );
    }
    let condition = NewCondition::true_(READY, SUCCEEDED).with_message(message);
    patch(json!({
        "phase": SnapshotPhase::Succeeded,
        "size": stored.size,
        "sha256": stored.sha256,
        "revision": stored.revision,
        "uploadID": null,
        "completionTime": now,
        "conditions": conditions_with(snapshot, condition, now),
    }))
}

/// Not taken, for `reason`.
pub fn failed(snapshot: &EtcdadmSnapshot, reason: &str, message: &str, now: &Time) -> Value {
    let condition = NewCondition::false_(READY, Severity::Error, reason, message);
    patch(json!({
        "phase": SnapshotPhase::Failed,
        "uploadID": null,
        "completionTime": now,
        "conditions": conditions_with(snapshot, condition, now),
    }))
}

/// Back to Pending after an interrupted attempt, its upload aborted.
pub fn retrying(snapshot: &EtcdadmSnapshot, message: &str, now: &Time) -> Value {
    let condition = NewCondition::false_(READY, Severity::Warning, RETRYING, message);
    patch(json!({
        "phase": SnapshotPhase::Pending,
        "uploadID": null,
        "conditions": conditions_with(snapshot, condition, now),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use etcdadm_shared::api::snapshot::EtcdadmSnapshotStatus;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    /// The snapshot after a merge patch of its status.
    fn applied(snapshot: &EtcdadmSnapshot, patch: &Value) -> EtcdadmSnapshot {
        let mut value = serde_json::to_value(snapshot).unwrap();
        json_patch::merge(&mut value, patch);
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_attempt_records_its_upload_and_the_outcome_clears_it() {
        let fresh = EtcdadmSnapshot::new("s1", Default::default());
        let target = Target {
            member: "m2".into(),
            client_url: "https://m2:2379".into(),
            etcd_version: Some("3.4.23".into()),
        };
        let store = S3Store {
            bucket: "snaps".into(),
            ..Default::default()
        };
        let running = applied(
            &fresh,
            &running(&fresh, &target, &store, "snaps/k.db", "u1", &at(10)),
        );
        let status: &EtcdadmSnapshotStatus = running.status.as_ref().unwrap();
        assert_eq!(status.phase, Some(SnapshotPhase::Running));
        assert_eq!(status.upload_id.as_deref(), Some("u1"));
        assert_eq!(status.attempts, Some(1));
        assert_eq!(status.member.as_deref(), Some("m2"));
        assert_eq!(status.store.as_ref().unwrap().s3.bucket, "snaps");

        let retried = applied(&running, &retrying(&running, "restarted", &at(20)));
        assert_eq!(retried.phase(), SnapshotPhase::Pending);
        assert_eq!(retried.status.as_ref().unwrap().upload_id, None);
        let again = applied(
            &retried,
            &super::running(&retried, &target, &store, "snaps/k.db", "u2", &at(30)),
        );
        assert_eq!(again.status.as_ref().unwrap().attempts, Some(2));

        let stored = StoredSnapshot {
            size: 4128,
            sha256: "ab".into(),
            database_sha256: "cd".into(),
            revision: 1001,
            revision_exact: false,
            sha256_in_metadata: false,
        };
        let done = applied(&again, &succeeded(&again, &stored, &at(40)));
        let status = done.status.as_ref().unwrap();
        assert_eq!(status.phase, Some(SnapshotPhase::Succeeded));
        assert_eq!((status.size, status.revision), (Some(4128), Some(1001)));
        assert_eq!(status.upload_id, None);
        assert_eq!(status.completion_time, Some(at(40)));
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert!(
            ready.message.as_deref().unwrap().contains("at least"),
            "{ready:?}"
        );

        let failed = applied(&again, &failed(&again, "HashMismatch", "bad", &at(50)));
        let ready = conditions::find(&failed.status.as_ref().unwrap().conditions, READY).unwrap();
        assert_eq!(failed.phase(), SnapshotPhase::Failed);
        assert_eq!(ready.reason.as_deref(), Some("HashMismatch"));
        assert_eq!(ready.severity.as_deref(), Some("Error"));
    }
}
