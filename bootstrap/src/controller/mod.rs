//! The EtcdadmConfig controller: observe → plan → apply one step → status, until the data
//! Secret exists; then keep status and the standalone init address current.

pub mod apply;
pub mod observe;
pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::conditions::{self, NewCondition, Severity};
use etcdadm_shared::api::config::BootstrapInitialization;
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig, EtcdadmConfigStatus};
use etcdadm_shared::manager::ManagerContext;
use etcdadm_shared::manager::invalid::report_invalid_object;
use etcdadm_shared::names;

use self::observe::Observation;
use self::plan::{Decision, reason};
use crate::error::Error;
use crate::metrics::{BootstrapMetrics, DataSecretOutcome};
use crate::render::{CaFiles, EtcdadmCommand, RenderInput, render_user_data};

/// Condition types this controller sets.
pub const READY: &str = "Ready";
pub const DATA_SECRET_AVAILABLE: &str = "DataSecretAvailable";
pub const PAUSED: &str = "Paused";

/// How long to wait before looking again while waiting on another actor.
const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// A config in a state only a human can fix is still looked at now and then.
const FAILED_REQUEUE: Duration = Duration::from_secs(60);
/// Steps (lock, CA, render) done in one reconcile before yielding.
const MAX_STEPS: usize = 6;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: BootstrapMetrics,
}

impl Context {
    /// A context whose metrics go to a registry nothing serves (tests, tools).
    pub fn new(client: Client) -> Self {
        Self::with_metrics(client, BootstrapMetrics::default())
    }

    /// A context reporting into `metrics`.
    pub fn with_metrics(client: Client, metrics: BootstrapMetrics) -> Self {
        let reporter = Reporter {
            controller: "etcdadm-bootstrap".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
        }
    }

    async fn event(&self, config: &EtcdadmConfig, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &config.object_ref(&())).await {
            warn!(config = %config.name_any(), error = %e, "publishing event failed");
        }
    }
}

