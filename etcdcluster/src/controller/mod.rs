//! The EtcdadmCluster controller: observe (API reads, etcd health) → plan one step → apply it
//! (status first), repeated a few times per reconcile, then requeued at the health-check
//! interval. Each pass enters each stage once. The layers, lowest first: `observation`,
//! `decision` (the words every concern speaks), `rules` (the membership safety rules), the
//! concerns in `plan`, `plan` itself (their sum and order), `status` and `apply`
//! (docs/architecture.md).

pub mod apply;
pub mod decision;
pub mod observation;
pub mod plan;
pub mod rules;
pub mod status;
#[cfg(test)]
pub(crate) mod testing;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;
use tracing::{debug, instrument, warn};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane, Machine};
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::error::Error;
use etcdadm_shared::manager::ManagerContext;
use etcdadm_shared::manager::events::Recorder;
use etcdadm_shared::manager::invalid::report_invalid_object;
use etcdadm_shared::manager::reconcile::{Next, WAIT_REQUEUE};
use etcdadm_shared::names;

use self::decision::Outputs;
use self::observation::health::{self, EtcdClients};
use self::observation::memo::Observations;
use self::observation::{Checked, Observation};
use self::watches::{
    Guarded, etcd_clusters_in, etcd_clusters_of, etcd_clusters_using, member_of, waiting_on,
    worth_reconciling,
};
use crate::metrics::EtcdClusterMetrics;

/// The apply site of the condition an unreadable object gets.
const INVALID_OBJECT_MANAGER: &str = "etcdadm-controller/invalid-object";
/// Steps applied in one reconcile before yielding.
const MAX_STEPS: usize = 8;
/// How long one reconcile may hold its turn, besides what a step declares it may take (a
/// defragmentation: [`plan::Step::time_allowed`]): its reads, one health round (each member at
/// most `healthCheck.timeout`, at most 30 s) and up to [`MAX_STEPS`] steps. A reconcile still
/// at work then is ended (and retried after the usual wait), so no cluster's numbers hold one
/// of the `--concurrency` turns for longer.
pub const RECONCILE_DEADLINE: Duration = Duration::from_secs(180);

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// Controller client certificates and member clients, per etcd cluster.
    pub etcd_clients: EtcdClients,
    /// Observations reused by health rounds while nothing they were made from changed.
    pub observations: Observations,
    /// Per-cluster metrics, when run by the manager (tests go without).
    pub metrics: Option<EtcdClusterMetrics>,
    /// `--concurrency` reconciles at work at once, each taking a turn in the order it fell due.
    /// kube-runtime's own limit parks the due requests in a hash set while its slots are full
    /// and takes them out in hash order, so under a sustained overload (thousands of clusters'
    /// health rounds on a busy machine) the same clusters waited minutes; here everyone is late
    /// by the same amount.
    pub turns: Semaphore,
    /// How long one reconcile may take ([`RECONCILE_DEADLINE`]; tests shorten it).
    pub reconcile_deadline: Duration,
    /// Restore checksums, computed in the snapshot slots rather than in a reconcile.
    pub checksums: crate::snapshot::Checksums,
    /// Restores' deltas, replayed in the snapshot slots rather than in a reconcile.
    pub replays: crate::snapshot::Replays,
}

impl Context {
    pub fn new(client: Client) -> Self {
        Context {
            recorder: Recorder::for_controller(client.clone(), "etcdadm-controller"),
            client,
            etcd_clients: EtcdClients::new(),
            observations: Observations::default(),
            metrics: None,
            turns: Semaphore::new(Semaphore::MAX_PERMITS),
            reconcile_deadline: RECONCILE_DEADLINE,
            checksums: crate::snapshot::Checksums::new(crate::snapshot::SnapshotPool::new(
                crate::snapshot::DEFAULT_SNAPSHOT_SLOTS,
            )),
            replays: crate::snapshot::Replays::new(crate::snapshot::SnapshotPool::new(
                crate::snapshot::DEFAULT_SNAPSHOT_SLOTS,
            )),
        }
    }

    /// The same, exporting per-cluster metrics.
    pub fn with_metrics(client: Client, metrics: EtcdClusterMetrics) -> Self {
        Context {
            metrics: Some(metrics),
            ..Context::new(client)
        }
    }

    /// Something the observations of `clusters` were made from changed; passes them on.
    fn changed(&self, clusters: Vec<ObjectRef<Guarded>>) -> Vec<ObjectRef<Guarded>> {
        for cluster in &clusters {
            let namespace = cluster.namespace.as_deref().unwrap_or_default();
            self.observations
                .invalidate(&format!("{namespace}/{}", cluster.name));
        }
        clusters
    }

    fn outputs(&self) -> Outputs<'_> {
        Outputs {
            client: &self.client,
            recorder: &self.recorder,
            etcd_clients: &self.etcd_clients,
            metrics: self.metrics.as_ref(),
            checksums: &self.checksums,
            replays: &self.replays,
        }
    }
}

