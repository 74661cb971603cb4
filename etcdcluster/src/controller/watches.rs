//! What the controller watches besides EtcdadmClusters, and which EtcdadmClusters an event
//! reaches: member Machines by label, Clusters by label or reference, KCPs by namespace, the
//! Secrets it reads by name, before-change snapshots by the cluster they are of; and which
//! EtcdadmCluster changes are worth a reconcile at all.

use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Secret;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::names;

/// An EtcdadmCluster as watched: read, or the reason it could not be.
pub type Guarded = DeserializeGuard<EtcdadmCluster>;

/// What a change to an EtcdadmCluster must differ in to trigger a reconcile: anything but the
/// status fields that only record observations (`lastHealthyTime`, `dbSize`). A steady cluster's
/// status is rewritten for those every 30 s or so, and each rewrite would otherwise cost one
/// more round of health checks (a third more at 1,000 clusters); status changes during an
/// operation still trigger the next step at once.
pub(super) fn worth_reconciling(etcd: &Guarded) -> Option<u64> {
    let meta = etcd.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.uid, owner.controller).hash(&mut hasher);
    }
    if let Ok(EtcdadmCluster {
        status: Some(status), ..
    }) = &etcd.0
    {
        let mut status = status.clone();
        for member in &mut status.members {
            member.last_healthy_time = None;
            member.db_size = None;
        }
        serde_json::to_string(&status)
            .unwrap_or_default()
            .hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// The EtcdadmCluster a member Machine belongs to, by its label (orphans included).
pub(super) fn member_of(machine: &DeserializeGuard<Machine>) -> Vec<ObjectRef<Guarded>> {
    match (
        machine.namespace(),
        machine.labels().get(names::ETCD_CLUSTER_LABEL),
    ) {
        (Some(namespace), Some(name)) => vec![ObjectRef::new(name).within(&namespace)],
        _ => vec![],
    }
}

/// EtcdadmClusters of the Cluster `cluster` (by label or by the fork's reference).
pub(super) fn etcd_clusters_of(store: &Store<Guarded>, cluster: &Cluster) -> Vec<ObjectRef<Guarded>> {
    let ns = cluster.namespace();
    let name = cluster.name_any();
    let referenced = cluster
        .spec
        .managed_external_etcd_ref
        .as_ref()
        .map(|r| r.name.clone());
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == ns)
        .filter(|e| {
            e.labels().get(names::CLUSTER_NAME_LABEL) == Some(&name)
                || referenced.as_deref() == Some(e.name_any().as_str())
        })
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// EtcdadmClusters that read the Secret `secret` (the CA and the next one of a rotation, the
/// init Secret, or the two the control plane is given), by its cluster-name label. Other Secrets
/// of the Cluster (bootstrap data, kubeconfigs) trigger nothing.
pub(super) fn etcd_clusters_using(
    store: &Store<Guarded>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<Guarded>> {
    let Some(cluster) = secret.labels().get(names::CLUSTER_NAME_LABEL) else {
        return vec![];
    };
    let name = secret.name_any();
    let read_by_us = [
        names::ca_secret_name(cluster),
        names::next_ca_secret_name(cluster),
        names::init_secret_name(cluster),
        names::kcp_etcd_ca_secret_name(cluster),
        names::apiserver_client_secret_name(cluster),
    ]
    .contains(&name);
    if !read_by_us {
        return vec![];
    }
    let ns = secret.namespace();
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == ns && e.labels().get(names::CLUSTER_NAME_LABEL) == Some(cluster))
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

/// The EtcdadmCluster a before-change snapshot is of: a change waits for it.
pub(super) fn waiting_on(snapshot: &DeserializeGuard<EtcdadmSnapshot>) -> Vec<ObjectRef<Guarded>> {
    match (snapshot.namespace(), &snapshot.0) {
        (Some(namespace), Ok(snapshot)) => {
            vec![ObjectRef::new(&snapshot.spec.cluster_name).within(&namespace)]
        }
        _ => vec![],
    }
}

/// EtcdadmClusters in the namespace of a KCP (few per namespace; the reconcile filters).
pub(super) fn etcd_clusters_in(store: &Store<Guarded>, namespace: Option<String>) -> Vec<ObjectRef<Guarded>> {
    store
        .state()
        .iter()
        .filter(|e| e.namespace() == namespace)
        .map(|e| ObjectRef::from_obj(e.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn guarded(value: serde_json::Value) -> Guarded {
        DeserializeGuard(Ok(serde_json::from_value(value).unwrap()))
    }

    fn etcd(generation: i64, paused: bool, last_healthy: &str, db_size: i64, healthy: bool) -> Guarded {
        let annotations = if paused {
            serde_json::json!({names::PAUSED_ANNOTATION: ""})
        } else {
            serde_json::json!({})
        };
        guarded(serde_json::json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "default", "generation": generation,
                         "annotations": annotations},
            "spec": {"infrastructureTemplate": {}},
            "status": {"members": [{"name": "m1", "healthy": healthy, "lastHealthyTime": last_healthy,
                                    "dbSize": db_size}]},
        }))
    }

    #[test]
    fn observation_only_status_updates_do_not_trigger_a_reconcile_but_everything_else_does() {
        let base = worth_reconciling(&etcd(1, false, "2026-11-23T10:00:00Z", 100, true));
        assert_eq!(
            base,
            worth_reconciling(&etcd(1, false, "2026-11-23T10:00:30Z", 4096, true)),
            "a lastHealthyTime or dbSize refresh"
        );
        for (what, changed) in [
            ("spec", etcd(2, false, "2026-11-23T10:00:00Z", 100, true)),
            ("annotations", etcd(1, true, "2026-11-23T10:00:00Z", 100, true)),
            (
                "member health",
                etcd(1, false, "2026-11-23T10:00:00Z", 100, false),
            ),
        ] {
            assert_ne!(base, worth_reconciling(&changed), "{what}");
        }
    }

    #[test]
    fn only_the_secrets_the_controller_reads_reach_the_etcd_clusters_of_their_cluster() {
        let (reader, mut writer) = kube::runtime::reflector::store::<Guarded>();
        let etcd = |name: &str, cluster: &str| {
            guarded(serde_json::json!({
                "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                "metadata": {"name": name, "namespace": "default",
                             "labels": {names::CLUSTER_NAME_LABEL: cluster}},
                "spec": {"infrastructureTemplate": {}},
            }))
        };
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(etcd("c1-etcd", "c1")));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(etcd("c2-etcd", "c2")));
        let secret = |name: &str, namespace: &str| -> PartialObjectMeta<Secret> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {names::CLUSTER_NAME_LABEL: "c1"}},
            }))
            .unwrap()
        };
        let c1 = vec![ObjectRef::<Guarded>::new("c1-etcd").within("default")];
        for name in [
            "c1-managed-etcd",
            "c1-etcd-init",
            "c1-etcd",
            "c1-apiserver-etcd-client",
        ] {
            assert_eq!(
                etcd_clusters_using(&reader, &secret(name, "default")),
                c1,
                "{name}"
            );
        }
        assert!(etcd_clusters_using(&reader, &secret("c1-kubeconfig", "default")).is_empty());
        assert!(etcd_clusters_using(&reader, &secret("c1-managed-etcd", "other")).is_empty());
    }
}
