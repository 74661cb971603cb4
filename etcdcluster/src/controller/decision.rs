//! The vocabulary every concern speaks, and the contract each concern fulfils
//! (`ConcernStep`): a rule that holds the plan back (`Hold`), a concern's answer (`Decision`),
//! its part of the status (`StatusPart`), where a step's effects go (`Outputs`), what applying
//! it came to (`Applied`), and what the reconcile does after it (`After`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use etcdadm_shared::api::conditions::{self, NewCondition};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterStatus};
use etcdadm_shared::etcd::EtcdError;
pub use etcdadm_shared::manager::events::EventNote;
use etcdadm_shared::manager::events::Recorder;
pub use etcdadm_shared::manager::reconcile::{REFUSED_REQUEUE, WAIT_REQUEUE};
use etcdadm_shared::ssa;
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;

use etcdadm_shared::error::Error;

use super::observation::clock::UnhealthyClock;
use super::observation::health::EtcdClients;
use super::observation::{Observation, Reads};
use crate::metrics::EtcdClusterMetrics;
use etcdadm_shared::manager::Metrics;

/// Field manager of this controller's creations and merge patches; each server-side apply site
/// has one of its own (`etcdadm-controller/<scope>`).
pub const FIELD_MANAGER: &str = "etcdadm-controller";
/// Requeue while a member joins: its start and its catching up show in etcd, not in any object
/// a watch would report (a learner's node writes nothing until it is promoted), so polling is
/// the only way to take the next step of a join promptly; it lasts only as long as the join.
/// Promotion in particular must follow quickly (docs/day2.md, "Learner joins": etcdadm's health
/// read gives up about 2.7 s after a learner starts).
pub const JOIN_POLL: Duration = Duration::from_millis(500);
/// Look again this soon after a promotion: the members apply it within a raft round, and what
/// follows (the next learner's turn, Ready) waits on nothing else.
pub const PROMOTION_APPLIED: Duration = Duration::from_millis(100);
/// Retry of a membership change etcd refused for a passing reason (no leader, leadership
/// moving, a timeout), and the pause after a removal or a leadership move.
pub const MEMBERSHIP_RETRY: Duration = Duration::from_secs(1);
/// Retry of a membership change etcd's strict reconfiguration check refused ("unhealthy
/// cluster": the member asked must have been connected to every voter for 5 s, so the next
/// learner waits about 5 s from the last one's start). It clears at a moment only etcd knows;
/// asked this often, the next join starts within a fraction of a second of it, for a few
/// requests per join.
pub const STRICT_CHECK_RETRY: Duration = Duration::from_millis(250);

/// Condition reasons more than one concern gives.
pub mod reason {
    pub const READY: &str = "Ready";
    pub const PROVISIONING: &str = "Provisioning";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const SCALING_UP: &str = "ScalingUp";
    pub const SCALING_DOWN: &str = "ScalingDown";
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    pub const REMEDIATING: &str = "Remediating";
    pub const RESTORING: &str = "RestoringFromSnapshot";
}

/// How much a hold asks of the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldKind {
    /// Waiting for something that comes by itself (severity Info).
    Wait,
    /// Waiting because the safety rules do not allow what is asked now: severity Warning, and a
    /// Warning Event when it begins.
    Refusal,
    /// Only a human can fix it (severity Error, a Warning Event when it begins); looked at again
    /// only now and then.
    Refuse,
}

/// A rule holding the plan back: nothing is written; `reason` and `message` say what is awaited
/// or refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub reason: &'static str,
    pub message: String,
    pub kind: HoldKind,
}

impl Hold {
    pub fn wait(reason: &'static str, message: impl Into<String>) -> Self {
        Hold {
            reason,
            message: message.into(),
            kind: HoldKind::Wait,
        }
    }

    pub fn refusal(reason: &'static str, message: impl Into<String>) -> Self {
        Hold {
            reason,
            message: message.into(),
            kind: HoldKind::Refusal,
        }
    }

    pub fn refuse(reason: &'static str, message: impl Into<String>) -> Self {
        Hold {
            reason,
            message: message.into(),
            kind: HoldKind::Refuse,
        }
    }

    /// A refusal an operator should hear about (a Warning Event when it starts).
    pub fn is_refusal(&self) -> bool {
        self.kind != HoldKind::Wait
    }
}

/// What a concern decides: hold the plan back, or take one of its steps.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision<S> {
    Hold(Hold),
    Do(S),
}

impl<S> From<Hold> for Decision<S> {
    fn from(hold: Hold) -> Self {
        Decision::Hold(hold)
    }
}

