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
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::OnceLock;

    use etcdadm_shared::pki::CertificateAuthority;

    use super::*;

    /// The CA of every fixture, generated once.
    fn test_ca() -> Ca {
        static CA: OnceLock<Ca> = OnceLock::new();
        CA.get_or_init(|| Ca::new(CertificateAuthority::generate("etcd-ca").unwrap()))
            .clone()
    }

    fn cluster_ref() -> ClusterRef {
        ClusterRef {
            name: "c1".into(),
            namespace: "ns".into(),
            owner: Default::default(),
        }
    }

    fn render(machine: &str) -> Render {
        Render {
            machine: machine.into(),
            cluster: "c1".into(),
            ca: test_ca(),
        }
    }

    fn render_init() -> Step {
        Step::RenderInit {
            render: render("m1"),
            restore: None,
        }
    }

    fn acquire(machine: &str) -> Step {
        Step::AcquireLock {
            cluster: cluster_ref(),
            machine: machine.into(),
        }
    }

    fn machine(name: &str) -> MachineView {
        MachineView {
            name: name.into(),
            cluster_name: Some("c1".into()),
            etcd_cluster: None,
            address: None,
            deleting: false,
        }
    }

    fn base() -> Observation {
        Observation {
            namespace: "ns".into(),
            paused_annotation: false,
            machine: Some(machine("m1")),
            cluster: ClusterView::Found {
                reference: cluster_ref(),
                paused: false,
                managed_etcd_initialized: false,
            },
            etcd_cluster: None,
            data_secret: DataSecretView::Missing,
            init_client_urls: None,
            lock: LockView::Free,
            ca: CaView::Missing,
            spec_problem: None,
            learner_join: None,
            secrets: ResolvedSecrets::default(),
            restore: None,
            lock_resource_version: None,
        }
    }

    fn held(holder: &str, exists: bool) -> LockView {
        LockView::Held {
            holder: holder.into(),
            holder_exists: exists,
        }
    }

    #[test]
    fn waits_for_owner_machine_then_cluster() {
        let mut o = base();
        o.machine = None;
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_MACHINE,
                ..
            }
        ));
        o.machine = Some(MachineView {
            cluster_name: None,
            ..machine("m1")
        });
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_CLUSTER,
                ..
            }
        ));
        o.machine = Some(machine("m1"));
        o.cluster = ClusterView::Missing;
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_CLUSTER,
                ..
            }
        ));
    }

    #[test]
    fn paused_by_cluster_or_annotation_does_nothing() {
        let mut o = base();
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: true,
            managed_etcd_initialized: false,
        };
        assert_eq!(plan(&o), Step::Paused);
        let mut o = base();
        o.paused_annotation = true;
        assert_eq!(plan(&o), Step::Paused);
    }

    #[test]
    fn a_machine_being_deleted_gets_no_data_but_keeps_what_it_has() {
        let mut o = base();
        o.machine = Some(MachineView {
            deleting: true,
            ..machine("m1")
        });
        o.lock = held("m1", true);
        o.ca = CaView::Valid(test_ca());
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::MACHINE_DELETING,
                ..
            }
        ));
        o.data_secret = DataSecretView::Ours;
        assert_eq!(plan(&o), Step::Done);
    }

    #[test]
    fn init_takes_lock_then_creates_ca_then_renders() {
        let mut o = base();
        assert_eq!(plan(&o), acquire("m1"));
        o.lock = held("m1", true);
        assert_eq!(
            plan(&o),
            Step::CreateCa {
                cluster: cluster_ref()
            }
        );
        o.ca = CaView::Valid(test_ca());
        assert_eq!(plan(&o), render_init());
        o.data_secret = DataSecretView::Ours;
        assert_eq!(plan(&o), Step::Done);
    }

    #[test]
    fn second_config_waits_for_the_lock_holder_and_releases_a_stale_lock() {
        let mut o = base();
        o.machine = Some(machine("m2"));
        o.lock = held("m1", true);
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_INIT_LOCK,
                ..
            }
        ));
        o.lock = held("m1", false);
        assert_eq!(
            plan(&o),
            Step::ReleaseStaleLock {
                holder: "m1".into(),
                cluster: "c1".into(),
                resource_version: None,
            }
        );
        o.lock = LockView::Unreadable;
        assert!(matches!(plan(&o), Step::ReleaseStaleLock { .. }));
    }

    #[test]
    fn standalone_join_uses_init_secret_and_needs_existing_ca() {
        let mut o = base();
        o.machine = Some(machine("m2"));
        o.lock = held("m1", true);
        o.init_client_urls = Some(vec!["https://10.0.0.1:2379".into()]);
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_CA,
                ..
            }
        ));
        o.ca = CaView::Valid(test_ca());
        assert_eq!(
            plan(&o),
            Step::RenderJoin {
                urls: vec!["https://10.0.0.1:2379".into()],
                learner: None,
                render: render("m2"),
            }
        );
    }

    #[test]
    fn managed_join_prefers_healthy_members_and_waits_without_one() {
        let mut o = base();
        o.machine = Some(MachineView {
            etcd_cluster: Some("c1-etcd".into()),
            ..machine("m2")
        });
        o.ca = CaView::Valid(test_ca());
        o.etcd_cluster = Some(EtcdClusterView {
            initialized: false,
            ..Default::default()
        });
        // Not initialized: competes for init even though an EtcdadmCluster owns it.
        assert_eq!(plan(&o), acquire("m2"));
        o.etcd_cluster = Some(EtcdClusterView {
            initialized: true,
            healthy_client_urls: vec!["https://10.0.0.2:2379".into()],
            reports_members: true,
        });
        o.init_client_urls = Some(vec!["https://10.0.0.1:2379".into()]);
        assert_eq!(
            plan(&o),
            Step::RenderJoin {
                urls: vec!["https://10.0.0.2:2379".into()],
                learner: None,
                render: render("m2"),
            }
        );
        o.etcd_cluster = Some(EtcdClusterView {
            initialized: true,
            healthy_client_urls: vec![],
            reports_members: true,
        });
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_HEALTHY_MEMBER,
                ..
            }
        ));
        // Initialized but no member list yet: the init Secret is the source.
        o.etcd_cluster = Some(EtcdClusterView {
            initialized: true,
            ..Default::default()
        });
        assert_eq!(
            plan(&o),
            Step::RenderJoin {
                urls: vec!["https://10.0.0.1:2379".into()],
                learner: None,
                render: render("m2"),
            }
        );
        o.init_client_urls = None;
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_INIT_SECRET,
                ..
            }
        ));
    }

    #[test]
    fn a_join_the_etcdadm_cluster_controller_marked_is_a_learner_join_and_init_never_is() {
        let mut o = base();
        o.machine = Some(MachineView {
            etcd_cluster: Some("c1-etcd".into()),
            ..machine("m2")
        });
        o.ca = CaView::Valid(test_ca());
        o.learner_join = Some(LearnerJoin::default());
        o.etcd_cluster = Some(EtcdClusterView {
            initialized: true,
            healthy_client_urls: vec!["https://10.0.0.2:2379".into()],
            reports_members: true,
        });
        assert_eq!(
            plan(&o),
            Step::RenderJoin {
                urls: vec!["https://10.0.0.2:2379".into()],
                learner: Some(LearnerJoin::default()),
                render: render("m2"),
            }
        );
        // The first member founds the cluster: there is nothing to add it to.
        o.etcd_cluster = Some(EtcdClusterView::default());
        o.lock = held("m2", true);
        assert_eq!(
            plan(&o),
            Step::RenderInit {
                render: render("m2"),
                restore: None
            }
        );
    }

    #[test]
    fn fork_condition_counts_as_initialized() {
        let mut o = base();
        o.machine = Some(MachineView {
            etcd_cluster: Some("c1-etcd".into()),
            ..machine("m2")
        });
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            managed_etcd_initialized: true,
        };
        o.etcd_cluster = Some(EtcdClusterView::default());
        o.ca = CaView::Valid(test_ca());
        assert!(matches!(
            plan(&o),
            Step::Wait {
                reason: reason::WAITING_FOR_INIT_SECRET,
                ..
            }
        ));
    }

    #[test]
    fn corrupt_ca_and_bad_spec_fail_without_rendering() {
        let mut o = base();
        o.lock = held("m1", true);
        o.ca = CaView::Corrupt("Secret ns/c1-managed-etcd: tls.key is not RSA".into());
        assert!(matches!(
            plan(&o),
            Step::Refuse {
                reason: reason::CA_CORRUPT,
                ..
            }
        ));
        let mut o = base();
        o.spec_problem = Some("spec.files[0].contentFrom: Secret x has no key y".into());
        assert!(matches!(
            plan(&o),
            Step::Refuse {
                reason: reason::INVALID_SPEC,
                ..
            }
        ));
    }

    #[test]
    fn foreign_data_secret_is_never_taken_over() {
        let mut o = base();
        o.data_secret = DataSecretView::Foreign("EtcdadmConfig other".into());
        assert!(matches!(
            plan(&o),
            Step::Refuse {
                reason: reason::DATA_SECRET_CONFLICT,
                ..
            }
        ));
    }

    #[test]
    fn init_address_published_only_by_rendered_standalone_lock_holder_with_address() {
        let mut o = base();
        o.lock = held("m1", true);
        o.data_secret = DataSecretView::Ours;
        assert_eq!(init_address_to_publish(&o), None, "no address yet");
        o.machine = Some(MachineView {
            address: Some("10.0.0.1".into()),
            ..machine("m1")
        });
        assert_eq!(init_address_to_publish(&o), Some("10.0.0.1".into()));
        o.init_client_urls = Some(vec![]);
        assert_eq!(init_address_to_publish(&o), None, "already published");
        o.init_client_urls = None;
        o.machine = Some(MachineView {
            address: Some("10.0.0.1".into()),
            etcd_cluster: Some("e".into()),
            ..machine("m1")
        });
        assert_eq!(
            init_address_to_publish(&o),
            None,
            "the EtcdadmCluster controller publishes"
        );
    }

    #[test]
    fn the_plan_publishes_the_init_address_once_rendered_but_never_while_paused() {
        let mut o = base();
        o.lock = held("m1", true);
        o.data_secret = DataSecretView::Ours;
        o.machine = Some(MachineView {
            address: Some("10.0.0.1".into()),
            ..machine("m1")
        });
        let publish = plan(&o);
        assert_eq!(
            publish,
            Step::PublishInitAddress {
                address: "10.0.0.1".into(),
                cluster: cluster_ref(),
            }
        );
        let (reason, note) = publish.event(&o).unwrap();
        assert_eq!(reason, "InitAddressPublished");
        assert!(
            note.contains("c1-etcd-init") && note.contains("10.0.0.1"),
            "{note}"
        );
        o.init_client_urls = Some(vec!["https://10.0.0.1:2379".into()]);
        assert_eq!(plan(&o), Step::Done);
        o.init_client_urls = None;
        o.paused_annotation = true;
        assert_eq!(plan(&o), Step::Paused);
    }
}
