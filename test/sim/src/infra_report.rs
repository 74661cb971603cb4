//! What a SimMachine says of its machine, split from the provider's reconcile (`infra`): its
//! provider ID, address, whether it is provisioned and whether its user data ran to its end.

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch};
use serde_json::{Value, json};

use etcdadm_sim_machines::MachineState;

use crate::infra::SimInfra;
use crate::infra_kinds::{BOOTSTRAP_EXEC_SUCCEEDED, is_subset, params, provider_id};

impl SimInfra {
    /// What the SimMachine says of its machine: provider ID, address, provisioned, whether its
    /// user data ran, and a terminal failure when it could not boot.
    pub(crate) async fn report(
        &self,
        api: &Api<DynamicObject>,
        sim: &DynamicObject,
        machine_name: &str,
        address: &str,
        runs_user_data: bool,
    ) -> Result<(), kube::Error> {
        let name = sim.name_any();
        let id = provider_id(machine_name);
        if sim.data.pointer("/spec/providerID").and_then(Value::as_str) != Some(id.as_str()) {
            api.patch(
                &name,
                &params(),
                &Patch::Merge(&json!({"spec": {"providerID": id}})),
            )
            .await?;
        }
        let mut status = json!({
            "initialization": {"provisioned": true},
            "addresses": [{"type": "InternalIP", "address": address}],
        });
        if runs_user_data {
            let state = match (self.runtime.state(machine_name), &self.control_plane) {
                (MachineState::Off, Some(hosts)) => hosts.state(machine_name),
                (state, _) => state,
            };
            let (condition, failure) = match state {
                MachineState::Running {
                    bootstrap_succeeded: true,
                } => (("True", "BootstrapExecSucceeded", String::new()), None),
                MachineState::Running {
                    bootstrap_succeeded: false,
                } => (
                    (
                        "False",
                        "BootstrapFailed",
                        "the user data did not run to its end".into(),
                    ),
                    None,
                ),
                MachineState::Failed { reason } => {
                    (("False", "BootstrapFailed", reason.clone()), Some(reason))
                }
                MachineState::Booting | MachineState::Off => (
                    ("False", "Bootstrapping", "the user data is running".into()),
                    None,
                ),
            };
            let (state, reason, message) = condition;
            status["conditions"] = json!([condition_json(sim, state, reason, &message)]);
            if let Some(reason) = failure {
                status["failureReason"] = json!("BootstrapFailed");
                status["failureMessage"] = json!(reason);
            }
        }
        if sim
            .data
            .get("status")
            .is_some_and(|current| is_subset(&status, current))
        {
            return Ok(());
        }
        api.patch_status(&name, &params(), &Patch::Merge(&json!({ "status": status })))
            .await?;
        Ok(())
    }
}

/// A v1beta2 condition of `sim`, keeping its transition time while the status stays.
fn condition_json(sim: &DynamicObject, status: &str, reason: &str, message: &str) -> Value {
    let current = sim
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c["type"] == BOOTSTRAP_EXEC_SUCCEEDED && c["status"] == status)
        });
    let since = current
        .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
        .unwrap_or_else(|| {
            k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        });
    json!({
        "type": BOOTSTRAP_EXEC_SUCCEEDED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    })
}
