//! The drills the controller runs, a task per cluster beside the reconcile loop (a drill takes
//! as long as a restore, which must not hold a reconcile turn), one at a time per controller so
//! the disk and memory a drill takes are had once, the turn going fairly between namespaces (a
//! pool of one slot, as the snapshot slots share theirs). Each records its result on the
//! drilled EtcdadmSnapshot (`status.lastDrill`) with an Event; the metrics are read from there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{DrillResult, DrillStatus, EtcdadmSnapshot};
use etcdadm_shared::manager::events::{EventNote, Recorder as EventRecorder};

use super::super::pool::SnapshotPool;
use super::run::{Report, Settings, drill};
use super::{Drill, Due};

/// Field manager of the drills' writes (`status.lastDrill`).
const FIELD_MANAGER: &str = "etcdadm-controller/restore-drills";
/// The most of a drill's message recorded.
const MAX_MESSAGE: usize = 1024;
/// A drill waiting for its turn asks again this often (within the pool's memory of waiters).
const TURN_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Event reasons.
pub mod reason {
    pub const PASSED: &str = "DrillPassed";
    pub const FAILED: &str = "DrillFailed";
    pub const INCONCLUSIVE: &str = "DrillInconclusive";
}

/// The drills running or run, by `<namespace>/<cluster>`.
pub struct Drills {
    client: Client,
    events: Arc<EventRecorder>,
    settings: Settings,
    /// One slot: one drill at a time, fair between namespaces.
    turn: Arc<SnapshotPool>,
    running: Mutex<HashMap<String, Running>>,
}

struct Running {
    /// The schedule time the drill was started for.
    tick: Timestamp,
    /// The `drill-now` value it answers.
    requested: Option<String>,
    /// The snapshot it drills.
    snapshot: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drills {
    pub fn new(client: Client, settings: Settings) -> Self {
        Drills {
            events: Arc::new(EventRecorder::for_controller(
                client.clone(),
                "etcdadm-controller",
            )),
            client,
            settings,
            turn: SnapshotPool::new(1),
            running: Mutex::default(),
        }
    }

    /// Start the drill `due` asks for, unless one of `cluster` runs or ran for its schedule
    /// time already (a drill whose result could not be recorded is not run again for it).
    pub fn ensure(&self, cluster: &EtcdadmCluster, due: &Due) {
        let Due::Now(want) = due else {
            return;
        };
        let namespace = cluster.namespace().unwrap_or_default();
        let name = cluster.name_any();
        let key = format!("{namespace}/{name}");
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        // A drill asked for now has `now` as its time: one per value asked.
        let same = |r: &Running| match &want.requested {
            Some(token) => r.requested.as_ref() == Some(token),
            None => r.tick == want.tick,
        };
        if running
            .get(&key)
            .is_some_and(|r| same(r) || !r.task.is_finished())
        {
            return;
        }
        let task = tokio::spawn(run_one(
            self.client.clone(),
            self.events.clone(),
            self.settings.clone(),
            self.turn.clone(),
            namespace,
            name,
            (**want).clone(),
        ));
        running.insert(
            key,
            Running {
                tick: want.tick,
                requested: want.requested.clone(),
                snapshot: want.snapshot.clone(),
                task,
            },
        );
    }

    /// Before snapshot `snapshot` of `cluster` is deleted: stop a drill of it and wait until it
    /// has (its process and scratch directory gone), so a drill never reads objects being
    /// deleted and fails for it. The next schedule time drills the snapshot then newest.
    pub async fn release(&self, cluster: &EtcdadmCluster, snapshot: &str) {
        let key = format!(
            "{}/{}",
            cluster.namespace().unwrap_or_default(),
            cluster.name_any()
        );
        let task = self.running.lock().ok().and_then(|mut running| {
            let drilling = running
                .get(&key)
                .is_some_and(|r| r.snapshot == snapshot && !r.task.is_finished());
            drilling.then(|| running.remove(&key)).flatten()
        });
        if let Some(r) = task {
            r.task.abort();
            let _ = r.task.await;
        }
    }

    /// The cluster `name` in `namespace` is gone: stop its drill (the process and the scratch
    /// directory go with the task).
    pub fn forget(&self, namespace: &str, name: &str) {
        if let Ok(mut running) = self.running.lock()
            && let Some(r) = running.remove(&format!("{namespace}/{name}"))
        {
            r.task.abort();
        }
    }
}

/// Wait for the controller's drill turn, drill, and record the result.
async fn run_one(
    client: Client,
    events: Arc<EventRecorder>,
    settings: Settings,
    turn: Arc<SnapshotPool>,
    namespace: String,
    cluster: String,
    want: Drill,
) {
    let _turn = loop {
        match turn.try_take(&namespace) {
            Ok(slot) => break slot,
            Err(_) => tokio::time::sleep(TURN_RETRY).await,
        }
    };
    let started = Timestamp::now();
    info!(%namespace, %cluster, snapshot = %want.snapshot, "restore drill started");
    let report = drill(&client, &namespace, &cluster, &want, &settings).await;
    info!(%namespace, %cluster, snapshot = %want.snapshot, result = report.result.as_str(), message = %report.message, "restore drill ended");
    let mut status = status_of(started, report);
    status.requested = want.requested;
    record(&client, &events, &namespace, &want.snapshot, status).await;
}

/// `status.lastDrill` of the drilled snapshot, and an Event on it.
async fn record(
    client: &Client,
    events: &EventRecorder,
    namespace: &str,
    snapshot: &str,
    status: DrillStatus,
) {
    let snapshots: Api<EtcdadmSnapshot> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch = json!({"status": {"lastDrill": &status}});
    match snapshots
        .patch_status(snapshot, &params, &Patch::Merge(&patch))
        .await
    {
        Ok(drilled) => {
            let note = match status.result {
                DrillResult::Passed => EventNote::normal(reason::PASSED, status.message),
                DrillResult::Failed => EventNote::warning(reason::FAILED, status.message),
                DrillResult::Inconclusive => EventNote::warning(reason::INCONCLUSIVE, status.message),
            };
            events.note(&drilled, "RestoreDrill", note).await;
        }
        // Deleted meanwhile (retention): nothing to record on.
        Err(e) => warn!(%namespace, %snapshot, error = %e, "recording a restore drill failed"),
    }
}

/// What `status.lastDrill` says of `report`, its message bounded.
pub fn status_of(started: Timestamp, report: Report) -> DrillStatus {
    let mut message = report.message;
    if let Some((at, _)) = message.char_indices().nth(MAX_MESSAGE) {
        message.truncate(at);
        message.push_str("...");
    }
    DrillStatus {
        time: Time(started),
        result: report.result,
        revision: report.revision,
        deltas: report.deltas,
        keys: report.keys,
        sampled: report.sampled,
        message,
        requested: None,
    }
}
