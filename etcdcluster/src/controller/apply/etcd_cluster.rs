//! Writes to the EtcdadmCluster itself: its Cluster owner reference, its finalizer, the record
//! of the last remediation, and its status with the Events of its transitions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::contract::owner_reference;
use etcdadm_shared::names;

use super::{Applied, FIELD_MANAGER, Outputs, observed};
use crate::controller::observe::Observation;
use crate::controller::plan::{Observed, REMEDIATION_ANNOTATION, RemediationRecord, Step};
use crate::controller::status;
use crate::error::Error;

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn api(out: &Outputs<'_>, etcd: &EtcdadmCluster) -> Api<EtcdadmCluster> {
    Api::namespaced(out.client.clone(), &etcd.namespace().unwrap_or_default())
}

/// Merge-patch `metadata`, guarded by the resourceVersion observed (lists in a merge patch are
/// replaced whole, so a concurrent change must not be overwritten).
async fn patch_metadata(out: &Outputs<'_>, etcd: &EtcdadmCluster, metadata: Value) -> Result<Applied, Error> {
    let mut metadata = metadata;
    if let Some(map) = metadata.as_object_mut() {
        map.insert("resourceVersion".into(), json!(etcd.resource_version()));
    }
    api(out, etcd)
        .patch(
            &etcd.name_any(),
            &patch_params(),
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    Ok(Applied::Done)
}

/// The Cluster as a (non-controller) owner: garbage collection and `clusterctl move`.
pub(super) async fn add_cluster_owner_ref(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let etcd = &obs.etcd_cluster;
    let mut owners = etcd.owner_references().to_vec();
    owners.push(owner_reference(observed(&obs.cluster, "Cluster")?)?);
    patch_metadata(out, etcd, json!({ "ownerReferences": owners })).await
}

pub(super) async fn add_finalizer(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let etcd = &obs.etcd_cluster;
    let mut finalizers = etcd.finalizers().to_vec();
    finalizers.push(names::ETCDADM_CLUSTER_FINALIZER.to_string());
    patch_metadata(out, etcd, json!({ "finalizers": finalizers })).await
}

/// The last step of a deletion: nothing of this etcd cluster is kept after it.
pub(super) async fn remove_finalizer(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let etcd = &obs.etcd_cluster;
    let finalizers: Vec<&String> = etcd
        .finalizers()
        .iter()
        .filter(|f| *f != names::ETCDADM_CLUSTER_FINALIZER)
        .collect();
    patch_metadata(out, etcd, json!({ "finalizers": finalizers })).await?;
    out.etcd_clients.forget(&obs.cache_key());
    tracing::info!("every etcd Machine is gone; finalizer removed");
    Ok(Applied::Done)
}

/// Record a remediation (read back for the backoff after a failed replacement). One annotation
/// key: nothing else is touched.
pub(super) async fn record_remediation(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    record: &RemediationRecord,
) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": {
        REMEDIATION_ANNOTATION: record.to_annotation()
    } } });
    api(out, etcd)
        .patch(&etcd.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Write status if it changed, and publish the Events of its transitions. Returns the object as
/// written, if it was.
pub async fn write_status(
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
        let patch = json!({ "status": status });
        written = Some(
            api(out, etcd)
                .patch_status(&etcd.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await?,
        );
    }
    for t in transitions {
        out.publish(etcd, t).await;
    }
    Ok(written)
}
