//! User data rendering: EtcdadmConfigSpec + CA + init/join choice in, cloud-config or
//! Bottlerocket bytes out.
//!
//! Pure: Secrets are fetched by the caller (see [`secret_refs`]) and handed in resolved.

mod bottlerocket;
pub mod cli;
mod cloud_config;
mod containerd;
mod error;
mod etcdadm_command;
mod files;
mod restore;
mod secrets;
mod shell;
mod yaml;

use etcdadm_shared::api::config::{EtcdadmConfigSpec, Format};

pub use bottlerocket::{DEFAULT_CIPHER_SUITES, HOST_ROOT};
pub use error::RenderError;
pub use etcdadm_command::{
    DEFAULT_ETCDADM_RELEASE, LEARNER_HEALTHY_WAIT_SECONDS, LEARNER_JOIN_SCRIPT, LEARNER_LISTED_WAIT_SECONDS,
    SUCCESS_SENTINEL,
};
pub use restore::{RESTORE_CURL_CONFIG, RESTORE_SNAPSHOT_FILE, SnapshotDownload};
pub use secrets::{REGISTRY_CREDENTIALS_SECRET, ResolvedSecrets, SecretRefUse, SecretTarget, secret_refs};

/// The etcd CA as PEM text (certificate, and the RSA key etcdadm signs member certificates with).
#[derive(Clone, Copy)]
pub struct CaFiles<'a> {
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
}

impl std::fmt::Debug for CaFiles<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaFiles")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Whether the machine founds the cluster or joins it.
#[derive(Debug, Clone, Copy)]
pub enum EtcdadmCommand<'a> {
    /// `etcdadm init`: the first member.
    Init,
    /// `etcdadm init --snapshot`: the first member, its data restored from a snapshot it
    /// downloads first (cloud-config only).
    InitFromSnapshot(&'a SnapshotDownload),
    /// `etcdadm join`: client URLs of healthy members. The upstream flavor uses the first only;
    /// the eks-anywhere flavor passes them all. `learner`: the EtcdadmCluster controller
    /// pre-adds the member as a learner (`EtcdadmConfig::joins_as_learner`, upstream flavor
    /// only), so the machine waits until it is listed and until it is promoted.
    Join { urls: &'a [String], learner: bool },
}

/// Everything one machine's user data depends on.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    pub spec: &'a EtcdadmConfigSpec,
    /// The Machine's name: etcdadm `--name`, so the member name is deterministic.
    pub machine_name: &'a str,
    pub ca: CaFiles<'a>,
    pub command: EtcdadmCommand<'a>,
    pub secrets: &'a ResolvedSecrets,
}

/// The user data for `input`, in the spec's format.
pub fn render_user_data(input: &RenderInput) -> Result<String, RenderError> {
    match input.spec.format() {
        Format::CloudConfig => cloud_config::render(input),
        Format::Bottlerocket => bottlerocket::render(input),
    }
}
