//! The snapshot controller: per EtcdadmCluster, observe (the cluster and its EtcdadmSnapshots)
//! → plan one step → apply, until nothing is left to do; it takes on-demand and scheduled
//! snapshots into the cluster's object store and applies retention (docs/day2.md, "Snapshots and restore").
//!
//! Reconciles are keyed by EtcdadmCluster, and kube-runtime never runs two for one key at once:
//! that, and taking a snapshot inside the reconcile, is what keeps one snapshot in flight per
//! cluster. Across clusters, snapshots take one of a few slots (`--max-concurrent-snapshots`),
//! so the memory they hold stays bounded. Snapshots naming a cluster that does not exist are failed by a second, small
//! controller keyed by snapshot (the first never hears of a cluster it has no object for).
//!
//! What survives `clusterctl move` (which copies no status) is `moving`'s: a finished
//! snapshot's record, and the store's Secrets labelled to move.
//!
//! A controller that dies while taking a snapshot leaves it Running with its upload recorded;
//! the next reconcile aborts that upload and takes the snapshot again, at most
//! [`plan::MAX_ATTEMPTS`] times in all.

mod apply;
mod checksums;
mod context;
mod continuous;
mod drill;
mod moving;
mod observe;
mod plan;
mod pool;
mod replays;
mod retention;
mod status;
mod take;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tracing::warn;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::manager::ManagerContext;
use etcdadm_shared::manager::invalid::report_invalid_object;

use crate::metrics::SnapshotMetrics;

pub use self::apply::new_snapshot;
pub use self::checksums::{Checksum, Checksums};
pub use self::context::{
    Context, DEFAULT_SNAPSHOT_SLOTS, FIELD_MANAGER, MISSING_CLUSTER_GRACE, STREAM_IDLE_TIMEOUT,
};
pub use self::drill::run::{Report as DrillReport, Settings as DrillSettings, drill as run_drill};
pub use self::drill::{Due as DrillDue, due as drill_due};
pub use self::observe::{snapshots_of, store_access};
pub use self::plan::SCHEDULED_FOR_ANNOTATION;
use self::plan::{Observed, Step};
pub use self::pool::{Busy, Slot, SnapshotPool};
pub use self::replays::{Replay, ReplayJob, Replays};
use self::take::Outcome;
use etcdadm_shared::error::Error;

/// Name of the controllers in metrics and logs.
pub const CONTROLLER_NAME: &str = "etcdadmsnapshot";
/// Steps applied in one reconcile before yielding.
const MAX_STEPS: usize = 16;
/// Retry after an error.
const ERROR_REQUEUE: Duration = Duration::from_secs(10);
/// A cluster with continuous backup is looked at again at least this often.
const CONTINUOUS_CHECK: Duration = Duration::from_secs(60);
/// A snapshot that found every slot taken looks again after this.
const SLOT_RETRY: Duration = Duration::from_secs(5);

type GuardedCluster = DeserializeGuard<EtcdadmCluster>;
type GuardedSnapshot = DeserializeGuard<EtcdadmSnapshot>;