/// Reconcile one EtcdadmCluster.
#[instrument(skip_all, fields(namespace = etcd.namespace().unwrap_or_default(), name = etcd.name_any()))]
pub async fn reconcile(etcd: Arc<EtcdadmCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = etcd.namespace().ok_or_else(|| {
        Error::Internal(format!(
            "EtcdadmCluster {} reached reconcile without a namespace",
            etcd.name_any()
        ))
    })?;
    let name = etcd.name_any();
    let key = format!("{namespace}/{name}");
    let out = ctx.outputs();
    let mut deadline = Deadline::after(ctx.reconcile_deadline);
    // The etcd side is checked once per reconcile: the steps taken in between do not change it.
    let mut etcd_view: Option<Checked> = None;
    // A kept observation may be used to find that nothing needs doing, never to do something.
    let mut read_afresh = false;
    for _ in 0..MAX_STEPS {
        let read = ctx.observations.read(
            &ctx.client,
            &namespace,
            &name,
            &etcd,
            read_afresh,
            &plan::Concerns,
        );
        let Some((reads, fresh)) = deadline.within("the API reads", read).await?? else {
            ctx.etcd_clients.forget(&key);
            ctx.observations.forget(&key);
            ctx.checksums.forget(&key);
            ctx.replays.forget(&key);
            return Ok(Action::await_change());
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let view = match &etcd_view {
            Some(view) => view.clone(),
            None => {
                let check = health::check_observed(&ctx.etcd_clients, ctx.metrics.as_ref(), &reads, now);
                let view = deadline.within("the members' health", check).await??;
                etcd_view = Some(view.clone());
                view
            }
        };
        let mut observation = Observation::new(&reads, view, now, &plan::Concerns);
        let step = plan::plan(&observation);
        if step.writes() && !fresh {
            read_afresh = true;
            continue;
        }
        if step.writes() {
            let (why, message) = step.reason();
            debug!(reason = why, %message, "applying step");
            ctx.observations.invalidate(&key);
            read_afresh = true;
        }
        deadline.extend(step.time_allowed());
        let next = deadline
            .within("a step", apply::apply(&out, &mut observation, step))
            .await??;
        // The status just written is what the watch cache will hold next.
        ctx.observations.carry(&key, &observation.etcd_cluster);
        match next {
            Next::Again => continue,
            Next::Done(action) => return Ok(action),
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// When a reconcile must be done by, and how long it was given.
struct Deadline {
    at: tokio::time::Instant,
    given: Duration,
}

impl Deadline {
    fn after(given: Duration) -> Self {
        Deadline {
            at: tokio::time::Instant::now() + given,
            given,
        }
    }

    /// A step that may take `more` moves it later.
    fn extend(&mut self, more: Duration) {
        self.at += more;
        self.given += more;
    }

    /// `work`, unless the deadline passes first (`waiting_on` names it then).
    async fn within<T>(&self, waiting_on: &'static str, work: impl Future<Output = T>) -> Result<T, Error> {
        tokio::time::timeout_at(self.at, work)
            .await
            .map_err(|_| Error::Overdue {
                waiting_on,
                after: self.given,
            })
    }
}

fn error_policy(etcd: Arc<Guarded>, error: &Error, _ctx: Arc<Context>) -> Action {
    // The one place a failed reconcile is logged.
    warn!(namespace = etcd.namespace().unwrap_or_default(), name = etcd.name_any(), category = %error.category(), %error, "reconcile failed");
    Action::requeue(WAIT_REQUEUE)
}

/// Name of this controller in metrics and logs.
pub const CONTROLLER_NAME: &str = "etcdadmcluster";

/// Run the controller until the manager's shutdown signal. `--namespace` limits and
/// `--watch-filter` filters every watch; readiness is reported once the clusters are listed.
pub async fn run(manager: ManagerContext, pool: Arc<crate::snapshot::SnapshotPool>) {
    // The controller and its watches are one builder chain: split, it would pass pieces around.
    let ManagerContext {
        client,
        settings,
        readiness,
        shutdown,
        metrics,
        ..
    } = manager;
    // Guarded: one object this version cannot read must not stop the watch for all the others.
    let (store, changes) = settings.watch_own_kind::<Guarded>(&client, readiness);
    let changes = changes.predicate_filter(worth_reconciling, PredicateConfig::default());
    // No limit of kube-runtime's: `--concurrency` is enforced by `Context::turns` instead.
    let controller =
        Controller::for_stream(changes, store.clone()).with_config(controller::Config::default());
    let cluster_store = store.clone();
    let kcp_store = store;
    let ctx = Arc::new(Context {
        turns: Semaphore::new(usize::from(settings.concurrency)),
        checksums: crate::snapshot::Checksums::new(pool.clone()),
        replays: crate::snapshot::Replays::new(pool),
        ..Context::with_metrics(
            client.clone(),
            EtcdClusterMetrics::register(&metrics, plan::concern_metrics(&metrics)),
        )
    });
    // Only member Machines, within the `--watch-filter` selection if there is one.
    let mut member_machines = settings.watcher_config();
    member_machines.label_selector = Some(match member_machines.label_selector.take() {
        Some(filter) => format!("{filter},{}", names::ETCD_CLUSTER_LABEL),
        None => names::ETCD_CLUSTER_LABEL.to_string(),
    });
    let measured = move |guarded: Arc<Guarded>, ctx: Arc<Context>| {
        let metrics = metrics.clone();
        async move {
            // Waiting for a turn holds no connection; the reconcile's own state is allocated
            // once the turn comes (boxed below).
            let _turn = ctx.turns.acquire().await;
            let timer = metrics.reconcile_started(CONTROLLER_NAME);
            let result = match &guarded.0 {
                Ok(etcd) => Box::pin(reconcile(Arc::new(etcd.clone()), ctx.clone())).await,
                Err(invalid) => report_invalid_object::<EtcdadmCluster>(
                    &ctx.client,
                    &ctx.recorder,
                    INVALID_OBJECT_MANAGER,
                    invalid,
                )
                .await
                .map(|()| Action::await_change())
                .map_err(Error::from),
            };
            timer.finish(&result, Error::category);
            result
        }
    };
    // The Secrets the controller depends on, metadata only (memory stays flat however many
    // Secrets a namespace holds), by the cluster-name label they carry.
    let mut cluster_secrets = settings.watcher_config();
    cluster_secrets.label_selector = Some(match cluster_secrets.label_selector.take() {
        Some(filter) => format!("{filter},{}", names::CLUSTER_NAME_LABEL),
        None => names::CLUSTER_NAME_LABEL.to_string(),
    });
    let secrets = settings.watch::<PartialObjectMeta<Secret>>(&client, cluster_secrets);
    let secret_store = cluster_store.clone();
    // Before-change snapshots (by their reason label): a change waiting for one goes on as soon
    // as it is taken.
    let mut before_change_snapshots = settings.watcher_config();
    before_change_snapshots.label_selector = Some(match before_change_snapshots.label_selector.take() {
        Some(filter) => format!("{filter},{}", names::SNAPSHOT_REASON_LABEL),
        None => names::SNAPSHOT_REASON_LABEL.to_string(),
    });
    // Every event that triggers a reconcile also ends the reuse of that cluster's observation.
    let (machines_ctx, clusters_ctx, kcps_ctx, secrets_ctx, snapshots_ctx) =
        (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());
    controller
        .watches_stream(
            settings.watch::<DeserializeGuard<Machine>>(&client, member_machines),
            move |machine| machines_ctx.changed(member_of(&machine)),
        )
        .watches_stream(
            settings.watch::<DeserializeGuard<Cluster>>(&client, settings.watcher_config()),
            move |cluster| match &cluster.0 {
                Ok(cluster) => clusters_ctx.changed(etcd_clusters_of(&cluster_store, cluster)),
                Err(_) => vec![],
            },
        )
        .watches_stream(
            settings.watch::<DeserializeGuard<KubeadmControlPlane>>(&client, settings.watcher_config()),
            move |kcp| kcps_ctx.changed(etcd_clusters_in(&kcp_store, kcp.namespace())),
        )
        .watches_stream(
            settings.watch::<DeserializeGuard<EtcdadmSnapshot>>(&client, before_change_snapshots),
            move |snapshot| snapshots_ctx.changed(waiting_on(&snapshot)),
        )
        .watches_stream(secrets, move |secret| {
            secrets_ctx.changed(etcd_clusters_using(&secret_store, &secret))
        })
        .reconcile_all_on(settings.resync_ticks())
        .graceful_shutdown_on(shutdown.wait())
        .run(measured, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                // Logged by `error_policy` already.
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "controller event"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[tokio::test]
    async fn a_member_machine_event_reaches_its_cluster_and_ends_the_reuse_of_its_observation() {
        let machine = |labels: serde_json::Value| -> DeserializeGuard<Machine> {
            DeserializeGuard(Ok(serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m1", "namespace": "default", "labels": labels},
                "spec": {"clusterName": "c1", "bootstrap": {},
                         "infrastructureRef": {"apiGroup": "x", "kind": "K", "name": "i"}},
            }))
            .unwrap()))
        };
        let member = machine(serde_json::json!({names::ETCD_CLUSTER_LABEL: "c1-etcd"}));
        let refs = member_of(&member);
        assert_eq!(refs, vec![ObjectRef::<Guarded>::new("c1-etcd").within("default")]);
        assert!(member_of(&machine(serde_json::json!({}))).is_empty());

        let client = Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let ctx = Context::new(client);
        let epoch = ctx.observations.epoch("default/c1-etcd");
        assert_eq!(ctx.changed(refs.clone()), refs);
        assert_ne!(ctx.observations.epoch("default/c1-etcd"), epoch);
    }
}
