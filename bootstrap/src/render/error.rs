//! Why user data could not be rendered, always naming the spec field to fix.

/// A spec (or render input) that cannot become user data.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A `passwdFrom`/`contentFrom` whose Secret value the caller did not supply.
    #[error("{field_path}: Secret {secret_name} key {key} was not resolved")]
    UnresolvedSecret {
        field_path: String,
        secret_name: String,
        key: String,
    },
    /// A field whose value cannot be rendered safely or meaningfully.
    #[error("{field_path}: {message}")]
    InvalidField { field_path: String, message: String },
    /// A join was requested without any member to join through.
    #[error(
        "etcdadm join needs at least one etcd client URL to join through and none was given: \
         publish the init member's address (<cluster>-etcd-init) or wait for a healthy member"
    )]
    NoJoinUrl,
    /// The template engine failed (a bug: the template and its inputs are ours).
    #[error("rendering a user data template failed: {0}")]
    Template(#[from] askama::Error),
}

impl RenderError {
    pub(crate) fn invalid(field_path: impl Into<String>, message: impl Into<String>) -> Self {
        RenderError::InvalidField {
            field_path: field_path.into(),
            message: message.into(),
        }
    }

    /// The spec field the error is about, when there is one.
    pub fn field_path(&self) -> Option<&str> {
        match self {
            RenderError::UnresolvedSecret { field_path, .. }
            | RenderError::InvalidField { field_path, .. } => Some(field_path),
            RenderError::NoJoinUrl | RenderError::Template(_) => None,
        }
    }
}
