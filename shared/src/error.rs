//! The one error type of the controllers, both binaries: what ended a reconcile, and the
//! category (`category()`) that names its Event reason and metric label.

use crate::category::ErrorCategory;
use crate::contract::ContractError;
use crate::etcd::EtcdError;
use crate::pki::PkiError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("etcd PKI: {0}")]
    Pki(#[from] PkiError),
    /// Writing an object of the shared contracts (CA, init Secret, init lock) failed.
    #[error(transparent)]
    Contract(#[from] ContractError),
    #[error("{0}")]
    Etcd(#[from] EtcdError),
    #[error("encoding an object failed: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
    /// An object a step needs was deleted after it was observed; the next round sees it gone.
    #[error("{0}")]
    NotFound(String),
    /// Continuous backup's deltas could not be replayed onto a restored member.
    #[error("{0}")]
    Deltas(String),
    /// A state the code should never reach: a bug, reported rather than guessed around.
    #[error("internal error: {0}")]
    Internal(String),
    /// The reconcile was ended at its deadline (what it waited on is named); it is retried.
    #[error("the reconcile was ended after {}, waiting on {waiting_on}", crate::duration::format(*after))]
    Overdue {
        waiting_on: &'static str,
        after: std::time::Duration,
    },
}

impl Error {
    pub fn category(&self) -> ErrorCategory {
        match self {
            Error::Kube(_) => ErrorCategory::KubeApi,
            Error::Pki(_) => ErrorCategory::Pki,
            Error::Contract(e) => e.category(),
            Error::Etcd(e) => e.category(),
            Error::Json(_) => ErrorCategory::Encoding,
            Error::Store(e) => e.category(),
            Error::NotFound(_) => ErrorCategory::NotFound,
            Error::Deltas(_) => ErrorCategory::DeltasUnusable,
            Error::Internal(_) => ErrorCategory::Internal,
            Error::Overdue { .. } => ErrorCategory::ReconcileDeadline,
        }
    }
}
