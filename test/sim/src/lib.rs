//! The local management plane: API server, CAPI stand-in and process machines, wired together
//! for the demo, the end-to-end scenarios and the benchmarks.

pub mod bench;
pub mod bench_boot;
pub mod bench_continuous;
pub mod bench_inputs;
pub mod bench_restore;
pub mod bench_rollout;
pub mod bench_scale;
pub mod bench_steps;
pub mod bench_timeline;
pub mod boot_delay;
pub mod capi;
pub mod control_plane_host;
pub mod dashboard_svg;
pub mod demo;
pub mod demo_webhooks;
pub mod error;
pub mod fake_etcd;
pub mod history;
pub mod hostile_etcd;
pub mod infra;
pub mod infra_kinds;
pub mod infra_report;
pub mod kcp;
pub mod load_balancer;
pub mod manifests;
pub mod netns;
pub mod plane;
pub mod real_apiserver;
pub mod real_capi;
pub mod saved_logs;
pub mod spdy;
pub mod wake;

use std::path::PathBuf;

/// The committed CRDs (config/crd/bases) of this repository.
pub fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/crd/bases")
}
