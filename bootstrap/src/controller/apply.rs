//! Performing the planned step, end to end: the lock, the CA, the rendered data Secret, the init
//! address, or the status a wait or a refusal shows; then the step's Event. Each write is safe
//! to repeat.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::contract::{
    bytes, ca, cluster_secret, controller_reference, create_if_absent, init_lock, init_secret,
};
use etcdadm_shared::manager::events::Recorder;
use etcdadm_shared::names;
use etcdadm_shared::ssa;
use serde_json::json;

use super::observe::Observation;
use super::plan::{Step, reason};
use super::status::{Outcome, write_status};
use crate::error::Error;
use crate::metrics::{BootstrapMetrics, DataSecretOutcome};
use crate::render::{CaFiles, EtcdadmCommand, RenderInput, render_user_data};

/// Field manager of this controller's creations.
pub const FIELD_MANAGER: &str = "etcdadm-bootstrap";
/// The apply site of a data Secret's data.
const DATA_MANAGER: &str = "etcdadm-bootstrap/data-secret";
/// How long to wait before looking again while waiting on another actor.
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// A config in a state only a human can fix is still looked at now and then.
const REFUSED_REQUEUE: Duration = Duration::from_secs(60);

/// Where a step's effects go: the API server, Events, metrics.
pub struct Outputs<'a> {
    pub client: &'a Client,
    pub recorder: &'a Recorder,
    pub metrics: &'a BootstrapMetrics,
}

impl Outputs<'_> {
    async fn publish(&self, config: &EtcdadmConfig, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &config.object_ref(&())).await {
            warn!(error = %e, "publishing event failed");
        }
    }
}

/// What the reconcile does after a step.
pub enum Next {
    /// Something changed; observe again.
    Again,
    Done(Action),
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
        Step::AcquireLock => {
            let machine = observed(&obs.machine, "Machine")?.name_any();
            init_lock::acquire(
                out.client,
                observed(&obs.cluster, "Cluster")?,
                &obs.namespace,
                &machine,
                FIELD_MANAGER,
            )
            .await?
        }
        Step::ReleaseStaleLock { .. } => {
            let cluster = observed(&obs.cluster, "Cluster")?.name_any();
            init_lock::release(
                out.client,
                &cluster,
                &obs.namespace,
                obs.lock_resource_version.clone(),
            )
            .await?;
            true
        }
        Step::CreateCa => {
            ca::create_ca(
                out.client,
                observed(&obs.cluster, "Cluster")?,
                &obs.namespace,
                FIELD_MANAGER,
            )
            .await?
        }
        Step::RenderInit => {
            let command = match &obs.restore {
                Some(download) => EtcdadmCommand::InitFromSnapshot(download),
                None => EtcdadmCommand::Init,
            };
            if !render_and_store(out, config, obs, command).await? {
                return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
            }
            true
        }
        Step::RenderJoin { urls, learner } => {
            let command = EtcdadmCommand::Join {
                urls,
                learner: *learner,
            };
            if !render_and_store(out, config, obs, command).await? {
                return Ok(Next::Done(Action::requeue(REFUSED_REQUEUE)));
            }
            true
        }
        Step::PublishInitAddress { address } => {
            let cluster = observed(&obs.cluster, "Cluster")?;
            let urls = [names::client_url(address)];
            init_secret::publish(out.client, cluster, &obs.namespace, address, &urls, FIELD_MANAGER).await?
        }
    };
    match step.event(&obs.observed) {
        Some((reason, note)) if created => {
            info!(reason, "{note}");
            out.publish(config, EventType::Normal, reason, note).await;
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
        out.publish(config, EventType::Warning, reason, message).await;
    }
    Ok(())
}

/// What a step needs of the observation, which the plan saw there.
fn observed<'a, T>(value: &'a Option<T>, what: &str) -> Result<&'a T, Error> {
    value.as_ref().ok_or_else(|| {
        Error::Internal(format!(
            "the plan chose a step that needs the {what}, which the observation does not hold"
        ))
    })
}

/// Render the user data and write the data Secret; `false` when the spec cannot be rendered
/// (refused: the condition names the field).
async fn render_and_store(
    out: &Outputs<'_>,
    config: &EtcdadmConfig,
    obs: &Observation,
    command: EtcdadmCommand<'_>,
) -> Result<bool, Error> {
    let ca = observed(&obs.ca, "etcd CA")?;
    let machine = observed(&obs.machine, "Machine")?;
    let input = RenderInput {
        spec: &config.spec,
        machine_name: &machine.name_any(),
        ca: CaFiles {
            cert_pem: ca.cert_pem(),
            key_pem: ca.key_pem(),
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
    let cluster = machine
        .labels()
        .get(names::CLUSTER_NAME_LABEL)
        .cloned()
        .unwrap_or_default();
    if let Err(e) = write_data_secret(out.client, config, &obs.namespace, &cluster, &user_data).await {
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
