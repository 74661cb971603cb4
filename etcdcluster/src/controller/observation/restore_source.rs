//! Reading what a first member is restored from (`spec.restore`, or the snapshot of a recovery
//! in its `Restoring` phase): the EtcdadmSnapshot or store object, whether it can be restored
//! from (Succeeded, in a store this controller can reach), and the restore Secret; and whether a
//! recovery's snapshot can be.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Client, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::RecoveryPhase;
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, RestoreSource, S3Store, SnapshotPhase};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::store::StoreClient;

use super::views::{RestoreDownload, RestoreView, SnapshotCheck};
use crate::snapshot::{snapshots_of, store_access};

/// `spec.restore` as read: the plan's view (with the download when the source is usable; its
/// Secret's age is filled in when the observation is assembled), and when the restore Secret's
/// URL was written.
#[derive(Clone, Debug)]
pub struct RestoreObservation {
    pub view: RestoreView,
    pub secret_written: Option<Timestamp>,
}

/// Whether the EtcdadmSnapshot `name` can be restored from, and the etcd version it holds.
pub async fn snapshot_check(client: &Client, namespace: &str, name: &str) -> Result<SnapshotCheck, Error> {
    let source = RestoreSource {
        name: Some(name.to_string()),
        ..Default::default()
    };
    let mut view = RestoreView::default();
    let problem = match resolve(client, namespace, &source, &mut view).await? {
        Ok(source) => reach(client, namespace, &source.store).await?.err(),
        Err(problem) => Some(problem),
    };
    Ok(SnapshotCheck {
        name: name.to_string(),
        problem,
        etcd_version: view.etcd_version,
    })
}

/// The newest Succeeded EtcdadmSnapshot of the EtcdadmCluster `cluster`, checked.
pub async fn newest_snapshot(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> Result<Option<SnapshotCheck>, Error> {
    let newest = snapshots_of(client, namespace, cluster)
        .await?
        .into_iter()
        .filter(|s| s.phase() == SnapshotPhase::Succeeded)
        .max_by_key(|s| {
            let status = s.status.clone().unwrap_or_default();
            (status.completion_time.map(|t| t.0), s.name_any())
        });
    match newest {
        Some(snapshot) => Ok(Some(
            snapshot_check(client, namespace, &snapshot.name_any()).await?,
        )),
        None => Ok(None),
    }
}

/// The object a source names: its store, key and what an EtcdadmSnapshot says of it.
struct Source {
    store: S3Store,
    key: String,
    sha256: Option<String>,
}

/// Read `spec.restore` of `etcd`, if set.
pub async fn observe(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<Option<RestoreObservation>, Error> {
    let status = etcd.status.clone().unwrap_or_default();
    let recovering = status
        .recovery
        .filter(|r| r.phase == RecoveryPhase::Restoring)
        .map(|r| RestoreSource {
            name: Some(r.snapshot),
            ..Default::default()
        });
    let (source, recorded) = match (recovering, &etcd.spec.restore) {
        (Some(source), _) => (source, false),
        (None, Some(restore)) => (restore.snapshot.clone(), status.restored_from.is_some()),
        (None, None) => return Ok(None),
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret_written = secrets
        .get_opt(&names::restore_secret_name(&etcd.name_any()))
        .await?
        .map(|secret| {
            secret
                .annotations()
                .get(names::RESTORE_URL_WRITTEN_ANNOTATION)
                .and_then(|t| t.parse::<Timestamp>().ok())
                .or_else(|| secret.metadata.creation_timestamp.map(|t| t.0))
                .unwrap_or(Timestamp::UNIX_EPOCH)
        });
    let mut view = RestoreView {
        snapshot: source.name.clone(),
        recorded,
        ..Default::default()
    };
    if !view.recorded {
        match resolve(client, namespace, &source, &mut view).await? {
            Ok(source) => {
                view.location = Some(format!("{}/{}", source.store.bucket, source.key));
                match reach(client, namespace, &source.store).await? {
                    Ok((store, ca_pem)) => {
                        view.download = Some(RestoreDownload {
                            store,
                            key: source.key,
                            sha256: source.sha256,
                            ca_pem,
                        })
                    }
                    Err(problem) => view.problem = Some(problem),
                }
            }
            Err(problem) => view.problem = Some(problem),
        }
    }
    Ok(Some(RestoreObservation { view, secret_written }))
}

/// The object `source` names, filling in what an EtcdadmSnapshot records; or why it is not
/// usable.
async fn resolve(
    client: &Client,
    namespace: &str,
    source: &RestoreSource,
    view: &mut RestoreView,
) -> Result<Result<Source, String>, Error> {
    let Some(name) = &source.name else {
        return Ok(match (&source.store, &source.key) {
            (Some(store), Some(key)) => Ok(Source {
                store: store.s3.clone(),
                key: key.clone(),
                sha256: None,
            }),
            _ => Err("neither an EtcdadmSnapshot name nor a store and key".into()),
        });
    };
    let Some(snapshot) = Api::<EtcdadmSnapshot>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(Err(format!("EtcdadmSnapshot {namespace}/{name} not found")));
    };
    let status = snapshot.status.clone().unwrap_or_default();
    view.revision = status.revision;
    view.etcd_version = status.etcd_version.clone();
    view.location = status.location.clone();
    let phase = snapshot.phase();
    if phase != SnapshotPhase::Succeeded {
        return Ok(Err(format!("EtcdadmSnapshot {name} is {phase:?}, not Succeeded")));
    }
    let (Some(store), Some(location)) = (status.store, status.location) else {
        return Ok(Err(format!(
            "EtcdadmSnapshot {name} records no store or location to download it from"
        )));
    };
    let Some(key) = location
        .strip_prefix(&format!("{}/", store.s3.bucket))
        .filter(|k| !k.is_empty())
    else {
        return Ok(Err(format!(
            "EtcdadmSnapshot {name}'s location {location} is not in its store's bucket {}",
            store.s3.bucket
        )));
    };
    Ok(Ok(Source {
        key: key.to_string(),
        store: store.s3,
        sha256: status.sha256,
    }))
}

/// A client of `store` (credentials from its Secret) and its CA bundle, or why there is none.
async fn reach(
    client: &Client,
    namespace: &str,
    store: &S3Store,
) -> Result<Result<(StoreClient, Option<String>), String>, Error> {
    Ok(store_access(client, namespace, store)
        .await?
        .map_err(|e| format!("its store cannot be used: {e}")))
}
