//! Process machines: each sim Machine runs its user data with real etcd behind stand-in tools.
//!
//! A machine is an `etcdadm-sim-machine` process in a private mount and UTS namespace whose
//! `/etc`, `/var`, `/run`, ... are overlays backed by the machine's root directory. It executes
//! its cloud-config user data the way cloud-init would, or its Bottlerocket user data the way
//! the EKS Anywhere bootstrap container would, with `etcdadm`, `systemctl`, `hostname` and `ip`
//! stand-ins first on PATH; the stand-ins run the real etcd binary. Host tools the user data uses
//! (`sh`, `curl`, `openssl`, ...) are the host's.

pub mod bootstrap_container;
pub mod bottlerocket;
pub mod cloud_config;
pub mod error;
pub mod etcdadm;
pub mod executor;
pub mod isolation;
pub mod log;
pub mod network;
pub mod real_etcdadm;
pub mod runner;
pub mod runtime;
pub mod systemd;
pub mod write_files;

pub use error::MachineError;
pub use runtime::{BuiltInRuntime, ExternalRuntime, Fault, MachineRuntime, MachineSpec, MachineState};
