//! The next step for one EtcdadmConfig, as a pure function of what was observed, and the Event
//! each step leaves once applied.
//!
//! The bootstrap steps of docs/bootstrap.md, "What the provider does"; everything that talks to
//! the API lives in `observe` and `apply`, so the rules here are tested without one. A step
//! carries what applying it needs.

use etcdadm_shared::contract::ClusterRef;
use etcdadm_shared::names;

pub use etcdadm_shared::contract::ca::{Ca, CaView};

use crate::render::{LearnerJoin, ResolvedSecrets, SnapshotDownload};

/// The owner Machine as far as the decision needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineView {
    pub name: String,
    /// `cluster.x-k8s.io/cluster-name` label.
    pub cluster_name: Option<String>,
    /// Name of the EtcdadmCluster that controls the Machine, if any (else: standalone).
    pub etcd_cluster: Option<String>,
    /// Address chosen by `Machine::etcd_address`.
    pub address: Option<String>,
    /// The Machine has a deletion timestamp.
    pub deleting: bool,
}

/// The Cluster from the Machine's label.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterView {
    Missing,
    Found {
        /// Name, namespace and owner reference: what the contract objects are made with.
        reference: ClusterRef,
        paused: bool,
        managed_etcd_initialized: bool,
    },
}

/// The EtcdadmCluster controlling the Machine.
#[derive(Clone, Debug, Default, PartialEq, Hash)]
pub struct EtcdClusterView {
    pub initialized: bool,
    /// Client URLs of members the EtcdadmCluster last saw healthy and voting, in status order.
    pub healthy_client_urls: Vec<String>,
    /// Whether the EtcdadmCluster reports any members at all.
    pub reports_members: bool,
}

/// The init lock ConfigMap `<cluster>-etcd-lock`.
#[derive(Clone, Debug, PartialEq)]
pub enum LockView {
    Free,
    /// Held by `holder` (a Machine name); `holder_exists` says whether that Machine is still there.
    Held {
        holder: String,
        holder_exists: bool,
    },
    /// Present but unreadable: treated as held by nobody known, so it is released.
    Unreadable,
}

/// The data Secret named after the config.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSecretView {
    Missing,
    /// Ours (controller ownerRef is this config).
    Ours,
    /// Exists but is controlled by something else: never taken over. Holds the message to show.
    Foreign(String),
}

/// Everything one reconcile read, as the decision and the steps it chooses need it.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub namespace: String,
    pub paused_annotation: bool,
    pub machine: Option<MachineView>,
    pub cluster: ClusterView,
    pub etcd_cluster: Option<EtcdClusterView>,
    pub data_secret: DataSecretView,
    /// Client URLs from `<cluster>-etcd-init`, if that Secret exists.
    pub init_client_urls: Option<Vec<String>>,
    pub lock: LockView,
    pub ca: CaView,
    /// A spec problem the controller found (e.g. unresolved secret reference), with field path.
    pub spec_problem: Option<String>,
    /// `EtcdadmConfig::joins_as_learner`: a join waits for the learner the EtcdadmCluster
    /// controller adds, as long as the controller wrote on the config.
    pub learner_join: Option<LearnerJoin>,
    /// Every Secret value the spec refers to, fetched.
    pub secrets: ResolvedSecrets,
    /// The snapshot an init restores, from the Secret the EtcdadmCluster controller named.
    pub restore: Option<SnapshotDownload>,
    /// resourceVersion of the lock ConfigMap, for a guarded release.
    pub lock_resource_version: Option<String>,
}

/// What rendering a Machine's user data needs besides the config and the observation.
#[derive(Clone, Debug, PartialEq)]
pub struct Render {
    pub machine: String,
    pub cluster: String,
    pub ca: Ca,
}

/// The one next thing to do. Waits and refusals carry the condition reason and message to show.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Wait {
        reason: &'static str,
        message: String,
    },
    Paused,
    /// The data Secret exists and nothing else is due: only status may need work.
    Done,
    /// Take Cluster `cluster`'s init lock for Machine `machine`.
    AcquireLock {
        cluster: ClusterRef,
        machine: String,
    },
    /// The lock's holder Machine is gone: delete the lock (the version read) so someone can
    /// take it.
    ReleaseStaleLock {
        holder: String,
        cluster: String,
        resource_version: Option<String>,
    },
    /// Generate and create the CA (none exists), then render init on the next pass.
    CreateCa {
        cluster: ClusterRef,
    },
    RenderInit {
        render: Render,
        restore: Option<SnapshotDownload>,
    },
    RenderJoin {
        urls: Vec<String>,
        learner: Option<LearnerJoin>,
        render: Render,
    },
    /// Standalone only: publish `<cluster>-etcd-init` with the first member's address, which
    /// the Machine gets after its data was rendered.
    PublishInitAddress {
        address: String,
        cluster: ClusterRef,
    },
    /// Something a human must fix; no Secret is written.
    Refuse {
        reason: &'static str,
        message: String,
    },
}

