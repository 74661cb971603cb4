//! The next step for one EtcdadmCluster as a pure function of what was observed: the etcd
//! membership safety rules of SPEC-etcdcluster.md live here, so they are tested without an API.
//!
//! Every multi-step operation is derived from the world, never from memory: a Machine being
//! deleted means "remove its member first" (whoever deleted it: scale down, rollout,
//! remediation, `kubectl delete machine`), a Machine of the wrong spec means "roll it", a member
//! unhealthy for long enough means "replace it". A controller killed between any two writes
//! therefore resumes where it stopped and never repeats a membership change already done.

use std::time::Duration;

use etcdadm_shared::duration;
use etcdadm_shared::names;

/// The Cluster this etcd serves, as far as the plan needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterView {
    Missing,
    Found {
        name: String,
        paused: bool,
        deleting: bool,
        infrastructure_ready: bool,
        /// Failure domains the infrastructure offers, sorted.
        failure_domains: Vec<String>,
    },
}

/// The etcd CA Secret `<cluster>-managed-etcd`.
#[derive(Clone, Debug, PartialEq)]
pub enum CaView {
    Missing,
    Valid,
    /// Present but unusable: reported, never regenerated over the top.
    Corrupt(String),
}

/// One member Machine of this EtcdadmCluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineView {
    pub name: String,
    pub failure_domain: Option<String>,
    /// Address used for the member's URLs (`Machine::etcd_address`).
    pub address: Option<String>,
    pub deleting: bool,
    /// Carries our pre-terminate hook annotation.
    pub has_hook: bool,
    /// Labelled for us but controlled by nobody: adopted.
    pub orphan: bool,
    /// Carries `cluster.x-k8s.io/delete-machine`: the first scale-down victim.
    pub delete_requested: bool,
    /// Why it no longer matches the spec (a rolling replacement is due), if it does not.
    pub outdated: Option<String>,
    /// Status recorded an etcd member for it: it joined once.
    pub was_member: bool,
    /// How long it has been without a healthy member, by the remediation clock (time while
    /// the cluster had no quorum does not count).
    pub unhealthy_for: Duration,
    /// Time since the Machine was created.
    pub age: Duration,
    /// The remediation this Machine was created to replace (its `remediation-for` record).
    pub replaces: Option<LastRemediation>,
}

/// One etcd member from the member list, with what the health check found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemberView {
    pub id: u64,
    /// Empty until the member's process started and published itself.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    /// Passed this round's health check (`/health` 200 + true, Status answered, no alarm).
    pub healthy: bool,
    /// Was healthy at some check, this one or an earlier one. A started member that never was
    /// is still catching up after its join.
    pub ever_healthy: bool,
    pub is_leader: bool,
    /// Why it is unhealthy.
    pub message: Option<String>,
    /// The Machine this member runs on (rule 5: by name and peer URL).
    pub machine: Option<String>,
    pub etcd_version: Option<String>,
    pub db_size: Option<i64>,
    pub alarms: Vec<String>,
    /// How long it has been unhealthy, by the remediation clock.
    pub unhealthy_for: Duration,
}

impl MemberView {
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    fn is_joining(&self) -> bool {
        !self.is_started() || (!self.healthy && !self.ever_healthy)
    }

    pub fn describe(&self) -> String {
        match (&self.machine, self.is_started()) {
            (Some(machine), _) => format!("member of Machine {machine}"),
            (None, true) => format!("member {}", self.name),
            (None, false) => format!(
                "member {} ({})",
                etcdadm_shared::etcd::member_id_hex(self.id),
                self.peer_urls.join(",")
            ),
        }
    }
}

/// What the health check learned about the etcd cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum EtcdView {
    /// Nothing was asked: no usable CA, or no Machine with an address.
    NotChecked,
    /// Members were probed, but none answered a member list.
    Unreachable {
        message: String,
    },
    Members(Vec<MemberView>),
}

/// `<cluster>-etcd-init`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitSecretView {
    pub address: Option<String>,
    pub client_urls: Vec<String>,
}

/// The KubeadmControlPlane of the Cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum KcpView {
    /// The Cluster names no KubeadmControlPlane: etcd serves something else.
    None,
    /// Named by the Cluster but not found (yet).
    Missing { name: String },
    Found {
        name: String,
        /// Declares local (stacked) etcd or no `etcd.external`: never touched.
        local_etcd: bool,
        endpoints: Vec<String>,
        paused: bool,
        skip_pause: bool,
        /// `<cluster>-etcd` and `<cluster>-apiserver-etcd-client` both exist.
        secrets_present: bool,
        /// Every control plane Machine runs the current spec (`rollout_complete()`).
        rollout_complete: bool,
    },
}

/// Remediation settings after defaults and the reference annotation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemediationPolicy {
    pub enabled: bool,
    pub unhealthy_after: Duration,
    /// How long a new Machine may take to become a healthy member before it is replaced:
    /// `unhealthyAfter`, and at least [`MIN_JOIN_INTERVALS`] health intervals and
    /// [`MIN_JOIN_DEADLINE`].
    pub join_deadline: Duration,
}

/// A join is never given up on sooner than this many health intervals...
pub const MIN_JOIN_INTERVALS: u32 = 3;
/// ...nor sooner than this (a machine boots and etcd syncs; CAPI's MachineHealthCheck holds
/// `nodeStartupTimeout` to the same minimum).
pub const MIN_JOIN_DEADLINE: Duration = Duration::from_secs(30);

impl Default for RemediationPolicy {
    fn default() -> Self {
        RemediationPolicy {
            enabled: true,
            unhealthy_after: etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER,
            join_deadline: etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER,
        }
    }
}

/// A remediation, as recorded on the EtcdadmCluster (the last one) or on the Machine created to
/// replace the remediated one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastRemediation {
    pub machine: String,
    /// How long ago it started.
    pub ago: Duration,
    /// Replacements that failed in a row before it.
    pub retries: u32,
}

/// Everything the plan reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Name of the EtcdadmCluster.
    pub name: String,
    pub deleting: bool,
    pub has_finalizer: bool,
    pub has_cluster_owner_ref: bool,
    pub paused_annotation: bool,
    pub replicas: i32,
    /// `rolloutStrategy.rollingUpdate.maxSurge` (default 1).
    pub max_surge: i32,
    pub remediation: RemediationPolicy,
    pub last_remediation: Option<LastRemediation>,
    /// A spec problem admission should have caught (e.g. template in another namespace).
    pub spec_problem: Option<String>,
    /// What admission would refuse in the spec (field path and why): no member Machine is
    /// created from it.
    pub member_spec_problem: Option<String>,
    /// `spec.infrastructureTemplate` (`<Kind> <namespace>/<name>`) when it does not exist.
    pub missing_infra_template: Option<String>,
    /// `spec.failureDomains`.
    pub spec_failure_domains: Vec<String>,
    pub cluster: ClusterView,
    pub ca: CaView,
    /// Member Machines, oldest first.
    pub machines: Vec<MachineView>,
    /// Infra machines or EtcdadmConfigs of ours that have no Machine (an interrupted creation),
    /// oldest first.
    pub leftovers: Vec<String>,
    pub etcd: EtcdView,
    pub init_secret: Option<InitSecretView>,
    /// `status.initialized` as stored.
    pub initialized: bool,
    /// `status.creationComplete` as stored.
    pub creation_complete: bool,
    pub kcp: KcpView,
    /// Control plane Machines of the Cluster (only counted while deleting).
    pub control_plane_machines: usize,
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
}

/// A replacement that fails within this time of its creation is a failed replacement (the next
/// remediation backs off), as KCP's `minHealthyPeriod` default.
pub const MIN_HEALTHY_PERIOD: Duration = Duration::from_secs(3600);

/// The one next thing to do, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing to write now; `reason` and `message` say what is awaited.
    Wait {
        reason: &'static str,
        message: String,
    },
    /// Something only a human can fix; nothing is written.
    Refuse {
        reason: &'static str,
        message: String,
    },
    /// Paused: no writes (status still reports).
    Paused,
    AddClusterOwnerRef,
    AddFinalizer,
    PauseKcp,
    CreateCa,
    PublishInitSecret {
        address: String,
        client_urls: Vec<String>,
    },
    UpdateInitSecretUrls {
        client_urls: Vec<String>,
    },
    /// Create the infra machine, EtcdadmConfig and Machine of one new member. `adopt` names an
    /// interrupted creation to finish instead of starting a new name.
    CreateMachine {
        adopt: Option<String>,
        failure_domain: Option<String>,
        purpose: Growth,
    },
    /// Remove infra machines/configs of interrupted creations no longer needed.
    DeleteLeftovers {
        names: Vec<String>,
    },
    /// A Machine labelled for us without a controller, or without our pre-terminate hook: take
    /// it over so its deletion cannot skip member removal.
    AdoptMachine {
        machine: String,
    },
    /// Delete a member Machine; its member is removed first (the hook holds the Machine).
    DeleteMachine {
        machine: String,
        purpose: Removal,
        message: String,
    },
    WriteKcpEndpoints {
        endpoints: Vec<String>,
    },
    CreateKcpSecrets,
    UnpauseKcp,
    /// Rule 6: hand leadership from the member about to be removed (asked through its own
    /// client URL) to the healthy voter `to`.
    MoveLeader {
        leader_url: String,
        to: u64,
        machine: String,
    },
    /// Rules 3 and 4: remove a member (of a Machine being deleted, or an unhealthy one that
    /// runs on no Machine), asking a healthy member. `member` names it, `why` says why.
    RemoveMember {
        member_id: u64,
        via_url: String,
        member: String,
        why: String,
    },
    /// The Machine's member is gone: let CAPI terminate it.
    ReleaseHook {
        machine: String,
    },
    /// Deletion: release our pre-terminate hook on these Machines and delete them.
    ReleaseAndDeleteMachines {
        names: Vec<String>,
    },
    RemoveFinalizer,
    /// Every desired member is a healthy voter and KCP has what it needs.
    Steady,
}

/// Condition reasons the plan uses.
pub mod reason {
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_INFRASTRUCTURE: &str = "WaitingForInfrastructure";
    pub const PAUSED: &str = "Paused";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const CA_CORRUPT: &str = "EtcdCACorrupt";
    pub const CA_MISSING: &str = "EtcdCAMissing";
    pub const QUORUM_LOST: &str = "QuorumLost";
    pub const WAITING_FOR_MACHINE_ADDRESS: &str = "WaitingForMachineAddress";
    pub const WAITING_FOR_FIRST_MEMBER: &str = "WaitingForFirstMember";
    pub const WAITING_FOR_MEMBER_JOIN: &str = "WaitingForMemberJoin";
    pub const WAITING_FOR_LEARNER: &str = "WaitingForLearnerPromotion";
    pub const WAITING_FOR_HEALTHY_MEMBERS: &str = "WaitingForHealthyMembers";
    pub const UNKNOWN_MEMBERS: &str = "MembersWithoutMachines";
    pub const NO_FAILURE_DOMAIN: &str = "NoAllowedFailureDomain";
    pub const WAITING_FOR_MACHINE_DELETION: &str = "WaitingForMachineDeletion";
    pub const REMOVAL_WOULD_LOSE_QUORUM: &str = "RemovalWouldLoseQuorum";
    pub const LAST_MEMBER: &str = "LastMember";
    pub const REMOVING_MEMBER: &str = "RemovingMember";
    pub const WAITING_FOR_CONTROL_PLANE_DELETION: &str = "WaitingForControlPlaneDeletion";
    pub const WAITING_FOR_CLUSTER_DELETION: &str = "WaitingForClusterDeletion";
    pub const SCALING_UP: &str = "ScalingUp";
    pub const SCALING_DOWN: &str = "ScalingDown";
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    pub const ROLLOUT_PAUSED: &str = "RollingUpdatePaused";
    pub const WAITING_FOR_CONTROL_PLANE_ROLLOUT: &str = "WaitingForControlPlaneRollout";
    pub const CONTROL_PLANE_NEEDS_MEMBER: &str = "ControlPlaneNeedsMember";
    pub const REMEDIATING: &str = "Remediating";
    pub const REMEDIATION_BACKOFF: &str = "RemediationBackoff";
    pub const REMEDIATION_DISABLED: &str = "RemediationDisabled";
    pub const ORPHAN_MACHINE: &str = "OrphanMachine";
    pub const ADOPTING_MACHINE: &str = "AdoptingMachine";
    pub const PROVISIONING: &str = "Provisioning";
    pub const UPDATING_CONTROL_PLANE: &str = "UpdatingControlPlane";
    pub const DELETING: &str = "Deleting";
    pub const READY: &str = "Ready";

