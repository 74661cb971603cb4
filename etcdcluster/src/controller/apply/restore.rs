//! The restore Secret: the snapshot's presigned download URL (with its SHA-256 and the store's
//! CA) that the first member's EtcdadmConfig names, written before that Machine and deleted once
//! the restored member is healthy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch};
use serde_json::json;

use etcdadm_shared::contract::{bytes, controller_reference};
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::{Applied, Outputs, observed};
use crate::controller::observe::Observation;
use crate::controller::plan::RESTORE_URL_TTL;
use crate::error::Error;

/// The apply site of the restore Secret.
const RESTORE_MANAGER: &str = "etcdadm-controller/restore";

/// Presign a GET of the snapshot and apply `<etcdadmcluster>-restore` with it (a renewal
/// replaces the URL). The URL is never logged.
pub(super) async fn write_secret(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let download = observed(
        &observed(&obs.restore, "spec.restore")?.download,
        "restore source",
    )?;
    let etcd = &obs.etcd_cluster;
    let url = download.store.presigned_get(&download.key, RESTORE_URL_TTL);
    let mut data = BTreeMap::from([(names::RESTORE_URL_KEY.to_string(), bytes(url.as_str()))]);
    if let Some(sha256) = &download.sha256 {
        data.insert(names::RESTORE_SHA256_KEY.to_string(), bytes(sha256));
    }
    if let Some(ca_pem) = &download.ca_pem {
        data.insert(names::RESTORE_CA_KEY.to_string(), bytes(ca_pem));
    }
    let name = names::restore_secret_name(&etcd.name_any());
    let metadata = json!({
        "namespace": obs.namespace,
        "labels": { names::ETCD_CLUSTER_LABEL: etcd.name_any() },
        "annotations": { names::RESTORE_URL_WRITTEN_ANNOTATION: Timestamp::now().to_string() },
        "ownerReferences": [controller_reference(etcd)?],
    });
    let body = ssa::configuration::<Secret>(&name, metadata, json!({ "type": "Opaque", "data": data }));
    Api::<Secret>::namespaced(out.client.clone(), &obs.namespace)
        .patch(&name, &ssa::params(RESTORE_MANAGER, true), &Patch::Apply(body))
        .await?;
    Ok(Applied::Done)
}

pub(super) async fn delete_secret(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let name = names::restore_secret_name(&obs.etcd_cluster.name_any());
    match Api::<Secret>::namespaced(out.client.clone(), &obs.namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Applied::AlreadyDone),
        Err(e) => Err(e.into()),
    }
}
