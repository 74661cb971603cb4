//! The recorders continuous backup runs, one task per cluster: each watches one member from its
//! snapshot's revision and uploads the writes as delta objects (`backup::delta::record`),
//! recording them on the snapshot's status. [`Recorders::ensure`] starts, keeps or replaces a
//! cluster's recorder to match what `continuous::recording` wants, and stops it when nothing
//! should record. A recorder resumes after the last delta the store lists, so a replaced one,
//! a failed one retried, or the next controller after a restart leaves no gap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::backup::delta::chain::DeltaName;
use etcdadm_shared::backup::delta::listing;
use etcdadm_shared::backup::delta::record::{Ended, MAX_DELTA_BYTES, RecordLimits, Recorder};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::manager::events::{EventNote, Recorder as EventRecorder};
use etcdadm_shared::store::StoreClient;

use super::super::observe::{CLIENT_COMMON_NAME, cluster_cas, store_client};
use super::{Recording, ended};

/// Lifetime of a recorder's client certificate; a recorder reconnects with a new one sooner.
const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// A recorder starts again with a new certificate after this long.
const RECONNECT_AFTER: Duration = Duration::from_secs(12 * 3600);
/// `status.deltas` is written at most this often (and when a recorder stops): every write of it
/// reconciles the cluster, and the store's listing is what a restore trusts first.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);
/// Deadline of a member's unary calls (the watch itself has none: it streams).
const MEMBER_TIMEOUT: Duration = Duration::from_secs(10);

/// Field manager of the recorders' writes (`status.deltas`).
const FIELD_MANAGER: &str = "etcdadm-controller/continuous-backup";

fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Event reasons.
pub mod reason {
    pub const STARTED: &str = "ContinuousBackupStarted";
    pub const FAILED: &str = "ContinuousBackupFailed";
    pub const ENDED: &str = "ContinuousBackupEnded";
}

/// The running recorders, by `<namespace>/<cluster>`.
pub struct Recorders {
    client: Client,
    events: Arc<EventRecorder>,
    store_deadline: Duration,
    running: Mutex<HashMap<String, Running>>,
}

struct Running {
    want: Recording,
    /// Set to stop the recorder, with why its deltas end (none: they may go on later).
    stop: watch::Sender<Option<Option<&'static str>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorders {
    pub fn new(client: Client, store_deadline: Duration) -> Self {
        Recorders {
            events: Arc::new(EventRecorder::for_controller(
                client.clone(),
                "etcdadm-controller",
            )),
            client,
            store_deadline,
            running: Mutex::default(),
        }
    }

    /// Make `cluster`'s recorder what `want` says: started, kept, replaced (another snapshot or
    /// member) or stopped. Deltas end for good (`status.deltas.ended`) when a newer snapshot
    /// takes over or continuous backup is turned off; a pause, a deletion or no healthy member
    /// only stops the watch.
    pub fn ensure(&self, cluster: &EtcdadmCluster, want: Option<Recording>) {
        let key = key_of(&cluster.namespace().unwrap_or_default(), &cluster.name_any());
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        // A replaced recorder uploads what it holds before the next one lists the store, so two
        // deltas never share a number.
        let mut previous = None;
        if let Some(current) = running.get(&key) {
            let same = want.as_ref() == Some(&current.want) && !current.task.is_finished();
            if same {
                return;
            }
            let why = match &want {
                Some(w) if w.snapshot != current.want.snapshot => Some(ended::SUPERSEDED),
                None if cluster
                    .spec
                    .backup
                    .as_ref()
                    .is_none_or(|b| b.continuous.is_none()) =>
                {
                    Some(ended::STOPPED)
                }
                _ => None,
            };
            if let Some(current) = running.remove(&key) {
                current.stop.send_replace(Some(why));
                previous = Some(current.task);
            }
        }
        if let Some(want) = want {
            let (stop, stopped) = watch::channel(None);
            let task = tokio::spawn(record(
                Deps {
                    client: self.client.clone(),
                    events: self.events.clone(),
                    store_deadline: self.store_deadline,
                },
                cluster.namespace().unwrap_or_default(),
                cluster.name_any(),
                want.clone(),
                stopped,
                previous,
            ));
            running.insert(key, Running { want, stop, task });
        }
    }