    /// Waits that are refusals: something is asked for that the safety rules do not allow now.
    /// Entering one is a Warning Event.
    pub const INFRASTRUCTURE_TEMPLATE_NOT_FOUND: &str = "InfrastructureTemplateNotFound";
    pub const MEMBER_JOIN_FAILED: &str = "MemberJoinFailed";
    pub const REFUSALS: [&str; 10] = [
        MEMBER_JOIN_FAILED,
        INFRASTRUCTURE_TEMPLATE_NOT_FOUND,
        QUORUM_LOST,
        REMOVAL_WOULD_LOSE_QUORUM,
        LAST_MEMBER,
        ROLLOUT_PAUSED,
        CONTROL_PLANE_NEEDS_MEMBER,
        REMEDIATION_BACKOFF,
        REMEDIATION_DISABLED,
        UNKNOWN_MEMBERS,
    ];
}

impl Step {
    /// The condition reason and message for the `Ready` summary while this step is next.
    pub fn reason(&self) -> (&'static str, String) {
        match self {
            Step::Wait { reason, message } | Step::Refuse { reason, message } => (reason, message.clone()),
            Step::Paused => (reason::PAUSED, "reconciliation is paused".into()),
            Step::AddClusterOwnerRef | Step::AddFinalizer | Step::CreateCa | Step::PauseKcp => (
                reason::PROVISIONING,
                "preparing the EtcdadmCluster, its CA and the control plane gate".into(),
            ),
            Step::PublishInitSecret { address, .. } => (
                reason::PROVISIONING,
                format!("publishing the first member's address {address}"),
            ),
            Step::UpdateInitSecretUrls { .. } => (
                reason::PROVISIONING,
                "updating the join URLs in the init Secret".into(),
            ),
            Step::CreateMachine { purpose, .. } => match purpose {
                Growth::ScaleUp => (reason::SCALING_UP, "creating a member Machine".into()),
                Growth::Rollout => (
                    reason::ROLLING_UPDATE,
                    "creating a member Machine of the current spec".into(),
                ),
                Growth::Replacement => (
                    reason::REMEDIATING,
                    "creating a Machine to replace the remediated member".into(),
                ),
            },
            Step::DeleteLeftovers { names } => (
                reason::PROVISIONING,
                format!(
                    "removing leftovers of interrupted creations: {}",
                    names.join(", ")
                ),
            ),
            Step::AdoptMachine { machine } => (
                reason::ADOPTING_MACHINE,
                format!("adopting Machine {machine} (controller reference, pre-terminate hook)"),
            ),
            Step::DeleteMachine { purpose, message, .. } => (removal_reason(*purpose), message.clone()),
            Step::WriteKcpEndpoints { .. } | Step::CreateKcpSecrets | Step::UnpauseKcp => (
                reason::UPDATING_CONTROL_PLANE,
                "handing the etcd endpoints and certificates to the KubeadmControlPlane".into(),
            ),
            Step::MoveLeader { machine, .. } => (
                reason::REMOVING_MEMBER,
                format!("moving etcd leadership away from Machine {machine} before removing its member"),
            ),
            Step::RemoveMember { member, why, .. } => {
                (reason::REMOVING_MEMBER, format!("removing the {member}: {why}"))
            }
            Step::ReleaseHook { machine } => (
                reason::REMOVING_MEMBER,
                format!("Machine {machine} has no etcd member any more; letting it go"),
            ),
            Step::ReleaseAndDeleteMachines { names } => (
                reason::DELETING,
                format!("deleting etcd Machines {}", names.join(", ")),
            ),
            Step::RemoveFinalizer => (reason::DELETING, "every etcd Machine is gone".into()),
            Step::Steady => (reason::READY, String::new()),
        }
    }

    /// Whether this step writes anything (used to check the "no writes" rules).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            Step::Wait { .. } | Step::Refuse { .. } | Step::Paused | Step::Steady
        )
    }

    /// Whether this step is a refusal an operator should hear about (a Warning Event when it
    /// starts): a Refuse, or a Wait whose reason is in [`reason::REFUSALS`].
    pub fn is_refusal(&self) -> bool {
        match self {
            Step::Refuse { .. } => true,
            Step::Wait { reason, .. } => reason::REFUSALS.contains(reason),
            _ => false,
        }
    }
}

/// The condition reason of a Machine deletion.
pub fn removal_reason(purpose: Removal) -> &'static str {
    match purpose {
        Removal::ScaleDown => reason::SCALING_DOWN,
        Removal::Rollout => reason::ROLLING_UPDATE,
        Removal::Remediation { .. } => reason::REMEDIATING,
        Removal::OrphanMachine => reason::ORPHAN_MACHINE,
        Removal::FailedJoin => reason::MEMBER_JOIN_FAILED,
    }
}

/// `q(n) = n/2 + 1`: how many voters a cluster of `n` needs to commit anything.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// Time between a remediation and the next one when the replacement it made failed: doubles
/// with each failed replacement, from twice `unhealthyAfter`, capped at an hour (or
/// `unhealthyAfter` if that is longer).
pub fn remediation_backoff(unhealthy_after: Duration, previous_retries: u32) -> Duration {
    let cap = unhealthy_after.max(Duration::from_secs(3600));
    let factor = 2u32.saturating_pow(previous_retries.saturating_add(1).min(20));
    unhealthy_after.saturating_mul(factor).min(cap)
}

/// Rule 5: the Machine a member runs on, by name (= Machine name, etcdadm `--name`) and by peer
/// URL `https://<machine address>:2380`. When the two point at different Machines there is no
/// answer: never guess.
pub fn machine_for_member<'a>(
    name: &str,
    peer_urls: &[String],
    machines: &'a [MachineView],
) -> Option<&'a str> {
    let by_name = (!name.is_empty())
        .then(|| machines.iter().find(|m| m.name == name))
        .flatten();
    let by_peer = machines.iter().find(|m| {
        m.address.as_deref().is_some_and(|a| {
            peer_urls
                .iter()
                .any(|u| u.trim_end_matches('/') == names::peer_url(a))
        })
    });
    match (by_name, by_peer) {
        (Some(a), Some(b)) if a.name != b.name => None,
        (Some(m), _) | (None, Some(m)) => Some(m.name.as_str()),
        (None, None) => None,
    }
}

/// The failure domains members may go to: `spec.failureDomains` ∩ the Cluster's (all of the
/// Cluster's by default). A Cluster that reports none leaves the spec's list as given. `Err`
/// when the spec names domains the Cluster does not offer at all.
pub fn allowed_failure_domains(spec: &[String], cluster: &[String]) -> Result<Vec<String>, String> {
    let mut allowed: Vec<String> = if spec.is_empty() {
        cluster.to_vec()
    } else if cluster.is_empty() {
        spec.to_vec()
    } else {
        spec.iter().filter(|d| cluster.contains(d)).cloned().collect()
    };
    allowed.sort();
    allowed.dedup();
    if allowed.is_empty() && !spec.is_empty() {
        return Err(format!(
            "spec.failureDomains [{}] names none of the Cluster's failure domains [{}]",
            spec.join(", "),
            cluster.join(", ")
        ));
    }
    Ok(allowed)
}

/// The allowed failure domain with the fewest current (not deleting) Machines; ties go to the
/// one with the fewest up-to-date Machines, then by name.
pub fn pick_failure_domain(allowed: &[String], machines: &[MachineView]) -> Option<String> {
    allowed
        .iter()
        .min_by_key(|domain| {
            let in_domain = || {
                machines
                    .iter()
                    .filter(|m| !m.deleting && m.failure_domain.as_deref() == Some(domain.as_str()))
            };
            let up_to_date = in_domain().filter(|m| m.outdated.is_none()).count();
            (in_domain().count(), up_to_date, domain.as_str())
        })
        .cloned()
}

/// The scale-down (or rollout) victim among `candidates`: a Machine annotated
/// `cluster.x-k8s.io/delete-machine` first, then one whose member is dead, then an outdated
/// one, then from the failure domain with the most Machines (Machines outside the allowed
/// domains first), oldest first.
pub fn pick_victim<'a>(
    o: &Observed,
    allowed_domains: &[String],
    candidates: &[&'a MachineView],
) -> Option<&'a MachineView> {
    let active: Vec<&MachineView> = o.active_machines().collect();
    candidates
        .iter()
        .enumerate()
        .min_by_key(|(age, m)| {
            let known = m
                .failure_domain
                .as_deref()
                .is_some_and(|d| allowed_domains.iter().any(|a| a == d));
            let crowd = active
                .iter()
                .filter(|other| other.failure_domain == m.failure_domain)
                .count();
            (
                !m.delete_requested,
                !o.is_dead(m),
                m.outdated.is_none(),
                known,
                std::cmp::Reverse(crowd),
                *age,
            )
        })
        .map(|(_, m)| *m)
}

impl Observed {
    fn active_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.machines.iter().filter(|m| !m.deleting)
    }

    fn members(&self) -> &[MemberView] {
        match &self.etcd {
            EtcdView::Members(members) => members,
            _ => &[],
        }
    }

    fn member_of(&self, machine: &str) -> Option<&MemberView> {
        self.members()
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine))
    }

    fn voters(&self) -> Vec<&MemberView> {
        self.members().iter().filter(|m| !m.is_learner).collect()
    }

    /// A Machine whose member joined once and is now unhealthy or gone from etcd.
    fn is_dead(&self, machine: &MachineView) -> bool {
        match self.member_of(&machine.name) {
            Some(member) => member.is_started() && !member.healthy && member.ever_healthy,
            None => machine.was_member,
        }
    }

    /// Initialized as stored, or a member passes its health check now.
    pub fn initialized_now(&self) -> bool {
        self.initialized || self.members().iter().any(|m| m.healthy)
    }

    /// The KCP uses this etcd (external etcd, given our endpoints once creation completed):
    /// its endpoints, and whether its own rollout is finished.
    fn kcp_in_use(&self) -> Option<(&str, &[String], bool)> {
        match &self.kcp {
            KcpView::Found {
                name,
                local_etcd: false,
                endpoints,
                rollout_complete,
                ..
            } if self.creation_complete => Some((name.as_str(), endpoints.as_slice(), *rollout_complete)),
            _ => None,
        }
    }

    /// A remediation happened and no Machine was created since: the next one replaces it.
    fn replacement_pending(&self) -> bool {
        self.last_remediation
            .as_ref()
            .is_some_and(|last| self.active_machines().all(|m| m.age >= last.ago))
    }

    /// Outdated members are replaced one at a time with a new one added first (`maxSurge` 1,
    /// or a single member, which cannot be replaced remove-first).
    fn surge(&self) -> bool {
        self.max_surge >= 1 || self.replicas <= 1
    }
}

/// `ready`: membership == Machines == replicas, and every one a healthy, started voter.
pub fn is_ready(o: &Observed) -> bool {
    let EtcdView::Members(members) = &o.etcd else {
        return false;
    };
    let active: Vec<&MachineView> = o.active_machines().collect();
    let replicas = usize::try_from(o.replicas).unwrap_or(0);
    active.len() == replicas
        && members.len() == active.len()
        && active.iter().all(|machine| {
            members.iter().any(|m| {
                m.machine.as_deref() == Some(machine.name.as_str())
                    && m.is_started()
                    && m.healthy
                    && !m.is_learner
            })
        })
}

/// Active Machines matching the spec (`status.updatedReplicas`).
pub fn up_to_date_machines(o: &Observed) -> usize {
    o.active_machines().filter(|m| m.outdated.is_none()).count()
}

/// The client URL a member is reached at: its Machine's address when it runs on one, else what
/// it advertises.
fn member_client_url(o: &Observed, member: &MemberView) -> Option<String> {
    let from_machine = member.machine.as_deref().and_then(|name| {
        o.machines
            .iter()
            .find(|machine| machine.name == name)
            .and_then(|machine| machine.address.as_deref())
            .map(names::client_url)
    });
    from_machine.or_else(|| member.client_urls.first().cloned())
}

fn sorted_urls<'a>(o: &Observed, members: impl Iterator<Item = &'a MemberView>) -> Vec<String> {
    let mut urls: Vec<String> = members.filter_map(|m| member_client_url(o, m)).collect();
    urls.sort();
    urls.dedup();
    urls
}

/// Client URLs of the started voting members, sorted: what KCP and `status.endpoints` list.
pub fn voting_endpoints(o: &Observed) -> Vec<String> {
    sorted_urls(o, o.members().iter().filter(|m| !m.is_learner && m.is_started()))
}

/// Client URLs of the healthy voting members, sorted: where joining members may go.
pub fn healthy_client_urls(o: &Observed) -> Vec<String> {
    sorted_urls(
        o,
        o.members()
            .iter()
            .filter(|m| !m.is_learner && m.is_started() && m.healthy),
    )
}

/// Client URLs of the members of up-to-date active Machines: the endpoints a rollout switches
/// the control plane to.
fn up_to_date_endpoints(o: &Observed) -> Vec<String> {
    sorted_urls(
        o,
        o.members().iter().filter(|m| {
            m.machine.as_deref().is_some_and(|name| {
                o.active_machines()
                    .any(|machine| machine.name == name && machine.outdated.is_none())
            })
        }),
    )
}

