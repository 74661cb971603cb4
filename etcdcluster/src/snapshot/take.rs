//! Taking one snapshot of one member into the store, recorded on its EtcdadmSnapshot: the
//! upload is opened and written to the status (so a controller that dies mid-way leaves what the
//! next one must abort) before any data moves, then the stream goes into it and the outcome is
//! recorded. Quorum is never needed: the member answers from its own backend, so quorum-loss
//! recovery snapshots a survivor with this too.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, S3Store};
use etcdadm_shared::backup::{StoredSnapshot, stream_to_store};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::pki::CertificateAuthority;

use super::context::{Context, patch_params};
use super::observe::{CLIENT_COMMON_NAME, cluster_cas, store_client};
use super::plan::Target;
use super::status;
use etcdadm_shared::error::Error;

/// Lifetime of that certificate: one snapshot's worth.
const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(3600);
/// Deadline of the member's short calls (its revision, opening the stream).
const MEMBER_TIMEOUT: Duration = Duration::from_secs(10);

/// How a snapshot attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Succeeded(StoredSnapshot),
    /// `reason` is the cause (BucketMissing, AuthRefused, MemberUnreachable, HashMismatch, ...).
    Failed {
        reason: &'static str,
        message: String,
    },
    /// The controller is stopping: the upload was aborted, the snapshot is left Running for the
    /// next controller to retry.
    Stopped,
}

/// The object key of a snapshot: `<prefix><namespace>/<cluster>/<snapshot>.db`.
pub fn object_key(store: &S3Store, snapshot: &EtcdadmSnapshot) -> String {
    store.key(&format!(
        "{}/{}/{}.db",
        snapshot.namespace().unwrap_or_default(),
        snapshot.spec.cluster_name,
        snapshot.name_any()
    ))
}

/// Take `snapshot` of `cluster` from `target` into `store`, recording every transition on the
/// snapshot and publishing an Event for its start and its end. Errors are only failures to talk
/// to the Kubernetes API; everything else ends in the returned outcome (and in the status).
pub async fn take_snapshot(
    ctx: &Context,
    cluster: &EtcdadmCluster,
    snapshot: &EtcdadmSnapshot,
    target: &Target,
    store: &S3Store,
) -> Result<Outcome, Error> {
    let namespace = snapshot.namespace().unwrap_or_default();
    let outcome = attempt(ctx, cluster, snapshot, target, store, &namespace).await?;
    let api: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), &namespace);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The status as it is now: the attempt recorded Running in it.
    let current = api.get_opt(&snapshot.name_any()).await?;
    let Some(current) = current else {
        if let Outcome::Succeeded(_) = outcome {
            forget_object(ctx, store, snapshot, &namespace).await;
        }
        return Ok(outcome);
    };
    match &outcome {
        Outcome::Succeeded(stored) => {
            patch_status(&api, &current, status::succeeded(&current, stored, &now)).await?;
            info!(snapshot = %snapshot.name_any(), revision = stored.revision, size = stored.size, "snapshot stored");
            let note = format!(
                "stored {} bytes from member {} at revision {} (SHA-256 {})",
                stored.size, target.member, stored.revision, stored.sha256
            );
            ctx.event(&current, false, status::SUCCEEDED, note).await;
        }
        Outcome::Failed { reason, message } => {
            patch_status(&api, &current, status::failed(&current, reason, message, &now)).await?;
            warn!(snapshot = %snapshot.name_any(), reason, %message, "snapshot failed");
            ctx.event(&current, true, reason, message.clone()).await;
        }
        Outcome::Stopped => {}
    }
    Ok(outcome)
}

async fn attempt(
    ctx: &Context,
    cluster: &EtcdadmCluster,
    snapshot: &EtcdadmSnapshot,
    target: &Target,
    store: &S3Store,
    namespace: &str,
) -> Result<Outcome, Error> {
    let failed = |reason: &'static str, message: String| Ok(Outcome::Failed { reason, message });
    let store_client = match store_client(&ctx.client, namespace, store, ctx.store_request_deadline).await? {
        Ok(client) => client,
        Err(e) => return failed(e.category().as_str(), e.to_string()),
    };
    if let Err(e) = store_client.check_bucket().await {
        return failed(e.category().as_str(), e.to_string());
    }
    let cas = match cluster_cas(&ctx.client, cluster).await? {
        Ok(cas) => cas,
        Err(problem) => return failed("CAUnavailable", problem),
    };
    let cas: Vec<&CertificateAuthority> = cas.iter().collect();
    let member = EtcdTls::issued_by_each(&cas, CLIENT_COMMON_NAME, CLIENT_CERT_VALIDITY)
        .map_err(|e| e.to_string())
        .and_then(|tls| {
            MemberClient::with_config(&target.client_url, tls, MEMBER_TIMEOUT).map_err(|e| e.to_string())
        });
    let member = match member {
        Ok(member) => member,
        Err(problem) => return failed("MemberUnreachable", problem),
    };
    let key = object_key(store, snapshot);
    let upload_id = match store_client.create_multipart_upload(&key).await {
        Ok(id) => id,
        Err(e) => return failed(e.category().as_str(), e.to_string()),
    };
    let location = store_client.location(&key);
    let api: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), namespace);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let running = status::running(snapshot, target, store, &location, &upload_id, &now);
    if let Err(e) = patch_status(&api, snapshot, running).await {
        let _ = store_client.abort_multipart_upload(&key, &upload_id).await;
        return Err(e);
    }
    let note = format!(
        "taking the snapshot from member {} into {location}",
        target.member
    );
    ctx.event(snapshot, false, status::RUNNING, note).await;

    let streamed = stream_to_store(&member, &store_client, &key, &upload_id, ctx.stream_limits);
    let stopping = async {
        match &ctx.shutdown {
            Some(shutdown) => shutdown.clone().wait().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = streamed => Ok(match result {
            Ok(stored) => Outcome::Succeeded(stored),
            Err(e) => Outcome::Failed { reason: e.category(), message: e.to_string() },
        }),
        () = stopping => {
            let _ = store_client.abort_multipart_upload(&key, &upload_id).await;
            info!(snapshot = %snapshot.name_any(), "controller stopping: snapshot upload aborted, left for the next one");
            Ok(Outcome::Stopped)
        }
    }
}

/// The snapshot was deleted while it was taken: its object would be found by nobody.
async fn forget_object(ctx: &Context, store: &S3Store, snapshot: &EtcdadmSnapshot, namespace: &str) {
    let key = object_key(store, snapshot);
    let deleted = match store_client(&ctx.client, namespace, store, ctx.store_request_deadline).await {
        Ok(Ok(client)) => client.delete_object(&key).await.map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = deleted {
        warn!(snapshot = %snapshot.name_any(), key, error = %e, "the snapshot was deleted while taken; deleting its object failed");
    }
}

/// Merge-patch the status, guarded by the resourceVersion it was computed from.
pub async fn patch_status(
    api: &Api<EtcdadmSnapshot>,
    snapshot: &EtcdadmSnapshot,
    mut patch: serde_json::Value,
) -> Result<(), Error> {
    if let Some(version) = snapshot.meta().resource_version.clone() {
        patch["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    api.patch_status(&snapshot.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
