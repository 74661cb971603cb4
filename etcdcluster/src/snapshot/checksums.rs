//! The SHA-256 of a restore's object nobody recorded one for, computed in a snapshot slot on a
//! task of its own: reading a whole object takes as long as the store lets it (up to its
//! deadline, an hour or more for a large one), which must not hold one of the reconcile turns
//! every cluster shares. The restore asks until the answer is there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::debug;

use etcdadm_shared::store::{StoreClient, StoreError};

use super::pool::SnapshotPool;

/// The checksums being computed and those computed, by the object they are of.
pub struct Checksums {
    pool: Arc<SnapshotPool>,
    jobs: Arc<Mutex<BTreeMap<Job, State>>>,
}

/// One object of one cluster's restore: `<namespace>/<cluster>`, the store's location of it
/// and its size.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Job {
    cluster: String,
    location: String,
    size: u64,
}

enum State {
    Computing,
    Done(Result<String, StoreError>),
}

/// Where a checksum is.
#[derive(Debug)]
pub enum Checksum {
    /// Computed (handed over once: asked again, it is computed again).
    Ready(String),
    /// Being computed.
    Computing,
    /// Waiting for a snapshot slot (why none is free).
    WaitingForSlot(String),
    /// Reading the object failed (handed over once).
    Failed(StoreError),
}

impl Checksums {
    pub fn new(pool: Arc<SnapshotPool>) -> Self {
        Checksums {
            pool,
            jobs: Arc::default(),
        }
    }

    /// The SHA-256 of `key` (`size` bytes) in `store`, for the restore of `cluster`
    /// (`<namespace>/<cluster>`): ready, or started in a slot of `namespace` if one is free.
    pub fn ask(&self, namespace: &str, cluster: &str, store: &StoreClient, key: &str, size: u64) -> Checksum {
        let job = Job {
            cluster: cluster.to_string(),
            location: store.location(key),
            size,
        };
        let Ok(mut jobs) = self.jobs.lock() else {
            return Checksum::WaitingForSlot("the checksum table was poisoned by a panic".into());
        };
        match jobs.remove(&job) {
            Some(State::Done(Ok(sha256))) => return Checksum::Ready(sha256),
            Some(State::Done(Err(e))) => return Checksum::Failed(e),
            Some(State::Computing) => {
                jobs.insert(job, State::Computing);
                return Checksum::Computing;
            }
            None => {}
        }
        let slot = match self.pool.try_take(namespace) {
            Ok(slot) => slot,
            Err(busy) => return Checksum::WaitingForSlot(busy.to_string()),
        };
        jobs.insert(job.clone(), State::Computing);
        let (table, store, key) = (self.jobs.clone(), store.clone(), key.to_string());
        tokio::spawn(async move {
            let computed = store.sha256_of(&key, size).await;
            drop(slot);
            debug!(
                cluster = job.cluster,
                ok = computed.is_ok(),
                "restore checksum computed"
            );
            if let Ok(mut jobs) = table.lock() {
                jobs.insert(job, State::Done(computed));
            }
        });
        Checksum::Computing
    }

    /// Forget what was computed for `cluster` (it is gone).
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.retain(|job, state| job.cluster != cluster || matches!(state, State::Computing));
        }
    }
}