/// The one next step.
pub fn plan(o: &Observed) -> Step {
    let ClusterView::Found {
        name: cluster_name,
        paused,
        deleting: cluster_deleting,
        infrastructure_ready,
        failure_domains,
    } = &o.cluster
    else {
        if o.deleting {
            return plan_deletion(o);
        }
        return Step::Wait {
            reason: reason::WAITING_FOR_CLUSTER,
            message: "no Cluster found: label the EtcdadmCluster with cluster.x-k8s.io/cluster-name \
                      or reference it from Cluster.spec.managedExternalEtcdRef"
                .into(),
        };
    };
    if *paused || o.paused_annotation {
        return Step::Paused;
    }
    if o.deleting || *cluster_deleting {
        return plan_deletion(o);
    }
    if !o.has_cluster_owner_ref {
        return Step::AddClusterOwnerRef;
    }
    if !o.has_finalizer {
        return Step::AddFinalizer;
    }
    if let Some(problem) = &o.spec_problem {
        return Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: problem.clone(),
        };
    }
    if o.replicas < 1 || o.replicas % 2 == 0 {
        return Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: format!("spec.replicas is {}; it must be odd and at least 1", o.replicas),
        };
    }
    if !infrastructure_ready {
        return Step::Wait {
            reason: reason::WAITING_FOR_INFRASTRUCTURE,
            message: format!("waiting for Cluster {cluster_name}'s infrastructure to be provisioned"),
        };
    }
    let kcp_unpaused = matches!(
        &o.kcp,
        KcpView::Found {
            local_etcd: false,
            paused: false,
            skip_pause: false,
            ..
        }
    );
    if kcp_unpaused && !is_ready(o) && !o.creation_complete {
        return Step::PauseKcp;
    }
    match &o.ca {
        CaView::Corrupt(problem) => {
            return Step::Refuse {
                reason: reason::CA_CORRUPT,
                message: format!("{problem}; fix or restore the Secret, it is never replaced"),
            };
        }
        CaView::Missing if !o.machines.is_empty() || o.initialized => {
            return Step::Refuse {
                reason: reason::CA_MISSING,
                message: format!(
                    "Secret {} is missing while etcd members exist; restore it (a new CA would \
                     cut every member off)",
                    names::ca_secret_name(cluster_name)
                ),
            };
        }
        CaView::Missing => return Step::CreateCa,
        CaView::Valid => {}
    }
    if let Some(wait) = quorum_lost(o) {
        return wait;
    }
    if let Some(step) = plan_adoption(o) {
        return step;
    }
    if let Some(step) = plan_member_removal(o) {
        return step;
    }
    if let Some(step) = plan_publish_init_secret(o) {
        return step;
    }
    let allowed = match allowed_failure_domains(&o.spec_failure_domains, failure_domains) {
        Ok(allowed) => allowed,
        Err(problem) => {
            return Step::Refuse {
                reason: reason::NO_FAILURE_DOMAIN,
                message: problem,
            };
        }
    };
    plan_membership(o, &allowed)
}

/// Rule 3's precondition: with fewer healthy voters than a quorum nothing may change. A join in
/// flight (added but not started, or started and catching up) is reported as such, not as lost.
fn quorum_lost(o: &Observed) -> Option<Step> {
    match &o.etcd {
        EtcdView::Unreachable { message } if o.initialized => Some(Step::Wait {
            reason: reason::QUORUM_LOST,
            message: format!("no etcd member answers: {message}; nothing is changed until they do"),
        }),
        EtcdView::Members(_) if !o.initialized_now() => None,
        EtcdView::Members(members) => {
            let voters: Vec<&MemberView> = members.iter().filter(|m| !m.is_learner).collect();
            let healthy = voters.iter().filter(|m| m.healthy).count();
            if voters.is_empty() || healthy >= quorum(voters.len()) {
                return None;
            }
            let settled = voters.iter().filter(|m| !m.is_joining()).count();
            let joining = voters.iter().find(|m| m.is_joining());
            if let (Some(joining), true) = (joining, healthy >= quorum(settled)) {
                return Some(Step::Wait {
                    reason: reason::WAITING_FOR_MEMBER_JOIN,
                    message: format!("{} is joining; waiting until it is healthy", joining.describe()),
                });
            }
            let unhealthy: Vec<String> = voters
                .iter()
                .filter(|m| !m.healthy)
                .map(|m| m.describe())
                .collect();
            Some(Step::Wait {
                reason: reason::QUORUM_LOST,
                message: format!(
                    "{healthy} of {} voting members healthy, {} needed for quorum (unhealthy: {}); \
                     nothing is changed or removed until quorum is back",
                    voters.len(),
                    quorum(voters.len()),
                    unhealthy.join(", ")
                ),
            })
        }
        _ => None,
    }
}

/// Machines labelled for us with no controller, or that lost our hook: adopted first, so no
/// deletion of theirs can skip member removal.
fn plan_adoption(o: &Observed) -> Option<Step> {
    o.active_machines()
        .find(|m| m.orphan || !m.has_hook)
        .map(|m| Step::AdoptMachine {
            machine: m.name.clone(),
        })
}

/// Rules 3 and 6 for the member about to be removed: never the last voter, never below quorum
/// of the remaining voters; a healthy member keeps the control plane one working endpoint.
fn removal_refusal(o: &Observed, member: &MemberView, what: &str) -> Option<Step> {
    if member.is_learner {
        return None;
    }
    let voters = o.voters();
    if voters.len() <= 1 {
        return Some(Step::Wait {
            reason: reason::LAST_MEMBER,
            message: format!(
                "{what} is the last etcd member, which is never removed; delete the EtcdadmCluster to delete the whole etcd cluster"
            ),
        });
    }
    let healthy = voters.iter().filter(|m| m.healthy).count();
    let after = healthy.saturating_sub(usize::from(member.healthy));
    if after < quorum(voters.len() - 1) {
        return Some(Step::Wait {
            reason: reason::REMOVAL_WOULD_LOSE_QUORUM,
            message: format!(
                "removing the {what} would leave {after} healthy of {} voters, below quorum {}; waiting until other members are healthy",
                voters.len() - 1,
                quorum(voters.len() - 1)
            ),
        });
    }
    if member.healthy
        && let Some((kcp, endpoints, _)) = o.kcp_in_use()
        && let Some(url) = member_client_url(o, member)
    {
        let healthy_urls = healthy_client_urls(o);
        let ours = endpoints.iter().any(|e| {
            o.members()
                .iter()
                .any(|m| member_client_url(o, m).as_deref() == Some(e.as_str()))
        });
        let others_working = endpoints.iter().any(|e| *e != url && healthy_urls.contains(e));
        if ours && !others_working {
            return Some(Step::Wait {
                reason: reason::CONTROL_PLANE_NEEDS_MEMBER,
                message: format!(
                    "KubeadmControlPlane {kcp} lists {url} as its only working etcd endpoint; the {what} stays until the control plane uses another"
                ),
            });
        }
    }
    None
}

/// Rules 3, 4 and 6 for a Machine being deleted (by anyone) that still carries our hook: its
/// member is removed first, leadership moved away first, and only while quorum survives it.
fn plan_member_removal(o: &Observed) -> Option<Step> {
    let machine = o.machines.iter().find(|m| m.deleting && m.has_hook)?;
    let release = Step::ReleaseHook {
        machine: machine.name.clone(),
    };
    let members = match &o.etcd {
        EtcdView::Members(members) => members,
        // Nothing ever had an address: nothing can have joined.
        EtcdView::NotChecked if o.machines.iter().all(|m| m.address.is_none()) => return Some(release),
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => {
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
                message: format!(
                    "Machine {} is being deleted; waiting for a member to answer before removing its member",
                    machine.name
                ),
            });
        }
    };
    let Some(member) = members
        .iter()
        .find(|m| m.machine.as_deref() == Some(machine.name.as_str()))
    else {
        return Some(release);
    };
    if let Some(other) = members.iter().find(|m| m.id != member.id && m.is_joining()) {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_MEMBER_JOIN,
            message: format!(
                "{} is joining; Machine {}'s member is removed after it (one change at a time)",
                other.describe(),
                machine.name
            ),
        });
    }
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(refusal);
    }
    let healthy_other = o
        .voters()
        .into_iter()
        .filter(|m| m.id != member.id && m.healthy)
        .find_map(|m| member_client_url(o, m).map(|url| (m.id, url)));
    let Some((other_id, other_url)) = healthy_other else {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
            message: format!(
                "no other healthy voting member to remove Machine {}'s member through",
                machine.name
            ),
        });
    };
    if member.is_leader
        && member.healthy
        && let Some(leader_url) = member_client_url(o, member)
    {
        return Some(Step::MoveLeader {
            leader_url,
            to: other_id,
            machine: machine.name.clone(),
        });
    }
    Some(Step::RemoveMember {
        member_id: member.id,
        via_url: other_url,
        member: what,
        why: format!("Machine {} is being deleted", machine.name),
    })
}

/// Publish `<cluster>-etcd-init` once the first Machine has an address.
fn plan_publish_init_secret(o: &Observed) -> Option<Step> {
    if o.init_secret.is_some() {
        return None;
    }
    let first = o.active_machines().next()?;
    let address = first.address.clone()?;
    let healthy_urls = healthy_client_urls(o);
    let client_urls = if healthy_urls.is_empty() {
        vec![names::client_url(&address)]
    } else {
        healthy_urls
    };
    Some(Step::PublishInitSecret { address, client_urls })
}

/// Keep the init Secret's join URLs on the healthy voters (called once every member is healthy,
/// so a new member never joins through a removed one).
fn plan_init_secret_urls(o: &Observed) -> Option<Step> {
    let secret = o.init_secret.as_ref()?;
    let healthy_urls = healthy_client_urls(o);
    (!healthy_urls.is_empty() && secret.client_urls != healthy_urls).then_some(Step::UpdateInitSecretUrls {
        client_urls: healthy_urls,
    })
}

/// Rules 1 and 2: a membership change in flight (a Machine without address or member yet, an
/// added member not started, a started member catching up, a learner) is waited out.
fn pending_change(o: &Observed) -> Option<Step> {
    for machine in o.active_machines() {
        if machine.address.is_none() {
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_MACHINE_ADDRESS,
                message: format!("Machine {} has no address yet", machine.name),
            });
        }
    }
    let members = match &o.etcd {
        EtcdView::Members(members) => members,
        EtcdView::NotChecked if o.machines.is_empty() => return None,
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => {
            let message = match &o.etcd {
                EtcdView::Unreachable { message } => message.clone(),
                _ => "not checked yet".into(),
            };
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_FIRST_MEMBER,
                message: format!("waiting for the first etcd member to answer: {message}"),
            });
        }
    };
    if let Some(m) = members.iter().find(|m| !m.is_started()) {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_MEMBER_JOIN,
            message: format!("{} was added but has not started yet", m.describe()),
        });
    }
    if let Some(m) = members.iter().find(|m| m.is_learner) {
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_LEARNER,
            message: format!("{} is a learner; one membership change at a time", m.describe()),
        });
    }
    if let Some(m) = members.iter().find(|m| m.is_joining()) {
        let why = m.message.clone().unwrap_or_else(|| "not healthy yet".into());
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_MEMBER_JOIN,
            message: format!("{} joined and is catching up: {why}", m.describe()),
        });
    }
    for machine in o.active_machines().filter(|m| !m.was_member) {
        if o.member_of(&machine.name).is_none() {
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_MEMBER_JOIN,
                message: format!("Machine {} is not an etcd member yet", machine.name),
            });
        }
    }
    None
}

/// A Machine that did not become a healthy member within the join deadline (no address, never
/// added, added but never started, or started but never healthy) is deleted; its hook removes
/// an added member first, which a quorum of started voters always allows, and a new Machine
/// replaces it. Before that, the join is waited for (rules 1 and 2). The first member is left
/// alone: without a healthy member there is no cluster to keep safe or to join anew.
fn failed_join(o: &Observed) -> Option<Step> {
    if !o.initialized_now() {
        return None;
    }
    let deadline = o.remediation.join_deadline;
    let (machine, state) = o
        .active_machines()
        .filter(|m| !m.was_member && m.age > deadline)
        .find_map(|m| {
            let state = match (&m.address, o.member_of(&m.name)) {
                (None, _) => "it has no address",
                (Some(_), None) => "it never became an etcd member",
                (Some(_), Some(member)) if !member.is_started() => "its member was added but never started",
                (Some(_), Some(member)) if !member.healthy && !member.ever_healthy => {
                    "its member started but was never healthy"
                }
                (Some(_), Some(_)) => return None,
            };
            Some((m, state))
        })?;
    let limit = duration::format(deadline);
    if !o.remediation.enabled {
        return Some(Step::Wait {
            reason: reason::MEMBER_JOIN_FAILED,
            message: format!(
                "Machine {} did not join within {limit} ({state}); remediation is disabled: delete the Machine to replace it",
                machine.name
            ),
        });
    }
    Some(Step::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::FailedJoin,
        message: format!(
            "Machine {} did not become a healthy etcd member within {limit} ({state}): deleting it (a member it added is removed first); a new one replaces it",
            machine.name
        ),
    })
}

