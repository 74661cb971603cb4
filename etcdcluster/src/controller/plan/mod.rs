//! The next step for one EtcdadmCluster: one module per concern below (its decisions, its words,
//! its steps' effects and its part of the status), the registry of concerns (`concerns!`: the
//! sum of their steps, each step's words and effect dispatched to the concern that owns it, and
//! every concern's part of the status in registry order), and `plan`, the order in which the
//! rules and concerns are asked (docs/architecture.md, "The order of the plan"; the rules cited
//! are those of docs/safety.md).
//!
//! Every multi-step operation is derived from the world, never from memory: a Machine being
//! deleted means "remove its member first" (whoever deleted it: scale down, rollout,
//! remediation, `kubectl delete machine`), a Machine of the wrong spec means "roll it", a member
//! unhealthy for long enough means "replace it". A controller killed between any two writes
//! therefore resumes where it stopped and never repeats a membership change already done.

pub mod alarms;
pub mod ca_rotation;
pub mod certificates;
pub mod control_plane;
pub mod lifecycle;
pub mod machines;
pub mod maintenance;
pub mod membership;
pub mod placement;
pub mod recovery;
pub mod remediation;
pub mod requeue;
pub mod restore;
pub mod rollout;
pub mod safe_changes;
pub mod secrets;
pub mod versions;

use futures::future::BoxFuture;
use kube::Client;

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::error::Error;
use etcdadm_shared::manager::Metrics;

use self::machines::Removal;
use self::rollout::Want;
use super::decision::reason::READY;
use super::decision::{
    After, Applied, ConcernMetrics, ConcernStep, ConcernView, Decision, EventNote, Hold, Outputs, StatusPart,
};
use super::observation::clock::UnhealthyClock;
use super::observation::{self, ByType, Observation, Reads, is_ready};
use super::rules::{self, reason as rule};
use crate::metrics::{ConcernFamilies, EtcdClusterMetrics};

