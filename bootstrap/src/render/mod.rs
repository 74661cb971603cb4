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
mod input;
mod jinja;
mod restore;
mod secrets;
mod shell;
mod yaml;

use etcdadm_shared::api::config::Format;

pub use bottlerocket::{DEFAULT_CIPHER_SUITES, HOST_ROOT};
pub use error::RenderError;
pub use etcdadm_command::{
    DEFAULT_ETCDADM_RELEASE, LEARNER_HEALTHY_WAIT_SECONDS, LEARNER_JOIN_SCRIPT, LEARNER_LISTED_WAIT_SECONDS,
    SUCCESS_SENTINEL,
};
pub use input::{CaFiles, EtcdadmCommand, LearnerJoin, RenderInput, SnapshotDownload};
pub use restore::{
    RESTORE_BUMP_SCRIPT, RESTORE_BUMP_SCRIPT_CONTENT, RESTORE_CURL_CONFIG, RESTORE_SNAPSHOT_FILE,
};
pub use secrets::{REGISTRY_CREDENTIALS_SECRET, ResolvedSecrets, SecretRefUse, SecretTarget, secret_refs};

/// The user data for `input`, in the spec's format.
pub fn render_user_data(input: &RenderInput) -> Result<String, RenderError> {
    match input.spec.format() {
        Format::CloudConfig => cloud_config::render(input),
        Format::Bottlerocket => bottlerocket::render(input),
    }
}
