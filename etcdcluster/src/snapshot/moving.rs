//! What `clusterctl move` must carry for snapshots to work in the target management cluster
//! (docs/capi.md, "clusterctl move"): it copies objects without their status, and only the
//! objects an owner reference or a label ties to the Cluster. So a finished snapshot's status is
//! also kept in an annotation of its own (a copy without status gets it back from there, instead
//! of being taken again, even before its cluster is there), and the Secrets the cluster's store
//! names carry clusterctl's move label. (Snapshots themselves move because their CRD carries
//! that label: nothing owns a snapshot.)

use kube::ResourceExt;
use serde_json::Value;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, EtcdadmSnapshotStatus};

/// Annotation of a finished snapshot: its status as JSON (without the upload of an attempt).
pub const RECORD_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/snapshot-record";
/// clusterctl's label for objects to move with the namespace whatever owns them.
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// A step that keeps snapshots movable.
#[derive(Clone, Debug, PartialEq)]
pub enum MoveStep {
    /// Keep `record`, the finished status, on the snapshot.
    Record { snapshot: String, record: String },
    /// A copy without status (made by `clusterctl move`): its status back from its record.
    Reinstate { snapshot: String, status: Value },
    /// Label the store's Secret `secret` for clusterctl move.
    LabelSecret { secret: String },
}

/// The record of `snapshot`'s status, when it is finished.
pub fn record(snapshot: &EtcdadmSnapshot) -> Option<String> {
    let status = snapshot
        .status
        .as_ref()
        .filter(|_| snapshot.phase().is_finished())?;
    let kept = EtcdadmSnapshotStatus {
        upload_id: None,
        ..status.clone()
    };
    serde_json::to_string(&kept).ok()
}

/// The status a copy without status gets back from its record, when the record parses and
/// says the snapshot finished (anything else is no record: the copy is taken as new).
fn reinstated(snapshot: &EtcdadmSnapshot) -> Option<Value> {
    if snapshot.status.as_ref().is_some_and(|s| s.phase.is_some()) {
        return None;
    }
    let text = snapshot.annotations().get(RECORD_ANNOTATION)?;
    let status: EtcdadmSnapshotStatus = serde_json::from_str(text).ok()?;
    status
        .phase
        .is_some_and(|p| p.is_finished())
        .then(|| serde_json::to_value(&status).ok())
        .flatten()
}

/// The status back for a copy without status that has a record, whatever its cluster.
pub fn reinstate(snapshot: &EtcdadmSnapshot) -> Option<MoveStep> {
    reinstated(snapshot).map(|status| MoveStep::Reinstate {
        snapshot: snapshot.name_any(),
        status,
    })
}

/// The next step for the snapshots of `cluster` (as just read), if one is due. Records and
/// reinstated statuses first; the store's Secrets are labelled only while the cluster is not
/// paused (a paused cluster's objects are not written).
pub fn next(
    cluster: &EtcdadmCluster,
    snapshots: &[EtcdadmSnapshot],
    paused: bool,
    unlabelled: &[String],
) -> Option<MoveStep> {
    for snapshot in snapshots {
        if let Some(step) = reinstate(snapshot) {
            return Some(step);
        }
        if let Some(record) = record(snapshot)
            && snapshot.annotations().get(RECORD_ANNOTATION) != Some(&record)
            && !paused
        {
            return Some(MoveStep::Record {
                snapshot: snapshot.name_any(),
                record,
            });
        }
    }
    if paused || cluster.metadata.deletion_timestamp.is_some() {
        return None;
    }
    unlabelled.first().map(|secret| MoveStep::LabelSecret {
        secret: secret.clone(),
    })
}

/// The Secrets `spec.backup.store` of `cluster` names (credentials, CA).
pub fn store_secrets(cluster: &EtcdadmCluster) -> Vec<String> {
    let Some(s3) = cluster.spec.backup.as_ref().map(|b| &b.store.s3) else {
        return vec![];
    };
    [Some(&s3.credentials_secret_ref), s3.ca_secret_ref.as_ref()]
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .filter(|name| !name.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use etcdadm_shared::api::snapshot::EtcdadmSnapshotSpec;
    use serde_json::json;

    use super::*;

    fn snapshot(status: Value, annotations: Value) -> EtcdadmSnapshot {
        serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
            "metadata": {"name": "s1", "namespace": "ns", "annotations": annotations},
            "spec": EtcdadmSnapshotSpec {cluster_name: "c1-etcd".into(), member: None},
            "status": status,
        }))
        .unwrap()
    }

    fn cluster() -> EtcdadmCluster {
        serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "ns"},
            "spec": {"replicas": 3, "infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"},
                     "etcdadmConfigSpec": {},
                     "backup": {"store": {"s3": {"endpoint": "https://s3.example", "bucket": "b",
                         "credentialsSecretRef": {"name": "s3-creds"}, "caSecretRef": {"name": "s3-ca"}}}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_finished_snapshot_keeps_its_status_in_a_record_and_a_copy_without_status_gets_it_back() {
        let finished = json!({"phase": "Succeeded", "location": "b/ns/c1-etcd/s1.db", "sha256": "ab",
                              "revision": 42, "uploadID": "u1"});
        let taken = snapshot(finished.clone(), json!({}));
        let Some(MoveStep::Record { record, .. }) =
            next(&cluster(), std::slice::from_ref(&taken), false, &[])
        else {
            panic!("expected a record");
        };
        assert!(
            !record.contains("u1"),
            "the upload is no part of the record: {record}"
        );
        // Recorded: nothing more to do; not while paused either.
        let recorded = snapshot(finished, json!({RECORD_ANNOTATION: record.clone()}));
        assert_eq!(next(&cluster(), &[recorded], false, &[]), None);
        assert_eq!(next(&cluster(), &[taken], true, &[]), None);
        // clusterctl move's copy: the annotation without the status, reinstated even while the
        // target's Cluster is still paused (only status is written).
        let copy = snapshot(Value::Null, json!({RECORD_ANNOTATION: record}));
        let Some(MoveStep::Reinstate { status, .. }) = next(&cluster(), &[copy], true, &[]) else {
            panic!("expected the status back");
        };
        assert_eq!(status["phase"], "Succeeded");
        assert_eq!(status["revision"], 42);
        assert_eq!(status["location"], "b/ns/c1-etcd/s1.db");
        // A record that does not parse, or of an unfinished snapshot, is no record.
        for bad in ["{", r#"{"phase": "Running"}"#] {
            let copy = snapshot(Value::Null, json!({RECORD_ANNOTATION: bad}));
            assert_eq!(next(&cluster(), &[copy], false, &[]), None, "{bad}");
        }
    }

    #[test]
    fn the_stores_secrets_are_labelled_for_clusterctl_move_unless_paused() {
        assert_eq!(store_secrets(&cluster()), ["s3-creds", "s3-ca"]);
        let unlabelled = ["s3-ca".to_string()];
        assert_eq!(
            next(&cluster(), &[], false, &unlabelled),
            Some(MoveStep::LabelSecret {
                secret: "s3-ca".into()
            })
        );
        assert_eq!(next(&cluster(), &[], true, &unlabelled), None);
    }
}