/// The registry of concerns: the sum of their steps and its dispatch, each arm calling the
/// concern's own `ConcernStep`, and the status made of every concern's part, in registry order
/// (its conditions are set in that order). A concern is one line here.
macro_rules! concerns {
    ($($(#[$doc:meta])* $variant:ident($step:ty)),* $(,)?) => {
        /// The one next thing to do, and why.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Step {
            /// Nothing to write now: a rule or a concern holds the plan back.
            Hold(Hold),
            $($(#[$doc])* $variant($step),)*
            /// Every desired member is a healthy voter and KCP has what it needs.
            Steady,
        }

        $(
            impl From<$step> for Step {
                fn from(step: $step) -> Self {
                    Step::$variant(step)
                }
            }

            impl From<Decision<$step>> for Step {
                fn from(decision: Decision<$step>) -> Self {
                    match decision {
                        Decision::Hold(hold) => Step::Hold(hold),
                        Decision::Do(step) => Step::$variant(step),
                    }
                }
            }
        )*

        /// The registry of concerns as the observation sees it: every concern's own reads and
        /// views.
        pub struct Concerns;

        /// One concern's read, kept once every read is done.
        type KeepRead = Box<dyn FnOnce(&mut ByType) + Send>;

        impl observation::Concerns for Concerns {
            fn read<'a>(
                &'a self,
                client: &'a Client,
                namespace: &'a str,
                etcd: &'a EtcdadmCluster,
            ) -> BoxFuture<'a, Result<ByType, Error>> {
                let reads: Vec<BoxFuture<'a, Result<KeepRead, Error>>> = vec![$(
                    Box::pin(async move {
                        let read =
                            <<$step as ConcernStep>::View as ConcernView>::read(client, namespace, etcd).await?;
                        let keep: KeepRead = Box::new(move |kept: &mut ByType| {
                            kept.insert::<<$step as ConcernStep>::View, _>(read)
                        });
                        Ok(keep)
                    }),
                )*];
                Box::pin(async move {
                    let mut kept = ByType::default();
                    for keep in futures::future::try_join_all(reads).await? {
                        keep(&mut kept);
                    }
                    Ok(kept)
                })
            }

            fn keep(&self, reads: &Reads) -> bool {
                $({
                    type View = <$step as ConcernStep>::View;
                    if let Some(read) = reads.concerns.get::<View, <View as ConcernView>::Read>()
                        && !View::keep(read, &reads.etcd_cluster)
                    {
                        return false;
                    }
                })*
                true
            }

            fn views(&self, reads: &Reads, clock: &UnhealthyClock) -> ByType {
                let mut views = ByType::default();
                $({
                    type View = <$step as ConcernStep>::View;
                    if let Some(read) = reads.concerns.get::<View, <View as ConcernView>::Read>() {
                        views.insert::<View, _>(View::view(read, reads, clock));
                    }
                })*
                views
            }

            fn outdated(&self, views: &ByType, machine: &str) -> Option<String> {
                let reasons: Vec<String> = [$({
                    type View = <$step as ConcernStep>::View;
                    views.get::<View, View>().and_then(|view| view.outdates(machine))
                }),*]
                .into_iter()
                .flatten()
                .collect();
                (!reasons.is_empty()).then(|| reasons.join("; "))
            }
        }

        /// Every concern's metric families, registered with `registry`.
        pub fn concern_metrics(registry: &Metrics) -> ConcernFamilies {
            let mut families = ConcernFamilies::default();
            $(
                let mine = <<$step as ConcernStep>::Metrics>::default();
                mine.register(registry);
                families.insert(mine);
            )*
            families
        }

        impl Step {
            /// The condition reason and message for the `Ready` summary while this step is next.
            pub fn reason(&self) -> (&'static str, String) {
                match self {
                    Step::Hold(hold) => (hold.reason, hold.message.clone()),
                    $(Step::$variant(step) => step.reason(),)*
                    Step::Steady => (READY, String::new()),
                }
            }

            /// The Event this step leaves once applied: a pure function of the plan's input and
            /// output. Steps that only tidy up and those that write nothing leave none.
            pub fn event(&self, o: &Observation) -> Option<EventNote> {
                match self {
                    Step::Hold(_) | Step::Steady => None,
                    $(Step::$variant(step) => step.event(o),)*
                }
            }

            /// Whether this step writes anything (used to check the "no writes" rules).
            pub fn writes(&self) -> bool {
                match self {
                    Step::Hold(_) | Step::Steady => false,
                    $(Step::$variant(step) => step.writes(),)*
                }
            }

            /// How much longer than the reconcile's deadline this step's effect may take.
            pub fn time_allowed(&self) -> std::time::Duration {
                match self {
                    Step::Hold(_) | Step::Steady => std::time::Duration::ZERO,
                    $(Step::$variant(step) => step.time_allowed(),)*
                }
            }

            /// Perform a step that writes; the concern that owns it does.
            pub async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
                match self {
                    Step::Hold(_) | Step::Steady => Ok(Applied::AlreadyDone),
                    $(Step::$variant(step) => step.apply(out, o).await,)*
                }
            }

            /// What the reconcile does once this step is done (or, for one that writes nothing,
            /// now).
            pub fn after(&self, o: &Observation) -> After {
                match self {
                    Step::Hold(hold) => requeue::hold_after(hold, o),
                    Step::Steady => After::Requeue(o.health_interval()),
                    $(Step::$variant(step) => step.after(o),)*
                }
            }

            /// Whether this step forgets the etcd cluster (`status.initialized` is cleared).
            pub fn forgets_cluster(&self) -> bool {
                match self {
                    Step::Hold(_) | Step::Steady => false,
                    $(Step::$variant(step) => step.forgets_cluster(),)*
                }
            }

            /// Every concern's metric gauges from what was observed and the status written.
            pub fn observe_concern_metrics(
                metrics: &EtcdClusterMetrics,
                namespace: &str,
                name: &str,
                o: &Observation,
                status: &EtcdadmClusterStatus,
            ) {
                $(
                    if let Some(families) = metrics.concern::<<$step as ConcernStep>::Metrics>() {
                        families.observe(namespace, name, o, status);
                    }
                )*
            }

            /// Every concern's part of the status, in registry order, this step being the one
            /// planned.
            pub fn concern_status(&self, part: &mut StatusPart<'_>) {
                $(
                    let step = if let Step::$variant(step) = self { Some(step) } else { None };
                    <$step as ConcernStep>::status(part, step);
                )*
            }
        }
    };
}

