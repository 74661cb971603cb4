//! The objects both providers write and read by contract (the etcd CA Secret, the
//! `<cluster>-etcd-init` Secret, the init lock) and how such objects are written: created only if
//! absent, owned by their Cluster and labelled with its name.

pub mod ca;
pub mod init_lock;
pub mod init_secret;

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use crate::api::capi::Cluster;
use crate::category::ErrorCategory;
use crate::names;
use crate::pki::PkiError;

/// Writing a contract object failed.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("etcd PKI: {0}")]
    Pki(#[from] PkiError),
    /// Only an object read from the API server can own another.
    #[error("{kind} {name} has no uid, so nothing can name it as owner: it was not read from the API server")]
    NoUid { kind: String, name: String },
}

impl ContractError {
    pub fn category(&self) -> ErrorCategory {
        match self {
            ContractError::Kube(_) => ErrorCategory::KubeApi,
            ContractError::Pki(_) => ErrorCategory::Pki,
            ContractError::NoUid { .. } => ErrorCategory::Internal,
        }
    }
}

/// A CAPI Cluster as the contract objects need it: its name and namespace, and the (non
/// controller) owner reference each of them carries.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterRef {
    pub name: String,
    pub namespace: String,
    pub owner: OwnerReference,
}

impl ClusterRef {
    /// `cluster`, as read from the API server (it has a uid).
    pub fn of(cluster: &Cluster) -> Result<Self, ContractError> {
        Ok(ClusterRef {
            name: cluster.name_any(),
            namespace: cluster.namespace().unwrap_or_default(),
            owner: owner_reference(cluster)?,
        })
    }
}

/// Create `object` as `field_manager`; AlreadyExists means an earlier attempt (or a racer) made
/// it, and it is kept as it is. Returns whether this call created it.
pub async fn create_if_absent<K>(api: &Api<K>, object: &K, field_manager: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let params = PostParams {
        field_manager: Some(field_manager.into()),
        ..Default::default()
    };
    match api.create(&params, object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The controller owner reference to `owner`.
pub fn controller_reference<K: Resource<DynamicType = ()>>(
    owner: &K,
) -> Result<OwnerReference, ContractError> {
    owner
        .controller_owner_ref(&())
        .ok_or_else(|| ContractError::NoUid {
            kind: K::kind(&()).into_owned(),
            name: owner.name_any(),
        })
}

/// A non-controller owner reference to `owner` (the Cluster of every contract object: garbage
/// collection and `clusterctl move`).
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Result<OwnerReference, ContractError> {
    controller_reference(owner).map(|r| OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..r
    })
}

/// `cluster.x-k8s.io/cluster-name: <cluster>`.
pub fn cluster_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(names::CLUSTER_NAME_LABEL.to_string(), cluster.to_string())])
}

/// A Secret of CAPI's type, labelled with its Cluster's name and owned by `owner`.
pub fn cluster_secret(
    name: String,
    namespace: &str,
    cluster: &str,
    owner: OwnerReference,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.into()),
            labels: Some(cluster_labels(cluster)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Create Secret `name` of `cluster` holding `data`, owned by the Cluster, unless it exists.
/// Returns whether this call created it.
pub async fn create_cluster_secret(
    client: &Client,
    cluster: &ClusterRef,
    name: String,
    data: BTreeMap<String, ByteString>,
    field_manager: &str,
) -> Result<bool, ContractError> {
    let secret = cluster_secret(
        name,
        &cluster.namespace,
        &cluster.name,
        cluster.owner.clone(),
        data,
    );
    Ok(create_if_absent(
        &Api::namespaced(client.clone(), &cluster.namespace),
        &secret,
        field_manager,
    )
    .await?)
}

/// `text` as a Secret value.
pub fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// The UTF-8 value of `key` in `secret` (`data`, else `stringData`).
pub fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cluster(uid: Option<&str>) -> Cluster {
        let mut cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "ns"}, "spec": {},
        }))
        .unwrap();
        cluster.metadata.uid = uid.map(String::from);
        cluster
    }

    #[test]
    fn contract_objects_are_owned_by_their_cluster_but_never_controlled() {
        let owner = owner_reference(&cluster(Some("u1"))).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Cluster", "c1", "u1")
        );
        assert_eq!((owner.controller, owner.block_owner_deletion), (None, None));
        assert_eq!(
            controller_reference(&cluster(Some("u1"))).unwrap().controller,
            Some(true)
        );
        let err = owner_reference(&cluster(None)).unwrap_err();
        assert_eq!(err.category(), ErrorCategory::Internal);
        assert!(err.to_string().contains("Cluster c1 has no uid"), "{err}");
        let secret = cluster_secret("s".into(), "ns", "c1", owner, BTreeMap::new());
        assert_eq!(secret.type_.as_deref(), Some(names::CLUSTER_SECRET_TYPE));
        assert_eq!(secret.metadata.labels, Some(cluster_labels("c1")));
    }
}
