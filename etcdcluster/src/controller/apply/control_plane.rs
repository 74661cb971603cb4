//! Writes to the KubeadmControlPlane: its pause while etcd is not ready, the external etcd
//! endpoints it is given, and the rollout that hands it a re-issued client certificate. The KCP
//! type here is partial, so every apply configuration is JSON holding only the fields this
//! controller owns.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::KubeadmControlPlane;
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::{Applied, Outputs, observed};
use crate::controller::observe::Observation;
use crate::error::Error;

/// Server-side apply sites on the KCP.
const PAUSE_MANAGER: &str = "etcdadm-controller/control-plane-pause";
const ENDPOINTS_MANAGER: &str = "etcdadm-controller/control-plane-endpoints";
const ROLLOUT_MANAGER: &str = "etcdadm-controller/control-plane-rollout";

fn api(out: &Outputs<'_>, kcp: &KubeadmControlPlane) -> Api<KubeadmControlPlane> {
    Api::namespaced(out.client.clone(), &kcp.namespace().unwrap_or_default())
}

/// Server-side apply `metadata` and `rest` (beside the KCP's identity) as `manager`.
async fn apply(
    out: &Outputs<'_>,
    kcp: &KubeadmControlPlane,
    manager: &str,
    force: bool,
    metadata: Value,
    rest: Value,
) -> Result<Applied, Error> {
    let body = ssa::configuration::<KubeadmControlPlane>(&kcp.name_any(), metadata, rest);
    api(out, kcp)
        .patch(&kcp.name_any(), &ssa::params(manager, force), &Patch::Apply(body))
        .await?;
    Ok(Applied::Done)
}

/// Keep the KCP from rolling its Machines until etcd is ready. Not forced: a pause someone
/// else set stays theirs.
pub(super) async fn pause(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    let metadata = json!({ "annotations": { names::PAUSED_ANNOTATION: "" } });
    apply(out, kcp, PAUSE_MANAGER, false, metadata, json!({})).await
}

/// Remove the pause once etcd is ready.
pub(super) async fn unpause(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    // A merge patch: an apply removes only what its manager alone owns, and an earlier version
    // paused the KCP by merge patch.
    let patch = json!({ "metadata": { "annotations": { names::PAUSED_ANNOTATION: null } } });
    let params = PatchParams {
        field_manager: Some(PAUSE_MANAGER.into()),
        ..Default::default()
    };
    api(out, kcp)
        .patch(&kcp.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    Ok(Applied::Done)
}

/// Write the external etcd endpoints: this controller's to decide, so forced.
pub(super) async fn write_endpoints(
    out: &Outputs<'_>,
    obs: &Observation,
    endpoints: &[String],
) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    let spec = json!({ "spec": { "kubeadmConfigSpec": { "clusterConfiguration": {
        "etcd": { "external": { "endpoints": endpoints } }
    } } } });
    apply(out, kcp, ENDPOINTS_MANAGER, true, json!({}), spec).await
}

/// Ask for a rollout of the Machines created before `after` (v1beta2 `spec.rollout.after`, the
/// version this controller reads the KCP at). Forced: a later request by anyone else would have
/// made this step unnecessary, so whatever is there is earlier.
pub(super) async fn request_rollout(
    out: &Outputs<'_>,
    obs: &Observation,
    after: k8s_openapi::jiff::Timestamp,
) -> Result<Applied, Error> {
    let kcp = observed(&obs.kcp, "KubeadmControlPlane")?;
    let spec = json!({ "spec": { "rollout": { "after": after.to_string() } } });
    apply(out, kcp, ROLLOUT_MANAGER, true, json!({}), spec).await
}