/// What the replica count and the rollout strategy want next, health aside.
enum Want<'a> {
    Add(Growth),
    /// Delete one of `candidates` (a victim is picked).
    Remove(Vec<&'a MachineView>, Removal),
    /// Point the control plane at these endpoints.
    SwitchKcp(Vec<String>),
    /// The control plane is rolling onto the endpoints it was given.
    WaitForKcp(String),
    Nothing,
}

/// Scale and rollout decisions (SPEC-etcdcluster.md "Scale up / down", "Rolling replacement").
fn want(o: &Observed) -> Want<'_> {
    let active: Vec<&MachineView> = o.active_machines().collect();
    let outdated: Vec<&MachineView> = active.iter().copied().filter(|m| m.outdated.is_some()).collect();
    let n = usize::try_from(o.replicas).unwrap_or(0);
    let (a, old) = (active.len(), outdated.len());
    let up_to_date = a - old;
    if old == 0 {
        return match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => Want::Nothing,
        };
    }
    let kcp = o.kcp_in_use();
    match (kcp, o.surge()) {
        // Surge-then-switch: every new member first, one endpoint update, then the old ones go.
        (Some((name, endpoints, complete)), true) => {
            if up_to_date < n {
                if old > n {
                    return Want::Remove(outdated, Removal::ScaleDown);
                }
                return Want::Add(Growth::Rollout);
            }
            let desired = up_to_date_endpoints(o);
            let mut current = endpoints.to_vec();
            current.sort();
            if current != desired {
                Want::SwitchKcp(desired)
            } else if !complete {
                Want::WaitForKcp(name.to_string())
            } else {
                Want::Remove(outdated, Removal::Rollout)
            }
        }
        // One at a time, add first: never more than N+1 members.
        (None, true) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::Rollout),
            std::cmp::Ordering::Equal => Want::Add(Growth::Rollout),
        },
        // One at a time, remove first: never more than N members; with a KCP, each new member
        // reaches the control plane before the next old one goes.
        (kcp, false) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::Rollout),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => {
                if let Some((name, endpoints, complete)) = kcp {
                    let mut current = endpoints.to_vec();
                    current.sort();
                    let voting = voting_endpoints(o);
                    if current != voting {
                        return Want::SwitchKcp(voting);
                    }
                    if !complete {
                        return Want::WaitForKcp(name.to_string());
                    }
                }
                Want::Remove(outdated, Removal::Rollout)
            }
        },
    }
}

/// Scale, roll and remediate: every step here starts a membership change (or hands the
/// control plane its endpoints), so each waits for the previous one to finish.
fn plan_membership(o: &Observed, allowed_domains: &[String]) -> Step {
    if let Some(m) = o.machines.iter().find(|m| m.deleting) {
        return Step::Wait {
            reason: reason::WAITING_FOR_MACHINE_DELETION,
            message: format!(
                "Machine {} is being deleted; the next change waits until it is gone",
                m.name
            ),
        };
    }
    if let Some(step) = failed_join(o) {
        return step;
    }
    if let Some(wait) = pending_change(o) {
        return wait;
    }
    let wanted = want(o);
    // A dead victim goes at once: removing it is the safest change there is.
    if let Want::Remove(candidates, purpose) = &wanted
        && let Some(victim) = pick_victim(o, allowed_domains, candidates)
        && o.is_dead(victim)
    {
        return removal_step(o, victim, *purpose);
    }
    if let Some(step) = plan_remediation(o) {
        return step;
    }
    if let Some(wait) = unknown_members_wait(o) {
        return wait;
    }
    if let Some(wait) = unhealthy_wait(o) {
        return wait;
    }
    let first = o.machines.is_empty() && o.members().is_empty();
    if !first && !o.initialized_now() {
        return Step::Wait {
            reason: reason::WAITING_FOR_FIRST_MEMBER,
            message: "waiting for the first member to pass a health check".into(),
        };
    }
    if let Some(step) = plan_init_secret_urls(o) {
        return step;
    }
    match wanted {
        Want::Add(_) if o.member_spec_problem.is_some() => Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: format!(
                "no member Machine is created from this spec until it is fixed: {}",
                o.member_spec_problem.as_deref().unwrap_or_default()
            ),
        },
        Want::Add(_) if o.missing_infra_template.is_some() => Step::Wait {
            reason: reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND,
            message: format!(
                "infrastructure template {} not found: member Machines are cloned from it once it exists",
                o.missing_infra_template.as_deref().unwrap_or_default()
            ),
        },
        Want::Add(purpose) => Step::CreateMachine {
            adopt: o.leftovers.first().cloned(),
            failure_domain: pick_failure_domain(allowed_domains, &o.machines),
            purpose: if o.replacement_pending() {
                Growth::Replacement
            } else {
                purpose
            },
        },
        Want::Remove(candidates, purpose) => match pick_victim(o, allowed_domains, &candidates) {
            Some(victim) => removal_step(o, victim, purpose),
            None => plan_ready(o),
        },
        Want::SwitchKcp(endpoints) => Step::WriteKcpEndpoints { endpoints },
        Want::WaitForKcp(name) => Step::Wait {
            reason: reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
            message: format!(
                "waiting for KubeadmControlPlane {name} to finish rolling its Machines onto the etcd endpoints it was given before the next outdated member goes"
            ),
        },
        Want::Nothing => plan_ready(o),
    }
}

/// Delete `victim` for `purpose`, if rules 3 and 6 allow removing its member now.
fn removal_step(o: &Observed, victim: &MachineView, purpose: Removal) -> Step {
    let what = format!("member of Machine {}", victim.name);
    if let Some(member) = o.member_of(&victim.name) {
        if let Some(refusal) = removal_refusal(o, member, &what) {
            return refusal;
        }
        if member.healthy
            && let Some((name, _, false)) = o.kcp_in_use()
        {
            return Step::Wait {
                reason: reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT,
                message: format!(
                    "waiting for KubeadmControlPlane {name} to finish its rollout before removing the {what}"
                ),
            };
        }
    }
    let replicas = o.replicas;
    let active = o.active_machines().count();
    let why = if o.is_dead(victim) {
        "its member is dead".to_string()
    } else if victim.delete_requested {
        format!("annotated {}", names::DELETE_MACHINE_ANNOTATION)
    } else if let Some(outdated) = &victim.outdated {
        format!("outdated: {outdated}")
    } else {
        "oldest in the most crowded failure domain".to_string()
    };
    let message = match purpose {
        Removal::ScaleDown => format!(
            "scaling down from {active} to {replicas} Machines: deleting Machine {} ({why}); its member is removed first",
            victim.name
        ),
        Removal::Rollout => format!(
            "rolling update: deleting Machine {} ({why}); its member is removed first",
            victim.name
        ),
        Removal::Remediation { .. } | Removal::OrphanMachine | Removal::FailedJoin => {
            format!("deleting Machine {} ({why})", victim.name)
        }
    };
    Step::DeleteMachine {
        machine: victim.name.clone(),
        purpose,
        message,
    }
}

/// Dead members are replaced (remediation), unhealthy members without a Machine removed (rule
/// 4), Machines whose member left etcd deleted: each once unhealthy for `unhealthyAfter`, one
/// at a time, under rule 3, with backoff after a failed replacement.
fn plan_remediation(o: &Observed) -> Option<Step> {
    let policy = o.remediation;
    let after = policy.unhealthy_after;
    let overdue = |d: Duration| d > after;
    // Rule 4: a member on no Machine of ours, unhealthy for long enough.
    if let Some(member) = o
        .members()
        .iter()
        .find(|m| m.machine.is_none() && m.is_started() && !m.healthy && overdue(m.unhealthy_for))
    {
        let what = member.describe();
        if let Some(refusal) = removal_refusal(o, member, &what) {
            return Some(refusal);
        }
        let via = o
            .voters()
            .into_iter()
            .filter(|m| m.healthy && m.id != member.id)
            .find_map(|m| member_client_url(o, m))?;
        return Some(Step::RemoveMember {
            member_id: member.id,
            via_url: via,
            member: what,
            why: format!(
                "it runs on no Machine of this EtcdadmCluster and has been unhealthy for {} ({})",
                duration::format(member.unhealthy_for),
                member.message.as_deref().unwrap_or("unhealthy")
            ),
        });
    }
    if !policy.enabled {
        return None;
    }
    if let Some(machine) = o
        .active_machines()
        .find(|m| m.was_member && o.member_of(&m.name).is_none() && overdue(m.unhealthy_for))
    {
        return Some(Step::DeleteMachine {
            machine: machine.name.clone(),
            purpose: Removal::OrphanMachine,
            message: format!(
                "Machine {}'s member left etcd {} ago and cannot rejoin: deleting the Machine; a new one replaces it",
                machine.name,
                duration::format(machine.unhealthy_for)
            ),
        });
    }
    let (machine, member) = o
        .active_machines()
        .filter_map(|machine| o.member_of(&machine.name).map(|member| (machine, member)))
        .filter(|(_, member)| member.is_started() && !member.healthy && overdue(member.unhealthy_for))
        .max_by_key(|(_, member)| member.unhealthy_for)?;
    let what = format!("member of Machine {}", machine.name);
    if let Some(refusal) = removal_refusal(o, member, &what) {
        return Some(refusal);
    }
    let retries = match &machine.replaces {
        Some(last) if machine.age < MIN_HEALTHY_PERIOD => {
            let wait = remediation_backoff(after, last.retries);
            if last.ago < wait {
                return Some(Step::Wait {
                    reason: reason::REMEDIATION_BACKOFF,
                    message: format!(
                        "Machine {} replaced Machine {} {} ago and is unhealthy too; the next remediation waits {} (failed replacements: {})",
                        machine.name,
                        last.machine,
                        duration::format(last.ago),
                        duration::format(wait.saturating_sub(last.ago)),
                        last.retries + 1
                    ),
                });
            }
            last.retries.saturating_add(1)
        }
        _ => 0,
    };
    Some(Step::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::Remediation { retries },
        message: format!(
            "the member of Machine {} has been unhealthy for {} ({}), longer than unhealthyAfter {}: deleting the Machine (its member is removed first); a new one replaces it",
            machine.name,
            duration::format(member.unhealthy_for),
            member.message.as_deref().unwrap_or("unhealthy"),
            duration::format(after)
        ),
    })
}

/// A healthy member on no Machine of ours may belong to someone else's restore: it is never
/// touched, and nothing else changes while it is there.
fn unknown_members_wait(o: &Observed) -> Option<Step> {
    let unknown: Vec<String> = o
        .members()
        .iter()
        .filter(|m| m.machine.is_none())
        .map(|m| m.describe())
        .collect();
    (!unknown.is_empty()).then(|| Step::Wait {
        reason: reason::UNKNOWN_MEMBERS,
        message: format!(
            "etcd has members that run on none of this cluster's Machines ({}); they are never removed while healthy, and nothing else changes until they are gone",
            unknown.join(", ")
        ),
    })
}

/// Rule 2 and the rollout rule: adding, switching endpoints and removing healthy members all
/// need every member healthy. Says what happens to the unhealthy ones.
fn unhealthy_wait(o: &Observed) -> Option<Step> {
    let mut problems: Vec<(String, Duration)> = o
        .members()
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| {
            let why = m.message.clone().unwrap_or_else(|| "unhealthy".into());
            (format!("{} is not healthy: {why}", m.describe()), m.unhealthy_for)
        })
        .collect();
    for machine in o.active_machines() {
        if machine.was_member && o.member_of(&machine.name).is_none() {
            problems.push((
                format!("Machine {}'s member is no longer in etcd", machine.name),
                machine.unhealthy_for,
            ));
        }
    }
    let (problem, longest) = problems.iter().max_by_key(|(_, d)| *d)?.clone();
    let policy = o.remediation;
    let rollout = o.active_machines().any(|m| m.outdated.is_some());
    let (reason, next) = if !policy.enabled && longest > policy.unhealthy_after {
        (
            reason::REMEDIATION_DISABLED,
            "remediation is disabled (healthCheck.remediation or the healthcheck-retries annotation): fix the member or delete its Machine".to_string(),
        )
    } else if policy.enabled {
        (
            reason::WAITING_FOR_HEALTHY_MEMBERS,
            format!(
                "it is replaced once unhealthy for {} (unhealthy for {} so far)",
                duration::format(policy.unhealthy_after),
                duration::format(longest)
            ),
        )
    } else {
        (
            reason::WAITING_FOR_HEALTHY_MEMBERS,
            "remediation is disabled".to_string(),
        )
    };
    let (reason, prefix) = if rollout {
        (
            reason::ROLLOUT_PAUSED,
            "the rolling update is paused until every member is healthy: ",
        )
    } else {
        (reason, "")
    };
    Some(Step::Wait {
        reason,
        message: format!("{prefix}{problem}; {next}"),
    })
}

