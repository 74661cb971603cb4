//! When a reconcile that could not go on looks again: progress that shows only in etcd (a
//! member's join, the first member's `etcdadm init`, etcd's strict reconfiguration check
//! clearing) is polled briefly, since no watched object changes with it; a wait on another actor
//! soon; what only a human can fix now and then.

use std::time::Duration;

use etcdadm_shared::etcd::{EtcdError, Refusal};

use super::super::decision::{
    After, Hold, HoldKind, JOIN_POLL, MEMBERSHIP_RETRY, REFUSED_REQUEUE, STRICT_CHECK_RETRY, WAIT_REQUEUE,
};
use super::super::observation::Observation;
use super::super::rules::reason as rule;

/// When to look again while `hold` holds the plan back.
pub fn hold_after(hold: &Hold, o: &Observation) -> After {
    let interval = o.health_interval();
    match (hold.kind, hold.reason) {
        (HoldKind::Refuse, _) => After::Requeue(REFUSED_REQUEUE),
        (HoldKind::Wait | HoldKind::Refusal, rule::WAITING_FOR_MEMBER_JOIN | rule::WAITING_FOR_LEARNER) => {
            After::Requeue(interval.min(JOIN_POLL))
        }
        // The first member's Machine booted: its `etcdadm init` runs, and it ends in etcd alone
        // (the joiners' Machines are created once it is healthy, so every second counts twice:
        // theirs boot only then).
        (HoldKind::Wait, rule::WAITING_FOR_FIRST_MEMBER) if first_member_initializing(o) => {
            After::Requeue(interval.min(JOIN_POLL))
        }
        (HoldKind::Wait | HoldKind::Refusal, _) => After::Requeue(interval.min(WAIT_REQUEUE)),
    }
}

/// The cluster was never initialized and a Machine of it has an address: the first member's
/// user data runs. (An initialized cluster that does not answer is no join: it is looked at
/// again at the usual pace.)
fn first_member_initializing(o: &Observation) -> bool {
    !o.initialized && o.machines.iter().any(|m| m.address.is_some() && !m.deleting)
}

/// When to ask again after etcd refused a membership change for a passing reason `e`: its
/// strict reconfiguration check (`unhealthy cluster`: the member asked must have been connected
/// to every voter for 5 s, counted from the newest voter's start) clears at a moment only etcd
/// knows, so it is asked often; the other passing refusals (no leader, leadership moving, a
/// timeout) a little later.
pub fn deferred_retry(e: &EtcdError) -> Duration {
    match e.refusal() {
        Some(Refusal::UnhealthyCluster) => STRICT_CHECK_RETRY,
        _ => MEMBERSHIP_RETRY,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::*;

    fn first_machine(address: Option<&str>) -> Observation {
        let mut o = base();
        o.machines = vec![machine("m1", address, None)];
        o
    }

    #[test]
    fn a_hold_is_polled_only_while_what_it_waits_for_shows_in_etcd_alone() {
        let booting = first_machine(None);
        let initializing = first_machine(Some("10.0.0.1"));
        let mut established = running(3);
        established.initialized = true;
        let mut being_deleted = first_machine(Some("10.0.0.1"));
        being_deleted.machines[0].deleting = true;
        let first = |message: &str| Hold::wait(rule::WAITING_FOR_FIRST_MEMBER, message);
        let poll = After::Requeue(JOIN_POLL);
        let wait = After::Requeue(WAIT_REQUEUE);
        for (what, hold, o, after) in [
            (
                "a member joining",
                Hold::wait(rule::WAITING_FOR_MEMBER_JOIN, "x"),
                &established,
                poll,
            ),
            (
                "a learner catching up",
                Hold::wait(rule::WAITING_FOR_LEARNER, "x"),
                &established,
                poll,
            ),
            (
                "the first Machine boots: its address comes through the watch",
                first("x"),
                &booting,
                wait,
            ),
            (
                "the first member's etcdadm init runs",
                first("x"),
                &initializing,
                poll,
            ),
            (
                "an initialized cluster that does not answer",
                first("x"),
                &established,
                wait,
            ),
            (
                "the first Machine is being deleted",
                first("x"),
                &being_deleted,
                wait,
            ),
            (
                "a refused change",
                Hold::refusal(rule::WAITING_FOR_FIRST_MEMBER, "x"),
                &initializing,
                wait,
            ),
            (
                "only a human can fix it",
                Hold::refuse(rule::WAITING_FOR_MEMBER_JOIN, "x"),
                &established,
                After::Requeue(REFUSED_REQUEUE),
            ),
        ] {
            assert_eq!(hold_after(&hold, o), after, "{what}");
        }
    }

    #[test]
    fn etcds_strict_reconfiguration_check_is_asked_again_sooner_than_other_passing_refusals() {
        let refused = |message: &str| EtcdError::Refused {
            endpoint: "https://10.0.0.1:2379".into(),
            operation: "MemberAdd",
            refusal: Refusal::from_message(message),
            message: message.into(),
        };
        for (message, retry) in [
            (
                "etcdserver: unhealthy cluster; wait until every voting member is started and connected, then retry",
                STRICT_CHECK_RETRY,
            ),
            ("etcdserver: no leader", MEMBERSHIP_RETRY),
            ("etcdserver: request timed out", MEMBERSHIP_RETRY),
        ] {
            assert_eq!(deferred_retry(&refused(message)), retry, "{message}");
        }
        assert!(STRICT_CHECK_RETRY < MEMBERSHIP_RETRY);
    }
}
