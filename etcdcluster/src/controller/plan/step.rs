//! The steps a plan can choose, what each says in the `Ready` condition while it is next and
//! in the Event it leaves once applied, and the condition reasons the plan uses.

use etcdadm_shared::etcd::member_id_hex;
use etcdadm_shared::names;

use super::observed::{ClusterView, KcpView, Observed};
use super::recovery::{RecoveryAction, RecoveryRecord};

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
    /// Create the infra machine, EtcdadmConfig and Machine of one new member, all named `name`:
    /// a fresh name, or the name of an interrupted creation to finish (`resume`).
    CreateMachine {
        name: String,
        resume: bool,
        failure_domain: Option<String>,
        purpose: Growth,
    },
    /// Write the restore Secret: a fresh download URL of `spec.restore`'s snapshot.
    WriteRestoreSecret,
    /// The restored first member is healthy: its download URL is not kept.
    DeleteRestoreSecret,
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
    /// Re-issue `<cluster>-apiserver-etcd-client` from the CA (the old one, expiring at `expiry`,
    /// stays valid until then).
    RenewApiserverClientCertificate {
        expiry: k8s_openapi::jiff::Timestamp,
    },
    /// Ask the KubeadmControlPlane to replace its Machines created before `after` (the re-issue
    /// time), so the API servers get the new client certificate.
    RequestControlPlaneRollout {
        after: k8s_openapi::jiff::Timestamp,
    },
    /// Rule 6: hand leadership from the member about to be removed (asked through its own
    /// client URL) to the healthy voter `to`.
    MoveLeader {
        leader_url: String,
        to: u64,
        machine: String,
    },
    /// Learner join: add Machine `machine`'s member as a learner at `peer_url`, asking the
    /// healthy voter at `via_url`.
    AddLearner {
        machine: String,
        peer_url: String,
        via_url: String,
    },
    /// Learner join: turn Machine `machine`'s learner into a voter, asking `via_url` (etcd
    /// refuses until it has caught up).
    PromoteLearner {
        member_id: u64,
        machine: String,
        via_url: String,
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
    /// The next action of a quorum-loss recovery; status records `record` first.
    Recover {
        record: Box<RecoveryRecord>,
        action: RecoveryAction,
    },
    /// Every desired member is a healthy voter and KCP has what it needs.
    Steady,
}

