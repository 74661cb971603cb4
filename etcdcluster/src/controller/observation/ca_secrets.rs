//! Why: the CA Secrets an etcd CA rotation decides from (docs/security.md, "Rotating the etcd
//! CA") are read with the CA itself, because the health check needs the next CA before any
//! concern is asked: the controller's etcd clients carry an identity from each CA in a rotation.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use etcdadm_shared::contract::ca::{Ca, CaView, ca_from_secret, ca_view};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

/// `<cluster>-managed-etcd` and `<cluster>-managed-etcd-next` as read, and the control plane's
/// two Secrets (read with the KubeadmControlPlane).
#[derive(Clone, Debug, Default)]
pub struct CaSecrets {
    /// `<cluster>-managed-etcd`'s metadata: its `ca-rotated-for` annotation and the version a
    /// rotation's last write goes over.
    pub current: Option<ObjectMeta>,
    /// `<cluster>-managed-etcd-next`, while a rotation is under way.
    pub next: Option<Secret>,
    /// Its CA, when usable.
    pub next_ca: Option<Ca>,
    /// `<cluster>-etcd` (what the API servers trust etcd's servers by), when read.
    pub kcp_etcd_ca: Option<Secret>,
    /// `<cluster>-apiserver-etcd-client`, when read.
    pub apiserver_client: Option<Secret>,
}

impl CaSecrets {
    /// The CAs the controller's etcd clients trust and carry an identity from: the current one
    /// and, during a rotation, the next.
    pub fn client_cas<'a>(&'a self, current: &'a CertificateAuthority) -> Vec<&'a CertificateAuthority> {
        std::iter::once(current).chain(self.next_ca.as_deref()).collect()
    }
}

/// The current CA as a plan sees it, with its metadata, and the next CA's Secret with its CA.
pub async fn read(
    secrets: &Api<Secret>,
    namespace: &str,
    cluster: &str,
) -> Result<(CaView, CaSecrets), Error> {
    let current_name = names::ca_secret_name(cluster);
    let next_name = names::next_ca_secret_name(cluster);
    let (current, next) = futures::try_join!(secrets.get_opt(&current_name), secrets.get_opt(&next_name))?;
    let view = ca_view(current.as_ref(), namespace, &current_name);
    let next_ca = next
        .as_ref()
        .and_then(|s| ca_from_secret(s, namespace, &next_name).ok())
        .map(Ca::new);
    Ok((
        view,
        CaSecrets {
            current: current.map(|s| s.metadata),
            next,
            next_ca,
            ..CaSecrets::default()
        },
    ))
}
