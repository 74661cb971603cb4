//! Which changes of Clusters and EtcdadmClusters reach which EtcdadmConfigs: only changes of
//! what the plan reads from them, and only the configs of that cluster.

use std::hash::{Hash, Hasher};

use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};

use etcdadm_shared::api::capi::Cluster;
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;

use super::observe::etcd_cluster_view;

type GuardedConfig = DeserializeGuard<EtcdadmConfig>;

/// What the plan reads from a Cluster: pause and managed-etcd initialization. Its status moves
/// for many other reasons, none of which changes a config's next step. Unreadable objects
/// always pass.
pub(super) fn cluster_inputs(cluster: &DeserializeGuard<Cluster>) -> Option<u64> {
    let cluster = cluster.0.as_ref().ok()?;
    Some(hash((cluster.is_paused(), cluster.managed_etcd_initialized())))
}

/// What the plan reads from an EtcdadmCluster: initialization and the healthy voting members'
/// client URLs (the join targets). A steady cluster's status is rewritten about every 30 s for
/// health times and database sizes; those no longer wake every config of the namespace.
pub(super) fn etcd_cluster_inputs(etcd: &DeserializeGuard<EtcdadmCluster>) -> Option<u64> {
    let etcd = etcd.0.as_ref().ok()?;
    Some(hash(etcd_cluster_view(etcd)))
}

fn hash(value: impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Configs in `namespace` labelled `label=name`, and those without the label (made by something
/// that does not label them; their Machine's labels are read in the reconcile).
pub(super) fn configs_labelled(
    store: &Store<GuardedConfig>,
    namespace: Option<String>,
    label: &str,
    name: &str,
) -> Vec<ObjectRef<GuardedConfig>> {
    store
        .state()
        .iter()
        .filter(|c| c.namespace() == namespace)
        .filter(|c| c.labels().get(label).is_none_or(|value| value == name))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The configs a Cluster's change concerns.
pub(super) fn configs_of_cluster(
    store: &Store<GuardedConfig>,
    cluster: &DeserializeGuard<Cluster>,
) -> Vec<ObjectRef<GuardedConfig>> {
    configs_labelled(
        store,
        cluster.namespace(),
        names::CLUSTER_NAME_LABEL,
        &cluster.name_any(),
    )
}

/// The configs an EtcdadmCluster's change concerns.
pub(super) fn configs_of_etcd_cluster(
    store: &Store<GuardedConfig>,
    etcd: &DeserializeGuard<EtcdadmCluster>,
) -> Vec<ObjectRef<GuardedConfig>> {
    configs_labelled(
        store,
        etcd.namespace(),
        names::ETCD_CLUSTER_LABEL,
        &etcd.name_any(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use kube::runtime::{reflector, watcher};
    use serde_json::{Value, json};

    use super::*;

    fn guarded<K: serde::de::DeserializeOwned>(value: Value) -> DeserializeGuard<K> {
        DeserializeGuard(Ok(serde_json::from_value(value).unwrap()))
    }

    fn cluster(paused: bool, conditions: Value) -> DeserializeGuard<Cluster> {
        guarded(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {"paused": paused},
            "status": {"conditions": conditions},
        }))
    }

    fn condition(type_: &str, status: &str) -> Value {
        json!({"type": type_, "status": status, "reason": "R", "lastTransitionTime": "2026-11-24T10:00:00Z"})
    }

    #[test]
    fn a_cluster_change_passes_only_when_pause_or_etcd_initialization_changes() {
        let base = cluster_inputs(&cluster(
            false,
            json!([condition("InfrastructureReady", "False")]),
        ));
        assert_eq!(
            base,
            cluster_inputs(&cluster(false, json!([condition("InfrastructureReady", "True")]))),
            "another condition moved"
        );
        assert_ne!(base, cluster_inputs(&cluster(true, json!([]))), "paused");
        let initialized = json!([condition(names::MANAGED_ETCD_INITIALIZED_CONDITION, "True")]);
        assert_ne!(base, cluster_inputs(&cluster(false, initialized)), "initialized");
        let unreadable: DeserializeGuard<Cluster> =
            serde_json::from_value(json!({"metadata": {"name": "c1"}, "spec": 3})).unwrap();
        assert!(unreadable.0.is_err());
        assert_eq!(
            cluster_inputs(&unreadable),
            None,
            "an unreadable Cluster always passes"
        );
    }

    fn etcd(
        initialized: bool,
        url: &str,
        last_healthy: &str,
        db_size: i64,
    ) -> DeserializeGuard<EtcdadmCluster> {
        guarded(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "default"},
            "spec": {"infrastructureTemplate": {}},
            "status": {"initialized": initialized, "members": [{"name": "m1", "healthy": true,
                "clientURL": url, "lastHealthyTime": last_healthy, "dbSize": db_size}]},
        }))
    }

    #[test]
    fn an_etcd_cluster_change_passes_only_when_initialization_or_join_targets_change() {
        let base = etcd_cluster_inputs(&etcd(true, "https://10.0.0.1:2379", "2026-11-24T10:00:00Z", 100));
        assert_eq!(
            base,
            etcd_cluster_inputs(&etcd(true, "https://10.0.0.1:2379", "2026-11-24T10:00:30Z", 4096)),
            "a health time or database size refresh"
        );
        assert_ne!(
            base,
            etcd_cluster_inputs(&etcd(true, "https://10.0.0.2:2379", "2026-11-24T10:00:00Z", 100)),
            "another healthy member"
        );
        assert_ne!(
            base,
            etcd_cluster_inputs(&etcd(false, "https://10.0.0.1:2379", "2026-11-24T10:00:00Z", 100)),
            "initialization"
        );
    }

    fn config(name: &str, namespace: &str, labels: Value) -> DeserializeGuard<EtcdadmConfig> {
        guarded(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {},
        }))
    }

    #[test]
    fn a_change_reaches_the_configs_of_its_cluster_and_unlabelled_ones_of_its_namespace() {
        let (store, mut writer) = reflector::store();
        for object in [
            config(
                "a-1",
                "default",
                json!({names::CLUSTER_NAME_LABEL: "a", names::ETCD_CLUSTER_LABEL: "a-etcd"}),
            ),
            config(
                "b-1",
                "default",
                json!({names::CLUSTER_NAME_LABEL: "b", names::ETCD_CLUSTER_LABEL: "b-etcd"}),
            ),
            config("loose", "default", json!({})),
            config("a-elsewhere", "other", json!({names::CLUSTER_NAME_LABEL: "a"})),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let names = |refs: Vec<ObjectRef<GuardedConfig>>| {
            let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
            names.sort();
            names
        };
        let cluster_a = guarded::<Cluster>(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "a", "namespace": "default"}, "spec": {},
        }));
        assert_eq!(names(configs_of_cluster(&store, &cluster_a)), ["a-1", "loose"]);
        let etcd_b = guarded::<EtcdadmCluster>(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "b-etcd", "namespace": "default"},
            "spec": {"infrastructureTemplate": {}},
        }));
        assert_eq!(names(configs_of_etcd_cluster(&store, &etcd_b)), ["b-1", "loose"]);
    }
}
