//! Tests of `plan`.

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
