//! The sim's infrastructure kinds as the API has them (their group, version, resources and
//! finalizer, a SimMachine's provider ID and what its status says of its user data), apart from
//! the provider that reconciles them (`infra`, `infra_report`), which both use.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

/// The API group of the sim's infrastructure kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// The version they are served at, which is also the CAPI contract they implement.
pub const VERSION: &str = "v1beta2";
/// The provider's finalizer on SimClusters and SimMachines.
pub const FINALIZER: &str = "sim.infrastructure.cluster.x-k8s.io";
/// The condition saying whether a SimMachine's user data ran to its end (CAPD's name for it).
pub const BOOTSTRAP_EXEC_SUCCEEDED: &str = "BootstrapExecSucceeded";
/// `spec.providerID` of the SimMachine of Machine `name`.
pub fn provider_id(name: &str) -> String {
    format!("sim:///{name}")
}
/// The field manager of the sim's infrastructure provider.
const MANAGER: &str = "sim-infrastructure";

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, VERSION, kind))
}

pub fn sim_machine_resource() -> ApiResource {
    resource("SimMachine")
}

pub fn sim_machine_template_resource() -> ApiResource {
    resource("SimMachineTemplate")
}

pub fn sim_cluster_resource() -> ApiResource {
    resource("SimCluster")
}

pub(crate) fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Whether every field of `wanted` is present with the same value in `current`.
pub fn is_subset(wanted: &Value, current: &Value) -> bool {
    match (wanted, current) {
        (Value::Object(w), Value::Object(c)) => {
            w.iter().all(|(k, v)| c.get(k).is_some_and(|cv| is_subset(v, cv)))
        }
        _ => wanted == current,
    }
}

/// Whether the SimMachine reports that its user data ran to its end.
pub fn bootstrap_succeeded(sim: &DynamicObject) -> bool {
    sim.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == BOOTSTRAP_EXEC_SUCCEEDED && c["status"] == "True")
        })
}

/// The Machines among `names` whose SimMachine does not yet report its user data ran to its end
/// (none of them under real CAPI and the stand-in alike has a phase that says so: without a
/// Node a Machine stays `Provisioned`).
pub async fn bootstrap_not_done(
    client: &Client,
    namespace: &str,
    names: &[String],
) -> Result<Vec<String>, kube::Error> {
    let sims: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &sim_machine_resource());
    let done: Vec<String> = sims
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|s| bootstrap_succeeded(s))
        .map(|s| s.name_any())
        .collect();
    Ok(names.iter().filter(|n| !done.contains(n)).cloned().collect())
}