/// Reconcile one EtcdadmConfig.
pub async fn reconcile(config: Arc<EtcdadmConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    for _ in 0..MAX_STEPS {
        let observation = observe::observe(&ctx.client, &config).await?;
        let decision = plan::plan(&observation.observed);
        publish_init_address(&ctx, &config, &observation).await?;
        match step(&ctx, &config, &observation, decision).await? {
            Next::Again => continue,
            Next::Done(action) => return Ok(action),
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

enum Next {
    /// Something changed; observe again.
    Again,
    Done(Action),
}

async fn step(
    ctx: &Context,
    config: &EtcdadmConfig,
    obs: &Observation,
    decision: Decision,
) -> Result<Next, Error> {
    let client = &ctx.client;
    let ns = obs.namespace.as_str();
    let cluster_name = obs
        .observed
        .machine
        .as_ref()
        .and_then(|m| m.cluster_name.clone())
        .unwrap_or_default();
    let machine_name = obs
        .observed
        .machine
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    match decision {
        Decision::Wait { reason, message } => {
            write_status(ctx, config, Outcome::Waiting { reason, message }).await?;
            Ok(Next::Done(Action::requeue(WAIT_REQUEUE)))
        }
        Decision::Fail { reason, message } => {
            if write_status(
                ctx,
                config,
                Outcome::Failed {
                    reason,
                    message: message.clone(),
                },
            )
            .await?
            {
                ctx.event(config, EventType::Warning, reason, message).await;
            }
            Ok(Next::Done(Action::requeue(FAILED_REQUEUE)))
        }
        Decision::Paused => {
            write_status(ctx, config, Outcome::Paused).await?;
            Ok(Next::Done(Action::await_change()))
        }
        Decision::Done => {
            write_status(ctx, config, Outcome::Rendered).await?;
            Ok(Next::Done(Action::await_change()))
        }
        Decision::AcquireLock => {
            let cluster = required(&obs.cluster, "Cluster")?;
            if apply::acquire_lock(client, cluster, ns, &machine_name).await? {
                info!(config = %config.name_any(), machine = %machine_name, "took the etcd init lock");
                let note = format!(
                    "Machine {machine_name} took the init lock {}",
                    names::init_lock_name(&cluster_name)
                );
                ctx.event(config, EventType::Normal, "InitLockAcquired", note)
                    .await;
            }
            Ok(Next::Again)
        }
        Decision::ReleaseStaleLock { holder } => {
            apply::release_lock(client, &cluster_name, ns, obs.lock_resource_version.clone()).await?;
            let note = format!("released the init lock held by Machine {holder}, which no longer exists");
            ctx.event(config, EventType::Normal, "InitLockReleased", note)
                .await;
            Ok(Next::Again)
        }
        Decision::CreateCa => {
            let cluster = required(&obs.cluster, "Cluster")?;
            if apply::create_ca(client, cluster, ns).await? {
                let note = format!(
                    "generated the etcd CA in Secret {}",
                    names::ca_secret_name(&cluster_name)
                );
                ctx.event(config, EventType::Normal, "CACreated", note).await;
            }
            Ok(Next::Again)
        }
        Decision::RenderInit => render_and_store(ctx, config, obs, EtcdadmCommand::Init, &cluster_name).await,
        Decision::RenderJoin { urls, learner } => {
            render_and_store(
                ctx,
                config,
                obs,
                EtcdadmCommand::Join { urls: &urls, learner },
                &cluster_name,
            )
            .await
        }
    }
}

fn required<'a, T>(value: &'a Option<T>, what: &str) -> Result<&'a T, Error> {
    value
        .as_ref()
        .ok_or_else(|| Error::InvalidObject(format!("{what} disappeared during reconcile")))
}

async fn render_and_store(
    ctx: &Context,
    config: &EtcdadmConfig,
    obs: &Observation,
    command: EtcdadmCommand<'_>,
    cluster_name: &str,
) -> Result<Next, Error> {
    let ca = required(&obs.ca, "etcd CA")?;
    let machine = required(&obs.machine, "Machine")?;
    let joining = match &command {
        EtcdadmCommand::Init => None,
        EtcdadmCommand::Join { urls, learner } => urls.first().map(|url| (url.clone(), *learner)),
    };
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
            ctx.metrics.data_secret(format, DataSecretOutcome::InvalidSpec);
            let message = e.to_string();
            if write_status(
                ctx,
                config,
                Outcome::Failed {
                    reason: reason::INVALID_SPEC,
                    message: message.clone(),
                },
            )
            .await?
            {
                ctx.event(config, EventType::Warning, reason::INVALID_SPEC, message)
                    .await;
            }
            return Ok(Next::Done(Action::requeue(FAILED_REQUEUE)));
        }
    };
    if let Err(e) =
        apply::write_data_secret(&ctx.client, config, &obs.namespace, cluster_name, &user_data).await
    {
        ctx.metrics.data_secret(format, DataSecretOutcome::WriteFailed);
        return Err(e);
    }
    ctx.metrics.data_secret(format, DataSecretOutcome::Created);
    let note = match joining {
        None => format!(
            "rendered etcdadm init user data for Machine {}",
            machine.name_any()
        ),
        Some((url, false)) => format!(
            "rendered etcdadm join {url} user data for Machine {}",
            machine.name_any()
        ),
        Some((url, true)) => format!(
            "rendered etcdadm join {url} user data for Machine {}, which waits for the \
             EtcdadmCluster controller to add it as a learner and to promote it",
            machine.name_any()
        ),
    };
    ctx.event(config, EventType::Normal, "DataSecretCreated", note)
        .await;
    Ok(Next::Again)
}

/// Step 8, checked on every pass (the Machine's address arrives after rendering).
async fn publish_init_address(ctx: &Context, config: &EtcdadmConfig, obs: &Observation) -> Result<(), Error> {
    let Some(address) = plan::init_address_to_publish(&obs.observed) else {
        return Ok(());
    };
    let cluster = required(&obs.cluster, "Cluster")?;
    if apply::publish_init_secret(&ctx.client, cluster, &obs.namespace, &address).await? {
        let note = format!(
            "published {} with the first member's address {address}",
            names::init_secret_name(&cluster.name_any())
        );
        ctx.event(config, EventType::Normal, "InitAddressPublished", note)
            .await;
    }
    Ok(())
}

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

