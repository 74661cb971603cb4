//! The writes of one planned step. Each is safe to repeat: a scheduled snapshot has one name per
//! schedule time, deleting an object or a snapshot that is gone succeeds, aborting an upload that
//! is gone succeeds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use tracing::info;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, EtcdadmSnapshotSpec, S3Store};

use super::context::{Context, FIELD_MANAGER, patch_params};
use super::continuous::FOR_CONTINUOUS_ANNOTATION;
use super::moving::{MOVE_LABEL, MoveStep, RECORD_ANNOTATION};
use super::observe::store_client;
use super::plan::{MAX_ATTEMPTS, SCHEDULED_FOR_ANNOTATION, reason};
use super::status;
use super::take::patch_status;
use etcdadm_shared::error::Error;

fn now() -> Time {
    Time(Timestamp::now())
}

/// Record why the snapshot waits.
pub async fn wait(
    ctx: &Context,
    snapshot: &EtcdadmSnapshot,
    why: &'static str,
    message: &str,
) -> Result<(), Error> {
    let api = snapshots(ctx, snapshot);
    patch_status(&api, snapshot, status::waiting(snapshot, why, message, &now())).await
}

/// Fail the snapshot for `why`, with a Warning Event naming it.
pub async fn fail(
    ctx: &Context,
    snapshot: &EtcdadmSnapshot,
    why: &'static str,
    message: &str,
) -> Result<(), Error> {
    let api = snapshots(ctx, snapshot);
    patch_status(&api, snapshot, status::failed(snapshot, why, message, &now())).await?;
    ctx.event(snapshot, true, why, message.to_string()).await;
    Ok(())
}

/// A controller stopped during `snapshot`: abort its upload, then retry it or give up.
pub async fn interrupted(ctx: &Context, snapshot: &EtcdadmSnapshot, retry: bool) -> Result<(), Error> {
    let attempts = snapshot.status.as_ref().and_then(|s| s.attempts).unwrap_or(1);
    let aborted = abort_upload(ctx, snapshot).await?;
    let api = snapshots(ctx, snapshot);
    if retry {
        let message = format!(
            "the controller stopped during attempt {attempts} of {MAX_ATTEMPTS}; {aborted}; trying again"
        );
        patch_status(&api, snapshot, status::retrying(snapshot, &message, &now())).await?;
        ctx.event(snapshot, true, status::RETRYING, message).await;
    } else {
        let message = format!(
            "the controller stopped during each of {attempts} attempts; {aborted}; create a new \
             EtcdadmSnapshot to try again"
        );
        fail(ctx, snapshot, reason::TOO_MANY_ATTEMPTS, &message).await?;
    }
    Ok(())
}

/// Abort the upload a Running snapshot recorded; what happened, for the condition.
async fn abort_upload(ctx: &Context, snapshot: &EtcdadmSnapshot) -> Result<String, Error> {
    let status = snapshot.status.clone().unwrap_or_default();
    let (Some(store), Some(upload_id), Some((_, key))) = (
        status.store.as_ref(),
        status.upload_id.as_deref(),
        super::plan::object_of(snapshot),
    ) else {
        return Ok("it had no upload to abort".into());
    };
    let namespace = snapshot.namespace().unwrap_or_default();
    match store_client(&ctx.client, &namespace, &store.s3, ctx.store_request_deadline).await? {
        Ok(client) => {
            client.abort_multipart_upload(&key, upload_id).await?;
            Ok(format!("its upload of {key} was aborted"))
        }
        // Without credentials nothing can be aborted; a store's lifecycle rule will drop it.
        Err(e) => Ok(format!("its upload of {key} could not be aborted ({e})")),
    }
}

/// A new EtcdadmSnapshot `name` of `cluster` (labelled with its Cluster, like the cluster), read
/// from the member of Machine `member` when given.
pub fn new_snapshot(cluster: &EtcdadmCluster, name: &str, member: Option<&str>) -> EtcdadmSnapshot {
    EtcdadmSnapshot {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: cluster.namespace(),
            labels: cluster
                .labels()
                .get(etcdadm_shared::names::CLUSTER_NAME_LABEL)
                .map(|c| [(etcdadm_shared::names::CLUSTER_NAME_LABEL.to_string(), c.clone())].into()),
            ..Default::default()
        },
        spec: EtcdadmSnapshotSpec {
            cluster_name: cluster.name_any(),
            member: member.map(str::to_string),
        },
        status: None,
    }
}