// A recovery records its outcome before the restore reads it (`RevisionsBumped` looks at both).
concerns!(
    Lifecycle(lifecycle::LifecycleStep),
    Secrets(secrets::SecretStep),
    Certificates(certificates::CertificateStep),
    CaRotation(ca_rotation::RotationStep),
    Machines(machines::MachineStep),
    Membership(membership::MembershipStep),
    ControlPlane(control_plane::ControlPlaneStep),
    Recover(recovery::RecoveryStep),
    Restore(restore::RestoreStep),
    Alarms(alarms::AlarmStep),
    Maintenance(maintenance::MaintenanceStep),
    SafeChanges(safe_changes::SafeChangeStep),
    Versions(versions::VersionStep),
);

impl From<Hold> for Step {
    fn from(hold: Hold) -> Self {
        Step::Hold(hold)
    }
}

impl Step {
    /// What holds the plan back, when this step is a hold.
    pub fn hold(&self) -> Option<&Hold> {
        if let Step::Hold(hold) = self {
            Some(hold)
        } else {
            None
        }
    }

    /// Whether this step is a refusal an operator should hear about (a Warning Event when it
    /// starts).
    pub fn is_refusal(&self) -> bool {
        self.hold().is_some_and(Hold::is_refusal)
    }
}

/// A rule's or a concern's answer, as a step.
fn step<S: Into<Step>>(answer: Option<S>) -> Option<Step> {
    answer.map(Into::into)
}

/// The one next step: the rules and concerns asked in order, the first answer taken.
pub fn plan(o: &Observation) -> Step {
    step(lifecycle::cluster(o))
        .or_else(|| step(lifecycle::deletion(o)))
        .or_else(|| step(lifecycle::ownership(o)))
        .or_else(|| step(lifecycle::spec(o)))
        .or_else(|| step(lifecycle::infrastructure(o)))
        // A go-ahead annotation naming no change under way is removed before it can waive one.
        .or_else(|| step(safe_changes::stale(o)))
        .or_else(|| step(control_plane::keep_paused(o)))
        .or_else(|| step(secrets::ca(o)))
        // Quorum-loss recovery: replaces the lost cluster (outside rule 3, only without quorum).
        .or_else(|| step(recovery::plan(o)))
        // Restore: only while no member ever existed, or once a recovery deleted them all.
        .or_else(|| step(restore::secret(o)))
        .or_else(|| step(restore::first_member(o)))
        // Rule 3: nothing at all while quorum is lost.
        .or_else(|| step(rules::quorum_lost(o)))
        // Rule 4: every Machine carries our hook; a deleted one's member goes first (rules 3, 6).
        .or_else(|| step(machines::adoption(o)))
        .or_else(|| step(membership::deleted_machine(o)))
        .or_else(|| step(secrets::publish_init_secret(o)))
        // Alarms: a full database is compacted, defragmented and disarmed first.
        .or_else(|| step(alarms::repair(o)))
        .unwrap_or_else(|| membership_changes(o))
}

/// Scale, roll and remediate: every step here starts a membership change (or hands the
/// control plane its endpoints), so each waits for the previous one to finish.
fn membership_changes(o: &Observation) -> Step {
    let allowed = match placement::allowed_domains(o) {
        Ok(allowed) => allowed,
        Err(refusal) => return refusal.into(),
    };
    let wanted = rollout::want(o);
    let room = rollout::waiting_room(o);
    // Rule 1: one change in flight, a join given up on past its deadline (or a Machine that
    // failed before its turn); Machines waiting for their turn that are no longer needed; a
    // learner join finished by its promotion, or resumed; Machines booted ahead of their turn
    // (no membership change: they join one at a time).
    step(machines::deletion_in_flight(o))
        .or_else(|| step(machines::failed_join(o)))
        .or_else(|| step(machines::surplus_waiting(o, room)))
        .or_else(|| step(membership::promote(o)))
        .or_else(|| step(membership::pre_add(o)))
        .or_else(|| step(machines::create_ahead(o, &allowed, room)))
        .or_else(|| step(rules::pending_change(o)))
        .or_else(|| step(remediation::replace_corrupt(o)))
        .or_else(|| {
            let Want::Remove(candidates, purpose) = &wanted else {
                return None;
            };
            step(machines::dead_victim(o, &allowed, candidates, *purpose))
        })
        .or_else(|| step(remediation::remove_stranger(o)))
        .or_else(|| step(remediation::replace_overdue(o)))
        // Rules 4 and 2: strangers and unhealthy members hold everything else back.
        .or_else(|| step(rules::unknown_members_wait(o)))
        .or_else(|| step(rules::unhealthy_wait(o)))
        .or_else(|| step(rules::first_member_wait(o)))
        .or_else(|| step(secrets::init_secret_urls(o)))
        .unwrap_or_else(|| act(o, &allowed, wanted))
}

