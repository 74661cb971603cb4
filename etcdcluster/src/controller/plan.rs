//! The next step for one EtcdadmCluster as a pure function of what was observed: the etcd
//! membership safety rules of SPEC-etcdcluster.md live here, so they are tested without an API.
//!
//! Planned here: linking, CA, initialization, scale-up one member at a time, member removal for
//! Machines deleted by anyone (rules 3, 4, 6), KCP gating and deletion. Rolling replacement,
//! scale-down victims and remediation are not yet: a plan that would need them waits and says so.

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
}

impl MemberView {
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    fn is_joining(&self) -> bool {
        !self.is_started() || (!self.healthy && !self.ever_healthy)
    }

    fn describe(&self) -> String {
        if self.is_started() {
            format!("member {}", self.name)
        } else {
            format!(
                "member {} ({})",
                etcdadm_shared::etcd::member_id_hex(self.id),
                self.peer_urls.join(",")
            )
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
    },
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
    /// A spec problem admission should have caught (e.g. template in another namespace).
    pub spec_problem: Option<String>,
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
    },
    /// Remove infra machines/configs of interrupted creations no longer needed.
    DeleteLeftovers {
        names: Vec<String>,
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
    /// Rules 3 and 4: remove the member of a Machine being deleted, asking a healthy member.
    RemoveMember {
        member_id: u64,
        via_url: String,
        machine: String,
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
    pub const SCALE_DOWN_NOT_IMPLEMENTED: &str = "ScaleDownNotImplemented";
    pub const WAITING_FOR_MACHINE_DELETION: &str = "WaitingForMachineDeletion";
    pub const REMOVAL_WOULD_LOSE_QUORUM: &str = "RemovalWouldLoseQuorum";
    pub const LAST_MEMBER: &str = "LastMember";
    pub const REMOVING_MEMBER: &str = "RemovingMember";
    pub const WAITING_FOR_CONTROL_PLANE_DELETION: &str = "WaitingForControlPlaneDeletion";
    pub const WAITING_FOR_CLUSTER_DELETION: &str = "WaitingForClusterDeletion";
    pub const SCALING_UP: &str = "ScalingUp";
    pub const PROVISIONING: &str = "Provisioning";
    pub const UPDATING_CONTROL_PLANE: &str = "UpdatingControlPlane";
    pub const DELETING: &str = "Deleting";
    pub const READY: &str = "Ready";
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
            Step::CreateMachine { .. } => (reason::SCALING_UP, "creating a member Machine".into()),
            Step::DeleteLeftovers { names } => (
                reason::PROVISIONING,
                format!(
                    "removing leftovers of interrupted creations: {}",
                    names.join(", ")
                ),
            ),
            Step::WriteKcpEndpoints { .. } | Step::CreateKcpSecrets | Step::UnpauseKcp => (
                reason::UPDATING_CONTROL_PLANE,
                "handing the etcd endpoints and certificates to the KubeadmControlPlane".into(),
            ),
            Step::MoveLeader { machine, .. } => (
                reason::REMOVING_MEMBER,
                format!("moving etcd leadership away from Machine {machine} before removing its member"),
            ),
            Step::RemoveMember { machine, .. } => (
                reason::REMOVING_MEMBER,
                format!("removing the etcd member of Machine {machine}, which is being deleted"),
            ),
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
}

/// `q(n) = n/2 + 1`: how many voters a cluster of `n` needs to commit anything.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
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

/// The allowed failure domain with the fewest current (not deleting) Machines; ties by name.
pub fn pick_failure_domain(allowed: &[String], machines: &[MachineView]) -> Option<String> {
    allowed
        .iter()
        .min_by_key(|domain| {
            let members = machines
                .iter()
                .filter(|m| !m.deleting && m.failure_domain.as_deref() == Some(domain.as_str()))
                .count();
            (members, domain.as_str())
        })
        .cloned()
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

    /// Initialized as stored, or a member passes its health check now.
    pub fn initialized_now(&self) -> bool {
        self.initialized || self.members().iter().any(|m| m.healthy)
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
    let ready = is_ready(o);
    let kcp_unpaused = matches!(
        &o.kcp,
        KcpView::Found {
            local_etcd: false,
            paused: false,
            skip_pause: false,
            ..
        }
    );
    if kcp_unpaused && !ready && !o.creation_complete {
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
    if let Some(step) = plan_member_removal(o) {
        return step;
    }
    if let Some(step) = plan_init_secret(o) {
        return step;
    }
    let active = o.active_machines().count();
    let replicas = usize::try_from(o.replicas).unwrap_or(0);
    if active < replicas {
        return plan_scale_up(o, failure_domains);
    }
    if active > replicas {
        return Step::Wait {
            reason: reason::SCALE_DOWN_NOT_IMPLEMENTED,
            message: format!(
                "{active} Machines for {replicas} replicas: scale-down is not implemented yet, \
                 nothing is removed"
            ),
        };
    }
    if !ready {
        return membership_wait(o).unwrap_or_else(|| Step::Wait {
            reason: reason::UNKNOWN_MEMBERS,
            message: "etcd has members that run on none of this cluster's Machines".into(),
        });
    }
    plan_ready(o)
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
                     nothing is changed until quorum is back",
                    voters.len(),
                    quorum(voters.len()),
                    unhealthy.join(", ")
                ),
            })
        }
        _ => None,
    }
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
    let voters: Vec<&MemberView> = members.iter().filter(|m| !m.is_learner).collect();
    if !member.is_learner {
        if voters.len() <= 1 {
            return Some(Step::Wait {
                reason: reason::LAST_MEMBER,
                message: format!(
                    "Machine {} runs the last etcd member, which is never removed; delete the EtcdadmCluster to delete the whole etcd cluster",
                    machine.name
                ),
            });
        }
        let healthy = voters.iter().filter(|m| m.healthy).count();
        let after = healthy.saturating_sub(usize::from(member.healthy));
        if after < quorum(voters.len() - 1) {
            return Some(Step::Wait {
                reason: reason::REMOVAL_WOULD_LOSE_QUORUM,
                message: format!(
                    "removing the member of Machine {} would leave {after} healthy of {} voters, below quorum {}",
                    machine.name,
                    voters.len() - 1,
                    quorum(voters.len() - 1)
                ),
            });
        }
    }
    let healthy_other = voters
        .iter()
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
        machine: machine.name.clone(),
    })
}

