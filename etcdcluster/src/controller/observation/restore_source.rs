//! Reading what a first member is restored from (`spec.restore`, or the snapshot of a recovery
//! in its `Restoring` phase): the EtcdadmSnapshot or store object, whether it can be restored
//! from (Succeeded, in a store this controller can reach), the SHA-256 it is checked against
//! (the EtcdadmSnapshot's, the spec's, the object's metadata, or one computed earlier and kept
//! in the restore Secret), and the restore Secret; and whether a recovery's snapshot can be.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Client, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::RecoveryPhase;
use etcdadm_shared::api::snapshot::{
    ChecksumSource, DeltasStatus, EtcdadmSnapshot, RestorePoint, RestoreSource, S3Store, SnapshotPhase,
};
use etcdadm_shared::backup::delta::chain::Target;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::validation::{is_sha256_hex, validate_store};

use super::views::{Checksum, DeltasPlan, RestoreDownload, RestoreSecretView, RestoreView, SnapshotCheck};
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

/// The object a source names: its store, key, and the SHA-256 and size the source gives.
struct Source {
    store: S3Store,
    key: String,
    checksum: Option<Checksum>,
    size: Option<u64>,
    /// An EtcdadmSnapshot's revision, and what it records of its deltas.
    revision: Option<i64>,
    deltas: Option<DeltasStatus>,
}

