//! The one error type of the EtcdadmCluster controller; `category` names Event reasons and
//! metric labels.

use etcdadm_shared::etcd::EtcdError;
use etcdadm_shared::pki::PkiError;
use etcdadm_shared::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    InvalidObject(String),
    #[error("etcd PKI: {0}")]
    Pki(#[from] PkiError),
    #[error("{0}")]
    Etcd(#[from] EtcdError),
    #[error("encoding an object failed: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl Error {
    /// Stable CamelCase name for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeApiError",
            Error::InvalidObject(_) => "InvalidObject",
            Error::Pki(_) => "PkiError",
            Error::Etcd(e) => e.category(),
            Error::Json(_) => "EncodingError",
            Error::Store(e) => e.category(),
        }
    }
}
