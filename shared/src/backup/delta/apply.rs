//! Continuous backup's replay: the events of a chain of deltas written onto a cluster restored
//! from their full snapshot, each revision's events in one transaction (as etcd made them), so
//! the keys end as they were at the point restored. Keys put with a lease get that lease: the
//! one restored with the snapshot when it exists, else one granted with the same ID.

use std::collections::BTreeSet;

use etcd_client::{LeaseGrantOptions, PutOptions, Txn, TxnOp};

use super::{Event, Kind};

/// The time to live of a lease a delta names that the restored cluster does not hold: the
/// deltas do not say how long it was granted for, and its holder (an API server) renews it
/// or lets it lapse as it would have.
pub const RESTORED_LEASE_TTL: i64 = 3600;

/// Leases known to exist on the cluster written to.
#[derive(Debug, Default)]
pub struct Leases(BTreeSet<i64>);

/// Write `events` (in revision order) onto the cluster `client` reaches; returns the number of
/// transactions made.
pub async fn apply(
    client: &mut etcd_client::Client,
    events: &[Event],
    leases: &mut Leases,
) -> Result<usize, etcd_client::Error> {
    let mut transactions = 0;
    for revision in events.chunk_by(|a, b| a.revision == b.revision) {
        let mut ops = Vec::with_capacity(revision.len());
        for e in revision {
            ops.push(match e.kind {
                Kind::Put if e.lease != 0 => {
                    ensure_lease(client, e.lease, leases).await?;
                    TxnOp::put(
                        e.key.clone(),
                        e.value.clone(),
                        Some(PutOptions::new().with_lease(e.lease)),
                    )
                }
                Kind::Put => TxnOp::put(e.key.clone(), e.value.clone(), None),
                Kind::Delete => TxnOp::delete(e.key.clone(), None),
            });
        }
        client.txn(Txn::new().and_then(ops)).await?;
        transactions += 1;
    }
    Ok(transactions)
}

/// Lease `id` exists on the cluster: it did (restored with the snapshot) or is granted now.
async fn ensure_lease(
    client: &mut etcd_client::Client,
    id: i64,
    leases: &mut Leases,
) -> Result<(), etcd_client::Error> {
    if leases.0.contains(&id) {
        return Ok(());
    }
    let alive = client
        .lease_time_to_live(id, None)
        .await
        .is_ok_and(|answer| answer.ttl() > 0);
    if !alive {
        client
            .lease_grant(RESTORED_LEASE_TTL, Some(LeaseGrantOptions::new().with_id(id)))
            .await?;
    }
    leases.0.insert(id);
    Ok(())
}
