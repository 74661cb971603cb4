//! Continuous backup's deltas replayed onto a restored first member, in a snapshot slot on a
//! task of its own: reading a chain of deltas and writing their events takes as long as the
//! store and the chain's length make it, which must not hold one of the reconcile turns every
//! cluster shares. The restore asks until the answer is there, handed over once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::{debug, info};

use etcdadm_shared::backup::delta::chain::Target;
use etcdadm_shared::backup::delta::replay::{self, ReplayError, Replayed, Verified};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::store::StoreClient;

use super::pool::SnapshotPool;

/// The replays under way and their outcomes, by what they replay.
pub struct Replays {
    pool: Arc<SnapshotPool>,
    /// By cluster (`<namespace>/<cluster>`): at most one replay onto a cluster at a time, for
    /// two writing the same keys in turn could leave an older value last.
    jobs: Arc<Mutex<BTreeMap<String, (Job, State)>>>,
}

/// One chain: the store's location of the full snapshot, its revision and the point. Not what
/// its status records as uploaded, which the recorder may raise during a replay: a replay
/// planned against the lower figure reached at least that far and is as good an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Job {
    location: String,
    base: i64,
    target: String,
}

enum State {
    Working,
    Done(Result<(Verified, Replayed), ReplayError>),
}

/// What the restore is told.
#[derive(Debug)]
pub enum Replay {
    /// Every event written (handed over once).
    Done { verified: Verified, replayed: Replayed },
    /// Being checked or written.
    Working,
    /// Waiting for a snapshot slot (why none is free).
    WaitingForSlot(String),
    /// It failed (handed over once): `transient` when asking again may succeed, else the chain
    /// cannot be restored as it stands.
    Failed { error: String, transient: bool },
}

/// The chain to replay and where.
pub struct ReplayJob<'a> {
    pub store: &'a StoreClient,
    pub key: &'a str,
    pub base: i64,
    pub recorded: Option<i64>,
    pub target: Target,
    pub member: Arc<MemberClient>,
}

impl Replays {
    pub fn new(pool: Arc<SnapshotPool>) -> Self {
        Replays {
            pool,
            jobs: Arc::default(),
        }
    }

    /// The outcome of replaying `job` for `cluster` (`<namespace>/<cluster>`): ready, or
    /// started in a slot of `namespace` if one is free.
    pub fn ask(&self, namespace: &str, cluster: &str, job: ReplayJob<'_>) -> Replay {
        let wanted = Job {
            location: job.store.location(job.key),
            base: job.base,
            target: format!("{:?}", job.target),
        };
        let Ok(mut jobs) = self.jobs.lock() else {
            return Replay::WaitingForSlot("the replay table was poisoned by a panic".into());
        };
        match jobs.remove(cluster) {
            // One under way, whatever it replays: waited for.
            Some((running, State::Working)) => {
                jobs.insert(cluster.to_string(), (running, State::Working));
                return Replay::Working;
            }
            Some((done, State::Done(Ok((verified, replayed))))) if done == wanted => {
                return Replay::Done { verified, replayed };
            }
            Some((done, State::Done(Err(e)))) if done == wanted => {
                return Replay::Failed {
                    error: e.to_string(),
                    transient: e.is_transient(),
                };
            }
            // The outcome of another chain (the status moved on meanwhile): asked again.
            Some(_) | None => {}
        }
        let slot = match self.pool.try_take(namespace) {
            Ok(slot) => slot,
            Err(busy) => return Replay::WaitingForSlot(busy.to_string()),
        };
        jobs.insert(cluster.to_string(), (wanted.clone(), State::Working));
        let table = self.jobs.clone();
        let cluster = cluster.to_string();
        let (store, snapshot_key, base, recorded, target, member) = (
            job.store.clone(),
            job.key.to_string(),
            job.base,
            job.recorded,
            job.target,
            job.member,
        );
        tokio::spawn(async move {
            let outcome = async {
                let verified = replay::verify(&store, &snapshot_key, base, recorded, target).await?;
                let mut client = member
                    .etcd_client()
                    .await
                    .map_err(|e| ReplayError::Connect(e.to_string()))?;
                let replayed = replay::replay(&store, &snapshot_key, base, &verified, &mut client).await?;
                Ok((verified, replayed))
            }
            .await;
            drop(slot);
            match &outcome {
                Ok((verified, replayed)) => info!(
                    cluster,
                    objects = verified.chain.deltas.len(),
                    events = replayed.events,
                    "deltas replayed onto the restored member"
                ),
                Err(e) => debug!(cluster, error = %e, "deltas not replayed"),
            }
            if let Ok(mut jobs) = table.lock() {
                jobs.insert(cluster, (wanted, State::Done(outcome)));
            }
        });
        Replay::Working
    }

    /// Forget the outcomes kept for `cluster` (it is gone).
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.retain(|key, (_, state)| key != cluster || matches!(state, State::Working));
        }
    }
}
