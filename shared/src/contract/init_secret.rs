//! `<cluster>-etcd-init`: the first member's address and the client URLs new members join
//! through. Published once by whichever provider runs the first member (the EtcdadmCluster
//! controller, or the bootstrap provider for a standalone Machine); the EtcdadmCluster
//! controller keeps its URLs on the healthy voters.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;

use super::{ClusterRef, ContractError, bytes, create_cluster_secret, secret_text};
use crate::names;
use crate::ssa;

/// What `<cluster>-etcd-init` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitSecret {
    pub address: Option<String>,
    pub client_urls: Vec<String>,
}

impl InitSecret {
    /// What `secret` says; blank values count as absent.
    pub fn from_secret(secret: &Secret) -> Self {
        InitSecret {
            address: secret_text(secret, names::INIT_ADDRESS_KEY)
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty()),
            client_urls: secret_text(secret, names::INIT_CLIENT_URLS_KEY)
                .map(|urls| {
                    urls.split(',')
                        .map(str::trim)
                        .filter(|u| !u.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Where a new member joins: the client URLs, else the first member's client URL.
    pub fn join_urls(&self) -> Vec<String> {
        if !self.client_urls.is_empty() {
            return self.client_urls.clone();
        }
        self.address.iter().map(|a| names::client_url(a)).collect()
    }
}

/// Publish `<cluster>-etcd-init` with `address` and `client_urls`, owned by the Cluster; an
/// existing one is kept. Returns whether this call created it.
pub async fn publish(
    client: &Client,
    cluster: &ClusterRef,
    address: &str,
    client_urls: &[String],
    field_manager: &str,
) -> Result<bool, ContractError> {
    let data = BTreeMap::from([
        (names::INIT_ADDRESS_KEY.to_string(), bytes(address)),
        (
            names::INIT_CLIENT_URLS_KEY.to_string(),
            bytes(&client_urls.join(",")),
        ),
    ]);
    let name = names::init_secret_name(&cluster.name);
    create_cluster_secret(client, cluster, name, data, field_manager).await
}

/// Point the join URLs of `<cluster>-etcd-init` at `client_urls`, by server-side apply of that
/// one key as `field_manager` (forced: the key is the applier's alone).
pub async fn apply_client_urls(
    client: &Client,
    cluster: &str,
    namespace: &str,
    client_urls: &[String],
    field_manager: &str,
) -> Result<(), kube::Error> {
    let name = names::init_secret_name(cluster);
    let data = json!({ "data": { names::INIT_CLIENT_URLS_KEY: bytes(&client_urls.join(",")) } });
    let body = ssa::configuration::<Secret>(&name, json!({}), data);
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    api.patch(&name, &ssa::params(field_manager, true), &Patch::Apply(&body))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(data.iter().map(|(k, v)| (k.to_string(), bytes(v))).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn both_providers_read_the_same_urls_and_fall_back_to_the_address() {
        let published = InitSecret::from_secret(&secret(&[
            (names::INIT_ADDRESS_KEY, " 10.0.0.1 "),
            (
                names::INIT_CLIENT_URLS_KEY,
                "https://10.0.0.1:2379, ,https://10.0.0.2:2379",
            ),
        ]));
        assert_eq!(published.address.as_deref(), Some("10.0.0.1"));
        assert_eq!(
            published.join_urls(),
            ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
        );
        let reference = InitSecret::from_secret(&secret(&[(names::INIT_ADDRESS_KEY, "fd00::1")]));
        assert!(reference.client_urls.is_empty());
        assert_eq!(reference.join_urls(), ["https://[fd00::1]:2379"]);
        let blank = InitSecret::from_secret(&secret(&[(names::INIT_ADDRESS_KEY, " ")]));
        assert_eq!(blank, InitSecret::default());
        assert!(blank.join_urls().is_empty());
    }
}
