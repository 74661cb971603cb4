//! The next step for one EtcdadmCluster as a pure function of what was observed: the etcd
//! membership safety rules of SPEC-etcdcluster.md live here, one module per concern, so they
//! are tested without an API. `plan` is the order in which the rules are asked.
//!
//! Every multi-step operation is derived from the world, never from memory: a Machine being
//! deleted means "remove its member first" (whoever deleted it: scale down, rollout,
//! remediation, `kubectl delete machine`), a Machine of the wrong spec means "roll it", a member
//! unhealthy for long enough means "replace it". A controller killed between any two writes
//! therefore resumes where it stopped and never repeats a membership change already done.

mod certificates;
mod control_plane;
mod deletion;
mod gates;
mod growth;
mod learners;
mod observed;
mod placement;
mod preflight;
mod recovery;
mod remediation;
mod removal;
mod restore;
mod rollout;
mod step;
#[cfg(test)]
pub(crate) mod testing;
mod versions;

pub use self::certificates::{CertificateKind, CertificateView, Expiring, expiring, outdate_expiring};
pub use self::gates::quorum;
pub use self::growth::{MIN_JOIN_DEADLINE, MIN_JOIN_INTERVALS, join_deadline};
pub use self::observed::{
    CaView, ClusterView, EtcdView, InitSecret, KcpView, LastRemediation, MachineView, MemberView, Observed,
    RemediationPolicy, RestoreView, healthy_client_urls, is_ready, machine_for_member, up_to_date_machines,
    voting_endpoints,
};
pub use self::placement::{allowed_failure_domains, pick_failure_domain, pick_victim};
pub use self::recovery::{
    Automatic, RecoveryAction, RecoveryRecord, RecoverySource, RecoveryView, SnapshotCheck, UnderWay,
    answer as recovery_answer,
};
pub use self::remediation::{
    ENDPOINTS_AVAILABLE, MIN_HEALTHY_PERIOD, REMEDIATION_ANNOTATION, REMEDIATION_FOR_ANNOTATION,
    RemediationRecord, UnhealthyClock, remediation_backoff, remediation_policy,
};
pub use self::restore::RESTORE_URL_TTL;
pub use self::rollout::{DesiredSpec, MemberSpec, config_hash, outdated_reason};
pub use self::step::{EventNote, Growth, Removal, Step, reason, removal_reason};
pub use self::versions::{VERSION_FIELD, cluster_version};

use self::rollout::Want;

/// The one next step.
pub fn plan(o: &Observed) -> Step {
    preflight::cluster(o)
        .or_else(|| deletion::plan(o))
        .or_else(|| preflight::ownership(o))
        .or_else(|| preflight::spec(o))
        .or_else(|| preflight::infrastructure(o))
        .or_else(|| control_plane::keep_paused(o))
        .or_else(|| preflight::ca(o))
        // Quorum-loss recovery: replaces the lost cluster (outside rule 3, only without quorum).
        .or_else(|| recovery::plan(o))
        // Restore: only while no member ever existed, or once a recovery deleted them all.
        .or_else(|| restore::plan(o))
        // Rule 3: nothing at all while quorum is lost.
        .or_else(|| gates::quorum_lost(o))
        // Rule 4: every Machine carries our hook; a deleted one's member goes first (rules 3, 6).
        .or_else(|| removal::adoption(o))
        .or_else(|| removal::deleted_machine(o))
        .or_else(|| growth::publish_init_secret(o))
        .unwrap_or_else(|| membership(o))
}

/// Scale, roll and remediate: every step here starts a membership change (or hands the
/// control plane its endpoints), so each waits for the previous one to finish.
fn membership(o: &Observed) -> Step {
    let allowed = match placement::allowed_domains(o) {
        Ok(allowed) => allowed,
        Err(refusal) => return refusal,
    };
    let wanted = rollout::want(o);
    // Rule 1: one change in flight, a join given up on past its deadline; a learner join
    // finished by its promotion, or begun once the way is clear (rule 2).
    removal::deletion_in_flight(o)
        .or_else(|| growth::failed_join(o))
        .or_else(|| learners::promote(o))
        .or_else(|| learners::pre_add(o))
        .or_else(|| gates::pending_change(o))
        .or_else(|| removal::dead_victim(o, &allowed, &wanted))
        .or_else(|| remediation::replace_overdue(o))
        // Rules 4 and 2: strangers and unhealthy members hold everything else back.
        .or_else(|| gates::unknown_members_wait(o))
        .or_else(|| gates::unhealthy_wait(o))
        .or_else(|| gates::first_member_wait(o))
        .or_else(|| growth::init_secret_urls(o))
        .unwrap_or_else(|| act(o, &allowed, wanted))
}

/// What the replica count and the rollout strategy want, once every gate is open.
fn act(o: &Observed, allowed: &[String], wanted: Want<'_>) -> Step {
    match wanted {
        Want::Add(purpose) => growth::create_machine(o, allowed, purpose),
        Want::Remove(candidates, purpose) => {
            // A remove-first rollout's removal is the first half of a replacement: not begun
            // unless the second half can be made.
            let remove_first = purpose == Removal::Rollout && !o.surge();
            let blocked = remove_first.then(|| growth::creation_blocked(o)).flatten();
            blocked
                .or_else(|| removal::remove_one(o, allowed, &candidates, purpose))
                .unwrap_or_else(|| settled(o))
        }
        Want::SwitchKcp(endpoints) => Step::WriteKcpEndpoints { endpoints },
        Want::WaitForKcp(name) => Step::Wait {
            reason: reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
            message: format!(
                "waiting for KubeadmControlPlane {name} to finish rolling its Machines onto the etcd endpoints it was given before the next outdated member goes"
            ),
        },
        Want::Nothing => settled(o),
    }
}

/// Nothing to add or remove: hand the control plane what it needs, clean up, renew its client
/// certificate, or say steady.
fn settled(o: &Observed) -> Step {
    control_plane::hand_over(o)
        .or_else(|| growth::leftovers(o))
        .or_else(|| certificates::client_renewal(o))
        .unwrap_or_else(|| {
            if is_ready(o) {
                Step::Steady
            } else {
                Step::Wait {
                    reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
                    message: "membership does not match the Machines yet".into(),
                }
            }
        })
}
