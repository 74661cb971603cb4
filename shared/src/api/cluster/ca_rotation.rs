//! Why: a `rotate-ca` request is checked at admission, where the person asking hears the reason
//! at once (docs/security.md, "Rotating the etcd CA"): a rotation never starts beside another,
//! a restore or a recovery, and not on Bottlerocket members, whose bootstrap container is not
//! verified with a CA bundle.

use std::collections::BTreeMap;

use super::status::{CaRotationStatus, EtcdadmClusterStatus};
use crate::names::{RECOVER_ANNOTATION, ROTATE_CA_ANNOTATION};
use crate::validation::field::FieldError;

/// What a rotation request is judged by, of one EtcdadmCluster (`EtcdadmCluster::rotation_facts`).
#[derive(Clone, Copy, Debug)]
pub struct RotationFacts<'a> {
    pub annotations: &'a BTreeMap<String, String>,
    pub status: Option<&'a EtcdadmClusterStatus>,
    /// Its members run Bottlerocket.
    pub bottlerocket: bool,
    /// `spec.restore` is set.
    pub restore: bool,
}

/// The longest `rotate-ca` value: a label's worth, enough to tell requests apart.
pub const MAX_ROTATE_CA_VALUE: usize = 63;

/// Why the Bottlerocket format refuses a rotation.
pub const BOTTLEROCKET_REFUSAL: &str = "CA rotation is not supported on Bottlerocket members yet: \
     its bootstrap container's user data has not been verified with a CA bundle";

/// The field path of the annotation, as admission names it.
fn path() -> String {
    format!("metadata.annotations[{ROTATE_CA_ANNOTATION}]")
}

/// A restore or a quorum-loss recovery under way, as the stored object says: a rotation neither
/// starts beside one nor is asked for during one.
pub fn other_operation(cluster: &RotationFacts<'_>) -> Option<String> {
    let recovering = cluster.status.is_some_and(|s| s.recovery.is_some());
    if recovering || cluster.annotations.contains_key(RECOVER_ANNOTATION) {
        return Some("a quorum-loss recovery is under way".into());
    }
    let initialized = cluster.status.is_some_and(|s| s.initialized);
    (cluster.restore && !initialized).then(|| "a restore is under way".into())
}

/// How a rotation under way is named in a refusal.
fn under_way(rotation: &CaRotationStatus) -> String {
    format!(
        "a CA rotation{} is under way (phase {}): it cannot be changed or stopped; set a new value once it is done",
        rotation
            .request
            .as_deref()
            .map(|r| format!(" for {r:?}"))
            .unwrap_or_default(),
        rotation.phase
    )
}

/// The refusals of a `rotate-ca` annotation set or changed on `new` (`old`: the object before,
/// None on create).
pub fn rotation_problems(old: Option<&RotationFacts<'_>>, new: &RotationFacts<'_>) -> Vec<FieldError> {
    let asked = new.annotations.get(ROTATE_CA_ANNOTATION);
    let before = old.and_then(|o| o.annotations.get(ROTATE_CA_ANNOTATION));
    if asked == before {
        return vec![];
    }
    // Removed or changed while a rotation is under way: it goes on for the request it began for.
    let status = old.and_then(|o| o.status).or(new.status);
    if let Some(rotation) = status.and_then(|s| s.ca_rotation.as_ref()) {
        return vec![FieldError::new(path(), under_way(rotation))];
    }
    let Some(value) = asked else {
        return vec![];
    };
    let mut errors = vec![];
    if value.trim().is_empty() || value.len() > MAX_ROTATE_CA_VALUE {
        errors.push(FieldError::new(
            path(),
            format!("must be 1 to {MAX_ROTATE_CA_VALUE} characters, a value no earlier rotation used"),
        ));
    }
    if new.bottlerocket {
        errors.push(FieldError::new(path(), BOTTLEROCKET_REFUSAL));
    }
    if let Some(blocker) = other_operation(new) {
        errors.push(FieldError::new(
            path(),
            format!("a CA rotation cannot start now: {blocker}"),
        ));
    }
    errors
}
