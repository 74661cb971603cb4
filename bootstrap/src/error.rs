//! The one error type of the bootstrap provider; `category` labels Events and metrics, in the
//! vocabulary both binaries share.

use etcdadm_shared::category::ErrorCategory;
use etcdadm_shared::contract::ContractError;
use etcdadm_shared::pki::PkiError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("etcd PKI: {0}")]
    Pki(#[from] PkiError),
    /// Writing an object of the shared contracts (CA, init Secret, init lock) failed.
    #[error(transparent)]
    Contract(#[from] ContractError),
    #[error("encoding an object failed: {0}")]
    Json(#[from] serde_json::Error),
    /// A state the code should never reach: a bug, reported rather than guessed around.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn category(&self) -> ErrorCategory {
        match self {
            Error::Kube(_) => ErrorCategory::KubeApi,
            Error::Pki(_) => ErrorCategory::Pki,
            Error::Contract(e) => e.category(),
            Error::Json(_) => ErrorCategory::Encoding,
            Error::Internal(_) => ErrorCategory::Internal,
        }
    }
}
