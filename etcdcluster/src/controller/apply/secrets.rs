//! Secrets: the etcd CA and `<cluster>-etcd-init` (shared contracts, created only if absent), the
//! join URLs kept on the healthy voters, the two Secrets the control plane is given, and the
//! re-issue of its client certificate.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use etcdadm_shared::contract::{bytes, ca, create_cluster_secret, init_secret};
use etcdadm_shared::names;
use etcdadm_shared::pki::LeafRequest;

use super::{Applied, FIELD_MANAGER, Outputs, observed};
use crate::controller::observe::Observation;
use crate::error::Error;

/// The apply site of the join URLs in `<cluster>-etcd-init`.
const JOIN_URLS_MANAGER: &str = "etcdadm-controller/init-secret-urls";

/// Generate the CA and create `<cluster>-managed-etcd`; an existing one is never replaced.
pub(super) async fn create_ca(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let cluster = observed(&obs.cluster, "Cluster")?;
    Ok(ca::create_ca(out.client, cluster, &obs.namespace, FIELD_MANAGER)
        .await?
        .into())
}

pub(super) async fn publish_init_secret(
    out: &Outputs<'_>,
    obs: &Observation,
    address: &str,
    client_urls: &[String],
) -> Result<Applied, Error> {
    let cluster = observed(&obs.cluster, "Cluster")?;
    Ok(init_secret::publish(
        out.client,
        cluster,
        &obs.namespace,
        address,
        client_urls,
        FIELD_MANAGER,
    )
    .await?
    .into())
}

/// Point the join URLs of `<cluster>-etcd-init` at the current healthy voters.
pub(super) async fn update_init_secret_urls(
    out: &Outputs<'_>,
    obs: &Observation,
    client_urls: &[String],
) -> Result<Applied, Error> {
    let cluster = observed(&obs.cluster, "Cluster")?.name_any();
    init_secret::apply_client_urls(
        out.client,
        &cluster,
        &obs.namespace,
        client_urls,
        JOIN_URLS_MANAGER,
    )
    .await?;
    Ok(Applied::Done)
}

/// Create the two Secrets KCP needs: `<cluster>-etcd` (CA certificate) and
/// `<cluster>-apiserver-etcd-client` (client certificate and key). Existing ones are kept.
pub(super) async fn create_kcp_secrets(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let cluster = observed(&obs.cluster, "Cluster")?;
    let ca = observed(&obs.ca, "etcd CA")?;
    let cluster_name = cluster.name_any();
    let ns = obs.namespace.as_str();
    let api: Api<Secret> = Api::namespaced(out.client.clone(), ns);
    let mut created = false;
    let ca_name = names::kcp_etcd_ca_secret_name(&cluster_name);
    if api.get_opt(&ca_name).await?.is_none() {
        let data = BTreeMap::from([(names::TLS_CERT_KEY.to_string(), bytes(ca.cert_pem()))]);
        created |= create_cluster_secret(out.client, cluster, ns, ca_name, data, FIELD_MANAGER).await?;
    }
    let client_name = names::apiserver_client_secret_name(&cluster_name);
    if api.get_opt(&client_name).await?.is_none() {
        // Issued only when the Secret is missing: an existing client certificate is kept.
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(&cluster_name))?;
        let data = BTreeMap::from([
            (names::TLS_CERT_KEY.to_string(), bytes(&leaf.cert_pem)),
            (names::TLS_KEY_KEY.to_string(), bytes(&leaf.key_pem)),
        ]);
        created |= create_cluster_secret(out.client, cluster, ns, client_name, data, FIELD_MANAGER).await?;
    }
    Ok(created.into())
}

/// Re-issue `<cluster>-apiserver-etcd-client` from the CA and note when on it, over exactly the
/// version observed: a concurrent writer makes this fail and the next pass decide again. The old
/// certificate is not revoked; it stays valid until it expires.
pub(super) async fn renew_apiserver_client(out: &Outputs<'_>, obs: &Observation) -> Result<Applied, Error> {
    let cluster = observed(&obs.cluster, "Cluster")?.name_any();
    let ca = observed(&obs.ca, "etcd CA")?;
    let secret = observed(&obs.apiserver_client, "API server client certificate Secret")?;
    let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(&cluster))?;
    let patch = json!({
        "metadata": {
            "resourceVersion": secret.resource_version,
            "annotations": { names::APISERVER_CLIENT_RENEWED_ANNOTATION: Timestamp::now().to_string() },
        },
        "data": {
            names::TLS_CERT_KEY: bytes(&leaf.cert_pem),
            names::TLS_KEY_KEY: bytes(&leaf.key_pem),
        },
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(out.client.clone(), &obs.namespace)
        .patch(
            &names::apiserver_client_secret_name(&cluster),
            &params,
            &Patch::Merge(&patch),
        )
        .await?;
    if std::env::var_os(names::EXIT_AFTER_CLIENT_RENEWAL_ENV).is_some() {
        warn!(
            "{} is set: exiting after the re-issue, as a crash would",
            names::EXIT_AFTER_CLIENT_RENEWAL_ENV
        );
        std::process::exit(3);
    }
    Ok(Applied::Done)
}
