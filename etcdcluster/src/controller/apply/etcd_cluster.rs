//! Writes to the EtcdadmCluster itself: its Cluster owner reference, its finalizer, the record
//! of the last remediation, and its status with the Events of its transitions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::contract::owner_reference;
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::{Applied, Outputs, observed};
use crate::controller::observe::Observation;
use crate::controller::plan::{Observed, REMEDIATION_ANNOTATION, RemediationRecord, Step};
use crate::controller::status;
use crate::error::Error;

/// Server-side apply sites on the EtcdadmCluster: each owns what it applies, and only that.
const OWNER_MANAGER: &str = "etcdadm-controller/cluster-owner";
const FINALIZER_MANAGER: &str = "etcdadm-controller/finalizer";
const REMEDIATION_MANAGER: &str = "etcdadm-controller/remediation";
const STATUS_MANAGER: &str = "etcdadm-controller/status";

fn api(out: &Outputs<'_>, etcd: &EtcdadmCluster) -> Api<EtcdadmCluster> {
    Api::namespaced(out.client.clone(), &etcd.namespace().unwrap_or_default())
}

/// Server-side apply `metadata` as `manager`; `force` takes over fields only this controller
/// should write.
async fn apply_metadata(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    manager: &str,
    force: bool,
    metadata: Value,
) -> Result<(), Error> {
    let body = ssa::configuration::<EtcdadmCluster>(&etcd.name_any(), metadata, json!({}));
    api(out, etcd)
        .patch(
            &etcd.name_any(),
            &ssa::params(manager, force),
            &Patch::Apply(body),
        )
        .await?;
    Ok(())
}

/// The Cluster as a (non-controller) owner: garbage collection and `clusterctl move`. The
/// owner list merges by uid, so the entry is applied alone.
pub(super) async fn add_cluster_owner_ref(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let owner = owner_reference(observed(&obs.cluster, "Cluster")?)?;
    let metadata = json!({ "ownerReferences": [owner] });
    apply_metadata(out, &obs.etcd_cluster, OWNER_MANAGER, false, metadata).await?;
    Ok(Applied::Done)
}

pub(super) async fn add_finalizer(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let metadata = json!({ "finalizers": [names::ETCDADM_CLUSTER_FINALIZER] });
    apply_metadata(out, &obs.etcd_cluster, FINALIZER_MANAGER, false, metadata).await?;
    Ok(Applied::Done)
}

/// The last step of a deletion: nothing of this etcd cluster is kept after it.
pub(super) async fn remove_finalizer(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let etcd = &obs.etcd_cluster;
    let finalizers: Vec<&String> = etcd
        .finalizers()
        .iter()
        .filter(|f| *f != names::ETCDADM_CLUSTER_FINALIZER)
        .collect();
    // A merge patch guarded by the resourceVersion observed: an apply removes only what its
    // manager alone owns, and an earlier version added the finalizer by merge patch.
    let metadata = json!({ "resourceVersion": etcd.resource_version(), "finalizers": finalizers });
    let params = PatchParams {
        field_manager: Some(FINALIZER_MANAGER.into()),
        ..Default::default()
    };
    api(out, etcd)
        .patch(
            &etcd.name_any(),
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    out.etcd_clients.forget(&obs.cache_key());
    tracing::info!("every etcd Machine is gone; finalizer removed");
    Ok(Applied::Done)
}

/// Record a remediation (read back for the backoff after a failed replacement): one
/// annotation, this controller's alone.
pub(super) async fn record_remediation(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    record: &RemediationRecord,
) -> Result<(), Error> {
    let metadata = json!({ "annotations": { REMEDIATION_ANNOTATION: record.to_annotation() } });
    apply_metadata(out, etcd, REMEDIATION_MANAGER, true, metadata).await
}

/// Write status if it changed, and publish the Events of its transitions. Returns the object as
/// written, if it was.
pub(super) async fn write_status(
    out: &Outputs<'_>,
    obs: &Observation,
    o: &Observed,
    step: &Step,
) -> Result<Option<EtcdadmCluster>, Error> {
    let etcd = &obs.etcd_cluster;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (status, transitions) = status::next_status(etcd, o, step, &now);
    out.metrics(etcd, |m, ns, name| {
        m.observe_status(ns, name, etcd.spec.replicas(), &status)
    });
    let old: EtcdadmClusterStatus = etcd.status.clone().unwrap_or_default();
    let mut written = None;
    if status != old {
        // The whole status, every time: its fields are this controller's alone.
        let body =
            ssa::configuration::<EtcdadmCluster>(&etcd.name_any(), json!({}), json!({ "status": status }));
        written = Some(
            api(out, etcd)
                .patch_status(
                    &etcd.name_any(),
                    &ssa::params(STATUS_MANAGER, true),
                    &Patch::Apply(body),
                )
                .await?,
        );
    }
    for t in transitions {
        out.publish(etcd, t).await;
    }
    Ok(written)
}
