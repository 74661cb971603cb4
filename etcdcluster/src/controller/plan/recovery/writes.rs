//! The Kubernetes writes of a recovery: the survivor's snapshot, the lost cluster's init Secret
//! deleted, the `recover` annotation removed once done.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;

use crate::controller::decision::{Applied, FIELD_MANAGER, Outputs};
use crate::controller::observation::Observation;
use crate::snapshot::new_snapshot;

/// Create the EtcdadmSnapshot `name` of Machine `machine`'s member (the snapshot controller
/// takes it without quorum); one that exists already is kept.
pub(super) async fn snapshot_survivor(
    out: &Outputs<'_>,
    o: &Observation,
    name: &str,
    machine: &str,
) -> Result<Applied, Error> {
    let snapshot = new_snapshot(&o.etcd_cluster, name, Some(machine));
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match Api::<EtcdadmSnapshot>::namespaced(out.client.clone(), &o.namespace)
        .create(&params, &snapshot)
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Applied::AlreadyDone),
        Err(e) => Err(e.into()),
    }
}

/// Delete the lost cluster's `<cluster>-etcd-init`: the restored first member publishes its own.
pub(super) async fn reset(
    out: &Outputs<'_>,
    o: &Observation,
    cluster: Option<&str>,
) -> Result<Applied, Error> {
    let Some(cluster) = cluster else {
        return Ok(Applied::AlreadyDone);
    };
    let name = names::init_secret_name(cluster);
    match Api::<Secret>::namespaced(out.client.clone(), &o.namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Applied::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Applied::Done),
        Err(e) => Err(e.into()),
    }
}

/// Remove the `recover` annotation (status recorded the recovery first).
pub(super) async fn finish(out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    if !etcd.annotations().contains_key(names::RECOVER_ANNOTATION) {
        return Ok(Applied::AlreadyDone);
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch = json!({ "metadata": { "annotations": { names::RECOVER_ANNOTATION: null } } });
    Api::<etcdadm_shared::api::EtcdadmCluster>::namespaced(out.client.clone(), &o.namespace)
        .patch(&etcd.name_any(), &params, &Patch::Merge(patch))
        .await?;
    Ok(Applied::Done)
}