impl Step {
    /// The Event this step leaves once applied, as reason and note: a pure function of the
    /// plan's input and output. Waits, refusals (reported by their condition) and `Done` leave
    /// none.
    pub fn event(&self, o: &Observation) -> Option<(&'static str, String)> {
        let machine = o.machine.as_ref().map(|m| m.name.as_str()).unwrap_or_default();
        let cluster = o
            .machine
            .as_ref()
            .and_then(|m| m.cluster_name.as_deref())
            .unwrap_or_default();
        match self {
            Step::Wait { .. } | Step::Paused | Step::Done | Step::Refuse { .. } => None,
            Step::AcquireLock { .. } => Some((
                "InitLockAcquired",
                format!(
                    "Machine {machine} took the init lock {}",
                    names::init_lock_name(cluster)
                ),
            )),
            Step::ReleaseStaleLock { holder, .. } => Some((
                "InitLockReleased",
                format!("released the init lock held by Machine {holder}, which no longer exists"),
            )),
            Step::CreateCa { .. } => Some((
                "CACreated",
                format!(
                    "generated the etcd CA in Secret {}",
                    names::ca_secret_name(cluster)
                ),
            )),
            Step::RenderInit { .. } => Some((
                reason::DATA_SECRET_CREATED,
                format!("rendered etcdadm init user data for Machine {machine}"),
            )),
            Step::RenderJoin { urls, learner, .. } => Some((
                reason::DATA_SECRET_CREATED,
                format!(
                    "rendered etcdadm join {} user data for Machine {machine}{}",
                    urls.first().map(String::as_str).unwrap_or_default(),
                    match learner {
                        Some(learner) => format!(
                            ", which waits up to {} s for the EtcdadmCluster controller to add it as \
                             a learner, then to promote it",
                            learner.listed_wait_seconds
                        ),
                        None => String::new(),
                    }
                ),
            )),
            Step::PublishInitAddress { address, .. } => Some((
                "InitAddressPublished",
                format!(
                    "published {} with the first member's address {address}",
                    names::init_secret_name(cluster)
                ),
            )),
        }
    }
}

/// Reasons used on the `Ready`/`DataSecretAvailable` conditions.
pub mod reason {
    pub const WAITING_FOR_MACHINE: &str = "WaitingForMachineOwner";
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_INIT_LOCK: &str = "WaitingForInitLock";
    pub const WAITING_FOR_INIT_SECRET: &str = "WaitingForEtcdInitSecret";
    pub const WAITING_FOR_CA: &str = "WaitingForEtcdCA";
    pub const WAITING_FOR_HEALTHY_MEMBER: &str = "WaitingForHealthyMember";
    pub const CA_CORRUPT: &str = "EtcdCACorrupt";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const DATA_SECRET_CONFLICT: &str = "DataSecretConflict";
    pub const PAUSED: &str = "Paused";
    pub const DATA_SECRET_CREATED: &str = "DataSecretCreated";
    pub const MACHINE_DELETING: &str = "MachineDeleting";
}

impl Observation {
    /// Whether the etcd cluster this config joins is initialized (step 4).
    fn initialized(&self) -> bool {
        match (&self.etcd_cluster, &self.cluster) {
            (
                Some(etcd),
                ClusterView::Found {
                    managed_etcd_initialized,
                    ..
                },
            ) => etcd.initialized || *managed_etcd_initialized,
            (Some(etcd), ClusterView::Missing) => etcd.initialized,
            (None, _) => self.init_client_urls.is_some(),
        }
    }
}

