//! Failures: the crate's own error type, and API errors rendered as Kubernetes `Status` objects.

use std::path::PathBuf;

use serde_json::{Value, json};

/// What can go wrong setting up or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// A CRD directory or file could not be read.
    #[error("cannot read CRDs from {path}: {source}; check that the directory exists (config/crd/bases)")]
    ReadCrds {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A CRD file is not a valid CustomResourceDefinition.
    #[error("{path} is not a valid apiextensions.k8s.io/v1 CustomResourceDefinition: {message}")]
    ParseCrd {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A CRD is valid YAML but cannot be served.
    #[error("cannot serve CRD {name}: {message}")]
    InvalidCrd {
        /// The CRD's name.
        name: String,
        /// Why.
        message: String,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}; pick another address or port")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// An API error: becomes a `Status` response with this code and reason.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Kubernetes `StatusReason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` of the Status (name, group, kind), if any.
    pub details: Option<Value>,
}

/// Which object an error is about, as `Status.details` names it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// API group ("" for core).
    pub group: &'a str,
    /// Resource plural (the real server puts it in `details.kind`).
    pub plural: &'a str,
    /// Object name.
    pub name: &'a str,
}

impl Subject<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn details(&self) -> Value {
        json!({"name": self.name, "group": self.group, "kind": self.plural})
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, subject: Subject<'_>) -> Self {
        self.details = Some(subject.details());
        self
    }

    /// 404 for an object.
    pub fn not_found(subject: Subject<'_>) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", subject.qualified(), subject.name),
        )
        .about(subject)
    }

    /// 404 for a path that names no resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 on create of an existing name.
    pub fn already_exists(subject: Subject<'_>) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", subject.qualified(), subject.name),
        )
        .about(subject)
    }

    /// 409 on a failed precondition (resourceVersion, uid).
    pub fn conflict(subject: Subject<'_>, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {why}",
                subject.qualified(),
                subject.name
            ),
        )
        .about(subject)
    }

    /// 409 when server-side apply meets fields owned by another manager.
    pub fn apply_conflict(subject: Subject<'_>, message: String) -> Self {
        Self::new(409, "Conflict", message).about(subject)
    }

    /// 422 for an object that fails validation.
    pub fn invalid(kind: &str, name: &str, group: &str, causes: &str) -> Self {
        let mut err = Self::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {causes}"));
        err.details = Some(json!({"name": name, "group": group, "kind": kind}));
        err
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403, e.g. creating in a terminating namespace.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 405 for a verb this server does not implement on a resource.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 406 when every response form the client accepts is one this server does not produce.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 415 for a patch or body type this server does not implement.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 410 for a resourceVersion or continue token older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 500 for a bug in this server; never expected.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object the real server would send.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(obj)) = (&self.details, status.as_object_mut()) {
            obj.insert("details".into(), details.clone());
        }
        status
    }
}