    /// Before snapshot `snapshot` of `cluster` is deleted: stop a recorder following it (a newer
    /// one took over) and wait until it has, so no delta is uploaded beside a deleted snapshot.
    pub async fn release(&self, cluster: &EtcdadmCluster, snapshot: &str) {
        let key = key_of(&cluster.namespace().unwrap_or_default(), &cluster.name_any());
        let following = self.running.lock().ok().and_then(|mut running| {
            let follows = running.get(&key).is_some_and(|r| r.want.snapshot == snapshot);
            follows.then(|| running.remove(&key)).flatten()
        });
        if let Some(r) = following {
            r.stop.send_replace(Some(Some(ended::SUPERSEDED)));
            let _ = r.task.await;
        }
    }

    /// Stop the recorder of cluster `name` in `namespace` (it is gone): the deltas do not end.
    pub fn forget(&self, namespace: &str, name: &str) {
        if let Ok(mut running) = self.running.lock()
            && let Some(r) = running.remove(&key_of(namespace, name))
        {
            r.stop.send_replace(Some(None));
        }
    }
}

/// A cluster's place in [`Recorders`]: `<namespace>/<name>`.
fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

struct Deps {
    client: Client,
    events: Arc<EventRecorder>,
    store_deadline: Duration,
}

/// One cluster's recorder: record until stopped or compacted, retrying after a failure.
async fn record(
    deps: Deps,
    namespace: String,
    cluster: String,
    want: Recording,
    mut stopped: watch::Receiver<Option<Option<&'static str>>>,
    previous: Option<tokio::task::JoinHandle<()>>,
) {
    if let Some(previous) = previous {
        let _ = previous.await;
    }
    let snapshots: Api<EtcdadmSnapshot> = Api::namespaced(deps.client.clone(), &namespace);
    let mut said = String::new();
    loop {
        let outcome = record_once(&deps, &namespace, &cluster, &want, &snapshots, stopped.clone()).await;
        let stop = *stopped.borrow();
        match (outcome, stop) {
            (
                Ok(Ended::Compacted {
                    reached,
                    compact_revision,
                }),
                _,
            ) => {
                let note = format!(
                    "the deltas after EtcdadmSnapshot {} end at revision {reached}: etcd compacted up to {compact_revision} before they were read; a new full snapshot follows",
                    want.snapshot
                );
                end(&deps, &snapshots, &want, ended::COMPACTED, &note).await;
                return;
            }
            (Ok(Ended::Stopped { .. }), Some(Some(why))) => {
                let note = format!("no more deltas follow EtcdadmSnapshot {} ({why})", want.snapshot);
                end(&deps, &snapshots, &want, why, &note).await;
                return;
            }
            (Ok(Ended::Stopped { .. }), Some(None)) => return,
            // Time for a new certificate: connect again.
            (Ok(Ended::Stopped { .. }), None) => {}
            (Err(_), Some(_)) => return,
            (Err(problem), None) => {
                warn!(%namespace, %cluster, snapshot = %want.snapshot, %problem, "continuous backup failed; retrying");
                if problem != said {
                    note(
                        &deps,
                        &snapshots,
                        &want,
                        EventNote::warning(reason::FAILED, problem.clone()),
                    )
                    .await;
                    said = problem;
                }
                tokio::select! {
                    () = tokio::time::sleep(want.interval) => {}
                    _ = stopped.changed() => return,
                }
            }
        }
    }
}

