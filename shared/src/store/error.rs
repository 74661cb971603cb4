//! Failures of object store requests, sorted into the causes a user can act on: the bucket or
//! object is missing, the credentials are refused, the endpoint gives no answer in time (or its
//! certificate is not trusted), or the store answered something else.
//!
//! A store is whatever endpoint a tenant names, so what it says is not repeated: a failure
//! carries the HTTP status and the S3 error code only (a code that is not a plain S3 code is
//! dropped), never the store's message or the text of a transport error, which could show what
//! answers on an internal address. Those details go to debug logs (`-v`).

use std::time::Duration;

use crate::category::ErrorCategory;
use crate::duration;

/// Why a request to the object store failed. Messages never carry credentials, signed URLs or
/// text the store sent.
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
    #[error("object {key:?} does not exist in bucket {bucket:?} at {endpoint} ({operation})")]
    ObjectMissing {
        endpoint: String,
        bucket: String,
        key: String,
        operation: &'static str,
    },
    #[error(
        "{endpoint} refused the credentials ({operation}): HTTP {status} {code}; check \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the credentials Secret and what they \
         may do on bucket {bucket:?}"
    )]
    AuthRefused {
        endpoint: String,
        bucket: String,
        operation: &'static str,
        status: u16,
        code: String,
    },
    #[error(
        "object store at {endpoint} gave no complete answer to {operation} within {} (no \
         connection, or too slow); check spec.backup.store.s3.endpoint and that the store runs",
        duration::format(*deadline)
    )]
    Unreachable {
        endpoint: String,
        operation: &'static str,
        deadline: Duration,
    },
    #[error(
        "TLS with the object store at {endpoint} failed ({operation}); its certificate must be \
         trusted by the system or by caSecretRef's ca.crt, for the endpoint's host name"
    )]
    Tls {
        endpoint: String,
        operation: &'static str,
    },
    #[error("the multipart upload {upload_id} of {key:?} no longer exists ({operation})")]
    NoSuchUpload {
        key: String,
        upload_id: String,
        operation: &'static str,
    },
    #[error("object store at {endpoint} answered {operation} with HTTP {status} {code}")]
    Refused {
        endpoint: String,
        operation: &'static str,
        status: u16,
        /// The S3 error code, or a description in parentheses when there is none.
        code: String,
    },
    #[error("invalid object store settings: {0}")]
    InvalidConfig(String),
    #[error("the object store at {endpoint} is not reached: {why}")]
    PolicyRefused { endpoint: String, why: String },
    #[error("{0}")]
    Interrupted(String),
}

impl StoreError {
    /// A stable CamelCase name for Event and condition reasons and metric labels.
    pub fn category(&self) -> ErrorCategory {
        match self {
            StoreError::BucketMissing { .. } => ErrorCategory::StoreBucketMissing,
            StoreError::ObjectMissing { .. } => ErrorCategory::StoreObjectMissing,
            StoreError::AuthRefused { .. } => ErrorCategory::StoreAuthRefused,
            StoreError::Unreachable { .. } => ErrorCategory::StoreUnreachable,
            StoreError::Tls { .. } => ErrorCategory::StoreTls,
            StoreError::NoSuchUpload { .. } => ErrorCategory::StoreNoSuchUpload,
            StoreError::Refused { .. } | StoreError::Interrupted(_) => ErrorCategory::StoreRefused,
            StoreError::InvalidConfig(_) => ErrorCategory::InvalidStore,
            StoreError::PolicyRefused { .. } => ErrorCategory::StorePolicyRefused,
        }
    }
}

/// What a status says when the answer had no S3 error code.
pub(crate) const NO_CODE: &str = "(no S3 error code)";

/// The `<Code>` of an S3 error document, if it is a plain S3 code (letters, digits and dots, at
/// most 64), and its `<Message>` (for debug logs only).
pub(crate) fn error_code_and_message(body: &str) -> (Option<String>, String) {
    let text = |tag: &str| {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        body.split_once(&open)
            .and_then(|(_, rest)| rest.split_once(&close))
            .map(|(inner, _)| inner.trim().to_string())
            .unwrap_or_default()
    };
    let code = text("Code");
    let plain =
        !code.is_empty() && code.len() <= 64 && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
    (plain.then_some(code), text("Message"))
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
    fn reads_a_plain_code_and_keeps_the_message_apart() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>x</BucketName></Error>"#;
        assert_eq!(
            error_code_and_message(body),
            (
                Some("NoSuchBucket".into()),
                "The specified bucket does not exist".into()
            )
        );
        assert_eq!(error_code_and_message(""), (None, String::new()));
        // What is not an S3 code is not repeated.
        for code in ["root:x:0:0 /etc/passwd", "a<b", &"A".repeat(65), "Ünïcode"] {
            let body = format!("<Error><Code>{code}</Code></Error>");
            assert_eq!(error_code_and_message(&body).0, None, "{code}");
        }
        assert!(is_auth_code("SignatureDoesNotMatch"));
        assert!(!is_auth_code("NoSuchKey"));
    }

    #[test]
    fn messages_show_status_and_code_only() {
        let err = StoreError::Refused {
            endpoint: "https://s3.example".into(),
            operation: "HeadBucket",
            status: 500,
            code: "InternalError".into(),
        };
        assert_eq!(
            err.to_string(),
            "object store at https://s3.example answered HeadBucket with HTTP 500 InternalError"
        );
        let err = StoreError::Unreachable {
            endpoint: "https://s3.example".into(),
            operation: "HeadBucket",
            deadline: Duration::from_secs(60),
        };
        assert!(err.to_string().contains("within 1m"), "{err}");
    }
}