/// Where a step's effects go: the API server, Events, etcd, metrics.
pub struct Outputs<'a> {
    pub client: &'a Client,
    pub recorder: &'a Recorder,
    pub etcd_clients: &'a EtcdClients,
    /// Per-cluster metrics, when run by the manager (tests go without).
    pub metrics: Option<&'a EtcdClusterMetrics>,
    /// Restore checksums, computed in the snapshot slots.
    pub checksums: &'a crate::snapshot::Checksums,
    /// Continuous backup's deltas replayed onto a restored member, in the snapshot slots.
    pub replays: &'a crate::snapshot::Replays,
}

impl Outputs<'_> {
    /// Record into the cluster's metrics, when there are any.
    pub fn metrics(&self, etcd: &EtcdadmCluster, record: impl FnOnce(&EtcdClusterMetrics, &str, &str)) {
        if let Some(metrics) = self.metrics {
            record(metrics, &etcd.namespace().unwrap_or_default(), &etcd.name_any());
        }
    }

    /// Record into a concern's own families `M`, when there are metrics.
    pub(crate) fn concern_metrics<M: ConcernMetrics>(
        &self,
        etcd: &EtcdadmCluster,
        record: impl FnOnce(&M, &str, &str),
    ) {
        if let Some(families) = self.metrics.and_then(EtcdClusterMetrics::concern::<M>) {
            record(families, &etcd.namespace().unwrap_or_default(), &etcd.name_any());
        }
    }

    /// Publish `note` about `etcd`.
    pub async fn publish(&self, etcd: &EtcdadmCluster, note: EventNote) {
        self.recorder.note(etcd, "Reconcile", note).await;
    }

    /// Write `status` as `etcd`'s whole status (its fields are this controller's alone); the
    /// object as written.
    pub async fn write_status(
        &self,
        etcd: &EtcdadmCluster,
        status: &EtcdadmClusterStatus,
    ) -> Result<EtcdadmCluster, Error> {
        let name = etcd.name_any();
        let body = ssa::configuration::<EtcdadmCluster>(&name, json!({}), json!({ "status": status }));
        Ok(
            Api::<EtcdadmCluster>::namespaced(self.client.clone(), &etcd.namespace().unwrap_or_default())
                .patch_status(&name, &ssa::params(STATUS_MANAGER, true), &Patch::Apply(body))
                .await?,
        )
    }
}

/// The apply site of the status.
const STATUS_MANAGER: &str = "etcdadm-controller/status";

/// The contract of a concern: what its step says and does, and its part of the status. Every
/// concern implements it on its step type and is registered once, in `plan/mod.rs`'s
/// `concerns!`; `plan::Step` dispatches to it and the status loops over it.
pub(crate) trait ConcernStep {
    /// What the concern reads and sees besides the core observation (`()` for nothing of its
    /// own).
    type View: ConcernView;
    /// The concern's metric families (`()` for a concern without any of its own).
    type Metrics: ConcernMetrics;
    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String);
    /// The Event this step leaves once applied, if it leaves one: a pure function of the
    /// observation and the step.
    fn event(&self, o: &Observation) -> Option<EventNote>;
    /// Whether it writes anything (only a pause does not).
    fn writes(&self) -> bool {
        true
    }
    /// Whether it forgets the etcd cluster (a recovery's reset): `status.initialized` is cleared
    /// with it, so the next member restores a new one.
    fn forgets_cluster(&self) -> bool {
        false
    }
    /// How much longer than the reconcile's own deadline its effect may take: a
    /// defragmentation, which takes as long as the database is large. None for most.
    fn time_allowed(&self) -> Duration {
        Duration::ZERO
    }
    /// Perform it.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error>;
    /// What the reconcile does once it took effect.
    fn after(&self, o: &Observation) -> After;
    /// This concern's part of the status (its fields, its conditions, the Events of what changed
    /// in them), written before the planned step is taken; `step` is the planned step when it is
    /// this concern's. Pure: the status a reconcile writes is made of these and the members.
    fn status(part: &mut StatusPart<'_>, step: Option<&Self>)
    where
        Self: Sized,
    {
        let _ = (part, step);
    }
}

