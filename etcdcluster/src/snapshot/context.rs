//! What every reconcile of the snapshot controllers shares: the API client, the Event recorder,
//! the shutdown signal a snapshot being taken is aborted on, the slots snapshots are taken in,
//! the continuous backup recorders and restore drills, and the waits they use.

use std::sync::Arc;
use std::time::Duration;

use kube::api::PatchParams;
use kube::{Client, Resource};

use etcdadm_shared::manager::ShutdownSignal;
use etcdadm_shared::manager::events::{EventNote, Recorder};

use etcdadm_shared::backup::StreamLimits;

use super::continuous::recorders::Recorders;
use super::drill::drills::Drills;
use super::drill::run::Settings as DrillSettings;
use super::pool::SnapshotPool;
use crate::metrics::SnapshotMetrics;

/// Field manager of this controller's writes.
pub const FIELD_MANAGER: &str = "etcdadm-controller/snapshots";
/// Default time the snapshot stream may stall before the attempt fails.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a snapshot of a cluster that does not exist waits for it (both may be applied at
/// once) before it fails.
pub const MISSING_CLUSTER_GRACE: Duration = Duration::from_secs(30);
/// Snapshots taken at once by default, whatever the number of clusters: each holds up to two
/// 5 MiB parts in memory (BENCHMARKS.md, "Concurrent snapshots").
pub const DEFAULT_SNAPSHOT_SLOTS: usize = 2;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// Resolves when the controller must stop: a snapshot being taken is aborted.
    pub shutdown: Option<ShutdownSignal>,
    /// How long the member's snapshot stream may stall, and take in all.
    pub stream_limits: StreamLimits,
    /// How long a snapshot of a cluster that does not exist waits for it.
    pub missing_cluster_grace: Duration,
    /// Snapshot age and schedule, when run by the manager (tests go without).
    pub metrics: Option<SnapshotMetrics>,
    /// One slot per snapshot being taken, fair between namespaces: a cluster whose turn comes
    /// with none free for it waits.
    pub snapshot_pool: Arc<SnapshotPool>,
    /// The deadline of each store request but part uploads (a tenant's store must not hold a
    /// reconcile for as long as it likes).
    pub store_request_deadline: Duration,
    /// Continuous backup's recorders, one per cluster that has one.
    pub recorders: Arc<Recorders>,
    /// Restore drills, one at a time.
    pub drills: Arc<Drills>,
}

impl Context {
    pub fn new(client: Client) -> Self {
        let recorders = Arc::new(Recorders::new(
            client.clone(),
            etcdadm_shared::store::limits::REQUEST_DEADLINE,
        ));
        let drills = Arc::new(Drills::new(
            client.clone(),
            DrillSettings {
                etcd_dir: None,
                scratch: std::env::temp_dir(),
                store_deadline: etcdadm_shared::store::limits::REQUEST_DEADLINE,
            },
        ));
        Context {
            recorder: Recorder::for_controller(client.clone(), "etcdadm-controller"),
            client,
            shutdown: None,
            stream_limits: StreamLimits::with_idle(STREAM_IDLE_TIMEOUT),
            missing_cluster_grace: MISSING_CLUSTER_GRACE,
            metrics: None,
            snapshot_pool: SnapshotPool::new(DEFAULT_SNAPSHOT_SLOTS),
            store_request_deadline: etcdadm_shared::store::limits::REQUEST_DEADLINE,
            recorders,
            drills,
        }
    }

    /// The same, running restore drills with `settings`.
    pub fn with_drills(mut self, settings: DrillSettings) -> Self {
        self.drills = Arc::new(Drills::new(self.client.clone(), settings));
        self
    }

    /// The same, taking snapshots in the slots of `pool`.
    pub fn with_snapshot_pool(mut self, pool: Arc<SnapshotPool>) -> Self {
        self.snapshot_pool = pool;
        self
    }

    /// Publish an Event about `object`; a failure to publish is logged, never fatal.
    pub async fn event<K>(&self, object: &K, warning: bool, reason: &'static str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let note = if warning {
            EventNote::warning(reason, note)
        } else {
            EventNote::normal(reason, note)
        };
        self.recorder.note(object, "Snapshot", note).await;
    }
}

pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}
