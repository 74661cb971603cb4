//! One vocabulary of error categories for both binaries: the `category` label of
//! `etcdadm_reconcile_errors_total` and the reason of a failure's Event, whichever controller
//! failed.

use std::fmt;

/// What kind of failure ended a reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// A Kubernetes API request failed; the API server's answer says why.
    KubeApi,
    /// An object's content cannot be read or acted on; its condition names the field.
    InvalidObject,
    /// An object a step needs was gone when the step ran (deleted after it was observed).
    NotFound,
    /// Keys or certificates could not be made or read.
    Pki,
    /// An object could not be encoded.
    Encoding,
    EtcdUnreachable,
    EtcdTimeout,
    EtcdTls,
    EtcdRefused,
    EtcdProtocol,
    EtcdInvalidInput,
    /// The object store: the bucket does not exist.
    StoreBucketMissing,
    /// The object store refused the credentials.
    StoreAuthRefused,
    /// The object store did not answer.
    StoreUnreachable,
    /// The object store's TLS failed.
    StoreTls,
    /// The object store refused the request for another reason.
    StoreRefused,
    /// An interrupted multipart upload the store no longer knows.
    StoreNoSuchUpload,
    /// The object named does not exist in the store.
    StoreObjectMissing,
    /// The store configuration cannot be used.
    InvalidStore,
    /// The controller's store policy refuses the store's address (`--store-*` flags).
    StorePolicyRefused,
    /// Continuous backup's deltas cannot be restored (a gap, a damaged object, or the store or
    /// the restored member not answering); nothing of them is left applied as done.
    DeltasUnusable,
    /// A reconcile took longer than its deadline and was ended; it is retried.
    ReconcileDeadline,
    /// A state the code should never reach: a bug, reported instead of guessed around.
    Internal,
}

impl ErrorCategory {
    /// Stable CamelCase name, for metric labels and Event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::KubeApi => "KubeApiError",
            ErrorCategory::InvalidObject => "InvalidObject",
            ErrorCategory::NotFound => "NotFound",
            ErrorCategory::Pki => "PkiError",
            ErrorCategory::Encoding => "EncodingError",
            ErrorCategory::EtcdUnreachable => "EtcdUnreachable",
            ErrorCategory::EtcdTimeout => "EtcdTimeout",
            ErrorCategory::EtcdTls => "EtcdTLSError",
            ErrorCategory::EtcdRefused => "EtcdRefused",
            ErrorCategory::EtcdProtocol => "EtcdProtocolError",
            ErrorCategory::EtcdInvalidInput => "EtcdInvalidInput",
            ErrorCategory::StoreBucketMissing => "BucketMissing",
            ErrorCategory::StoreAuthRefused => "AuthRefused",
            ErrorCategory::StoreUnreachable => "StoreUnreachable",
            ErrorCategory::StoreTls => "StoreTLSError",
            ErrorCategory::StoreRefused => "StoreError",
            ErrorCategory::StoreNoSuchUpload => "NoSuchUpload",
            ErrorCategory::StoreObjectMissing => "ObjectMissing",
            ErrorCategory::InvalidStore => "InvalidStore",
            ErrorCategory::StorePolicyRefused => "StorePolicyRefused",
            ErrorCategory::DeltasUnusable => "DeltasUnusable",
            ErrorCategory::ReconcileDeadline => "ReconcileDeadlineExceeded",
            ErrorCategory::Internal => "InternalError",
        }
    }
}

impl AsRef<str> for ErrorCategory {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
