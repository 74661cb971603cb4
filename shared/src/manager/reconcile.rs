//! What every reconcile loop of these controllers shares: how long to wait before looking
//! again, and what a loop does after a step.

use std::time::Duration;

use kube::runtime::controller::Action;

/// Requeue while waiting on another actor (a watch event usually comes sooner).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// A state only a human can fix is still looked at now and then.
pub const REFUSED_REQUEUE: Duration = Duration::from_secs(60);

/// What the reconcile does after a step.
pub enum Next {
    /// Something changed; observe again.
    Again,
    Done(Action),
}
