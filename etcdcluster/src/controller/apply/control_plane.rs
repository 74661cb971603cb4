//! Writes to the KubeadmControlPlane: its pause while etcd is not ready, and the external etcd
//! endpoints it is given (only those fields: the KCP type here is partial).

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::KubeadmControlPlane;
use etcdadm_shared::names;

use super::{Applied, FIELD_MANAGER, Outputs, observed};
use crate::controller::observe::Observation;
use crate::error::Error;

async fn patch(out: &Outputs<'_>, kcp: &KubeadmControlPlane, patch: Value) -> Result<Applied, Error> {
    let api: Api<KubeadmControlPlane> =
        Api::namespaced(out.client.clone(), &kcp.namespace().unwrap_or_default());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(&kcp.name_any(), &params, &Patch::Merge(&patch)).await?;
    Ok(Applied::Done)
}

/// Set (`true`) or remove the `cluster.x-k8s.io/paused` annotation.
pub(super) async fn set_paused(out: &Outputs<'_>, obs: &Observation, paused: bool) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    let value = if paused { json!("") } else { Value::Null };
    patch(
        out,
        kcp,
        json!({ "metadata": { "annotations": { names::PAUSED_ANNOTATION: value } } }),
    )
    .await
}

/// Write the external etcd endpoints (only that list: everything else stays).
pub(super) async fn write_endpoints(
    out: &Outputs<'_>,
    obs: &Observation,
    endpoints: &[String],
) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    patch(
        out,
        kcp,
        json!({ "spec": { "kubeadmConfigSpec": { "clusterConfiguration": {
            "etcd": { "external": { "endpoints": endpoints } }
        } } } }),
    )
    .await
}