/// The one next thing to do for this config.
pub fn plan(observed: &Observation) -> Step {
    let Some(machine) = &observed.machine else {
        return Step::Wait {
            reason: reason::WAITING_FOR_MACHINE,
            message: "waiting for a Machine to reference this EtcdadmConfig and become its owner".into(),
        };
    };
    let Some(cluster_name) = &machine.cluster_name else {
        return Step::Wait {
            reason: reason::WAITING_FOR_CLUSTER,
            message: format!(
                "Machine {} has no cluster.x-k8s.io/cluster-name label",
                machine.name
            ),
        };
    };
    let ClusterView::Found {
        reference, paused, ..
    } = &observed.cluster
    else {
        return Step::Wait {
            reason: reason::WAITING_FOR_CLUSTER,
            message: format!("Cluster {cluster_name} not found"),
        };
    };
    if *paused || observed.paused_annotation {
        return Step::Paused;
    }
    match &observed.data_secret {
        DataSecretView::Ours => {
            return init_address_to_publish(observed).map_or(Step::Done, |address| {
                Step::PublishInitAddress {
                    address,
                    cluster: reference.clone(),
                }
            });
        }
        DataSecretView::Foreign(problem) => {
            return Step::Refuse {
                reason: reason::DATA_SECRET_CONFLICT,
                message: problem.clone(),
            };
        }
        DataSecretView::Missing => {}
    }
    // Nothing will boot it; and its config may already be gone with its Secret (CAPI deletes
    // both with the Machine), so a Secret written now would belong to nobody.
    if machine.deleting {
        return Step::Wait {
            reason: reason::MACHINE_DELETING,
            message: format!(
                "Machine {} is being deleted; no bootstrap data is rendered for it",
                machine.name
            ),
        };
    }
    if let Some(problem) = &observed.spec_problem {
        return Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: problem.clone(),
        };
    }
    if let CaView::Corrupt(problem) = &observed.ca {
        return Step::Refuse {
            reason: reason::CA_CORRUPT,
            message: problem.clone(),
        };
    }
    if observed.initialized() {
        plan_join(observed, machine, cluster_name)
    } else {
        plan_init(observed, machine, reference)
    }
}

fn plan_init(observed: &Observation, machine: &MachineView, cluster: &ClusterRef) -> Step {
    let release = |holder: &str| Step::ReleaseStaleLock {
        holder: holder.to_string(),
        cluster: cluster.name.clone(),
        resource_version: observed.lock_resource_version.clone(),
    };
    match &observed.lock {
        LockView::Free => Step::AcquireLock {
            cluster: cluster.clone(),
            machine: machine.name.clone(),
        },
        LockView::Unreadable => release("<unreadable>"),
        LockView::Held { holder, .. } if holder == &machine.name => match &observed.ca {
            CaView::Missing => Step::CreateCa {
                cluster: cluster.clone(),
            },
            CaView::Valid(ca) => Step::RenderInit {
                render: Render {
                    machine: machine.name.clone(),
                    cluster: cluster.name.clone(),
                    ca: ca.clone(),
                },
                restore: observed.restore.clone(),
            },
            CaView::Corrupt(problem) => Step::Refuse {
                reason: reason::CA_CORRUPT,
                message: problem.clone(),
            },
        },
        LockView::Held {
            holder,
            holder_exists: false,
        } => release(holder),
        LockView::Held {
            holder,
            holder_exists: true,
        } => Step::Wait {
            reason: reason::WAITING_FOR_INIT_LOCK,
            message: format!(
                "Machine {holder} holds the init lock and is initializing etcd; this member will join"
            ),
        },
    }
}

fn plan_join(observed: &Observation, machine: &MachineView, cluster_name: &str) -> Step {
    let init_urls = observed.init_client_urls.clone().unwrap_or_default();
    let urls = match &observed.etcd_cluster {
        Some(etcd) if !etcd.healthy_client_urls.is_empty() => etcd.healthy_client_urls.clone(),
        Some(etcd) if etcd.reports_members => {
            return Step::Wait {
                reason: reason::WAITING_FOR_HEALTHY_MEMBER,
                message: "no etcd member is currently reported healthy to join through".into(),
            };
        }
        _ => init_urls,
    };
    if urls.is_empty() {
        return Step::Wait {
            reason: reason::WAITING_FOR_INIT_SECRET,
            message: format!(
                "waiting for Secret {} with the client URL of the first member",
                names::init_secret_name(cluster_name)
            ),
        };
    }
    match &observed.ca {
        CaView::Valid(ca) => Step::RenderJoin {
            urls,
            learner: observed.learner_join,
            render: Render {
                machine: machine.name.clone(),
                cluster: cluster_name.to_string(),
                ca: ca.clone(),
            },
        },
        // A join never generates a CA: the members already running trust only theirs.
        _ => Step::Wait {
            reason: reason::WAITING_FOR_CA,
            message: format!(
                "waiting for the etcd CA Secret {}; a joining member never creates one",
                names::ca_secret_name(cluster_name)
            ),
        },
    }
}

/// Standalone only: the address to publish in `<cluster>-etcd-init`, if it is time.
fn init_address_to_publish(observed: &Observation) -> Option<String> {
    let machine = observed.machine.as_ref()?;
    if machine.etcd_cluster.is_some() || observed.init_client_urls.is_some() {
        return None;
    }
    let holds_lock = matches!(&observed.lock, LockView::Held { holder, .. } if holder == &machine.name);
    let rendered = matches!(observed.data_secret, DataSecretView::Ours);
    if holds_lock && rendered {
        machine.address.clone()
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