/// Create the snapshot the schedule asks for at `tick` (an existing one of that name is it).
pub async fn schedule(
    ctx: &Context,
    cluster: &EtcdadmCluster,
    name: &str,
    tick: Timestamp,
) -> Result<(), Error> {
    let note = format!("created EtcdadmSnapshot {name} for the schedule time {tick}");
    create(
        ctx,
        cluster,
        name,
        (SCHEDULED_FOR_ANNOTATION, tick.to_string()),
        "SnapshotScheduled",
        note,
    )
    .await
}

/// Delete a snapshot retention keeps no longer: its deltas and object first, so a crash in between leaves the
/// snapshot to be retired again rather than an object nobody knows of.
pub async fn retire(
    ctx: &Context,
    cluster: &EtcdadmCluster,
    snapshot: &str,
    object: Option<&(S3Store, String)>,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    if let Some((store, key)) = object {
        let client = store_client(&ctx.client, &namespace, store, ctx.store_request_deadline)
            .await?
            .map_err(Error::Store)?;
        // Its deltas first: a controller stopped half-way leaves the snapshot to retire again.
        let deltas = client
            .list(&etcdadm_shared::backup::delta::prefix(key))
            .await
            .map_err(Error::Store)?;
        for delta in &deltas {
            client.delete_object(&delta.key).await.map_err(Error::Store)?;
        }
        client.delete_object(key).await.map_err(Error::Store)?;
    }
    let api: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.delete(snapshot, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let note = match object {
        Some((store, key)) => format!(
            "deleted EtcdadmSnapshot {snapshot}, its object {}/{key} and its deltas (retention keeps it no longer)",
            store.bucket
        ),
        None => format!("deleted EtcdadmSnapshot {snapshot} (retention keeps it no longer)"),
    };
    ctx.event(cluster, false, "SnapshotRetired", note).await;
    Ok(())
}

/// Create the full snapshot continuous backup needs (an existing one of that name is it).
pub async fn continuous_snapshot(ctx: &Context, cluster: &EtcdadmCluster, name: &str) -> Result<(), Error> {
    let note = format!("created EtcdadmSnapshot {name}: continuous backup follows a full snapshot");
    let annotation = (FOR_CONTINUOUS_ANNOTATION, Timestamp::now().to_string());
    create(
        ctx,
        cluster,
        name,
        annotation,
        "SnapshotForContinuousBackup",
        note,
    )
    .await
}

/// Create snapshot `name` of `cluster` with `annotation`, saying `note` (an existing one of that
/// name is it: creating twice is harmless).
async fn create(
    ctx: &Context,
    cluster: &EtcdadmCluster,
    name: &str,
    annotation: (&str, String),
    reason: &'static str,
    note: String,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut snapshot = new_snapshot(cluster, name, None);
    snapshot.metadata.annotations = Some([(annotation.0.to_string(), annotation.1)].into());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &snapshot).await {
        Ok(_) => {
            info!(etcdcluster = %cluster.name_any(), snapshot = name, reason, "snapshot created");
            ctx.event(cluster, false, reason, note).await;
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `spec.backup.schedule` does not parse: say so on the cluster.
pub async fn invalid_schedule(ctx: &Context, cluster: &EtcdadmCluster, message: &str) {
    ctx.event(cluster, true, reason::INVALID_SCHEDULE, message.to_string())
        .await;
}

/// Keep a snapshot movable: its record, its status back from its record, a store Secret
/// labelled for clusterctl move.
pub async fn moving(ctx: &Context, namespace: &str, step: &MoveStep) -> Result<(), Error> {
    let snapshots: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), namespace);
    let params = patch_params();
    match step {
        MoveStep::Record { snapshot, record } => {
            let patch = serde_json::json!({"metadata": {"annotations": {RECORD_ANNOTATION: record}}});
            snapshots.patch(snapshot, &params, &Patch::Merge(&patch)).await?;
        }
        MoveStep::Reinstate { snapshot, status } => {
            let patch = serde_json::json!({ "status": status });
            snapshots
                .patch_status(snapshot, &params, &Patch::Merge(&patch))
                .await?;
            info!(
                snapshot,
                "status reinstated from its record (a copy clusterctl move made)"
            );
        }
        MoveStep::LabelSecret { secret } => {
            let secrets: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(ctx.client.clone(), namespace);
            let patch = serde_json::json!({"metadata": {"labels": {MOVE_LABEL: ""}}});
            secrets.patch(secret, &params, &Patch::Merge(&patch)).await?;
        }
    }
    Ok(())
}

fn snapshots(ctx: &Context, snapshot: &EtcdadmSnapshot) -> Api<EtcdadmSnapshot> {
    Api::namespaced(ctx.client.clone(), &snapshot.namespace().unwrap_or_default())
}
