//! The CA rotation's writes (docs/security.md, "Rotating the etcd CA"), each idempotent: the
//! next CA is created beside the current one, never over anything; the current CA Secret is
//! written once, at the end, over exactly the version read; what is already so is left alone.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use etcdadm_shared::contract::{ClusterRef, bytes, cluster_secret, create_if_absent};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};

use crate::controller::decision::FIELD_MANAGER;

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Generate the next CA and create `<cluster>-managed-etcd-next` for `request`, owned by the
/// Cluster; an existing Secret of that name is never replaced. Its common name carries the time
/// it was made, so it differs from the current CA's (`etcd-ca`, or an earlier rotation's): a
/// client of both tells them apart by the names a member accepts. Returns whether this call
/// created it.
pub async fn create_next_ca(client: &Client, cluster: &ClusterRef, request: &str) -> Result<bool, Error> {
    let ca = CertificateAuthority::generate(&format!("etcd-ca-{}", Timestamp::now().as_second()))?;
    let data = [
        (names::TLS_CERT_KEY.to_string(), bytes(ca.cert_pem())),
        (names::TLS_KEY_KEY.to_string(), bytes(ca.key_pem())),
    ]
    .into_iter()
    .collect();
    let mut secret = cluster_secret(
        names::next_ca_secret_name(&cluster.name),
        &cluster.namespace,
        &cluster.name,
        cluster.owner.clone(),
        data,
    );
    secret.metadata.annotations = Some(
        [(names::CA_ROTATED_FOR_ANNOTATION.to_string(), request.to_string())]
            .into_iter()
            .collect(),
    );
    let api = Api::<Secret>::namespaced(client.clone(), &cluster.namespace);
    Ok(create_if_absent(&api, &secret, FIELD_MANAGER).await?)
}

/// `<cluster>-etcd` trusts `trusted` (their certificates, in order); with `reissue_from`,
/// `<cluster>-apiserver-etcd-client` is re-issued from that CA and marked with the time, which
/// the control plane rollout follows. The trust first: an API server made between the two
/// writes trusts every member either way.
pub async fn hand_control_plane(
    client: &Client,
    namespace: &str,
    cluster: &str,
    trusted: &[&CertificateAuthority],
    reissue_from: Option<&CertificateAuthority>,
) -> Result<(), Error> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let bundle: String = trusted.iter().map(|ca| ca.cert_pem()).collect();
    let trust = json!({ "data": { names::TLS_CERT_KEY: bytes(&bundle) } });
    api.patch(
        &names::kcp_etcd_ca_secret_name(cluster),
        &params(),
        &Patch::Merge(&trust),
    )
    .await?;
    if let Some(ca) = reissue_from {
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(cluster))?;
        let patch = json!({
            "metadata": {
                "annotations": { names::APISERVER_CLIENT_RENEWED_ANNOTATION: Timestamp::now().to_string() },
            },
            "data": {
                names::TLS_CERT_KEY: bytes(&leaf.cert_pem),
                names::TLS_KEY_KEY: bytes(&leaf.key_pem),
            },
        });
        api.patch(
            &names::apiserver_client_secret_name(cluster),
            &params(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Write `next` into `<cluster>-managed-etcd`, marked with the `request` it was made for, over
/// exactly `resource_version` (the version the plan read): a Secret changed since fails the
/// write, and the next pass decides again. The rotation is then done and the old CA gone.
pub async fn adopt_next_ca(
    client: &Client,
    namespace: &str,
    cluster: &str,
    resource_version: &str,
    next: &CertificateAuthority,
    request: &str,
) -> Result<(), Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { names::CA_ROTATED_FOR_ANNOTATION: request },
        },
        "data": {
            names::TLS_CERT_KEY: bytes(next.cert_pem()),
            names::TLS_KEY_KEY: bytes(next.key_pem()),
        },
    });
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(&names::ca_secret_name(cluster), &params(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// After the adoption: `<cluster>-etcd` trusts `trust_only` alone when given (new control
/// plane Machines; the running ones keep both until they are replaced), then
/// `<cluster>-managed-etcd-next` is deleted (already gone: done).
pub async fn forget_old_ca(
    client: &Client,
    namespace: &str,
    cluster: &str,
    trust_only: Option<&CertificateAuthority>,
) -> Result<(), Error> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    if let Some(ca) = trust_only {
        hand_control_plane(client, namespace, cluster, &[ca], None).await?;
    }
    match api
        .delete(&names::next_ca_secret_name(cluster), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
