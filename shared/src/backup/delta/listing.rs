//! Why: the delta objects a store holds beside a full snapshot, read from its listing; apart
//! from `chain`, which plans from names alone and is what the API's types use.

use super::chain::DeltaName;
use super::prefix;
use crate::store::{StoreClient, StoreError};

/// The delta objects `store` lists beside the full snapshot `snapshot_key` (other keys under
/// its prefix are not deltas and are passed over), in the listing's order.
pub async fn listed(store: &StoreClient, snapshot_key: &str) -> Result<Vec<DeltaName>, StoreError> {
    Ok(store
        .list(&prefix(snapshot_key))
        .await?
        .iter()
        .filter_map(|o| DeltaName::parse(snapshot_key, &o.key))
        .collect())
}
