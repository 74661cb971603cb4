//! The scenarios' real kube-apiserver (`etcdadm_sim::real_apiserver`: our CRDs and the sim's,
//! config/rbac, each controller as its own ServiceAccount); a setup failure fails the test.

pub use etcdadm_sim::real_apiserver::{RealApiServer, forbidden_lines};

/// Start one, or fail the test saying why (a missing kube-apiserver names how to install it).
pub async fn start() -> RealApiServer {
    RealApiServer::start().await.unwrap_or_else(|e| panic!("{e}"))
}