/// What the replica count and the rollout strategy want, once every gate is open.
fn act(o: &Observation, allowed: &[String], wanted: Want<'_>) -> Step {
    match wanted {
        // A Machine waiting for its turn joins before any is created (rules 1 and 2 hold here).
        Want::Add(purpose) => step(membership::next_turn(o))
            .unwrap_or_else(|| machines::create_machine(o, allowed, purpose).into()),
        Want::Remove(candidates, purpose) => {
            // A remove-first rollout's removal is the first half of a replacement: not begun
            // unless the second half can be made.
            let remove_first = purpose == Removal::Rollout && !o.surge();
            let blocked = remove_first
                .then(|| machines::creation_blocked(o).err())
                .flatten();
            // A rollout's or a scale-down's removal waits for its before-change snapshot.
            step(blocked)
                .or_else(|| step(safe_changes::before_removal(o)))
                .or_else(|| step(machines::remove_one(o, allowed, &candidates, purpose)))
                .unwrap_or_else(|| settled(o))
        }
        Want::SwitchKcp(kcp, endpoints) => control_plane::switch(&kcp, endpoints).into(),
        Want::WaitForKcp(name) => Hold::wait(
            machines::reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
            format!(
                "waiting for KubeadmControlPlane {name} to finish rolling its Machines onto the etcd endpoints it was given before the next outdated member goes"
            ),
        )
        .into(),
        Want::Nothing => settled(o),
    }
}

/// Nothing to add or remove: hand the control plane what it needs, clean up, renew its client
/// certificate, say why an alarm is still raised, defragment a member on the policy, or say
/// steady.
fn settled(o: &Observation) -> Step {
    step(control_plane::hand_over(o))
        .or_else(|| step(machines::leftovers(o)))
        .or_else(|| step(restore::control_plane_rollout(o)))
        .or_else(|| step(certificates::client_renewal(o)))
        // A CA rotation's own writes; its rolls are the rolling replacement's.
        .or_else(|| step(ca_rotation::step::plan(o)))
        .unwrap_or_else(|| {
            if is_ready(o) {
                step(alarms::remaining(o))
                    .or_else(|| step(maintenance::routine(o)))
                    .unwrap_or(Step::Steady)
            } else {
                Hold::wait(
                    rule::WAITING_FOR_HEALTHY_MEMBERS,
                    "membership does not match the Machines yet",
                )
                .into()
            }
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::*;

    #[test]
    fn each_step_names_its_event_from_the_plan_alone() {
        let o = running(2);
        let create = plan(&o);
        let event = create.event(&o).unwrap();
        assert_eq!(
            (event.warning, event.reason, event.note.as_str()),
            (
                false,
                "MachineCreated",
                "created Machine c1-etcd-fresh (Machine 3 for 3 replicas)"
            )
        );
        let mut sick = running(3);
        members_mut(&mut sick)[1] = unhealthy(members_mut(&mut sick)[1].clone(), "connection refused");
        members_mut(&mut sick)[1].unhealthy_for = sick.remediation.unhealthy_after * 2;
        let remediate = plan(&sick);
        let event = remediate.event(&sick).unwrap();
        assert!(event.warning, "{remediate:?}");
        assert_eq!(event.reason, "MemberRemediation");
        assert_eq!(event.note, remediate.reason().1);
        let mut adopt = running(3);
        adopt.machines[1].orphan = true;
        let note = plan(&adopt).event(&adopt).unwrap().note;
        assert!(note.starts_with("adopted Machine c1-etcd-m1"), "{note}");
        assert_eq!(
            Step::Lifecycle(lifecycle::LifecycleStep::AddFinalizer).event(&o),
            None
        );
        assert_eq!(Step::Steady.event(&o), None);
    }
}
