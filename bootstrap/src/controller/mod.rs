//! The EtcdadmConfig controller: observe → plan one step → apply it (status included), until
//! the data Secret exists; then keep status and the standalone init address current.

pub mod apply;
pub mod observe;
pub mod plan;
pub mod status;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, ResourceExt};
use tracing::{instrument, warn};

use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::manager::ManagerContext;
use etcdadm_shared::manager::events::Recorder;
use etcdadm_shared::manager::invalid::report_invalid_object;
use etcdadm_shared::manager::reconcile::{Next, WAIT_REQUEUE};

use self::apply::Outputs;
use self::watches::{cluster_inputs, configs_of_cluster, configs_of_etcd_cluster, etcd_cluster_inputs};
use crate::metrics::BootstrapMetrics;
use etcdadm_shared::error::Error;

/// The apply site of the condition an unreadable object gets.
const INVALID_OBJECT_MANAGER: &str = "etcdadm-bootstrap/invalid-object";
/// Steps (lock, CA, render, init address) done in one reconcile before yielding.
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
        Context {
            recorder: Recorder::for_controller(client.clone(), "etcdadm-bootstrap"),
            client,
            metrics,
        }
    }
}

/// Reconcile one EtcdadmConfig.
#[instrument(skip_all, fields(namespace = config.namespace().unwrap_or_default(), name = config.name_any()))]
pub async fn reconcile(config: Arc<EtcdadmConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let out = Outputs {
        client: &ctx.client,
        recorder: &ctx.recorder,
        metrics: &ctx.metrics,
    };
    for _ in 0..MAX_STEPS {
        let observation = observe::observe(&ctx.client, &config).await?;
        let step = plan::plan(&observation);
        match apply::apply(&out, &config, &observation, step).await? {
            Next::Again => continue,
            Next::Done(action) => return Ok(action),
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

fn error_policy(config: Arc<DeserializeGuard<EtcdadmConfig>>, error: &Error, _ctx: Arc<Context>) -> Action {
    // The one place a failed reconcile is logged.
    warn!(namespace = config.namespace().unwrap_or_default(), name = config.name_any(), category = %error.category(), %error, "reconcile failed");
    Action::requeue(WAIT_REQUEUE)
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
    report_invalid_object::<EtcdadmConfig>(&ctx.client, &ctx.recorder, INVALID_OBJECT_MANAGER, invalid)
        .await?;
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
    let clusters = settings
        .watch::<DeserializeGuard<Cluster>>(&client, settings.watcher_config())
        .predicate_filter(cluster_inputs, PredicateConfig::default());
    let etcd_clusters = settings
        .watch::<DeserializeGuard<EtcdadmCluster>>(&client, settings.watcher_config())
        .predicate_filter(etcd_cluster_inputs, PredicateConfig::default());
    controller
        .watches_stream(
            settings.watch::<DeserializeGuard<Machine>>(&client, settings.watcher_config()),
            |machine| {
                let machine = machine.0.as_ref().ok()?;
                let config_ref = machine.spec.bootstrap.config_ref.as_ref()?;
                let ns = machine.namespace()?;
                (config_ref.kind == "EtcdadmConfig").then(|| ObjectRef::new(&config_ref.name).within(&ns))
            },
        )
        .watches_stream(clusters, move |cluster| {
            configs_of_cluster(&cluster_store, &cluster)
        })
        .watches_stream(etcd_clusters, move |etcd| {
            configs_of_etcd_cluster(&etcd_store, &etcd)
        })
        .reconcile_all_on(settings.resync_ticks())
        .graceful_shutdown_on(shutdown.wait())
        .run(measured_reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                // Logged by `error_policy` already.
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "controller event"),
            }
        })
        .await;
}