/// Everything snapshot-related for one EtcdadmCluster, a step at a time.
pub async fn reconcile(etcd: Arc<EtcdadmCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Observe, plan, then one arm per step of the snapshot plan: the loop read at once.
    let namespace = etcd.namespace().unwrap_or_default();
    let name = etcd.name_any();
    let clusters: Api<EtcdadmCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    for _ in 0..MAX_STEPS {
        let Some(cluster) = clusters.get_opt(&name).await? else {
            ctx.recorders.forget(&namespace, &name);
            ctx.drills.forget(&namespace, &name);
            return Ok(Action::await_change());
        };
        let snapshots = observe::snapshots_of(&ctx.client, &namespace, &name).await?;
        if let Some(metrics) = &ctx.metrics {
            metrics.observe(&cluster, &snapshots, Timestamp::now());
        }
        let unlabelled = observe::unlabelled_store_secrets(&ctx.client, &namespace, &cluster).await?;
        if let Some(step) = moving::next(&cluster, &snapshots, plan::is_paused(&cluster), &unlabelled) {
            apply::moving(&ctx, &namespace, &step).await?;
            continue;
        }
        let referenced = match &cluster.spec.backup {
            Some(_) => observe::referenced_snapshots(&ctx.client, &namespace).await?,
            None => Vec::new(),
        };
        let now = Timestamp::now();
        let step = plan::plan(&Observed {
            cluster: &cluster,
            snapshots: &snapshots,
            now,
            referenced: &referenced,
            continuous_snapshot: continuous::full_snapshot_wanted(&cluster, &snapshots, now),
        });
        let find = |wanted: &str| {
            snapshots.iter().find(|s| s.name_any() == wanted).ok_or_else(|| {
                Error::NotFound(format!("EtcdadmSnapshot {wanted} disappeared during reconcile"))
            })
        };
        match step {
            Step::Idle { requeue } => {
                // Continuous backup's recorder follows what is settled; looked at again at
                // least every minute, so one that stopped starts again.
                let recording = continuous::recording(&cluster, &snapshots);
                let requeue = match recording.is_some() {
                    true => Some(requeue.map_or(CONTINUOUS_CHECK, |r| r.min(CONTINUOUS_CHECK))),
                    false => requeue,
                };
                ctx.recorders.ensure(&cluster, recording);
                // Restore drills run beside the loop; looked at again by the next schedule time.
                let drill = drill::due(&cluster, &snapshots, now);
                ctx.drills.ensure(&cluster, &drill);
                let requeue = match drill {
                    drill::Due::Later { next: Some(next) } => Some(requeue.map_or(next, |r| r.min(next))),
                    drill::Due::Now(_) => Some(requeue.map_or(CONTINUOUS_CHECK, |r| r.min(CONTINUOUS_CHECK))),
                    drill::Due::Later { next: None } => requeue,
                };
                return Ok(requeue.map_or_else(Action::await_change, Action::requeue));
            }
            Step::ContinuousSnapshot { name } => apply::continuous_snapshot(&ctx, &cluster, &name).await?,
            Step::Interrupted { snapshot, retry } => {
                apply::interrupted(&ctx, find(&snapshot)?, retry).await?;
            }
            Step::Fail {
                snapshot,
                reason,
                message,
            } => apply::fail(&ctx, find(&snapshot)?, reason, &message).await?,
            Step::Wait {
                snapshot,
                reason,
                message,
            } => apply::wait(&ctx, find(&snapshot)?, reason, &message).await?,
            Step::Take {
                snapshot,
                target,
                store,
            } => {
                let snapshot = find(&snapshot)?;
                // Snapshots share a few slots across clusters, fairly between namespaces:
                // memory stays bounded however many fall due at once, no tenant holds them all,
                // and a waiting cluster holds no reconcile slot.
                let _slot = match ctx.snapshot_pool.try_take(&namespace) {
                    Ok(slot) => slot,
                    Err(busy) => {
                        let message = busy.to_string();
                        if !plan::says(snapshot, plan::reason::WAITING_FOR_SLOT, &message) {
                            apply::wait(&ctx, snapshot, plan::reason::WAITING_FOR_SLOT, &message).await?;
                        }
                        return Ok(Action::requeue(SLOT_RETRY));
                    }
                };
                let outcome = take::take_snapshot(&ctx, &cluster, snapshot, &target, &store).await?;
                if outcome == Outcome::Stopped {
                    return Ok(Action::await_change());
                }
            }
            Step::Retire { snapshot, object } => {
                ctx.recorders.release(&cluster, &snapshot).await;
                ctx.drills.release(&cluster, &snapshot).await;
                apply::retire(&ctx, &cluster, &snapshot, object.as_ref()).await?;
            }
            Step::Schedule { name, tick } => apply::schedule(&ctx, &cluster, &name, tick).await?,
            Step::InvalidSchedule { message } => {
                apply::invalid_schedule(&ctx, &cluster, &message).await;
                return Ok(Action::await_change());
            }
        }
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// A snapshot whose EtcdadmCluster does not exist (after a grace period) fails.
pub async fn reconcile_orphan(snapshot: Arc<EtcdadmSnapshot>, ctx: Arc<Context>) -> Result<Action, Error> {
    if snapshot.phase().is_finished() {
        return Ok(Action::await_change());
    }
    // A copy `clusterctl move` made, which may come before its cluster: its status back first.
    if let Some(step) = moving::reinstate(&snapshot) {
        apply::moving(&ctx, &snapshot.namespace().unwrap_or_default(), &step).await?;
        return Ok(Action::await_change());
    }
    let namespace = snapshot.namespace().unwrap_or_default();
    let clusters: Api<EtcdadmCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    if clusters.get_opt(&snapshot.spec.cluster_name).await?.is_some() {
        return Ok(Action::await_change());
    }
    let age = snapshot
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
        .unwrap_or(ctx.missing_cluster_grace);
    if age < ctx.missing_cluster_grace {
        return Ok(Action::requeue(ctx.missing_cluster_grace - age));
    }
    let api: Api<EtcdadmSnapshot> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(current) = api.get_opt(&snapshot.name_any()).await? else {
        return Ok(Action::await_change());
    };
    if !current.phase().is_finished() {
        let message = format!(
            "EtcdadmCluster {namespace}/{} does not exist",
            snapshot.spec.cluster_name
        );
        apply::fail(&ctx, &current, plan::reason::CLUSTER_NOT_FOUND, &message).await?;
    }
    Ok(Action::await_change())
}

fn error_policy<K: Resource>(object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(object = ?object.meta().name, category = %error.category(), %error, "snapshot reconcile failed");
    Action::requeue(ERROR_REQUEUE)
}

/// What a change to an EtcdadmCluster must differ in to concern snapshots: its spec, pause
/// annotations and deletion. Status changes are not waited for (a waiting snapshot looks again
/// every few seconds).
fn worth_reconciling(etcd: &GuardedCluster) -> Option<u64> {
    let meta = etcd.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// The EtcdadmCluster a snapshot is of.
fn cluster_of(snapshot: &GuardedSnapshot) -> Option<ObjectRef<GuardedCluster>> {
    let namespace = snapshot.namespace()?;
    let cluster = snapshot.0.as_ref().ok()?.spec.cluster_name.clone();
    Some(ObjectRef::new(&cluster).within(&namespace))
}

/// Run both controllers until the manager's shutdown signal, taking snapshots in the slots of
/// `pool` (which restore checksums share) and running restore drills with `drills`.
pub async fn run(manager: ManagerContext, pool: Arc<SnapshotPool>, drills: DrillSettings) {
    let ManagerContext {
        client,
        settings,
        readiness,
        shutdown,
        metrics,
        ..
    } = manager;
    let mut context = Context::new(client.clone())
        .with_snapshot_pool(pool)
        .with_drills(drills);
    context.shutdown = Some(shutdown.clone());
    context.metrics = Some(SnapshotMetrics::register(&metrics));
    let ctx = Arc::new(context);

    let (clusters, cluster_changes) = settings.watch_own_kind::<GuardedCluster>(&client, readiness.clone());
    let cluster_changes = cluster_changes.predicate_filter(worth_reconciling, PredicateConfig::default());
    let (snapshots, snapshot_changes) = settings.watch_own_kind::<GuardedSnapshot>(&client, readiness);

    let cluster_metrics = metrics.clone();
    let per_cluster = Controller::for_stream(cluster_changes, clusters)
        .with_config(settings.controller_config())
        .watches_stream(
            settings.watch::<GuardedSnapshot>(&client, settings.watcher_config()),
            |snapshot| cluster_of(&snapshot),
        )
        .reconcile_all_on(settings.resync_ticks())
        .graceful_shutdown_on(shutdown.clone().wait())
        .run(
            move |guarded: Arc<GuardedCluster>, ctx: Arc<Context>| {
                let timer = cluster_metrics.reconcile_started(CONTROLLER_NAME);
                async move {
                    // A cluster this version cannot read is reported by the EtcdadmCluster
                    // controller; nothing here can act on it.
                    let result = match &guarded.0 {
                        Ok(etcd) => reconcile(Arc::new(etcd.clone()), ctx).await,
                        Err(_) => Ok(Action::await_change()),
                    };
                    timer.finish(&result, Error::category);
                    result
                }
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "snapshot controller event");
            }
        });

    let orphans = Controller::for_stream(snapshot_changes, snapshots)
        .with_config(settings.controller_config())
        .graceful_shutdown_on(shutdown.wait())
        .run(
            move |guarded: Arc<GuardedSnapshot>, ctx: Arc<Context>| async move {
                match &guarded.0 {
                    Ok(snapshot) => reconcile_orphan(Arc::new(snapshot.clone()), ctx).await,
                    Err(invalid) => report_invalid_object::<EtcdadmSnapshot>(
                        &ctx.client,
                        &ctx.recorder,
                        FIELD_MANAGER,
                        invalid,
                    )
                    .await
                    .map(|()| Action::await_change())
                    .map_err(Error::from),
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "snapshot controller event");
            }
        });
    futures::join!(per_cluster, orphans);
}