/// The deltas to replay onto `source`: those `target` asks for, after an EtcdadmSnapshot that
/// records its revision. A recovery replays only where continuous backup recorded some; asked
/// for by `spec.restore.to`, the chain is planned whatever is recorded (and refused if short).
fn deltas_plan(source: &Source, target: Option<Target>, asked: bool) -> Option<DeltasPlan> {
    let target = target?;
    if !asked && source.deltas.as_ref().is_none_or(|d| d.count == 0) {
        return None;
    }
    Some(DeltasPlan {
        key: source.key.clone(),
        base: source.revision?,
        recorded: source.deltas.as_ref().map(|d| d.last_revision),
        target,
    })
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
    // A recovery replays every delta after its snapshot; `spec.restore` as far as `to` says.
    let (source, recorded, target, asked) = match (recovering, &etcd.spec.restore) {
        (Some(source), _) => (source, false, Some(Target::Latest), false),
        (None, Some(restore)) => (
            restore.snapshot.clone(),
            status.restored_from.is_some(),
            restore.to.as_ref().and_then(RestorePoint::target),
            restore.to.is_some(),
        ),
        (None, None) => return Ok(None),
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(&names::restore_secret_name(&etcd.name_any()))
        .await?;
    let secret_written = secret.as_ref().map(|secret| {
        secret
            .annotations()
            .get(names::RESTORE_URL_WRITTEN_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .or_else(|| secret.metadata.creation_timestamp.clone().map(|t| t.0))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    });
    let mut view = RestoreView {
        snapshot: source.name.clone(),
        recorded,
        secret: secret.as_ref().map(|s| secret_view(s, etcd)),
        ..Default::default()
    };
    if !view.recorded {
        match resolve(client, namespace, &source, &mut view).await? {
            Ok(source) => {
                view.location = Some(format!("{}/{}", source.store.bucket, source.key));
                view.deltas = deltas_plan(&source, target, asked);
                // Asked for, the deltas are replayed or the restore waits saying why: never
                // the snapshot alone in silence.
                if asked && view.deltas.is_none() {
                    view.problem = Some(match target {
                        None => "spec.restore.to: set exactly one of latest (true), revision (at least 1) \
                                 and time"
                            .into(),
                        Some(_) => {
                            "spec.restore.to: the snapshot's revision is not known (an EtcdadmSnapshot \
                                    that records one is needed), so its deltas cannot be placed after it"
                                .into()
                        }
                    });
                }
                match download(client, namespace, source, view.secret.as_ref()).await? {
                    Ok(download) => view.download = Some(download),
                    Err(problem) => view.problem = Some(problem),
                }
            }
            Err(problem) => view.problem = Some(problem),
        }
    }
    Ok(Some(RestoreObservation { view, secret_written }))
}

/// How the object of `source` is downloaded and checked: its store's client and CA, and the
/// SHA-256 the source gives, else the one in its metadata (read with its size by HeadObject),
/// else one computed earlier and kept in our restore Secret.
async fn download(
    client: &Client,
    namespace: &str,
    source: Source,
    secret: Option<&RestoreSecretView>,
) -> Result<Result<RestoreDownload, String>, Error> {
    let (store, ca_pem) = match reach(client, namespace, &source.store).await? {
        Ok(reached) => reached,
        Err(problem) => return Ok(Err(problem)),
    };
    let (mut checksum, mut size) = (source.checksum, source.size);
    if size.is_none() {
        match store.head_object(&source.key).await {
            Ok(head) => {
                size = Some(head.size);
                checksum = checksum.or(head.sha256.map(|sha256| Checksum {
                    sha256,
                    source: ChecksumSource::ObjectMetadata,
                }));
            }
            Err(e) => return Ok(Err(format!("its object cannot be read: {e}"))),
        }
    }
    let kept = secret
        .filter(|s| s.ours)
        .and_then(|s| s.checksum.clone())
        .filter(|c| c.source == ChecksumSource::Computed);
    Ok(Ok(RestoreDownload {
        store,
        key: source.key,
        checksum: checksum.or(kept),
        size,
        ca_pem,
        insecure: source.store.allows_insecure(),
    }))
}

/// The restore Secret as the plan needs it: ours (a controller reference with this
/// EtcdadmCluster's UID) or not, and the SHA-256 it records.
fn secret_view(secret: &Secret, etcd: &EtcdadmCluster) -> RestoreSecretView {
    let uid = etcd.metadata.uid.as_deref();
    let ours = uid.is_some()
        && secret
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid && o.kind == "EtcdadmCluster");
    let sha256 = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::RESTORE_SHA256_KEY))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|v| is_sha256_hex(v));
    let source = secret
        .annotations()
        .get(names::RESTORE_SHA256_SOURCE_ANNOTATION)
        .and_then(|s| ChecksumSource::parse(s));
    let deltas_unusable = secret
        .annotations()
        .get(names::RESTORE_DELTAS_UNUSABLE_ANNOTATION)
        .zip(
            secret
                .annotations()
                .get(names::RESTORE_DELTAS_CHECKED_ANNOTATION)
                .and_then(|t| t.parse::<Timestamp>().ok()),
        )
        .map(|(why, at)| (why.clone(), at));
    RestoreSecretView {
        ours,
        uid: secret.metadata.uid.clone().unwrap_or_default(),
        resource_version: secret.metadata.resource_version.clone().unwrap_or_default(),
        checksum: sha256
            .zip(source)
            .map(|(sha256, source)| Checksum { sha256, source }),
        deltas_unusable: deltas_unusable.filter(|_| ours),
    }
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
                checksum: source.sha256.as_ref().map(|sha256| Checksum {
                    sha256: sha256.to_ascii_lowercase(),
                    source: ChecksumSource::Spec,
                }),
                size: None,
                revision: None,
                deltas: None,
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
    let Some(sha256) = status.sha256.filter(|s| is_sha256_hex(s)) else {
        return Ok(Err(format!(
            "EtcdadmSnapshot {name} records no SHA-256 to check its download against"
        )));
    };
    Ok(Ok(Source {
        key: key.to_string(),
        store: store.s3,
        checksum: Some(Checksum {
            sha256: sha256.to_ascii_lowercase(),
            source: ChecksumSource::EtcdadmSnapshot,
        }),
        size: status.size.and_then(|s| u64::try_from(s).ok()),
        revision: status.revision,
        deltas: status.deltas,
    }))
}

/// A client of `store` (credentials from its Secret) and its CA bundle, or why there is none
/// (among them: a plain http endpoint without `insecure: true`, which an EtcdadmSnapshot taken
/// before that rule may record).
async fn reach(
    client: &Client,
    namespace: &str,
    store: &S3Store,
) -> Result<Result<(StoreClient, Option<String>), String>, Error> {
    let problems = validate_store(store, "store.s3");
    if !problems.is_empty() {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Ok(Err(format!("its store cannot be used: {}", listed.join("; "))));
    }
    Ok(store_access(client, namespace, store)
        .await?
        .map_err(|e| format!("its store cannot be used: {e}")))
}