/// What a concern reads of the API and sees at one moment, declared in its module: its read is
/// made with every other read at once and kept between health rounds with them
/// (`observation::memo`), and its view is made with each observation (`Observation::view`).
pub(crate) trait ConcernView: std::any::Any + Clone + Default + Send + Sync {
    /// What it reads.
    type Read: std::any::Any + Clone + Send + Sync;
    /// Read it, for `etcd` as just read.
    fn read(
        client: &Client,
        namespace: &str,
        etcd: &EtcdadmCluster,
    ) -> impl Future<Output = Result<Self::Read, Error>> + Send;
    /// Whether what it read may be kept between health rounds (not while it waits on objects
    /// whose changes end no reuse).
    fn keep(read: &Self::Read, etcd: &EtcdadmCluster) -> bool {
        let _ = (read, etcd);
        true
    }
    /// Its view at one moment: from what it read, the observation's other reads and the clock.
    fn view(read: &Self::Read, reads: &Reads, clock: &UnhealthyClock) -> Self;
    /// Why this concern wants Machine `machine` replaced by the rolling replacement, if it does
    /// (a CA rotation's roll): added to the Machine's outdated reasons.
    fn outdates(&self, machine: &str) -> Option<String> {
        let _ = machine;
        None
    }
}

/// Nothing of its own to read or see.
impl ConcernView for () {
    type Read = ();

    async fn read(_: &Client, _: &str, _: &EtcdadmCluster) -> Result<(), Error> {
        Ok(())
    }

    fn view(_: &(), _: &Reads, _: &UnhealthyClock) {}
}

/// A concern's metric families, declared in its module: registered once with the manager's
/// registry through the registry of concerns, recorded by its steps (`Outputs::concern_metrics`)
/// and set from each status written.
pub(crate) trait ConcernMetrics: std::any::Any + Default + Send + Sync {
    /// Register every family, each with its help text.
    fn register(&self, registry: &Metrics);
    /// Set the gauges that follow what a reconcile observed and the status it wrote.
    fn observe(&self, namespace: &str, name: &str, o: &Observation, status: &EtcdadmClusterStatus) {
        let _ = (namespace, name, o, status);
    }
}

/// No families of its own.
impl ConcernMetrics for () {
    fn register(&self, _: &Metrics) {}
}

/// The status being made, as a concern's part of it sees it: the observation, the status as
/// stored, the step planned, the status so far (members, health, the summary) to add its own
/// fields and conditions to, and the Events of what changed.
pub struct StatusPart<'a> {
    pub o: &'a Observation,
    /// The status as stored before this reconcile's write.
    pub old: &'a EtcdadmClusterStatus,
    /// The planned step's condition reason and message (the `Ready` summary's while it is next).
    pub next: (&'static str, &'a str),
    pub now: &'a Time,
    pub status: &'a mut EtcdadmClusterStatus,
    pub events: &'a mut Vec<EventNote>,
}

impl StatusPart<'_> {
    /// Set condition `condition` (as of the EtcdadmCluster's generation).
    pub fn set_condition(&mut self, condition: NewCondition) {
        let generation = self.o.etcd_cluster.metadata.generation;
        conditions::set(&mut self.status.conditions, condition, generation, self.now);
    }

    /// Remove the condition of type `type_`, if it is there.
    pub fn remove_condition(&mut self, type_: &str) {
        self.status.conditions.retain(|c| c.type_ != type_);
    }

    /// An Event of what changed in this part.
    pub fn event(&mut self, note: EventNote) {
        self.events.push(note);
    }
}

/// How applying a step went.
pub enum Applied {
    /// It took effect: its Event is published.
    Done,
    /// What it creates existed already (an earlier attempt or a racer made it): no Event.
    AlreadyDone,
    /// etcd refused the membership change for a passing reason: retried shortly.
    Deferred(EtcdError),
    /// etcd is not ready for it yet (a learner catching up): asked again after [`JOIN_POLL`],
    /// without an Event.
    NotYet,
    /// It took effect, and what only its outcome tells (a defragmentation's size after) goes
    /// into the status: the reconcile writes the status again with it, then publishes the
    /// step's Event.
    Recorded(Record),
}

/// What a step's outcome adds to the status as written before the step.
pub type Record = Box<dyn FnOnce(&mut EtcdadmClusterStatus) + Send>;

impl From<bool> for Applied {
    /// `created` as returned by a create-if-absent.
    fn from(created: bool) -> Self {
        if created {
            Applied::Done
        } else {
            Applied::AlreadyDone
        }
    }
}

/// What the reconcile does once a step took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Observe again at once: the next step may follow.
    Again,
    /// Look again after this long: what comes next shows in etcd or in another actor's objects,
    /// not in an object this controller watches.
    Requeue(Duration),
    /// Nothing more until something changes.
    AwaitChange,
}

impl After {
    /// The requeue `self` asks for; `None` to observe again at once.
    pub fn action(self) -> Option<Action> {
        match self {
            After::Again => None,
            After::Requeue(wait) => Some(Action::requeue(wait)),
            After::AwaitChange => Some(Action::await_change()),
        }
    }
}
