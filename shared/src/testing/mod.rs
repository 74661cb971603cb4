//! Real counterparts for tests: etcd members and clusters over TLS, a kube-apiserver, an S3 store
//! (SeaweedFS), each found the way CI installs it or failing with how to install it; and a
//! hostile stand-in for a store a tenant controls.
//!
//! Only compiled with the `testing` feature; the helpers panic on setup failures because a test
//! that cannot set up must fail loudly, never skip.
#![allow(clippy::panic, clippy::expect_used, clippy::unwrap_used)]

mod etcd;
pub use etcd::{
    ClusterState, ETCD_INSTALL_HINT, EtcdMemberProcess, TempDir, TlsEtcd, TlsEtcdCluster, etcd_binary,
    etcd_tools_dir, free_loopback_ip, mtls_http_client, tamper_value,
};

pub mod ports;

mod seaweedfs;
pub use seaweedfs::{CA_SECRET, CREDENTIALS_SECRET, SEAWEEDFS_INSTALL_HINT, SeaweedFs, weed_binary};

mod promtool;
pub use promtool::{PROMTOOL_HINT, promtool, run_promtool};

mod hostile_store;
pub use hostile_store::{HostileStore, Hostility, INTERNAL_TEXT};
