//! Performing the planned step, end to end: the lock, the CA, the rendered data Secret, the init
//! address, or the status a wait or a refusal shows; then the step's Event. Each write is safe
//! to repeat.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tracing::{debug, info};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::contract::{
    bytes, ca, cluster_secret, controller_reference, create_if_absent, init_lock, init_secret,
};
use etcdadm_shared::error::Error;
use etcdadm_shared::manager::events::{EventNote, Recorder};
use etcdadm_shared::manager::reconcile::{Next, REFUSED_REQUEUE, WAIT_REQUEUE};
use etcdadm_shared::names;
use etcdadm_shared::ssa;
use serde_json::json;

use super::plan::{Observation, Render, Step, reason};
use super::status::{Outcome, write_status};
use crate::metrics::{BootstrapMetrics, DataSecretOutcome};
use crate::render::{CaFiles, EtcdadmCommand, RenderInput, render_user_data};

/// Field manager of this controller's creations.
pub const FIELD_MANAGER: &str = "etcdadm-bootstrap";
/// The apply site of a data Secret's data.
const DATA_MANAGER: &str = "etcdadm-bootstrap/data-secret";

/// Where a step's effects go: the API server, Events, metrics.
pub struct Outputs<'a> {
    pub client: &'a Client,
    pub recorder: &'a Recorder,
    pub metrics: &'a BootstrapMetrics,
}

impl Outputs<'_> {
    async fn publish(&self, config: &EtcdadmConfig, note: EventNote) {
        self.recorder.note(config, "Reconcile", note).await;
    }
}

/// Perform `step` for `config` and report it.
pub async fn apply(
    out: &Outputs<'_>,
    config: &EtcdadmConfig,
    obs: &Observation,
    step: Step,
) -> Result<Next, Error> {
    let created = match &step {
        Step::Wait { reason, message } => {
            let outcome = Outcome::Waiting {
                reason,
                message: message.clone(),
            };
            write_status(out.client, config, outcome).await?;
            return Ok(Next::Done(Action::requeue(WAIT_REQUEUE)));
        }
        Step::Refuse { reason, message } => {
            refuse(out, config, reason, message.clone()).await?;
            return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
        }
        Step::Paused => {
            write_status(out.client, config, Outcome::Paused).await?;
            return Ok(Next::Done(Action::await_change()));
        }
        Step::Done => {
            write_status(out.client, config, Outcome::Rendered).await?;
            return Ok(Next::Done(Action::await_change()));
        }
        Step::AcquireLock { cluster, machine } => {
            init_lock::acquire(out.client, cluster, machine, FIELD_MANAGER).await?
        }
        Step::ReleaseStaleLock {
            cluster,
            resource_version,
            ..
        } => {
            init_lock::release(out.client, cluster, &obs.namespace, resource_version.clone()).await?;
            true
        }
        Step::CreateCa { cluster } => ca::create_ca(out.client, cluster, FIELD_MANAGER).await?,
        Step::RenderInit { render, restore } => {
            let command = match restore {
                Some(download) => EtcdadmCommand::InitFromSnapshot(download),
                None => EtcdadmCommand::Init,
            };
            if !render_and_store(out, config, obs, render, command).await? {
                return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
            }
            true
        }
        Step::RenderJoin {
            urls,
            learner,
            render,
        } => {
            let command = EtcdadmCommand::Join {
                urls,
                learner: *learner,
            };
            if !render_and_store(out, config, obs, render, command).await? {
                return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
            }
            true
        }
        Step::PublishInitAddress { address, cluster } => {
            let urls = [names::client_url(address)];
            init_secret::publish(out.client, cluster, address, &urls, FIELD_MANAGER).await?
        }
    };
    match step.event(obs) {
        Some((reason, note)) if created => {
            info!(reason, "{note}");
            out.publish(config, EventNote::normal(reason, note)).await;
        }
        _ => debug!(?step, "nothing to report: done already"),
    }
    Ok(Next::Again)
}

/// Something a human must fix: the condition says so, and a Warning Event the first time.
async fn refuse(
    out: &Outputs<'_>,
    config: &EtcdadmConfig,
    reason: &'static str,
    message: String,
) -> Result<(), Error> {
    let outcome = Outcome::Failed {
        reason,
        message: message.clone(),
    };
    if write_status(out.client, config, outcome).await? {
        out.publish(config, EventNote::warning(reason, message)).await;
    }
    Ok(())
}

/// Render the user data and write the data Secret; `false` when the spec cannot be rendered
/// (refused: the condition names the field).
async fn render_and_store(
    out: &Outputs<'_>,
    config: &EtcdadmConfig,
    obs: &Observation,
    render: &Render,
    command: EtcdadmCommand<'_>,
) -> Result<bool, Error> {
    let input = RenderInput {
        spec: &config.spec,
        machine_name: &render.machine,
        ca: CaFiles {
            cert_pem: render.ca.cert_pem(),
            key_pem: render.ca.key_pem(),
        },
        command,
        secrets: &obs.secrets,
    };
    let format = config.spec.format();
    let user_data = match render_user_data(&input) {
        Ok(user_data) => user_data,
        Err(e) => {
            out.metrics.data_secret(format, DataSecretOutcome::InvalidSpec);
            refuse(out, config, reason::INVALID_SPEC, e.to_string()).await?;
            return Ok(false);
        }
    };
    if let Err(e) = write_data_secret(out.client, config, &obs.namespace, &render.cluster, &user_data).await {
        out.metrics.data_secret(format, DataSecretOutcome::WriteFailed);
        return Err(e);
    }
    out.metrics.data_secret(format, DataSecretOutcome::Created);
    Ok(true)
}

/// Write the data Secret (`value`, `format`) controlled by `config`: create it, or bring an
/// existing one of ours (left by a crashed attempt) up to date.
async fn write_data_secret(
    client: &Client,
    config: &EtcdadmConfig,
    ns: &str,
    cluster: &str,
    user_data: &str,
) -> Result<(), Error> {
    let data = BTreeMap::from([
        (names::DATA_SECRET_VALUE_KEY.to_string(), bytes(user_data)),
        (
            names::DATA_SECRET_FORMAT_KEY.to_string(),
            bytes(config.spec.format().as_str()),
        ),
    ]);
    let secret = cluster_secret(
        config.name_any(),
        ns,
        cluster,
        controller_reference(config)?,
        data.clone(),
    );
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    if !create_if_absent(&api, &secret, FIELD_MANAGER).await? {
        // Only reached when observe saw no Secret: a racing writer of ours made it; make its
        // data current (this config's to decide, so forced).
        let body = ssa::configuration::<Secret>(&config.name_any(), json!({}), json!({ "data": data }));
        api.patch(
            &config.name_any(),
            &ssa::params(DATA_MANAGER, true),
            &Patch::Apply(body),
        )
        .await?;
    }
    Ok(())
}
