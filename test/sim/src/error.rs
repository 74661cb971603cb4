//! Errors of the sim: setup problems say what to install or build.

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid object: {0}")]
    Json(#[from] serde_json::Error),
    #[error("setup: {0}")]
    Setup(String),
    #[error("timed out: {0}")]
    Timeout(String),
}
