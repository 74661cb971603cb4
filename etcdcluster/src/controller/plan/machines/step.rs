//! The Machine concern's words: why a Machine is created or deleted, what a new member is made
//! of, the step, and the condition reasons of both.

use std::time::Duration;

use kube::api::ApiResource;

use crate::controller::decision::reason::{REMEDIATING, ROLLING_UPDATE, SCALING_DOWN};

/// Condition reasons of Machine creation and deletion.
pub mod reason {
    pub const ADOPTING_MACHINE: &str = "AdoptingMachine";
    pub const ORPHAN_MACHINE: &str = "OrphanMachine";
    pub const MEMBER_JOIN_FAILED: &str = "MemberJoinFailed";
    pub const INFRASTRUCTURE_TEMPLATE_NOT_FOUND: &str = "InfrastructureTemplateNotFound";
    pub const WAITING_FOR_MACHINE_DELETION: &str = "WaitingForMachineDeletion";
    pub const WAITING_FOR_CONTROL_PLANE_ROLLOUT: &str = "WaitingForControlPlaneRollout";
}

/// Why a Machine is deleted (its member is removed first, through the pre-terminate hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    ScaleDown,
    /// An outdated member during a rolling replacement.
    Rollout,
    /// Its member was unhealthy for longer than `unhealthyAfter`; `retries` counts the failed
    /// replacements before this one.
    Remediation {
        retries: u32,
    },
    /// Its member left etcd (removed by someone) and never came back.
    OrphanMachine,
    /// It did not become a healthy member within the join deadline.
    FailedJoin,
}

/// Why a Machine is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    ScaleUp,
    /// A member of the current spec during a rolling replacement.
    Rollout,
    /// The replacement of a remediated member: it carries the remediation's record, so its own
    /// failure soon after counts as a failed replacement.
    Replacement,
    /// The first member of a cluster created from a snapshot: its EtcdadmConfig names the
    /// restore Secret.
    Restore,
}

/// What every new member's objects are made of besides its name, as observed: the Cluster, the
/// infrastructure machine kind cloned from the template, the Machine version, how long a
/// learner join waits to be listed and, for a replacement, the remediation record it carries.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberTemplate {
    pub cluster: String,
    pub infra: ApiResource,
    pub version: Option<String>,
    /// Written on its EtcdadmConfig for the bootstrap provider (`learner_listed_wait`).
    pub listed_wait: Duration,
    pub remediation_for: Option<String>,
    /// Its EtcdadmConfig's `ca-bundle` annotation: the bundle a CA rotation's roll targets
    /// (None: the current CA alone).
    pub ca_bundle: Option<String>,
}

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum MachineStep {
    /// Create the infra machine, EtcdadmConfig and Machine of one new member, all named `name`:
    /// a fresh name, or the name of an interrupted creation to finish (`resume`).
    CreateMachine {
        name: String,
        resume: bool,
        failure_domain: Option<String>,
        purpose: Growth,
        template: MemberTemplate,
    },
    /// A Machine labelled for us without a controller (`orphan`), or without our pre-terminate
    /// hook: take it over so its deletion cannot skip member removal.
    AdoptMachine { machine: String, orphan: bool },
    /// Delete a member Machine; its member is removed first (the hook holds the Machine).
    DeleteMachine {
        machine: String,
        purpose: Removal,
        message: String,
    },
    /// Remove infra machines/configs of interrupted creations no longer needed.
    DeleteLeftovers {
        names: Vec<String>,
        infra: Option<ApiResource>,
    },
}

/// What a member Machine is to report of itself: whether it runs the current spec (its
/// `UpToDate` condition, which v1beta2 leaves to a Machine's owner), since `since` when its
/// status stays.
#[derive(Clone, Debug, PartialEq)]
pub struct UpToDateReport {
    pub machine: String,
    pub up_to_date: bool,
    pub message: String,
    pub since: Option<String>,
}
/// The condition reason of a Machine deletion.
pub fn removal_reason(purpose: Removal) -> &'static str {
    match purpose {
        Removal::ScaleDown => SCALING_DOWN,
        Removal::Rollout => ROLLING_UPDATE,
        Removal::Remediation { .. } => REMEDIATING,
        Removal::OrphanMachine => reason::ORPHAN_MACHINE,
        Removal::FailedJoin => reason::MEMBER_JOIN_FAILED,
    }
}
