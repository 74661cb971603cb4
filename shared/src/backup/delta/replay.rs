//! A restore's deltas, checked whole before the first one is written: the chain planned from the
//! store's listing, every object read, its SHA-256 and header checked against its name and the
//! full snapshot, so a gap, a damaged or swapped object stops the restore by name with nothing
//! applied. The replay then reads each object again (one at a time: memory stays one object)
//! and writes only what the check saw, so an object changed in between stops it too.

use super::apply::{self, Leases};
use super::chain::{self, Chain, ChainError, DeltaName, Target};
use super::listing;
use super::record::MAX_DELTA_BYTES;
use super::{DeltaError, decode};
use crate::store::{StoreClient, StoreError};

/// The largest delta object read: the recorder seals one past [`MAX_DELTA_BYTES`] of events,
/// after at most one more watch answer (4 MiB), plus its header and checksum.
pub const MAX_DELTA_OBJECT_BYTES: u64 = (MAX_DELTA_BYTES as u64) + (4 << 20) + (1 << 20);

/// A chain every object of which was read and found whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub chain: Chain,
    /// Each object's SHA-256 (its last 32 bytes), in chain order.
    pub sums: Vec<[u8; 32]>,
    /// Events the point restored takes from them.
    pub events: u64,
    /// The revision the restored data reaches (the full snapshot's when no event is taken).
    pub revision: i64,
}

/// What a replay wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replayed {
    pub events: u64,
    pub transactions: u64,
}

/// Why the deltas cannot be restored; nothing was written unless the error is `Write`.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("listing the delta objects: {0}")]
    List(StoreError),
    #[error("{0}")]
    Chain(#[from] ChainError),
    #[error("delta object {key} cannot be read: {error}")]
    Read { key: String, error: StoreError },
    #[error("delta object {key} is damaged: {error}")]
    Damaged { key: String, error: DeltaError },
    #[error("delta object {key} does not hold what its name says: {what}")]
    Mismatch { key: String, what: String },
    #[error("delta object {key} changed after it was checked")]
    Changed { key: String },
    #[error("connecting to the restored member: {0}")]
    Connect(String),
    #[error("writing the deltas' events: {0}")]
    Write(etcd_client::Error),
}

impl ReplayError {
    /// Whether asking again may succeed (the store or etcd did not answer), as against a
    /// chain that cannot be restored as it stands.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ReplayError::List(_) | ReplayError::Read { .. } | ReplayError::Connect(_) | ReplayError::Write(_)
        )
    }
}

/// The deltas after the full snapshot `snapshot_key` (at revision `base`) that bring a restore
/// to `target`, every one read and checked; `recorded` is the last revision its status records
/// as uploaded.
pub async fn verify(
    store: &StoreClient,
    snapshot_key: &str,
    base: i64,
    recorded: Option<i64>,
    target: Target,
) -> Result<Verified, ReplayError> {
    let listed = listing::listed(store, snapshot_key)
        .await
        .map_err(ReplayError::List)?;
    let chain = chain::plan(base, &listed, recorded, target)?;
    let mut verified = Verified {
        sums: Vec::with_capacity(chain.deltas.len()),
        events: 0,
        revision: base,
        chain,
    };
    for name in verified.chain.deltas.clone() {
        let (bytes, key) = read(store, snapshot_key, &name).await?;
        let delta = checked(&bytes, &key, &name, base)?;
        for e in delta
            .events
            .iter()
            .filter(|e| verified.chain.includes(e.revision, e.received_ms))
        {
            verified.events += 1;
            verified.revision = verified.revision.max(e.revision);
        }
        verified.sums.push(sum_of(&bytes));
    }
    Ok(verified)
}

/// Write the events `verified` found onto the cluster `client` reaches (restored from the full
/// snapshot), reading each object again and refusing one that changed since.
pub async fn replay(
    store: &StoreClient,
    snapshot_key: &str,
    base: i64,
    verified: &Verified,
    client: &mut etcd_client::Client,
) -> Result<Replayed, ReplayError> {
    let mut leases = Leases::default();
    let mut replayed = Replayed {
        events: 0,
        transactions: 0,
    };
    for (name, sum) in verified.chain.deltas.iter().zip(&verified.sums) {
        let (bytes, key) = read(store, snapshot_key, name).await?;
        if sum_of(&bytes) != *sum {
            return Err(ReplayError::Changed { key });
        }
        let delta = checked(&bytes, &key, name, base)?;
        let events: Vec<_> = delta
            .events
            .into_iter()
            .filter(|e| verified.chain.includes(e.revision, e.received_ms))
            .collect();
        let made = apply::apply(client, &events, &mut leases)
            .await
            .map_err(ReplayError::Write)?;
        replayed.events += events.len() as u64;
        replayed.transactions += made as u64;
    }
    Ok(replayed)
}

/// The object `name` names, and its key.
async fn read(
    store: &StoreClient,
    snapshot_key: &str,
    name: &DeltaName,
) -> Result<(Vec<u8>, String), ReplayError> {
    let key = name.key(snapshot_key);
    match store.get_object(&key, MAX_DELTA_OBJECT_BYTES).await {
        Ok(bytes) => Ok((bytes, key)),
        Err(error) => Err(ReplayError::Read { key, error }),
    }
}

/// The delta in `bytes`, whole and holding what its name and the full snapshot say.
fn checked(bytes: &[u8], key: &str, name: &DeltaName, base: i64) -> Result<super::Delta, ReplayError> {
    let delta = decode(bytes).map_err(|error| ReplayError::Damaged {
        key: key.to_string(),
        error,
    })?;
    let mismatch = |what: String| ReplayError::Mismatch {
        key: key.to_string(),
        what,
    };
    if delta.base != base {
        return Err(mismatch(format!(
            "it follows revision {}, not the full snapshot's {base}",
            delta.base
        )));
    }
    if (delta.first, delta.last) != (name.first, name.last) {
        return Err(mismatch(format!(
            "it holds revisions {}-{}, its name says {}-{}",
            delta.first, delta.last, name.first, name.last
        )));
    }
    Ok(delta)
}

/// An object's own SHA-256: its last 32 bytes (checked by `decode`).
fn sum_of(bytes: &[u8]) -> [u8; 32] {
    let mut sum = [0; 32];
    if let Some(tail) = bytes.len().checked_sub(32).and_then(|at| bytes.get(at..)) {
        sum.copy_from_slice(tail);
    }
    sum
}