/// Publish `<cluster>-etcd-init` once the first Machine has an address; keep its join URLs
/// pointing at healthy voters once there are any.
fn plan_init_secret(o: &Observed) -> Option<Step> {
    let healthy_urls = healthy_client_urls(o);
    match &o.init_secret {
        None => {
            let first = o.active_machines().next()?;
            let address = first.address.clone()?;
            let client_urls = if healthy_urls.is_empty() {
                vec![names::client_url(&address)]
            } else {
                healthy_urls
            };
            Some(Step::PublishInitSecret { address, client_urls })
        }
        Some(secret) => (is_ready(o) && !healthy_urls.is_empty() && secret.client_urls != healthy_urls)
            .then_some(Step::UpdateInitSecretUrls {
                client_urls: healthy_urls,
            }),
    }
}

/// Why membership is not settled (rules 1 and 2), if it is not: a Machine without address or
/// member, an unstarted or learning member, an unhealthy voter.
fn membership_wait(o: &Observed) -> Option<Step> {
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
    for machine in o.active_machines() {
        let member = members
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine.name.as_str()));
        if member.is_none() {
            return Some(Step::Wait {
                reason: reason::WAITING_FOR_MEMBER_JOIN,
                message: format!("Machine {} is not an etcd member yet", machine.name),
            });
        }
    }
    if let Some(m) = members.iter().find(|m| !m.healthy) {
        let why = m.message.clone().unwrap_or_else(|| "unhealthy".into());
        return Some(Step::Wait {
            reason: reason::WAITING_FOR_HEALTHY_MEMBERS,
            message: format!("{} is not healthy: {why}", m.describe()),
        });
    }
    None
}

/// Rules 1 and 2: one new Machine, only when every voter is healthy, no join is pending and the
/// first member has been seen healthy (so joins have somewhere to go).
fn plan_scale_up(o: &Observed, cluster_domains: &[String]) -> Step {
    let first = o.machines.is_empty() && o.members().is_empty();
    if !first {
        if let Some(wait) = membership_wait(o) {
            return wait;
        }
        if !o.initialized_now() {
            return Step::Wait {
                reason: reason::WAITING_FOR_FIRST_MEMBER,
                message: "waiting for the first member to pass a health check".into(),
            };
        }
    }
    let allowed = match allowed_failure_domains(&o.spec_failure_domains, cluster_domains) {
        Ok(allowed) => allowed,
        Err(problem) => {
            return Step::Refuse {
                reason: reason::NO_FAILURE_DOMAIN,
                message: problem,
            };
        }
    };
    Step::CreateMachine {
        adopt: o.leftovers.first().cloned(),
        failure_domain: pick_failure_domain(&allowed, &o.machines),
    }
}

/// Ready: keep the join URLs current, hand KCP its endpoints and certificates, then un-pause it.
fn plan_ready(o: &Observed) -> Step {
    if let KcpView::Found {
        local_etcd: false,
        endpoints,
        paused,
        skip_pause,
        secrets_present,
        ..
    } = &o.kcp
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
            deleting: false,
            has_hook: true,
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
            spec_problem: None,
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
                failure_domain: None
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
                failure_domain: None
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
                failure_domain: None
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
    fn scale_down_waits_and_removes_nothing() {
        let mut o = running(3);
        o.replicas = 1;
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::SCALE_DOWN_NOT_IMPLEMENTED);
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
        };
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: true,
            endpoints: vec![],
            paused: false,
            skip_pause: false,
            secrets_present: false,
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
                machine: "c1-etcd-m2".into()
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

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!([1, 2, 3, 4, 5].map(quorum), [1, 2, 2, 3, 3]);
    }
}
