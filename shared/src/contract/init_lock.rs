//! The init lock `<cluster>-etcd-lock`: a ConfigMap created by the Machine that initializes etcd
//! (JSON `{"machineName": ...}`, as the reference writes it), so exactly one member runs
//! `etcdadm init`; released when its holder is gone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, Preconditions};

use super::{ClusterRef, ContractError, cluster_labels, create_if_absent};
use crate::names;

/// The Machine a lock names as its holder; `None` when it names none readably.
pub fn holder(lock: &ConfigMap) -> Option<String> {
    let info = lock.data.as_ref()?.get(names::LOCK_INFORMATION_KEY)?;
    let parsed: BTreeMap<String, serde_json::Value> = serde_json::from_str(info).ok()?;
    parsed
        .get("machineName")?
        .as_str()
        .filter(|n| !n.is_empty())
        .map(String::from)
}

/// Take the lock for `machine`. Returns whether this call created it (someone else may hold it).
pub async fn acquire(
    client: &Client,
    cluster: &ClusterRef,
    machine: &str,
    field_manager: &str,
) -> Result<bool, ContractError> {
    let info = serde_json::json!({ "machineName": machine }).to_string();
    let lock = ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::init_lock_name(&cluster.name)),
            namespace: Some(cluster.namespace.clone()),
            labels: Some(cluster_labels(&cluster.name)),
            owner_references: Some(vec![cluster.owner.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(names::LOCK_INFORMATION_KEY.to_string(), info)])),
        ..Default::default()
    };
    Ok(create_if_absent(
        &Api::namespaced(client.clone(), &cluster.namespace),
        &lock,
        field_manager,
    )
    .await?)
}

/// Delete the lock, but only the version that was observed (someone may have re-taken it).
pub async fn release(
    client: &Client,
    cluster: &str,
    namespace: &str,
    resource_version: Option<String>,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version,
            uid: None,
        }),
        ..Default::default()
    };
    match api.delete(&names::init_lock_name(cluster), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lock(info: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([(
                names::LOCK_INFORMATION_KEY.to_string(),
                info.to_string(),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn the_holder_is_read_as_the_reference_writes_it_and_nothing_else_is_guessed() {
        assert_eq!(holder(&lock(r#"{"machineName":"m1"}"#)).as_deref(), Some("m1"));
        for unreadable in [
            r#"{"machineName":""}"#,
            r#"{"machine":"m1"}"#,
            "m1",
            r#"{"machineName":7}"#,
        ] {
            assert_eq!(holder(&lock(unreadable)), None, "{unreadable}");
        }
        assert_eq!(holder(&ConfigMap::default()), None);
    }
}
