//! The reads the snapshot controller plans from: the EtcdadmCluster and its snapshots, listed
//! fresh from the API (a cached list could still show an attempt this controller just finished
//! as Running), and the Secrets a snapshot needs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{CA_BUNDLE_KEY, EtcdadmSnapshot, S3Store};
use etcdadm_shared::contract::ca::ca_from_secret;
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::store::{StoreClient, StoreCredentials, StoreError};

use etcdadm_shared::error::Error;

/// Common name of the client certificate the controller reads snapshots and watches with.
pub const CLIENT_COMMON_NAME: &str = "etcdadm-controller";

/// The snapshots of the EtcdadmCluster `cluster` in `namespace`, as the API has them now.
pub async fn snapshots_of(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> Result<Vec<EtcdadmSnapshot>, Error> {
    let api: Api<EtcdadmSnapshot> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.cluster_name == cluster)
        .collect())
}

/// The Secrets `cluster`'s store names that exist without clusterctl's move label.
pub async fn unlabelled_store_secrets(
    client: &Client,
    namespace: &str,
    cluster: &EtcdadmCluster,
) -> Result<Vec<String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut unlabelled = Vec::new();
    for name in super::moving::store_secrets(cluster) {
        if let Some(secret) = secrets.get_opt(&name).await?
            && !secret.labels().contains_key(super::moving::MOVE_LABEL)
        {
            unlabelled.push(name);
        }
    }
    Ok(unlabelled)
}

/// The EtcdadmSnapshots a restore or a recovery of any EtcdadmCluster in `namespace` names
/// (`spec.restore.snapshot.name`, `status.recovery`, `status.lastRecovery`,
/// `status.restoredFrom`): retention never deletes them.
pub async fn referenced_snapshots(client: &Client, namespace: &str) -> Result<Vec<String>, Error> {
    let clusters: Api<EtcdadmCluster> = Api::namespaced(client.clone(), namespace);
    let mut names = Vec::new();
    for cluster in clusters.list(&ListParams::default()).await?.items {
        names.extend(
            cluster
                .spec
                .restore
                .as_ref()
                .and_then(|r| r.snapshot.name.clone()),
        );
        if let Some(status) = cluster.status {
            names.extend(status.recovery.map(|r| r.snapshot));
            names.extend(status.last_recovery.map(|r| r.snapshot));
            names.extend(status.restored_from.and_then(|r| r.snapshot));
        }
    }
    Ok(names)
}

/// The CAPI Cluster an EtcdadmCluster serves: its cluster-name label, else the Cluster that owns
/// it (the EKS-A fork links them by reference; the EtcdadmCluster controller then adds the
/// owner reference).
pub fn capi_cluster_name(etcd: &EtcdadmCluster) -> Option<String> {
    etcd.labels().get(names::CLUSTER_NAME_LABEL).cloned().or_else(|| {
        etcd.owner_references()
            .iter()
            .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
            .map(|o| o.name.clone())
    })
}

/// The etcd CAs of `etcd`'s cluster (the current one, then the next one during a rotation), or
/// why they cannot be had.
pub async fn cluster_cas(
    client: &Client,
    etcd: &EtcdadmCluster,
) -> Result<Result<Vec<CertificateAuthority>, String>, Error> {
    let namespace = etcd.namespace().unwrap_or_default();
    let Some(cluster) = capi_cluster_name(etcd) else {
        return Ok(Err(format!(
            "EtcdadmCluster {} names no Cluster (label {})",
            etcd.name_any(),
            names::CLUSTER_NAME_LABEL
        )));
    };
    let name = names::ca_secret_name(&cluster);
    let next_name = names::next_ca_secret_name(&cluster);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let (current, next) = futures::try_join!(secrets.get_opt(&name), secrets.get_opt(&next_name))?;
    let current = match current {
        None => {
            return Ok(Err(format!(
                "the etcd CA Secret {namespace}/{name} does not exist"
            )));
        }
        Some(secret) => ca_from_secret(&secret, &namespace, &name),
    };
    // During a rotation members signed by the next CA, trusting it alone, are reached too.
    let next = next.and_then(|secret| ca_from_secret(&secret, &namespace, &next_name).ok());
    Ok(current.map(|current| std::iter::once(current).chain(next).collect()))
}

/// A client of `store` with the credentials (and CA) from its Secrets in `namespace`, its
/// ordinary requests ending within `deadline`; a missing Secret or key is a store problem
/// ([`StoreError::InvalidConfig`]).
pub async fn store_client(
    client: &Client,
    namespace: &str,
    store: &S3Store,
    deadline: Duration,
) -> Result<Result<StoreClient, StoreError>, Error> {
    Ok(store_access(client, namespace, store)
        .await?
        .map(|(store_client, _)| store_client.with_request_deadline(deadline)))
}

/// [`store_client`], and the CA bundle it trusts (for a node that downloads from the store too).
pub async fn store_access(
    client: &Client,
    namespace: &str,
    store: &S3Store,
) -> Result<Result<(StoreClient, Option<String>), StoreError>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let credentials_name = &store.credentials_secret_ref.name;
    let Some(credentials) = secrets.get_opt(credentials_name).await? else {
        return Ok(Err(StoreError::InvalidConfig(format!(
            "the credentials Secret {namespace}/{credentials_name} does not exist"
        ))));
    };
    let data = credentials.data.unwrap_or_default();
    let credentials =
        match StoreCredentials::from_secret_data(&format!("{namespace}/{credentials_name}"), &data) {
            Ok(credentials) => credentials,
            Err(e) => return Ok(Err(e)),
        };
    let ca_pem = match store_ca(client, namespace, store).await? {
        Ok(ca_pem) => ca_pem,
        Err(e) => return Ok(Err(e)),
    };
    Ok(StoreClient::new(store, credentials, ca_pem.as_deref()).map(|store_client| (store_client, ca_pem)))
}

/// The PEM bundle `store`'s endpoint certificate is checked against (`caSecretRef`), if any; a
/// missing Secret or key is a store problem.
async fn store_ca(
    client: &Client,
    namespace: &str,
    store: &S3Store,
) -> Result<Result<Option<String>, StoreError>, Error> {
    let Some(reference) = &store.ca_secret_ref else {
        return Ok(Ok(None));
    };
    let missing = |what: &str| {
        StoreError::InvalidConfig(format!("the CA Secret {namespace}/{} {what}", reference.name))
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(secret) = secrets.get_opt(&reference.name).await? else {
        return Ok(Err(missing("does not exist")));
    };
    let Some(bytes) = secret.data.unwrap_or_default().remove(CA_BUNDLE_KEY) else {
        return Ok(Err(missing(&format!("has no {CA_BUNDLE_KEY}"))));
    };
    Ok(match String::from_utf8(bytes.0) {
        Ok(pem) => Ok(Some(pem)),
        Err(_) => Err(missing(&format!("has a {CA_BUNDLE_KEY} that is not PEM"))),
    })
}