/// Patch status if it changed; returns whether it did (callers emit Events only on change).
async fn write_status(ctx: &Context, config: &EtcdadmConfig, outcome: Outcome) -> Result<bool, Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // Status is computed from the freshest copy so a stale cache does not flap conditions.
    let api: Api<EtcdadmConfig> =
        Api::namespaced(ctx.client.clone(), &config.namespace().unwrap_or_default());
    let fresh = api
        .get_opt(&config.name_any())
        .await?
        .unwrap_or_else(|| config.clone());
    let Some(status) = next_status(&fresh, &outcome, &now) else {
        return Ok(false);
    };
    let patch = serde_json::json!({ "status": status });
    let params = PatchParams {
        field_manager: Some(apply::FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(&config.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

fn error_policy(config: Arc<DeserializeGuard<EtcdadmConfig>>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(config = %config.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(WAIT_REQUEUE)
}

/// Configs in `namespace` from the controller's cache.
fn configs_in(
    store: &Store<DeserializeGuard<EtcdadmConfig>>,
    namespace: Option<String>,
) -> Vec<ObjectRef<DeserializeGuard<EtcdadmConfig>>> {
    store
        .state()
        .iter()
        .filter(|c| c.namespace() == namespace)
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Reconcile with the runtime's timing and error metrics around it.
async fn measured_reconcile(
    guarded: Arc<DeserializeGuard<EtcdadmConfig>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let timer = ctx.metrics.reconcile_started();
    let result = match &guarded.0 {
        Ok(config) => reconcile(Arc::new(config.clone()), ctx).await,
        Err(invalid) => report_invalid(&ctx, invalid).await,
    };
    timer.finish(&result, Error::category);
    result
}

/// An EtcdadmConfig this version cannot read (say, an enum value it does not know) gets a
/// condition and an Event naming the problem; the watch and every other config go on.
async fn report_invalid(ctx: &Context, invalid: &InvalidObject) -> Result<Action, Error> {
    report_invalid_object::<EtcdadmConfig>(&ctx.client, &ctx.recorder, apply::FIELD_MANAGER, invalid).await?;
    Ok(Action::await_change())
}

/// Run the controller until the manager's shutdown signal. `--namespace` limits and
/// `--watch-filter` filters every watch; readiness is reported once the configs are listed.
pub async fn run(manager: ManagerContext, metrics: BootstrapMetrics) {
    let ManagerContext {
        client,
        settings,
        readiness,
        shutdown,
        ..
    } = manager;
    // Guarded: one object this version cannot read must not stop the watch for all the others.
    let (store, changes) = settings.watch_own_kind::<DeserializeGuard<EtcdadmConfig>>(&client, readiness);
    let controller = Controller::for_stream(changes, store.clone()).with_config(settings.controller_config());
    let cluster_store = store.clone();
    let etcd_store = store;
    let ctx = Arc::new(Context::with_metrics(client.clone(), metrics));
    controller
        .watches(
            settings.api::<DeserializeGuard<Machine>>(&client),
            settings.watcher_config(),
            |machine| {
                let machine = machine.0.as_ref().ok()?;
                let config_ref = machine.spec.bootstrap.config_ref.as_ref()?;
                let ns = machine.namespace()?;
                (config_ref.kind == "EtcdadmConfig").then(|| ObjectRef::new(&config_ref.name).within(&ns))
            },
        )
        .watches(
            settings.api::<DeserializeGuard<Cluster>>(&client),
            settings.watcher_config(),
            move |cluster| configs_in(&cluster_store, cluster.namespace()),
        )
        .watches(
            settings.api::<DeserializeGuard<EtcdadmCluster>>(&client),
            settings.watcher_config(),
            move |etcd| configs_in(&etcd_store, etcd.namespace()),
        )
        .reconcile_all_on(settings.resync_ticks())
        .graceful_shutdown_on(shutdown.wait())
        .run(measured_reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "controller event");
            }
        })
        .await;
}