/// Ready: hand KCP its endpoints and certificates, then un-pause it; clean up leftovers.
fn plan_ready(o: &Observed) -> Step {
    if let KcpView::Found {
        local_etcd: false,
        endpoints,
        paused,
        skip_pause,
        secrets_present,
        ..
    } = &o.kcp
        && is_ready(o)
    {
        let desired = voting_endpoints(o);
        let mut current = endpoints.clone();
        current.sort();
        if current != desired {
            return Step::WriteKcpEndpoints { endpoints: desired };
        }
        if !secrets_present {
            return Step::CreateKcpSecrets;
        }
        if *paused && !skip_pause {
            return Step::UnpauseKcp;
        }
    }
    if !o.leftovers.is_empty() {
        return Step::DeleteLeftovers {
            names: o.leftovers.clone(),
        };
    }
    if !is_ready(o) {
        return Step::Wait {
            reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
            message: "membership does not match the Machines yet".into(),
        };
    }
    Step::Steady
}

/// Deletion: the control plane goes first (the apiservers need etcd until then), then every
/// etcd Machine (hooks released: the whole cluster is going), then the finalizer.
fn plan_deletion(o: &Observed) -> Step {
    if o.control_plane_machines > 0 {
        return Step::Wait {
            reason: reason::WAITING_FOR_CONTROL_PLANE_DELETION,
            message: format!(
                "{} control plane Machines still use etcd; deleting etcd Machines after they are gone",
                o.control_plane_machines
            ),
        };
    }
    let to_release: Vec<String> = o
        .machines
        .iter()
        .filter(|m| m.has_hook || !m.deleting)
        .map(|m| m.name.clone())
        .collect();
    if !to_release.is_empty() {
        return Step::ReleaseAndDeleteMachines { names: to_release };
    }
    if !o.machines.is_empty() {
        let names: Vec<&str> = o.machines.iter().map(|m| m.name.as_str()).collect();
        return Step::Wait {
            reason: reason::WAITING_FOR_MACHINE_DELETION,
            message: format!("waiting for Machines {} to go", names.join(", ")),
        };
    }
    if o.deleting && o.has_finalizer {
        return Step::RemoveFinalizer;
    }
    Step::Wait {
        reason: reason::WAITING_FOR_CLUSTER_DELETION,
        message: "every etcd Machine is gone; waiting for the Cluster's deletion to remove this object"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn machine(name: &str, address: Option<&str>, domain: Option<&str>) -> MachineView {
        MachineView {
            name: name.into(),
            failure_domain: domain.map(String::from),
            address: address.map(String::from),
            has_hook: true,
            ..Default::default()
        }
    }

    /// A started, healthy voter on Machine `name` at `address`.
    fn member(id: u64, name: &str, address: &str) -> MemberView {
        MemberView {
            id,
            name: name.into(),
            peer_urls: vec![names::peer_url(address)],
            client_urls: vec![names::client_url(address)],
            is_learner: false,
            healthy: true,
            ever_healthy: true,
            is_leader: id == 1,
            message: None,
            machine: Some(name.into()),
            ..Default::default()
        }
    }

    fn unhealthy(mut m: MemberView, why: &str) -> MemberView {
        m.healthy = false;
        m.message = Some(why.into());
        m
    }

    fn kcp(endpoints: &[&str], paused: bool, secrets: bool) -> KcpView {
        KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: false,
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            paused,
            skip_pause: false,
            secrets_present: secrets,
            rollout_complete: true,
        }
    }

    /// A 3-replica cluster past all housekeeping, nothing created yet.
    fn base() -> Observed {
        Observed {
            name: "c1-etcd".into(),
            deleting: false,
            has_finalizer: true,
            has_cluster_owner_ref: true,
            paused_annotation: false,
            replicas: 3,
            max_surge: 1,
            remediation: RemediationPolicy::default(),
            last_remediation: None,
            spec_problem: None,
            member_spec_problem: None,
            missing_infra_template: None,
            spec_failure_domains: vec![],
            cluster: ClusterView::Found {
                name: "c1".into(),
                paused: false,
                deleting: false,
                infrastructure_ready: true,
                failure_domains: vec![],
            },
            ca: CaView::Valid,
            machines: vec![],
            leftovers: vec![],
            etcd: EtcdView::NotChecked,
            init_secret: None,
            initialized: false,
            creation_complete: false,
            kcp: KcpView::None,
            control_plane_machines: 0,
        }
    }

    /// `n` healthy members on `n` Machines, initialized, init Secret published.
    fn running(n: usize) -> Observed {
        let mut o = base();
        for i in 0..n {
            let name = format!("c1-etcd-m{i}");
            let address = format!("10.0.0.{}", i + 1);
            o.machines.push(machine(&name, Some(&address), None));
        }
        o.etcd = EtcdView::Members(
            (0..n)
                .map(|i| {
                    member(
                        i as u64 + 1,
                        &format!("c1-etcd-m{i}"),
                        &format!("10.0.0.{}", i + 1),
                    )
                })
                .collect(),
        );
        o.initialized = true;
        o.init_secret = Some(InitSecretView {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        o
    }

    fn wait_reason(step: &Step) -> &'static str {
        match step {
            Step::Wait { reason, .. } | Step::Refuse { reason, .. } => reason,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    fn wait_message(step: &Step) -> String {
        match step {
            Step::Wait { message, .. } | Step::Refuse { message, .. } => message.clone(),
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    fn members_mut(o: &mut Observed) -> &mut Vec<MemberView> {
        match &mut o.etcd {
            EtcdView::Members(m) => m,
            _ => panic!("no members"),
        }
    }

    /// `running(3)` scaling to 5, with a fourth Machine `c1-etcd-m3` at 10.0.0.4, `age` old,
    /// whose join is in the state `member` gives (`None`: never added).
    fn joining(age: Duration, member: Option<MemberView>) -> Observed {
        let mut o = running(3);
        o.replicas = 5;
        let mut m = machine("c1-etcd-m3", Some("10.0.0.4"), None);
        m.age = age;
        o.machines.push(m);
        if let Some(member) = member {
            members_mut(&mut o).push(member);
        }
        o
    }

    /// Added by `MemberAdd` through etcdadm, process never started.
    fn added_not_started() -> MemberView {
        MemberView {
            id: 4,
            peer_urls: vec![names::peer_url("10.0.0.4")],
            machine: Some("c1-etcd-m3".into()),
            ..Default::default()
        }
    }

    fn started_never_healthy() -> MemberView {
        let mut m = unhealthy(member(4, "c1-etcd-m3", "10.0.0.4"), "not yet synced");
        m.ever_healthy = false;
        m
    }

    const DEADLINE: Duration = etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER;
    const JUST_BEFORE: Duration = DEADLINE;
    const JUST_AFTER: Duration = DEADLINE.saturating_add(Duration::from_secs(1));

    fn failed_join_of(step: &Step) -> Option<&str> {
        match step {
            Step::DeleteMachine {
                machine,
                purpose: Removal::FailedJoin,
                ..
            } => Some(machine),
            _ => None,
        }
    }

    #[test]
    fn a_join_is_waited_for_until_its_deadline_and_its_machine_replaced_after_it() {
        let no_address = |age| {
            let mut o = joining(age, None);
            o.machines[3].address = None;
            o
        };
        type Case = (&'static str, fn(Duration) -> Observed, &'static str);
        let cases: [Case; 4] = [
            ("no address", no_address, reason::WAITING_FOR_MACHINE_ADDRESS),
            (
                "never added",
                |age| joining(age, None),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
            (
                "added, never started",
                |age| joining(age, Some(added_not_started())),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
            (
                "started, never healthy",
                |age| joining(age, Some(started_never_healthy())),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
        ];
        for (what, make, waiting) in cases {
            let before = plan(&make(JUST_BEFORE));
            assert_eq!(wait_reason(&before), waiting, "{what}: {before:?}");
            let after = plan(&make(JUST_AFTER));
            assert_eq!(failed_join_of(&after), Some("c1-etcd-m3"), "{what}: {after:?}");
            let (reason, message) = after.reason();
            assert_eq!(reason, reason::MEMBER_JOIN_FAILED, "{what}");
            assert!(
                message.contains("did not become a healthy etcd member within 5m"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_member_a_failed_join_added_is_removed_before_anything_else() {
        // Scale-up (3 started voters + 1 never started) and a remove-first rollout (2 + 1): a
        // quorum of started voters remains either way, so the added member can always go.
        for started in [3, 2] {
            let mut o = joining(JUST_AFTER, Some(added_not_started()));
            if started == 2 {
                o.replicas = 3;
                o.machines.remove(2);
                members_mut(&mut o).remove(2);
            }
            o.machines.last_mut().unwrap().deleting = true;
            match plan(&o) {
                Step::RemoveMember {
                    member_id, via_url, ..
                } => {
                    assert_eq!(member_id, 4, "{started} started voters");
                    assert_ne!(via_url, names::client_url("10.0.0.4"));
                }
                step => panic!("{started} started voters: expected the member's removal, got {step:?}"),
            }
            // Once it is gone from etcd, the hook is released.
            members_mut(&mut o).retain(|m| m.id != 4);
            assert_eq!(
                plan(&o),
                Step::ReleaseHook {
                    machine: "c1-etcd-m3".into()
                }
            );
        }
    }

    #[test]
    fn a_healthy_new_member_or_the_first_member_is_never_a_failed_join() {
        let joined = joining(JUST_AFTER, Some(member(4, "c1-etcd-m3", "10.0.0.4")));
        assert_eq!(failed_join_of(&plan(&joined)), None, "{:?}", plan(&joined));
        let mut first = base();
        first.replicas = 3;
        let mut m = machine("c1-etcd-m0", Some("10.0.0.1"), None);
        m.age = JUST_AFTER * 10;
        first.machines.push(m);
        first.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(failed_join_of(&plan(&first)), None);
    }

    #[test]
    fn with_remediation_disabled_a_failed_join_is_reported_not_replaced() {
        let mut o = joining(JUST_AFTER, Some(added_not_started()));
        o.remediation.enabled = false;
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::MEMBER_JOIN_FAILED);
        assert!(step.is_refusal());
        assert!(wait_message(&step).contains("remediation is disabled"));
    }

    #[test]
    fn a_stuck_join_never_blocks_remediation_for_longer_than_its_deadline() {
        // Five members, m1 dead and overdue, a sixth Machine m5 joining: until m5's deadline the
        // join is waited for (one change at a time); past it m5 goes first, then m1 is
        // remediated. (Four healthy of six voters keep a quorum throughout.)
        let mut o = running(5);
        o.replicas = 7;
        let mut dead = unhealthy(member(2, "c1-etcd-m1", "10.0.0.2"), "connection refused");
        dead.unhealthy_for = DEADLINE * 2;
        members_mut(&mut o)[1] = dead;
        o.machines[1].was_member = true;
        o.machines[1].unhealthy_for = DEADLINE * 2;
        let mut m5 = machine("c1-etcd-m5", Some("10.0.0.6"), None);
        m5.age = JUST_BEFORE;
        o.machines.push(m5);
        members_mut(&mut o).push(MemberView {
            id: 6,
            peer_urls: vec![names::peer_url("10.0.0.6")],
            machine: Some("c1-etcd-m5".into()),
            ..Default::default()
        });
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        o.machines[5].age = JUST_AFTER;
        assert_eq!(failed_join_of(&plan(&o)), Some("c1-etcd-m5"));
        o.machines.pop();
        members_mut(&mut o).pop();
        match plan(&o) {
            Step::DeleteMachine {
                machine,
                purpose: Removal::Remediation { .. },
                ..
            } => assert_eq!(machine, "c1-etcd-m1"),
            step => panic!("expected m1's remediation, got {step:?}"),
        }
    }

    #[test]
    fn housekeeping_comes_first_in_order() {
        let mut o = base();
        o.cluster = ClusterView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER);
        let mut o = base();
        o.has_cluster_owner_ref = false;
        o.has_finalizer = false;
        assert_eq!(plan(&o), Step::AddClusterOwnerRef);
        o.has_cluster_owner_ref = true;
        assert_eq!(plan(&o), Step::AddFinalizer);
        o.has_finalizer = true;
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: false,
            infrastructure_ready: false,
            failure_domains: vec![],
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_INFRASTRUCTURE);
    }

    #[test]
    fn paused_cluster_or_annotation_writes_nothing() {
        let mut o = base();
        o.has_finalizer = false;
        o.paused_annotation = true;
        assert_eq!(plan(&o), Step::Paused);
        o.paused_annotation = false;
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: true,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: vec![],
        };
        assert_eq!(plan(&o), Step::Paused);
        assert!(!plan(&o).writes());
    }

    #[test]
    fn invalid_replicas_and_spec_problems_are_refused() {
        for replicas in [0, 2, 4, -1] {
            let mut o = base();
            o.replicas = replicas;
            assert_eq!(wait_reason(&plan(&o)), reason::INVALID_SPEC, "{replicas}");
        }
        let mut o = base();
        o.spec_problem = Some("spec.infrastructureTemplate.namespace other".into());
        assert_eq!(wait_reason(&plan(&o)), reason::INVALID_SPEC);
    }

    #[test]
    fn a_missing_infrastructure_template_is_named_and_waited_for() {
        let mut o = running(2);
        o.replicas = 3;
        o.missing_infra_template = Some("DevMachineTemplate default/etcd".into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND);
        assert!(step.is_refusal(), "a Warning Event says so");
        assert!(wait_message(&step).contains("DevMachineTemplate default/etcd"));
        o.missing_infra_template = None;
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
    }

    #[test]
    fn a_member_spec_admission_would_refuse_creates_no_machine_but_stops_nothing_else() {
        let problem = "spec.etcdadmConfigSpec.cloudInitConfig.version: \"v3\" is not an etcd version";
        let mut o = base();
        o.member_spec_problem = Some(problem.into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::INVALID_SPEC);
        let (_, message) = step.reason();
        assert!(message.contains(problem), "{message}");
        // A cluster whose members need nothing new keeps being looked after.
        let mut steady = running(3);
        steady.replicas = 3;
        steady.member_spec_problem = Some(problem.into());
        assert_eq!(plan(&steady), Step::Steady);
    }

    #[test]
    fn ca_is_created_once_and_never_regenerated_under_members() {
        let mut o = base();
        o.ca = CaView::Missing;
        assert_eq!(plan(&o), Step::CreateCa);
        o.ca = CaView::Corrupt("Secret default/c1-managed-etcd has no tls.key".into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CA_CORRUPT);
        assert!(wait_message(&step).contains("no tls.key"));
        assert!(!step.writes());
        let mut o = running(1);
        o.ca = CaView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::CA_MISSING);
    }

    #[test]
    fn the_first_machine_is_created_when_nothing_exists() {
        let o = base();
        assert_eq!(
            plan(&o),
            Step::CreateMachine {
                adopt: None,
                failure_domain: None,
                purpose: Growth::ScaleUp,
            }
        );
    }

    #[test]
    fn the_init_secret_is_published_once_the_first_machine_has_an_address() {
        let mut o = base();
        o.machines.push(machine("c1-etcd-a", None, None));
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
        o.machines[0].address = Some("10.0.0.1".into());
        assert_eq!(
            plan(&o),
            Step::PublishInitSecret {
                address: "10.0.0.1".into(),
                client_urls: vec!["https://10.0.0.1:2379".into()]
            }
        );
        // Published, first member not answering yet: no second Machine.
        o.init_secret = Some(InitSecretView {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        o.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_FIRST_MEMBER);
    }

    #[test]
    fn never_add_while_a_member_is_unhealthy() {
        let mut o = running(2);
        o.replicas = 3;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "RAFT NO LEADER");
        // 1 of 2 healthy is below quorum: nothing at all.
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
        let mut o = running(3);
        o.replicas = 5;
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::WAITING_FOR_HEALTHY_MEMBERS);
        assert!(wait_message(&step).contains("c1-etcd-m2"));
        assert!(wait_message(&step).contains("connection refused"));
    }

    #[test]
    fn never_add_while_a_join_is_pending() {
        // A Machine without an etcd member yet.
        let mut o = running(1);
        o.machines.push(machine("c1-etcd-m1", Some("10.0.0.2"), None));
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::WAITING_FOR_MEMBER_JOIN);
        assert!(wait_message(&step).contains("c1-etcd-m1"));
        // MemberAdd done, process not started: pending (rule 1), not "quorum lost".
        members_mut(&mut o).push(MemberView {
            id: 9,
            peer_urls: vec![names::peer_url("10.0.0.2")],
            healthy: false,
            machine: Some("c1-etcd-m1".into()),
            ..Default::default()
        });
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        // Started, catching up (never healthy yet): still a join in flight.
        let joined = member(9, "c1-etcd-m1", "10.0.0.2");
        members_mut(&mut o)[1] = MemberView {
            ever_healthy: false,
            ..unhealthy(joined, "not ready")
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        // A learner is a change in flight too.
        let mut o = running(3);
        o.replicas = 5;
        members_mut(&mut o)[2].is_learner = true;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_LEARNER);
    }

    #[test]
    fn exactly_one_machine_is_added_per_step_once_all_are_healthy_voters() {
        let mut o = running(1);
        assert_eq!(
            plan(&o),
            Step::CreateMachine {
                adopt: None,
                failure_domain: None,
                purpose: Growth::ScaleUp,
            }
        );
        // Before the first member was ever healthy, even with a member list, no second add.
        o.initialized = false;
        members_mut(&mut o)[0] = MemberView {
            ever_healthy: false,
            ..unhealthy(members_mut(&mut o)[0].clone(), "starting")
        };
        assert!(!matches!(plan(&o), Step::CreateMachine { .. }));
    }

    #[test]
    fn quorum_lost_means_no_writes_at_all() {
        let mut o = running(3);
        for i in [1, 2] {
            members_mut(&mut o)[i] = unhealthy(members_mut(&mut o)[i].clone(), "connection refused");
        }
        o.kcp = kcp(&[], true, false);
        o.leftovers = vec!["c1-etcd-zzzzz".into()];
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::QUORUM_LOST);
        assert!(wait_message(&step).contains("1 of 3"));
        assert!(!step.writes());
        // Nobody answering at all after initialization is the same.
        let mut o = running(3);
        o.etcd = EtcdView::Unreachable {
            message: "all refused".into(),
        };
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
    }

    #[test]
    fn zone_spread_puts_one_member_in_each_of_three_zones() {
        let zones = vec!["us-a".to_string(), "us-b".into(), "us-c".into()];
        let mut o = base();
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: zones.clone(),
        };
        let mut placed = Vec::new();
        for i in 0..3 {
            let Step::CreateMachine { failure_domain, .. } = plan(&o) else {
                panic!("expected a Machine at step {i}: {:?}", plan(&o));
            };
            let domain = failure_domain.unwrap();
            let name = format!("c1-etcd-m{i}");
            let address = format!("10.0.0.{}", i + 1);
            o.machines.push(machine(&name, Some(&address), Some(&domain)));
            let mut members = match &o.etcd {
                EtcdView::Members(m) => m.clone(),
                _ => vec![],
            };
            members.push(member(i as u64 + 1, &name, &address));
            o.etcd = EtcdView::Members(members);
            o.initialized = true;
            o.init_secret = Some(InitSecretView {
                address: Some("10.0.0.1".into()),
                client_urls: healthy_client_urls(&o),
            });
            placed.push(domain);
        }
        placed.sort();
        assert_eq!(placed, zones);
        assert!(is_ready(&o));
    }

    #[test]
    fn failure_domains_are_restricted_by_the_spec_and_ties_go_by_name() {
        let cluster = vec!["a".to_string(), "b".into(), "c".into()];
        assert_eq!(allowed_failure_domains(&[], &cluster).unwrap(), cluster);
        assert_eq!(
            allowed_failure_domains(&["c".into(), "x".into(), "b".into()], &cluster).unwrap(),
            vec!["b".to_string(), "c".into()]
        );
        assert!(allowed_failure_domains(&["x".into()], &cluster).is_err());
        assert_eq!(
            allowed_failure_domains(&["x".into()], &[]).unwrap(),
            vec!["x".to_string()]
        );
        let machines = vec![
            machine("m0", None, Some("a")),
            machine("m1", None, Some("b")),
            MachineView {
                deleting: true,
                ..machine("m2", None, Some("c"))
            },
        ];
        assert_eq!(pick_failure_domain(&cluster, &machines).as_deref(), Some("c"));
        assert_eq!(
            pick_failure_domain(&cluster, &machines[..1]).as_deref(),
            Some("b")
        );
        assert_eq!(pick_failure_domain(&[], &machines), None);
        let mut o = base();
        o.spec_failure_domains = vec!["x".into()];
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: cluster,
        };
        assert_eq!(wait_reason(&plan(&o)), reason::NO_FAILURE_DOMAIN);
    }

    #[test]
    fn an_interrupted_creation_is_adopted_not_orphaned() {
        let mut o = base();
        o.leftovers = vec!["c1-etcd-abcde".into()];
        assert_eq!(
            plan(&o),
            Step::CreateMachine {
                adopt: Some("c1-etcd-abcde".into()),
                failure_domain: None,
                purpose: Growth::ScaleUp,
            }
        );
        // At full size the leftovers are cleaned up instead, once ready.
        let mut o = running(3);
        o.leftovers = vec!["c1-etcd-abcde".into()];
        assert_eq!(
            plan(&o),
            Step::DeleteLeftovers {
                names: vec!["c1-etcd-abcde".into()]
            }
        );
    }

    #[test]
    fn members_match_machines_by_name_and_peer_url_never_by_guess() {
        let machines = vec![
            machine("m0", Some("10.0.0.1"), None),
            machine("m1", Some("10.0.0.2"), None),
        ];
        let peer = |a: &str| vec![names::peer_url(a)];
        assert_eq!(machine_for_member("m0", &peer("10.0.0.1"), &machines), Some("m0"));
        assert_eq!(machine_for_member("", &peer("10.0.0.2"), &machines), Some("m1"));
        assert_eq!(machine_for_member("m1", &peer("10.9.9.9"), &machines), Some("m1"));
        assert_eq!(machine_for_member("m0", &peer("10.0.0.2"), &machines), None);
        assert_eq!(machine_for_member("other", &peer("10.9.9.9"), &machines), None);
    }

    #[test]
    fn a_member_without_machine_blocks_ready_but_is_never_touched() {
        let mut o = running(3);
        members_mut(&mut o).push(MemberView {
            machine: None,
            ..member(7, "restored", "10.0.0.9")
        });
        assert!(!is_ready(&o));
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::UNKNOWN_MEMBERS);
        assert!(!step.writes());
    }

    #[test]
    fn kcp_is_paused_until_ready_then_gets_endpoints_secrets_and_unpause_in_order() {
        let mut o = base();
        o.kcp = kcp(&["https://placeholder:2379"], false, false);
        assert_eq!(plan(&o), Step::PauseKcp);
        // Skip annotation or local etcd: never paused.
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: false,
            endpoints: vec![],
            paused: false,
            skip_pause: true,
            secrets_present: false,
            rollout_complete: false,
        };
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: true,
            endpoints: vec![],
            paused: false,
            skip_pause: false,
            secrets_present: false,
            rollout_complete: false,
        };
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));

        let mut o = running(3);
        o.kcp = kcp(&["https://placeholder:2379"], true, false);
        let expected: Vec<String> = (1..=3).map(|i| format!("https://10.0.0.{i}:2379")).collect();
        assert_eq!(
            plan(&o),
            Step::WriteKcpEndpoints {
                endpoints: expected.clone()
            }
        );
        let refs: Vec<&str> = expected.iter().map(String::as_str).collect();
        o.kcp = kcp(&refs, true, false);
        assert_eq!(plan(&o), Step::CreateKcpSecrets);
        o.kcp = kcp(&refs, true, true);
        assert_eq!(plan(&o), Step::UnpauseKcp);
        o.kcp = kcp(&refs, false, true);
        assert_eq!(plan(&o), Step::Steady);
        // Not ready (one member missing): KCP is not touched, and after creation not re-paused.
        let mut o = running(2);
        o.kcp = kcp(&[], false, false);
        o.creation_complete = true;
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
    }

    #[test]
    fn init_secret_urls_follow_the_healthy_voters_once_ready() {
        let mut o = running(3);
        o.init_secret = Some(InitSecretView {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        let Step::UpdateInitSecretUrls { client_urls } = plan(&o) else {
            panic!("expected an init Secret update: {:?}", plan(&o));
        };
        assert_eq!(client_urls.len(), 3);
    }

    #[test]
    fn deletion_waits_for_the_control_plane_then_deletes_machines_then_the_finalizer() {
        let mut o = running(3);
        o.deleting = true;
        o.control_plane_machines = 2;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
        o.control_plane_machines = 0;
        let Step::ReleaseAndDeleteMachines { names } = plan(&o) else {
            panic!("expected Machine deletion");
        };
        assert_eq!(names.len(), 3);
        for m in &mut o.machines {
            m.deleting = true;
            m.has_hook = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_DELETION);
        o.machines.clear();
        assert_eq!(plan(&o), Step::RemoveFinalizer);
        // Quorum lost does not block deletion.
        let mut o = running(3);
        o.deleting = true;
        o.etcd = EtcdView::Unreachable {
            message: "gone".into(),
        };
        assert!(matches!(plan(&o), Step::ReleaseAndDeleteMachines { .. }));
        // The Cluster deleting alone deletes Machines but leaves our finalizer to our deletion.
        let mut o = base();
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: true,
            infrastructure_ready: true,
            failure_domains: vec![],
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER_DELETION);
    }

    #[test]
    fn ready_needs_membership_equal_to_machines_equal_to_replicas() {
        let o = running(3);
        assert!(is_ready(&o));
        assert_eq!(plan(&o), Step::Steady);
        let mut short = running(3);
        short.replicas = 5;
        assert!(!is_ready(&short));
        let mut sick = running(3);
        members_mut(&mut sick)[0].healthy = false;
        assert!(!is_ready(&sick));
        assert_eq!(
            voting_endpoints(&o),
            vec![
                "https://10.0.0.1:2379".to_string(),
                "https://10.0.0.2:2379".into(),
                "https://10.0.0.3:2379".into()
            ]
        );
        assert_eq!(healthy_client_urls(&sick).len(), 2);
    }

    #[test]
    fn a_deleted_machines_member_is_removed_first_under_quorum_and_leader_rules() {
        // A follower: removed through a healthy member, then the hook is released.
        let mut o = running(3);
        o.machines[2].deleting = true;
        let step = plan(&o);
        assert_eq!(
            step,
            Step::RemoveMember {
                member_id: 3,
                via_url: "https://10.0.0.1:2379".into(),
                member: "member of Machine c1-etcd-m2".into(),
                why: "Machine c1-etcd-m2 is being deleted".into(),
            }
        );
        members_mut(&mut o).pop();
        assert_eq!(
            plan(&o),
            Step::ReleaseHook {
                machine: "c1-etcd-m2".into()
            }
        );
        // The leader (member 1): leadership moves first (rule 6), asked of the leader itself.
        let mut o = running(3);
        o.machines[0].deleting = true;
        assert_eq!(
            plan(&o),
            Step::MoveLeader {
                leader_url: "https://10.0.0.1:2379".into(),
                to: 2,
                machine: "c1-etcd-m0".into()
            }
        );
        // Rule 3: 3 voters, one already unhealthy: removing a healthy one leaves 1 of 2.
        let mut o = running(3);
        o.machines[2].deleting = true;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        assert_eq!(wait_reason(&plan(&o)), reason::REMOVAL_WOULD_LOSE_QUORUM);
        // Removing the unhealthy one instead is fine: 2 of 2 remain.
        let mut o = running(3);
        o.machines[1].deleting = true;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        assert!(matches!(plan(&o), Step::RemoveMember { member_id: 2, .. }));
        // Never the last member.
        let mut o = running(1);
        o.replicas = 1;
        o.machines[0].deleting = true;
        assert_eq!(wait_reason(&plan(&o)), reason::LAST_MEMBER);
        // Membership unknown: wait, never release blindly.
        let mut o = running(3);
        o.machines[2].deleting = true;
        o.etcd = EtcdView::Unreachable { message: "x".into() };
        o.initialized = false;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
        // A Machine that never got an address never joined.
        let mut o = base();
        o.machines.push(MachineView {
            deleting: true,
            ..machine("c1-etcd-x", None, None)
        });
        assert_eq!(
            plan(&o),
            Step::ReleaseHook {
                machine: "c1-etcd-x".into()
            }
        );
        // No scale-up while a removal is in flight.
        let mut o = running(3);
        o.replicas = 3;
        o.machines[2].deleting = true;
        assert!(!matches!(plan(&o), Step::CreateMachine { .. }));
    }

    /// A toy world for whole-operation plan tests: every step takes effect at once, joins are
    /// instant and healthy, CAPI lets a Machine go as soon as its hook is released, and the
    /// control plane finishes a rollout when waited for.
    struct World {
        o: Observed,
        next: usize,
        kcp_writes: Vec<Vec<String>>,
        max_members: usize,
        max_machines: usize,
        removed: Vec<String>,
    }

    impl World {
        fn new(o: Observed) -> World {
            let members = o.members().len();
            let machines = o.machines.len();
            World {
                o,
                next: 0,
                kcp_writes: vec![],
                max_members: members,
                max_machines: machines,
                removed: vec![],
            }
        }

        fn apply(&mut self, step: &Step) {
            match step {
                Step::CreateMachine { failure_domain, .. } => {
                    self.next += 1;
                    let name = format!("c1-etcd-n{}", self.next);
                    let address = format!("10.0.1.{}", self.next);
                    self.o
                        .machines
                        .push(machine(&name, Some(&address), failure_domain.as_deref()));
                    let mut m = member(100 + self.next as u64, &name, &address);
                    m.is_leader = false;
                    members_mut(&mut self.o).push(m);
                }
                Step::DeleteMachine { machine, .. } => {
                    let m = self.o.machines.iter_mut().find(|m| &m.name == machine).unwrap();
                    assert!(!m.deleting, "deleted twice: {machine}");
                    m.deleting = true;
                }
                Step::MoveLeader { to, .. } => {
                    for m in members_mut(&mut self.o) {
                        m.is_leader = m.id == *to;
                    }
                }
                Step::RemoveMember { member_id, .. } => {
                    let members = members_mut(&mut self.o);
                    let gone = members.iter().find(|m| m.id == *member_id).unwrap();
                    assert!(!gone.is_leader, "removed the leader without moving it");
                    self.removed.push(gone.name.clone());
                    members.retain(|m| m.id != *member_id);
                }
                Step::ReleaseHook { machine } => self.o.machines.retain(|m| &m.name != machine),
                Step::WriteKcpEndpoints { endpoints } => {
                    self.kcp_writes.push(endpoints.clone());
                    if let KcpView::Found {
                        endpoints: current,
                        rollout_complete,
                        ..
                    } = &mut self.o.kcp
                    {
                        *current = endpoints.clone();
                        *rollout_complete = false;
                    }
                }
                Step::Wait { reason, .. } if *reason == reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT => {
                    if let KcpView::Found { rollout_complete, .. } = &mut self.o.kcp {
                        *rollout_complete = true;
                    }
                }
                Step::UpdateInitSecretUrls { client_urls } => {
                    self.o.init_secret = Some(InitSecretView {
                        address: Some("10.0.0.1".into()),
                        client_urls: client_urls.clone(),
                    });
                }
                other => panic!("unexpected step {other:?}"),
            }
            self.max_members = self.max_members.max(self.o.members().len());
            self.max_machines = self.max_machines.max(self.o.machines.len());
        }

        /// Plan and apply until steady; returns the steps taken.
        fn run(&mut self) -> Vec<Step> {
            let mut steps = vec![];
            for _ in 0..200 {
                let step = plan(&self.o);
                if step == Step::Steady {
                    return steps;
                }
                self.apply(&step);
                steps.push(step);
            }
            panic!("no steady state after 200 steps: {steps:#?}");
        }

        fn member_names(&self) -> Vec<String> {
            let mut names: Vec<String> = self.o.members().iter().map(|m| m.name.clone()).collect();
            names.sort();
            names
        }
    }

    fn zones() -> Vec<String> {
        vec!["a".to_string(), "b".into(), "c".into()]
    }

    /// `n` healthy members spread over zones a, b, c, optionally with a KCP that uses them.
    fn zoned(n: usize, with_kcp: bool) -> Observed {
        let mut o = running(n);
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: zones(),
        };
        for (i, m) in o.machines.iter_mut().enumerate() {
            m.failure_domain = Some(zones()[i % 3].clone());
        }
        o.creation_complete = true;
        if with_kcp {
            let urls = voting_endpoints(&o);
            let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
            o.kcp = kcp(&refs, false, true);
        }
        o
    }

    fn outdate_all(o: &mut Observed) {
        for m in &mut o.machines {
            m.outdated = Some("etcdadmConfigSpec changed (cloudInitConfig.version)".into());
        }
    }

    fn new_members_only(w: &World) -> bool {
        w.member_names().iter().all(|n| n.starts_with("c1-etcd-n"))
    }

    fn zone_counts(o: &Observed) -> Vec<usize> {
        zones()
            .iter()
            .map(|z| {
                o.machines
                    .iter()
                    .filter(|m| m.failure_domain.as_deref() == Some(z.as_str()))
                    .count()
            })
            .collect()
    }

    #[test]
    fn scale_down_five_to_three_to_one_removes_members_first_one_at_a_time() {
        let mut w = World::new(zoned(5, false));
        w.o.replicas = 3;
        let steps = w.run();
        assert_eq!(w.o.machines.len(), 3);
        assert_eq!(w.member_names().len(), 3);
        // Each Machine deletion is followed by its member's removal before the next deletion.
        let mut deleting: Option<String> = None;
        for step in &steps {
            match step {
                Step::DeleteMachine { machine, purpose, .. } => {
                    assert_eq!(*purpose, Removal::ScaleDown);
                    assert!(deleting.is_none(), "two removals in flight: {steps:#?}");
                    deleting = Some(machine.clone());
                }
                Step::ReleaseHook { machine } => {
                    assert_eq!(deleting.as_deref(), Some(machine.as_str()));
                    assert!(
                        w.removed.contains(machine),
                        "hook released before the member left"
                    );
                    deleting = None;
                }
                _ => {}
            }
        }
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1], "{:?}", w.o.machines);
        // 3 → 1 passes through two members: removing a healthy one of two is allowed.
        w.o.replicas = 1;
        w.run();
        assert_eq!(w.o.machines.len(), 1);
        assert_eq!(w.member_names().len(), 1);
        // And back to 3.
        w.o.replicas = 3;
        w.run();
        assert_eq!(w.member_names().len(), 3);
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
    }

    #[test]
    fn scale_down_victim_annotation_then_dead_then_crowded_domain_then_oldest() {
        let domains = zones();
        let mut o = zoned(3, false);
        o.machines
            .push(machine("c1-etcd-m3", Some("10.0.0.4"), Some("a")));
        members_mut(&mut o).push(member(4, "c1-etcd-m3", "10.0.0.4"));
        o.machines
            .push(machine("c1-etcd-m4", Some("10.0.0.5"), Some("b")));
        members_mut(&mut o).push(member(5, "c1-etcd-m4", "10.0.0.5"));
        let all: Vec<&MachineView> = o.machines.iter().collect();
        // Zones a and b hold two each: the oldest of the first crowded one goes.
        assert_eq!(pick_victim(&o, &domains, &all).unwrap().name, "c1-etcd-m0");
        // A Machine outside the allowed domains goes first.
        let mut outside = o.clone();
        outside.machines[2].failure_domain = Some("gone".into());
        let all: Vec<&MachineView> = outside.machines.iter().collect();
        assert_eq!(pick_victim(&outside, &domains, &all).unwrap().name, "c1-etcd-m2");
        // A dead member goes before that.
        let mut dead = outside.clone();
        members_mut(&mut dead)[4] = unhealthy(members_mut(&mut dead)[4].clone(), "connection refused");
        let all: Vec<&MachineView> = dead.machines.iter().collect();
        assert_eq!(pick_victim(&dead, &domains, &all).unwrap().name, "c1-etcd-m4");
        // The delete-machine annotation wins over everything.
        dead.machines[1].delete_requested = true;
        let all: Vec<&MachineView> = dead.machines.iter().collect();
        assert_eq!(pick_victim(&dead, &domains, &all).unwrap().name, "c1-etcd-m1");
        // Planned: 5 → 3 deletes the annotated Machine first.
        o.replicas = 3;
        o.machines[4].delete_requested = true;
        o.init_secret = Some(InitSecretView {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        assert!(
            matches!(plan(&o), Step::DeleteMachine { machine, purpose: Removal::ScaleDown, .. } if machine == "c1-etcd-m4")
        );
    }

    #[test]
    fn refusals_never_break_the_membership_rules() {
        // Removing a member from a 2-member cluster whose other member is unhealthy: quorum is
        // already lost, nothing is written.
        let mut o = running(2);
        o.replicas = 1;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::QUORUM_LOST);
        assert!(!step.writes() && step.is_refusal());
        // Removing a healthy member while another is dead (3 members): refused, whoever asks.
        let mut o = running(3);
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        o.machines[2].deleting = true;
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::REMOVAL_WOULD_LOSE_QUORUM);
        assert!(step.is_refusal());
        // ... and a scale down to 1 takes the dead one, never a healthy one first.
        let mut o = running(3);
        o.replicas = 1;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        assert!(matches!(plan(&o), Step::DeleteMachine { machine, .. } if machine == "c1-etcd-m1"));
        let mut o = running(3);
        o.replicas = 1;
        o.machines[2].delete_requested = true;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        let step = plan(&o);
        assert_eq!(
            wait_reason(&step),
            reason::WAITING_FOR_HEALTHY_MEMBERS,
            "{step:?}"
        );
        // Removing the last member.
        let mut o = running(1);
        o.machines[0].deleting = true;
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::LAST_MEMBER);
        assert!(step.is_refusal());
        // Adding while a member is unhealthy.
        let mut o = running(3);
        o.replicas = 5;
        members_mut(&mut o)[0] = unhealthy(members_mut(&mut o)[0].clone(), "down");
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
        // Promoting or adding during quorum loss: nothing, even with a learner waiting.
        let mut o = running(3);
        o.replicas = 5;
        members_mut(&mut o)[2].is_learner = true;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "down");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::QUORUM_LOST, "{step:?}");
        assert!(!step.writes());
        // Allowed: one healthy member of a healthy 2-member cluster (that is how 3 → 1 works).
        let mut o = running(2);
        o.replicas = 1;
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::ScaleDown,
                ..
            }
        ));
        let mut o = running(2);
        o.machines[1].deleting = true;
        assert!(matches!(plan(&o), Step::RemoveMember { member_id: 2, .. }));
    }

    #[test]
    fn rollout_with_a_kcp_adds_all_then_switches_once_then_removes_the_old() {
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        let old = voting_endpoints(&o);
        let mut w = World::new(o);
        let steps = w.run();
        assert_eq!(w.max_members, 6, "surge to 2N");
        assert_eq!(w.kcp_writes.len(), 1, "one endpoint update: {:?}", w.kcp_writes);
        assert!(
            w.kcp_writes[0].iter().all(|e| !old.contains(e)),
            "{:?}",
            w.kcp_writes
        );
        assert!(new_members_only(&w), "{:?}", w.member_names());
        assert_eq!(w.o.machines.len(), 3);
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // Adds all come before the switch; removals all after it.
        let switch = steps
            .iter()
            .position(|s| matches!(s, Step::WriteKcpEndpoints { .. }))
            .unwrap();
        assert!(
            steps[..switch]
                .iter()
                .all(|s| !matches!(s, Step::DeleteMachine { .. }))
        );
        assert!(
            steps[switch..]
                .iter()
                .all(|s| !matches!(s, Step::CreateMachine { .. }))
        );
        assert_eq!(up_to_date_machines(&w.o), 3);
    }

    #[test]
    fn rollout_without_kcp_or_with_max_surge_zero_stays_within_its_bounds() {
        // No KCP, maxSurge 1: never more than N+1.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 4);
        assert_eq!(w.max_machines, 4);
        assert!(new_members_only(&w));
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // maxSurge 0 without KCP: never more than N.
        let mut o = zoned(3, false);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert!(new_members_only(&w));
        // maxSurge 0 with a KCP: never more than N, one control plane rollout per member.
        let mut o = zoned(3, true);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert_eq!(w.kcp_writes.len(), 3, "{:?}", w.kcp_writes);
        assert!(new_members_only(&w));
        // A single member cannot be replaced remove-first: maxSurge 0 surges anyway.
        let mut o = zoned(1, true);
        o.replicas = 1;
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 2);
        assert_eq!(w.kcp_writes.len(), 1);
        assert!(new_members_only(&w));
    }

    #[test]
    fn a_rollout_starts_only_healthy_pauses_when_health_is_lost_and_replaces_dead_members_first() {
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::ROLLOUT_PAUSED);
        assert!(step.is_refusal() && !step.writes());
        assert!(wait_message(&step).contains("c1-etcd-m2"), "{step:?}");
        // Mid-way (N+1 Machines), the dead member is the one removed.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        o.machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), Some("a")));
        members_mut(&mut o).push(member(9, "c1-etcd-n1", "10.0.1.1"));
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        assert!(matches!(plan(&o), Step::DeleteMachine { machine, .. } if machine == "c1-etcd-m1"));
        // With a KCP, the switch waits for health too.
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        for i in 0..3 {
            let name = format!("c1-etcd-n{i}");
            let address = format!("10.0.1.{i}");
            o.machines.push(machine(&name, Some(&address), Some("a")));
            members_mut(&mut o).push(MemberView {
                is_leader: false,
                ..member(10 + i, &name, &address)
            });
        }
        o.init_secret = Some(InitSecretView {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        assert!(
            matches!(plan(&o), Step::WriteKcpEndpoints { .. }),
            "{:?}",
            plan(&o)
        );
        members_mut(&mut o)[4] = unhealthy(members_mut(&mut o)[4].clone(), "down");
        assert_eq!(wait_reason(&plan(&o)), reason::ROLLOUT_PAUSED);
    }

    #[test]
    fn the_control_plane_keeps_a_working_endpoint_and_its_rollout_finishes_first() {
        // KCP lists only m0; removing m0 (Machine deleted by hand) waits for another endpoint.
        let mut o = zoned(3, false);
        o.kcp = kcp(&["https://10.0.0.1:2379"], false, true);
        o.machines[0].deleting = true;
        o.etcd = EtcdView::Members(
            members_mut(&mut o)
                .iter()
                .map(|m| MemberView {
                    is_leader: m.id == 2,
                    ..m.clone()
                })
                .collect(),
        );
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CONTROL_PLANE_NEEDS_MEMBER, "{step:?}");
        assert!(step.is_refusal());
        // A scale down waits while the KCP is rolling.
        let mut o = zoned(3, true);
        o.replicas = 1;
        if let KcpView::Found { rollout_complete, .. } = &mut o.kcp {
            *rollout_complete = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT);
    }

    #[test]
    fn a_member_dead_longer_than_unhealthy_after_is_replaced_once_at_a_time() {
        let after = Duration::from_secs(5);
        let mut o = zoned(3, false);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(3);
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::WAITING_FOR_HEALTHY_MEMBERS);
        assert!(
            wait_message(&step).contains("replaced once unhealthy for 5s"),
            "{step:?}"
        );
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(6);
        let step = plan(&o);
        assert_eq!(
            step,
            Step::DeleteMachine {
                machine: "c1-etcd-m1".into(),
                purpose: Removal::Remediation { retries: 0 },
                message: "the member of Machine c1-etcd-m1 has been unhealthy for 6s (connection refused), longer than unhealthyAfter 5s: deleting the Machine (its member is removed first); a new one replaces it".into(),
            }
        );
        // The whole replacement: member removed, Machine gone, a new one added, healthy.
        let mut w = World::new(o.clone());
        w.apply(&step);
        let rest = w.run();
        assert!(
            matches!(rest[0], Step::RemoveMember { member_id: 2, .. }),
            "{rest:?}"
        );
        assert_eq!(w.member_names().len(), 3);
        assert!(!w.member_names().contains(&"c1-etcd-m1".to_string()));
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // Never two at a time: while the first Machine is still being deleted, wait.
        let mut two = o.clone();
        members_mut(&mut two)[2] = unhealthy(members_mut(&mut two)[2].clone(), "down");
        members_mut(&mut two)[2].unhealthy_for = Duration::from_secs(60);
        assert_eq!(
            wait_reason(&plan(&two)),
            reason::QUORUM_LOST,
            "2 of 3 dead: nothing"
        );
        let mut five = zoned(5, false);
        five.replicas = 5;
        five.remediation.unhealthy_after = after;
        for i in [1, 2] {
            members_mut(&mut five)[i] = unhealthy(members_mut(&mut five)[i].clone(), "down");
            members_mut(&mut five)[i].unhealthy_for = Duration::from_secs(60);
        }
        assert!(matches!(plan(&five), Step::DeleteMachine { .. }));
        five.machines[1].deleting = true;
        five.machines[1].has_hook = false;
        assert_eq!(wait_reason(&plan(&five)), reason::WAITING_FOR_MACHINE_DELETION);
        // Disabled: reported, nothing removed.
        let mut off = o.clone();
        off.remediation.enabled = false;
        let step = plan(&off);
        assert_eq!(wait_reason(&step), reason::REMEDIATION_DISABLED);
        assert!(!step.writes() && step.is_refusal());
    }

    #[test]
    fn a_failed_replacement_is_retried_with_backoff() {
        let after = Duration::from_secs(5);
        let mut o = zoned(3, false);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        members_mut(&mut o)[1].unhealthy_for = Duration::from_secs(6);
        o.machines[1].age = Duration::from_secs(9);
        o.machines[1].replaces = Some(LastRemediation {
            machine: "c1-etcd-old".into(),
            ago: Duration::from_secs(9),
            retries: 0,
        });
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::REMEDIATION_BACKOFF);
        assert!(wait_message(&step).contains("c1-etcd-old"), "{step:?}");
        fn replaces(o: &mut Observed) -> &mut LastRemediation {
            o.machines[1].replaces.as_mut().unwrap()
        }
        replaces(&mut o).ago = Duration::from_secs(11);
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::Remediation { retries: 1 },
                ..
            }
        ));
        // The second failure waits twice as long.
        replaces(&mut o).retries = 1;
        assert_eq!(wait_reason(&plan(&o)), reason::REMEDIATION_BACKOFF);
        replaces(&mut o).ago = Duration::from_secs(21);
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::Remediation { retries: 2 },
                ..
            }
        ));
        // A replacement that stayed healthy for long is not a failed replacement.
        o.machines[1].age = MIN_HEALTHY_PERIOD + Duration::from_secs(1);
        replaces(&mut o).ago = Duration::from_secs(1);
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::Remediation { retries: 0 },
                ..
            }
        ));
        // Nor is any other Machine, however recent the last remediation.
        o.machines[1].age = Duration::from_secs(9);
        o.machines[1].replaces = None;
        o.last_remediation = Some(LastRemediation {
            machine: "c1-etcd-old".into(),
            ago: Duration::from_secs(1),
            retries: 3,
        });
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::Remediation { retries: 0 },
                ..
            }
        ));
        assert_eq!(
            remediation_backoff(Duration::from_secs(300), 10),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn the_machine_created_after_a_remediation_is_marked_as_its_replacement() {
        let mut o = running(2);
        for m in &mut o.machines {
            m.age = Duration::from_secs(100);
        }
        o.last_remediation = Some(LastRemediation {
            machine: "c1-etcd-dead".into(),
            ago: Duration::from_secs(2),
            retries: 0,
        });
        assert!(matches!(
            plan(&o),
            Step::CreateMachine {
                purpose: Growth::Replacement,
                ..
            }
        ));
        // Once a Machine was created after it, later ones are ordinary.
        o.machines[1].age = Duration::from_secs(1);
        assert!(matches!(
            plan(&o),
            Step::CreateMachine {
                purpose: Growth::ScaleUp,
                ..
            }
        ));
    }

    #[test]
    fn orphans_unhealthy_members_go_healthy_ones_stay_machines_are_adopted_or_replaced() {
        let after = Duration::from_secs(5);
        // An unhealthy member on no Machine: removed under rule 3 once overdue.
        let mut o = running(3);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o).push(MemberView {
            machine: None,
            unhealthy_for: Duration::from_secs(9),
            ..unhealthy(member(7, "gone-machine", "10.0.0.9"), "connection refused")
        });
        let step = plan(&o);
        assert!(
            matches!(&step, Step::RemoveMember { member_id: 7, why, .. } if why.contains("no Machine")),
            "{step:?}"
        );
        // Even with remediation disabled (rule 4 is not remediation).
        o.remediation.enabled = false;
        assert!(matches!(plan(&o), Step::RemoveMember { member_id: 7, .. }));
        // Healthy: never touched.
        members_mut(&mut o)[3].healthy = true;
        assert_eq!(wait_reason(&plan(&o)), reason::UNKNOWN_MEMBERS);
        // A Machine whose member left etcd: replaced once overdue.
        let mut o = running(3);
        o.remediation.unhealthy_after = after;
        members_mut(&mut o).remove(2);
        o.machines[2].was_member = true;
        o.machines[2].unhealthy_for = Duration::from_secs(2);
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_HEALTHY_MEMBERS);
        o.machines[2].unhealthy_for = Duration::from_secs(6);
        assert!(matches!(
            plan(&o),
            Step::DeleteMachine {
                purpose: Removal::OrphanMachine,
                ..
            }
        ));
        // A new Machine without a member is a join in flight, not an orphan.
        o.machines[2].was_member = false;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        // Labelled Machines with no controller, or without our hook, are adopted first.
        let mut o = running(3);
        o.machines[1].orphan = true;
        assert_eq!(
            plan(&o),
            Step::AdoptMachine {
                machine: "c1-etcd-m1".into()
            }
        );
        let mut o = running(3);
        o.machines[2].has_hook = false;
        assert_eq!(
            plan(&o),
            Step::AdoptMachine {
                machine: "c1-etcd-m2".into()
            }
        );
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!([1, 2, 3, 4, 5].map(quorum), [1, 2, 2, 3, 3]);
    }
}
