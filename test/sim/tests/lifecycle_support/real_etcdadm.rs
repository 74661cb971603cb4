#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]
//! Planes whose machines run the real etcdadm, each in a network namespace on a bridge of the
//! plane's own lab (see `etcdadm_sim_machines::network`).

use std::time::Duration;

use etcdadm_shared::testing::TempDir;
use etcdadm_sim::plane::{Machines, Plane};
use etcdadm_sim_machines::real_etcdadm;
use serde_json::Value;

/// A plane on the in-memory API server whose machines run the real etcdadm on lab `lab`
/// (`10.213.<lab>.N`; also the scenario's namespace prefix).
pub async fn start_plane(lab: u8, work: &TempDir, kcp_rollout_step: Duration) -> Plane {
    start_plane_with_image_tools(lab, work, kcp_rollout_step, vec![]).await
}

/// [`start_plane`] with machines whose image carries `image_tools` besides etcdadm.
pub async fn start_plane_with_image_tools(
    lab: u8,
    work: &TempDir,
    kcp_rollout_step: Duration,
    image_tools: Vec<std::path::PathBuf>,
) -> Plane {
    let mut options = super::plane_options(lab, work, kcp_rollout_step);
    options.machines = Machines::RealEtcdadm { lab };
    options.image_tools = image_tools;
    Plane::start(options).await.unwrap()
}

/// An EtcdadmConfig spec for real-etcdadm machines: `extra`'s fields over etcdadm built into the
/// image and etcd from the local release archive.
pub fn config(extra: Value) -> Value {
    let mut spec = real_etcdadm::config_spec().unwrap_or_else(|hint| panic!("{hint}"));
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    spec
}