/// Condition reasons the plan uses.
pub mod reason {
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_INFRASTRUCTURE: &str = "WaitingForInfrastructure";
    pub const PAUSED: &str = "Paused";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const UNSUPPORTED_VERSION_CHANGE: &str = "UnsupportedVersionChange";
    pub const CA_CORRUPT: &str = "EtcdCACorrupt";
    pub const CA_MISSING: &str = "EtcdCAMissing";
    pub const QUORUM_LOST: &str = "QuorumLost";
    pub const WAITING_FOR_MACHINE_ADDRESS: &str = "WaitingForMachineAddress";
    pub const WAITING_FOR_FIRST_MEMBER: &str = "WaitingForFirstMember";
    pub const WAITING_FOR_MEMBER_JOIN: &str = "WaitingForMemberJoin";
    pub const WAITING_FOR_LEARNER: &str = "WaitingForLearnerPromotion";
    pub const ADDING_LEARNER: &str = "AddingLearner";
    pub const LEARNER_CATCHING_UP: &str = "LearnerCatchingUp";
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
    pub const RENEWING_CERTIFICATES: &str = "RenewingCertificates";
    pub const DELETING: &str = "Deleting";
    pub const READY: &str = "Ready";
    pub const RESTORING: &str = "RestoringFromSnapshot";
    pub const RESTORE_SOURCE_UNUSABLE: &str = "RestoreSourceUnusable";
    pub const RESTORE_VERSION_MISMATCH: &str = "RestoreVersionMismatch";
    pub const RECOVERY_REFUSED: &str = "RecoveryRefused";
    pub const RECOVERING: &str = "Recovering";
    pub const RECOVERY_FAILED: &str = "RecoveryFailed";

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
                Growth::Restore => (
                    reason::RESTORING,
                    "creating the first member Machine, its data restored from the snapshot".into(),
                ),
            },
            Step::WriteRestoreSecret => (
                reason::RESTORING,
                "writing the snapshot's download URL for the first member".into(),
            ),
            Step::DeleteRestoreSecret => (
                reason::RESTORING,
                "the restored member is healthy: deleting the snapshot's download URL".into(),
            ),
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
            Step::RenewApiserverClientCertificate { expiry } => (
                reason::RENEWING_CERTIFICATES,
                format!("re-issuing the API server client certificate, which expires {expiry}"),
            ),
            Step::RequestControlPlaneRollout { .. } => (
                reason::RENEWING_CERTIFICATES,
                "asking the KubeadmControlPlane for a rollout so its Machines get the re-issued API server client certificate".into(),
            ),
            Step::MoveLeader { machine, .. } => (
                reason::REMOVING_MEMBER,
                format!("moving etcd leadership away from Machine {machine} before removing its member"),
            ),
            Step::AddLearner {
                machine, peer_url, ..
            } => (
                reason::ADDING_LEARNER,
                format!("adding Machine {machine}'s member as a learner at {peer_url}"),
            ),
            Step::PromoteLearner { machine, .. } => (
                reason::LEARNER_CATCHING_UP,
                format!(
                    "Machine {machine}'s member is a learner catching up; it is promoted to a voter as soon as etcd accepts"
                ),
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
            Step::Recover { record, action } => (reason::RECOVERING, recovery_note(record, action)),
            Step::Steady => (reason::READY, String::new()),
        }
    }

    /// The Event this step leaves once applied: a pure function of the plan's input and output.
    /// Steps that only tidy up (ownership, finalizer, join URLs) and those that write nothing
    /// leave none.
    pub fn event(&self, o: &Observed) -> Option<EventNote> {
        let cluster = match &o.cluster {
            ClusterView::Found { name, .. } => name.as_str(),
            ClusterView::Missing => "",
        };
        let kcp = match &o.kcp {
            KcpView::Found { name, .. } | KcpView::Missing { name } => name.as_str(),
            KcpView::None => "",
        };
        let (reason, note) = match self {
            Step::Wait { .. }
            | Step::Refuse { .. }
            | Step::Paused
            | Step::Steady
            | Step::AddClusterOwnerRef
            | Step::AddFinalizer
            | Step::UpdateInitSecretUrls { .. }
            | Step::RemoveFinalizer => return None,
            Step::PauseKcp => (
                "ControlPlanePaused",
                format!("paused KubeadmControlPlane {kcp} until etcd is ready"),
            ),
            Step::CreateCa => (
                "CACreated",
                format!(
                    "generated the etcd CA in Secret {}",
                    names::ca_secret_name(cluster)
                ),
            ),
            Step::PublishInitSecret { address, .. } => (
                "InitSecretPublished",
                format!(
                    "published Secret {} with the first member's address {address}",
                    names::init_secret_name(cluster)
                ),
            ),
            Step::CreateMachine {
                name,
                resume,
                failure_domain,
                purpose,
            } => {
                let machines = o.active_machines().count() + 1;
                let replicas = o.replicas;
                let mut note = match purpose {
                    Growth::ScaleUp => {
                        format!("created Machine {name} (Machine {machines} for {replicas} replicas)")
                    }
                    Growth::Rollout => format!(
                        "rolling update: created Machine {name} of the current spec ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Replacement => format!(
                        "created Machine {name} to replace the remediated member ({machines} Machines for {replicas} replicas)"
                    ),
                    Growth::Restore => format!(
                        "created Machine {name}, the first member, its data restored from {}",
                        restore_source(o)
                    ),
                };
                if let Some(domain) = failure_domain {
                    note.push_str(&format!(" in failure domain {domain}"));
                }
                if *resume {
                    note.push_str(", finishing an interrupted creation");
                }
                ("MachineCreated", note)
            }
            Step::AdoptMachine { machine } => {
                let orphan = o.machines.iter().any(|m| m.name == *machine && m.orphan);
                let note = if orphan {
                    format!(
                        "adopted Machine {machine}: it carries this EtcdadmCluster's label but had no controller"
                    )
                } else {
                    format!(
                        "restored the pre-terminate hook on Machine {machine}: its deletion must remove its member first"
                    )
                };
                ("MachineAdopted", note)
            }
            Step::DeleteMachine { purpose, message, .. } => {
                let (warning, reason) = match purpose {
                    Removal::ScaleDown => (false, "ScalingDown"),
                    Removal::Rollout => (false, "RollingUpdate"),
                    Removal::Remediation { .. } => (true, "MemberRemediation"),
                    Removal::OrphanMachine => (true, "OrphanMachineDeleted"),
                    Removal::FailedJoin => (true, "MemberJoinFailed"),
                };
                return Some(EventNote {
                    warning,
                    reason,
                    note: message.clone(),
                });
            }
            Step::Recover { record, action } => {
                let reason = match action {
                    RecoveryAction::SnapshotSurvivor { .. } => "RecoverySnapshot",
                    RecoveryAction::DeleteMachines { .. } => "RecoveryReplacingMachines",
                    RecoveryAction::Reset => "RecoveryRestoring",
                    RecoveryAction::Finish => "Recovered",
                    RecoveryAction::Abandon => "RecoveryAbandoned",
                };
                let mut note = recovery_note(record, action);
                if let (RecoveryAction::Finish, Some(restore)) = (action, &o.restore) {
                    let revision = restore
                        .revision
                        .map(|r| format!(" at revision {r}"))
                        .unwrap_or_default();
                    note = format!("{note}: {} members restored{revision}", o.replicas);
                }
                return Some(EventNote {
                    warning: !matches!(action, RecoveryAction::Finish),
                    reason,
                    note,
                });
            }
            Step::WriteRestoreSecret => (
                "RestoreSecretWritten",
                format!(
                    "wrote Secret {} with a download URL of {} for the first member",
                    names::restore_secret_name(&o.name),
                    restore_source(o)
                ),
            ),
            Step::DeleteRestoreSecret => (
                "RestoreSecretDeleted",
                format!(
                    "the restored first member is healthy: deleted Secret {} and the download URL in it",
                    names::restore_secret_name(&o.name)
                ),
            ),
            Step::DeleteLeftovers { names } => (
                "LeftoversDeleted",
                format!("deleted leftovers of interrupted creations: {}", names.join(", ")),
            ),
            Step::WriteKcpEndpoints { endpoints } => (
                "ControlPlaneEndpointsUpdated",
                format!(
                    "wrote etcd endpoints {} into KubeadmControlPlane {kcp}",
                    endpoints.join(",")
                ),
            ),
            Step::CreateKcpSecrets => (
                "ControlPlaneSecretsCreated",
                format!(
                    "created the Secrets the control plane needs, {} and {} (one that existed already is kept as it was)",
                    names::kcp_etcd_ca_secret_name(cluster),
                    names::apiserver_client_secret_name(cluster)
                ),
            ),
            Step::UnpauseKcp => (
                "ControlPlaneUnpaused",
                format!("etcd is ready: un-paused KubeadmControlPlane {kcp}"),
            ),
            Step::RenewApiserverClientCertificate { expiry } => (
                "ApiserverClientCertificateRenewed",
                format!(
                    "re-issued the API server client certificate in Secret {} from the etcd CA (the old one stays valid until {expiry})",
                    names::apiserver_client_secret_name(cluster)
                ),
            ),
            Step::RequestControlPlaneRollout { after } => (
                "ControlPlaneRolloutRequested",
                format!(
                    "asked KubeadmControlPlane {kcp} to replace its Machines created before {after}, so they carry the re-issued API server client certificate"
                ),
            ),
            Step::MoveLeader { to, machine, .. } => (
                "LeadershipMoved",
                format!(
                    "moved etcd leadership to member {} before removing Machine {machine}'s member",
                    member_id_hex(*to)
                ),
            ),
            Step::AddLearner {
                machine, peer_url, ..
            } => (
                "LearnerAdded",
                format!("added Machine {machine}'s member as a learner at {peer_url}"),
            ),
            Step::PromoteLearner {
                member_id, machine, ..
            } => (
                "LearnerPromoted",
                format!(
                    "promoted Machine {machine}'s learner ({}) to a voting member",
                    member_id_hex(*member_id)
                ),
            ),
            Step::RemoveMember {
                member_id,
                member,
                why,
                ..
            } => (
                "MemberRemoved",
                format!("removed the etcd {member} ({}): {why}", member_id_hex(*member_id)),
            ),
            Step::ReleaseHook { machine } => (
                "PreTerminateHookReleased",
                format!("Machine {machine} has no etcd member; released its pre-terminate hook"),
            ),
            Step::ReleaseAndDeleteMachines { names } => (
                "MachinesDeleted",
                format!(
                    "deleting etcd Machines {} (their pre-terminate hooks released)",
                    names.join(", ")
                ),
            ),
        };
        Some(EventNote::normal(reason, note))
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

/// What a recovery step does, for its condition message and its Event.
fn recovery_note(record: &RecoveryRecord, action: &RecoveryAction) -> String {
    let source = record.source.describe();
    let snapshot = &record.snapshot;
    match action {
        RecoveryAction::SnapshotSurvivor { machine } => format!(
            "quorum is lost: taking EtcdadmSnapshot {snapshot} of the member of Machine {machine}{} to recover from",
            record
                .survivor_revision
                .map(|r| format!(" (revision {r})"))
                .unwrap_or_default()
        ),
        RecoveryAction::DeleteMachines { names } => format!(
            "recovering from {source}: deleting the lost cluster's Machines {} without removing their \
             members (the CA and client certificates are kept)",
            names.join(", ")
        ),
        RecoveryAction::Reset => format!(
            "recovering from {source}: the lost cluster's Machines are gone; a first member is restored \
             from EtcdadmSnapshot {snapshot}"
        ),
        RecoveryAction::Finish => {
            format!("recovered from {source} (EtcdadmSnapshot {snapshot}); the recover annotation is removed")
        }
        RecoveryAction::Abandon => format!(
            "the recover annotation was removed before any Machine was deleted: the recovery from {source} \
             is dropped (EtcdadmSnapshot {snapshot} is kept)"
        ),
    }
}

fn restore_source(o: &Observed) -> String {
    o.restore.clone().unwrap_or_default().describe()
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

/// An Event to publish on the EtcdadmCluster: what a step did, or a change of state.
#[derive(Clone, Debug, PartialEq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl EventNote {
    pub fn normal(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: false,
            reason,
            note,
        }
    }

    pub fn warning(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: true,
            reason,
            note,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;

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
        assert_eq!(Step::AddFinalizer.event(&o), None);
        assert_eq!(Step::Steady.event(&o), None);
    }
}
