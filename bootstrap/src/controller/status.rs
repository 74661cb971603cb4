//! The status an EtcdadmConfig shows: computed purely from what the reconcile came to, and
//! written only when it changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch};

pub use etcdadm_shared::api::conditions::READY;
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::api::config::BootstrapInitialization;
use etcdadm_shared::api::{EtcdadmConfig, EtcdadmConfigStatus};
use etcdadm_shared::ssa;

use super::plan::reason;
use etcdadm_shared::error::Error;

/// Condition types this controller sets besides `Ready`.
pub const DATA_SECRET_AVAILABLE: &str = "DataSecretAvailable";
pub const PAUSED: &str = "Paused";

/// The apply site of status.
const FIELD_MANAGER: &str = "etcdadm-bootstrap/status";

/// What status should say after this reconcile.
pub enum Outcome {
    Waiting { reason: &'static str, message: String },
    Failed { reason: &'static str, message: String },
    Paused,
    Rendered,
}

/// Compute the new status from `outcome`; `None` when nothing changes.
pub fn next_status(config: &EtcdadmConfig, outcome: &Outcome, now: &Time) -> Option<EtcdadmConfigStatus> {
    let old = config.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let generation = config.metadata.generation;
    status.observed_generation = generation;
    let paused = matches!(outcome, Outcome::Paused);
    let not_paused = NewCondition::false_(PAUSED, Severity::Info, "NotPaused", "");
    let paused_condition = if paused {
        NewCondition::true_(PAUSED, reason::PAUSED)
    } else {
        not_paused
    };
    conditions::set(&mut status.conditions, paused_condition, generation, now);
    match outcome {
        Outcome::Paused => {}
        Outcome::Rendered => {
            status.ready = true;
            status.data_secret_name = Some(config.name_any());
            status.initialization = Some(BootstrapInitialization {
                data_secret_created: Some(true),
            });
            for type_ in [DATA_SECRET_AVAILABLE, READY] {
                conditions::set(
                    &mut status.conditions,
                    NewCondition::true_(type_, reason::DATA_SECRET_CREATED),
                    generation,
                    now,
                );
            }
        }
        Outcome::Waiting { reason, message } | Outcome::Failed { reason, message } => {
            let severity = if matches!(outcome, Outcome::Failed { .. }) {
                Severity::Error
            } else {
                Severity::Info
            };
            for type_ in [DATA_SECRET_AVAILABLE, READY] {
                let condition = NewCondition::false_(type_, severity, reason, message.as_str());
                conditions::set(&mut status.conditions, condition, generation, now);
            }
        }
    }
    (status != old).then_some(status)
}

/// Apply status if it changed; returns whether it did (callers emit Events only on change).
pub async fn write_status(
    client: &kube::Client,
    config: &EtcdadmConfig,
    outcome: Outcome,
) -> Result<bool, Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // Status is computed from the freshest copy so a stale cache does not flap conditions.
    let api: Api<EtcdadmConfig> = Api::namespaced(client.clone(), &config.namespace().unwrap_or_default());
    let fresh = api
        .get_opt(&config.name_any())
        .await?
        .unwrap_or_else(|| config.clone());
    let Some(status) = next_status(&fresh, &outcome, &now) else {
        return Ok(false);
    };
    // The whole status, every time: its fields are this controller's alone.
    let body = ssa::configuration::<EtcdadmConfig>(
        &config.name_any(),
        serde_json::json!({}),
        serde_json::json!({ "status": status }),
    );
    api.patch_status(
        &config.name_any(),
        &ssa::params(FIELD_MANAGER, true),
        &Patch::Apply(body),
    )
    .await?;
    Ok(true)
}