/// Connect, resume after the last delta listed, and record until stopped, compacted or failed.
async fn record_once(
    deps: &Deps,
    namespace: &str,
    cluster: &str,
    want: &Recording,
    snapshots: &Api<EtcdadmSnapshot>,
    mut stopped: watch::Receiver<Option<Option<&'static str>>>,
) -> Result<Ended, String> {
    let store = store_client(&deps.client, namespace, &want.store, deps.store_deadline)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let after = last_listed(&store, &want.key).await?;
    let clusters: Api<EtcdadmCluster> = Api::namespaced(deps.client.clone(), namespace);
    let etcd = clusters
        .get_opt(cluster)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("EtcdadmCluster {cluster} is gone"))?;
    // During a CA rotation, an identity from each CA (docs/security.md).
    let cas = cluster_cas(&deps.client, &etcd)
        .await
        .map_err(|e| e.to_string())??;
    let cas: Vec<&etcdadm_shared::pki::CertificateAuthority> = cas.iter().collect();
    let tls =
        EtcdTls::issued_by_each(&cas, CLIENT_COMMON_NAME, CLIENT_CERT_VALIDITY).map_err(|e| e.to_string())?;
    let member =
        MemberClient::with_config(&want.member.client_url, tls, MEMBER_TIMEOUT).map_err(|e| e.to_string())?;
    let mut client = member.etcd_client().await.map_err(|e| e.to_string())?;
    if after.is_none() {
        let text = format!(
            "recording the writes after EtcdadmSnapshot {} (revision {}) from member {} every {:?}",
            want.snapshot, want.base, want.member.member, want.interval
        );
        info!(%namespace, %cluster, snapshot = %want.snapshot, "continuous backup started");
        note(deps, snapshots, want, EventNote::normal(reason::STARTED, text)).await;
    }
    let recorder = Recorder {
        store: &store,
        snapshot_key: &want.key,
        base: want.base,
        limits: RecordLimits {
            interval: want.interval,
            max_bytes: MAX_DELTA_BYTES,
        },
    };
    let (progress, mut uploaded) = watch::channel(after);
    let mut tell = move |name: DeltaName| {
        progress.send_replace(Some(name));
    };
    let stop = async {
        tokio::select! {
            _ = stopped.changed() => {}
            () = tokio::time::sleep(RECONNECT_AFTER) => {}
        }
    };
    let recording = recorder.run(&mut client, after, &mut tell, stop);
    tokio::pin!(recording);
    // The first delta is recorded at once, later ones at most every PROGRESS_EVERY.
    let mut recorded: Option<tokio::time::Instant> = None;
    let result = loop {
        tokio::select! {
            result = &mut recording => break result,
            Ok(()) = uploaded.changed(), if recorded.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) => {
                let last = *uploaded.borrow_and_update();
                if let Some(last) = last {
                    record_progress(snapshots, want, last).await;
                    recorded = Some(tokio::time::Instant::now());
                }
            }
            // Looked at again once the next progress may be recorded.
            () = sleep_until_due(recorded), if recorded.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) => {}
        }
    };
    let last = *uploaded.borrow();
    if let Some(last) = last {
        record_progress(snapshots, want, last).await;
    }
    result.map_err(|e| e.to_string())
}

/// Until progress may be recorded again.
async fn sleep_until_due(recorded: Option<tokio::time::Instant>) {
    if let Some(t) = recorded {
        tokio::time::sleep_until(t + PROGRESS_EVERY).await;
    }
}

/// The last delta after `key` the store lists (none: none yet).
async fn last_listed(store: &StoreClient, key: &str) -> Result<Option<DeltaName>, String> {
    let listed = listing::listed(store, key).await.map_err(|e| e.to_string())?;
    Ok(listed.into_iter().max_by_key(|n| n.seq))
}

/// `status.deltas` as far as `last`.
async fn record_progress(snapshots: &Api<EtcdadmSnapshot>, want: &Recording, last: DeltaName) {
    let time = Timestamp::from_millisecond(last.last_ms).ok().map(Time);
    let patch = json!({"status": {"deltas": {
        "count": last.seq, "lastRevision": last.last, "lastTime": time,
    }}});
    if let Err(e) = snapshots
        .patch_status(&want.snapshot, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        warn!(snapshot = %want.snapshot, error = %e, "recording continuous backup's progress failed");
    }
}

/// The deltas after the snapshot end: say why on it.
async fn end(deps: &Deps, snapshots: &Api<EtcdadmSnapshot>, want: &Recording, why: &str, text: &str) {
    let patch = json!({"status": {"deltas": {"ended": why}}});
    if let Err(e) = snapshots
        .patch_status(&want.snapshot, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        warn!(snapshot = %want.snapshot, error = %e, "recording the end of continuous backup failed");
    }
    let warning = why == ended::COMPACTED;
    let event = if warning {
        EventNote::warning(reason::ENDED, text.to_string())
    } else {
        EventNote::normal(reason::ENDED, text.to_string())
    };
    note(deps, snapshots, want, event).await;
}

/// An Event on the snapshot (if it still exists).
async fn note(deps: &Deps, snapshots: &Api<EtcdadmSnapshot>, want: &Recording, event: EventNote) {
    if let Ok(Some(snapshot)) = snapshots.get_opt(&want.snapshot).await {
        deps.events.note(&snapshot, "ContinuousBackup", event).await;
    }
}
