//! The one error type of the bootstrap provider; `category` labels Events and metrics.

use etcdadm_shared::pki::PkiError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    InvalidObject(String),
    #[error("etcd PKI: {0}")]
    Pki(#[from] PkiError),
    #[error("encoding an object failed: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Short machine-readable kind: `kube`, `invalid-object`, `pki`, `encoding`.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::InvalidObject(_) => "invalid-object",
            Error::Pki(_) => "pki",
            Error::Json(_) => "encoding",
        }
    }
}
