//! What one machine's user data is rendered from: the config spec, the CA, whether it founds,
//! restores or joins the cluster (with the snapshot download of a restore), and the Secret
//! values the spec refers to.

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::config::{DEFAULT_LEARNER_LISTED_WAIT, EtcdadmConfigSpec};

use super::secrets::ResolvedSecrets;

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
    Join {
        urls: &'a [String],
        learner: Option<LearnerJoin>,
    },
}

/// A learner join: how long the machine waits for the EtcdadmCluster controller to add its
/// member (its turn may come after other joins) before it gives up without joining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnerJoin {
    pub listed_wait_seconds: u64,
}

impl LearnerJoin {
    /// The learner join `config` asks for, with the wait the controller wrote on it; `None` for
    /// a voter join.
    pub fn of(config: &EtcdadmConfig) -> Option<LearnerJoin> {
        config.joins_as_learner().then(|| LearnerJoin {
            listed_wait_seconds: config.learner_listed_wait().as_secs(),
        })
    }
}

impl Default for LearnerJoin {
    /// The wait when the controller wrote none.
    fn default() -> Self {
        LearnerJoin {
            listed_wait_seconds: DEFAULT_LEARNER_LISTED_WAIT.as_secs(),
        }
    }
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

/// The snapshot download of a restoring first member, from the Secret named by the config's
/// [`RESTORE_SECRET_ANNOTATION`](etcdadm_shared::names::RESTORE_SECRET_ANNOTATION).
#[derive(Clone, PartialEq)]
pub struct SnapshotDownload {
    /// Presigned GET URL: whoever holds it may read the snapshot until it expires.
    pub url: String,
    /// Hex SHA-256 of the object, checked before etcdadm sees the file.
    pub sha256: Option<String>,
    /// PEM bundle the store's certificate is checked against, instead of the machine's CAs.
    pub ca_pem: Option<String>,
    /// Raise the restored revision by this much, where the machine's etcdutl can.
    pub bump_revision: Option<i64>,
    /// The store is `insecure: true`: a plain `http://` URL is allowed.
    pub insecure: bool,
    /// The object's size in bytes, when the controller knows it.
    pub size: Option<u64>,
}

/// Never prints the URL (it grants access to the snapshot).
impl std::fmt::Debug for SnapshotDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotDownload")
            .field("url", &"<redacted>")
            .field("sha256", &self.sha256)
            .field("ca_pem", &self.ca_pem.is_some())
            .field("bump_revision", &self.bump_revision)
            .field("insecure", &self.insecure)
            .field("size", &self.size)
            .finish()
    }
}
