//! The writes of one decision: lock, CA, data Secret, init Secret. Each is safe to repeat.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::Cluster;
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

use crate::error::Error;

/// Field manager for every write of this controller.
pub const FIELD_MANAGER: &str = "etcdadm-bootstrap";

/// Create `object`; an AlreadyExists answer means someone else won the race, which is fine.
async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            object,
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn cluster_owner(cluster: &Cluster) -> Result<OwnerReference, Error> {
    cluster
        .controller_owner_ref(&())
        .map(|mut r| {
            r.controller = None;
            r.block_owner_deletion = None;
            r
        })
        .ok_or_else(|| Error::InvalidObject(format!("Cluster {} has no uid", cluster.name_any())))
}

fn cluster_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(names::CLUSTER_NAME_LABEL.to_string(), cluster.to_string())])
}

/// Take the init lock for `machine`. Returns whether this call created it.
pub async fn acquire_lock(
    client: &Client,
    cluster: &Cluster,
    ns: &str,
    machine: &str,
) -> Result<bool, Error> {
    let cluster_name = cluster.name_any();
    let info = serde_json::json!({ "machineName": machine }).to_string();
    let lock = ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::init_lock_name(&cluster_name)),
            namespace: Some(ns.into()),
            labels: Some(cluster_labels(&cluster_name)),
            owner_references: Some(vec![cluster_owner(cluster)?]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(names::LOCK_INFORMATION_KEY.to_string(), info)])),
        ..Default::default()
    };
    create_if_absent(&Api::namespaced(client.clone(), ns), &lock).await
}

/// Delete the lock, but only the version that was observed (someone may have re-taken it).
pub async fn release_lock(
    client: &Client,
    cluster: &str,
    ns: &str,
    resource_version: Option<String>,
) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
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
        Err(e) => Err(e.into()),
    }
}

/// Generate the CA and create its Secret; never replaces an existing one. Returns whether this
/// call created it.
pub async fn create_ca(client: &Client, cluster: &Cluster, ns: &str) -> Result<bool, Error> {
    let cluster_name = cluster.name_any();
    let ca = CertificateAuthority::generate("etcd-ca")?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names::ca_secret_name(&cluster_name)),
            namespace: Some(ns.into()),
            labels: Some(cluster_labels(&cluster_name)),
            owner_references: Some(vec![cluster_owner(cluster)?]),
            ..Default::default()
        },
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            (
                names::TLS_CERT_KEY.to_string(),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
            (
                names::TLS_KEY_KEY.to_string(),
                ByteString(ca.key_pem().as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    };
    create_if_absent(&Api::namespaced(client.clone(), ns), &secret).await
}

/// Write the data Secret (`value`, `format`) controlled by `config`: create it, or bring an
/// existing one of ours (left by a crashed attempt) up to date.
pub async fn write_data_secret(
    client: &Client,
    config: &EtcdadmConfig,
    ns: &str,
    cluster: &str,
    user_data: &str,
) -> Result<(), Error> {
    let owner = config
        .controller_owner_ref(&())
        .ok_or_else(|| Error::InvalidObject(format!("EtcdadmConfig {} has no uid", config.name_any())))?;
    let data = BTreeMap::from([
        (
            names::DATA_SECRET_VALUE_KEY.to_string(),
            ByteString(user_data.as_bytes().to_vec()),
        ),
        (
            names::DATA_SECRET_FORMAT_KEY.to_string(),
            ByteString(config.spec.format().as_str().as_bytes().to_vec()),
        ),
    ]);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(config.name_any()),
            namespace: Some(ns.into()),
            labels: Some(cluster_labels(cluster)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(data.clone()),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    if !create_if_absent(&api, &secret).await? {
        // Only reached when observe saw no Secret: a racing writer of ours made it; make it current.
        let patch = serde_json::json!({ "data": data });
        api.patch(
            &config.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Step 8: publish `<cluster>-etcd-init` with the first member's address.
pub async fn publish_init_secret(
    client: &Client,
    cluster: &Cluster,
    ns: &str,
    address: &str,
) -> Result<bool, Error> {
    let cluster_name = cluster.name_any();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names::init_secret_name(&cluster_name)),
            namespace: Some(ns.into()),
            labels: Some(cluster_labels(&cluster_name)),
            owner_references: Some(vec![cluster_owner(cluster)?]),
            ..Default::default()
        },
        type_: Some(names::CLUSTER_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            (
                names::INIT_ADDRESS_KEY.to_string(),
                ByteString(address.as_bytes().to_vec()),
            ),
            (
                names::INIT_CLIENT_URLS_KEY.to_string(),
                ByteString(names::client_url(address).into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    create_if_absent(&Api::namespaced(client.clone(), ns), &secret).await
}
