//! Failures of object store requests, sorted into the causes a user can act on: the bucket is
//! missing, the credentials are refused, the endpoint cannot be reached (or its certificate is
//! not trusted), or the store answered something else.

use crate::category::ErrorCategory;

/// Why a request to the object store failed. Messages never carry credentials or signed URLs.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "bucket {bucket:?} does not exist at {endpoint} ({operation}); create it, or fix \
         spec.backup.store.s3.bucket"
    )]
    BucketMissing {
        endpoint: String,
        bucket: String,
        operation: &'static str,
    },
    #[error(
        "{endpoint} refused the credentials ({operation}): {code}: {message}; check \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the credentials Secret and what they \
         may do on bucket {bucket:?}"
    )]
    AuthRefused {
        endpoint: String,
        bucket: String,
        operation: &'static str,
        code: String,
        message: String,
    },
    #[error(
        "object store at {endpoint} is unreachable ({operation}): {message}; check \
         spec.backup.store.s3.endpoint and that the store runs"
    )]
    Unreachable {
        endpoint: String,
        operation: &'static str,
        message: String,
    },
    #[error(
        "TLS with the object store at {endpoint} failed ({operation}): {message}; its \
         certificate must be trusted by the system or by caSecretRef's ca.crt"
    )]
    Tls {
        endpoint: String,
        operation: &'static str,
        message: String,
    },
    #[error("the multipart upload {upload_id} of {key:?} no longer exists ({operation})")]
    NoSuchUpload {
        key: String,
        upload_id: String,
        operation: &'static str,
    },
    #[error("object store at {endpoint} answered {operation} with HTTP {status}: {code}: {message}")]
    Refused {
        endpoint: String,
        operation: &'static str,
        status: u16,
        code: String,
        message: String,
    },
    #[error("invalid object store settings: {0}")]
    InvalidConfig(String),
    #[error("{0}")]
    Interrupted(String),
}

impl StoreError {
    /// A stable CamelCase name for Event and condition reasons and metric labels.
    pub fn category(&self) -> ErrorCategory {
        match self {
            StoreError::BucketMissing { .. } => ErrorCategory::StoreBucketMissing,
            StoreError::AuthRefused { .. } => ErrorCategory::StoreAuthRefused,
            StoreError::Unreachable { .. } => ErrorCategory::StoreUnreachable,
            StoreError::Tls { .. } => ErrorCategory::StoreTls,
            StoreError::NoSuchUpload { .. } => ErrorCategory::StoreNoSuchUpload,
            StoreError::Refused { .. } | StoreError::Interrupted(_) => ErrorCategory::StoreRefused,
            StoreError::InvalidConfig(_) => ErrorCategory::InvalidStore,
        }
    }
}

/// The `<Code>` and `<Message>` of an S3 error document (empty when absent).
pub(crate) fn error_code_and_message(body: &str) -> (String, String) {
    let text = |tag: &str| {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        body.split_once(&open)
            .and_then(|(_, rest)| rest.split_once(&close))
            .map(|(inner, _)| inner.trim().to_string())
            .unwrap_or_default()
    };
    (text("Code"), text("Message"))
}

/// S3 error codes that mean the credentials (or what they may do) are the problem.
pub(crate) fn is_auth_code(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "InvalidToken"
            | "ExpiredToken"
            | "AuthorizationHeaderMalformed"
            | "AuthorizationQueryParametersError"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_code_and_message_of_an_s3_error() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>x</BucketName></Error>"#;
        assert_eq!(
            error_code_and_message(body),
            (
                "NoSuchBucket".into(),
                "The specified bucket does not exist".into()
            )
        );
        assert_eq!(error_code_and_message(""), (String::new(), String::new()));
        assert!(is_auth_code("SignatureDoesNotMatch"));
        assert!(!is_auth_code("NoSuchKey"));
    }
}
