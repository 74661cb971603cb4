//! Fixtures of the plan's table tests: observations to start from, and a toy world in which
//! planned steps take effect at once, for tests of whole operations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;
use std::time::Duration;

use kube::api::{ApiResource, GroupVersionKind};

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterSpec};
use etcdadm_shared::contract::ClusterRef;
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;

pub use super::decision::Hold;
pub use super::observation::*;
pub use super::plan::alarms::{AlarmStep, DisarmRecord};
pub use super::plan::control_plane::ControlPlaneStep;
pub use super::plan::machines::{Growth, MachineStep, MemberTemplate, Removal};
pub use super::plan::membership::MembershipStep;
pub use super::plan::recovery::{RecoveryAction, RecoveryStep};
pub use super::plan::restore::{ChecksumPlan, RestoreStep};
pub use super::plan::secrets::SecretStep;
pub use super::plan::{Step, plan};
pub use super::rules::quorum;

/// Every condition reason, for tests that name them.
pub mod reason {
    pub use crate::controller::decision::reason::*;
    pub use crate::controller::plan::alarms::reason::*;
    pub use crate::controller::plan::lifecycle::reason::*;
    pub use crate::controller::plan::machines::reason::*;
    pub use crate::controller::plan::membership::reason::*;
    pub use crate::controller::plan::placement::reason::*;
    pub use crate::controller::plan::recovery::reason::*;
    pub use crate::controller::plan::remediation::reason::*;
    pub use crate::controller::plan::restore::reason::*;
    pub use crate::controller::plan::safe_changes::reason::*;
    pub use crate::controller::plan::secrets::reason::*;
    pub use crate::controller::plan::versions::reason::*;
    pub use crate::controller::rules::reason::*;
}

/// The CA of every fixture, generated once.
pub fn test_ca() -> Ca {
    static CA: OnceLock<Ca> = OnceLock::new();
    CA.get_or_init(|| Ca::new(CertificateAuthority::generate("etcd-ca").unwrap()))
        .clone()
}

/// Cluster `c1` in namespace `default`, as the contract objects name it.
pub fn cluster_ref() -> ClusterRef {
    ClusterRef {
        name: "c1".into(),
        namespace: "default".into(),
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: "c1".into(),
            uid: "c1-uid".into(),
            ..Default::default()
        },
    }
}

/// Cluster `c1`, provisioned, over `failure_domains`.
pub fn cluster_found(failure_domains: Vec<String>) -> ClusterView {
    ClusterView::Found {
        reference: cluster_ref(),
        paused: false,
        deleting: false,
        infrastructure_ready: true,
        failure_domains,
        deletes_etcd_last: false,
    }
}

/// The infrastructure machine kind of the fixtures.
pub fn infra_kind() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "SimMachine",
    ))
}

/// What the fixtures' new members are made of (for 3 replicas).
pub fn member_template() -> MemberTemplate {
    MemberTemplate {
        cluster: "c1".into(),
        infra: infra_kind(),
        version: None,
        listed_wait: learner_listed_wait(3, DEADLINE),
        remediation_for: None,
        ca_bundle: None,
    }
}

/// The download of the fixtures' snapshot (`backups/c0/s.db` in a store on localhost).
pub fn download() -> RestoreDownload {
    let store: etcdadm_shared::api::snapshot::S3Store = serde_json::from_value(serde_json::json!({
        "endpoint": "https://127.0.0.1:9000", "bucket": "backups", "forcePathStyle": true,
        "credentialsSecretRef": {"name": "s3"},
    }))
    .unwrap();
    let credentials = etcdadm_shared::store::StoreCredentials::new("id", "secret");
    RestoreDownload {
        store: etcdadm_shared::store::StoreClient::new(&store, credentials, None).unwrap(),
        key: "c0/s.db".into(),
        checksum: Some(snapshot_checksum()),
        size: Some(4128),
        ca_pem: None,
        insecure: false,
    }
}

/// The SHA-256 the fixtures' EtcdadmSnapshot records.
pub fn snapshot_checksum() -> Checksum {
    Checksum {
        sha256: "ab".repeat(32),
        source: etcdadm_shared::api::snapshot::ChecksumSource::EtcdadmSnapshot,
    }
}

/// The step creating the restore Secret with the fixtures' download URL.
pub fn write_restore_secret() -> Step {
    Step::Restore(RestoreStep::WriteRestoreSecret {
        download: Box::new(download()),
        checksum: ChecksumPlan::Known(snapshot_checksum()),
        existing: None,
    })
}

/// `restore` with our restore Secret (UID `restore-uid`, resourceVersion `7`), written `age` ago.
pub fn with_our_secret(restore: &mut RestoreView, age: Duration) {
    restore.secret_age = Some(age);
    restore.secret = Some(RestoreSecretView {
        ours: true,
        uid: "restore-uid".into(),
        resource_version: "7".into(),
        checksum: Some(snapshot_checksum()),
        deltas_unusable: None,
    });
}

/// The step creating Machine `name` as `purpose` in `failure_domain` (`resume`: finishing an
/// interrupted creation), made of the fixtures' template.
pub fn created_machine(name: &str, resume: bool, failure_domain: Option<&str>, purpose: Growth) -> Step {
    Step::Machines(MachineStep::CreateMachine {
        name: name.into(),
        resume,
        failure_domain: failure_domain.map(String::from),
        purpose,
        template: member_template(),
    })
}

pub fn machine(name: &str, address: Option<&str>, domain: Option<&str>) -> MachineView {
    MachineView {
        name: name.into(),
        failure_domain: domain.map(String::from),
        address: address.map(String::from),
        has_hook: true,
        ..Default::default()
    }
}

/// A started, healthy voter on Machine `name` at `address`.
pub fn member(id: u64, name: &str, address: &str) -> MemberView {
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

pub fn unhealthy(mut m: MemberView, why: &str) -> MemberView {
    m.healthy = false;
    m.message = Some(why.into());
    m
}

pub fn kcp(endpoints: &[&str], paused: bool, secrets: bool) -> KcpView {
    KcpView::Found {
        name: "c1-cp".into(),
        local_etcd: false,
        endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
        paused,
        skip_pause: false,
        secrets_present: secrets,
        rollout_complete: true,
        rollout_after: None,
    }
}

/// What was read of `etcd` in `namespace` when nothing around it exists.
pub fn reads_of(etcd: EtcdadmCluster, namespace: &str) -> Reads {
    Reads {
        etcd_cluster: etcd,
        namespace: namespace.into(),
        cluster: ClusterView::Missing,
        ca: CaView::Missing,
        ca_secrets: Default::default(),
        machines: vec![],
        leftovers: vec![],
        init_secret: None,
        kcp: KcpView::None,
        kcp_version: None,
        apiserver_client: None,
        control_plane_machines: 0,
        spec_problem: None,
        member_spec_problem: None,
        missing_infra_template: None,
        infra_machine: None,
        concerns: Default::default(),
    }
}

/// A 3-replica cluster past all housekeeping, nothing created yet.
pub fn base() -> Observation {
    let mut etcd_cluster = EtcdadmCluster::new("c1-etcd", EtcdadmClusterSpec::default());
    etcd_cluster.metadata.namespace = Some("default".into());
    Observation {
        etcd_cluster,
        namespace: "default".into(),
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
        infra_machine: Some(infra_kind()),
        machine_version: None,
        spec_failure_domains: vec![],
        spec_version: None,
        running_versions: vec![],
        cluster: cluster_found(vec![]),
        ca: CaView::Valid(test_ca()),
        certificates: CertificateView::default(),
        machines: vec![],
        leftovers: vec![],
        etcd: EtcdView::NotChecked,
        alarms: vec![],
        alarm_repair: Default::default(),
        init_secret: None,
        initialized: false,
        creation_complete: false,
        kcp: KcpView::None,
        control_plane_machines: 0,
        views: ByType::default(),
        new_member_name: "c1-etcd-fresh".into(),
    }
}

/// `n` healthy members on `n` Machines, initialized, init Secret published.
pub fn running(n: usize) -> Observation {
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
    o.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: healthy_client_urls(&o),
    });
    o
}

/// A step, or a hold alone: what holds the plan back.
pub trait Held: std::fmt::Debug {
    fn held(&self) -> Option<&Hold>;
}

impl Held for Step {
    fn held(&self) -> Option<&Hold> {
        match self {
            Step::Hold(hold) => Some(hold),
            _ => None,
        }
    }
}

impl Held for Hold {
    fn held(&self) -> Option<&Hold> {
        Some(self)
    }
}

/// A hold writes nothing, like the step that holds the plan back.
pub trait Writes {
    fn writes(&self) -> bool;
}

impl Writes for Hold {
    fn writes(&self) -> bool {
        false
    }
}

pub fn wait_reason(step: &impl Held) -> &'static str {
    match step.held() {
        Some(hold) => hold.reason,
        None => panic!("expected a wait, got {step:?}"),
    }
}

pub fn wait_message(step: &impl Held) -> String {
    match step.held() {
        Some(hold) => hold.message.clone(),
        None => panic!("expected a wait, got {step:?}"),
    }
}

pub fn members_mut(o: &mut Observation) -> &mut Vec<MemberView> {
    match &mut o.etcd {
        EtcdView::Members(m) => m,
        _ => panic!("no members"),
    }
}

/// `running(3)` scaling to 5, with a fourth Machine `c1-etcd-m3` at 10.0.0.4, `age` old,
/// whose join is in the state `member` gives (`None`: never added).
pub fn joining(age: Duration, member: Option<MemberView>) -> Observation {
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
pub fn added_not_started() -> MemberView {
    MemberView {
        id: 4,
        peer_urls: vec![names::peer_url("10.0.0.4")],
        machine: Some("c1-etcd-m3".into()),
        ..Default::default()
    }
}

pub fn started_never_healthy() -> MemberView {
    let mut m = unhealthy(member(4, "c1-etcd-m3", "10.0.0.4"), "not yet synced");
    m.ever_healthy = false;
    m
}

pub const DEADLINE: Duration = etcdadm_shared::api::cluster::DEFAULT_UNHEALTHY_AFTER;
pub const JUST_BEFORE: Duration = DEADLINE;
pub const JUST_AFTER: Duration = DEADLINE.saturating_add(Duration::from_secs(1));

pub fn failed_join_of(step: &Step) -> Option<&str> {
    match step {
        Step::Machines(MachineStep::DeleteMachine {
            machine,
            purpose: Removal::FailedJoin,
            ..
        }) => Some(machine),
        _ => None,
    }
}

/// A toy world for whole-operation plan tests: every step takes effect at once, joins are
/// instant and healthy, CAPI lets a Machine go as soon as its hook is released, and the
/// control plane finishes a rollout when waited for. New Machines join as the spec says: as
/// learners, pre-added, started at once, then promoted; or (`voter_joins`) as voters at once.
pub struct World {
    pub o: Observation,
    next: usize,
    next_member: u64,
    pub kcp_writes: Vec<Vec<String>>,
    pub max_members: usize,
    pub max_machines: usize,
    pub removed: Vec<String>,
    pub max_learners: usize,
    /// Most Machines that were not voting members at once (booting, waiting or joining).
    pub max_unjoined: usize,
    /// The bytes of live data each member's database shrinks to once compacted and
    /// defragmented.
    pub live_data: i64,
}

impl World {
    pub fn new(o: Observation) -> World {
        let members = o.members().len();
        let machines = o.machines.len();
        // A world made again from a world's observation goes on numbering after what it holds.
        let next = o
            .machines
            .iter()
            .filter_map(|m| m.name.strip_prefix("c1-etcd-n")?.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        let next_member = o.members().iter().map(|m| m.id).max().unwrap_or(0).max(100);
        World {
            o,
            next,
            next_member,
            kcp_writes: vec![],
            max_members: members,
            max_machines: machines,
            removed: vec![],
            max_learners: 0,
            max_unjoined: 0,
            live_data: 1 << 20,
        }
    }

    pub fn apply(&mut self, step: &Step) {
        match step {
            Step::Machines(MachineStep::CreateMachine { failure_domain, .. }) => {
                self.next += 1;
                let name = format!("c1-etcd-n{}", self.next);
                let address = format!("10.0.1.{}", self.next);
                let learner = self.o.learner_joins();
                let mut new = machine(&name, Some(&address), failure_domain.as_deref());
                new.learner_join = learner;
                self.o.machines.push(new);
                if !learner {
                    self.next_member += 1;
                    let mut m = member(self.next_member, &name, &address);
                    m.is_leader = false;
                    members_mut(&mut self.o).push(m);
                }
            }
            Step::Membership(MembershipStep::AddLearner {
                machine, peer_url, ..
            }) => {
                let joining = self.o.machines.iter_mut().find(|m| &m.name == machine).unwrap();
                joining.join_started.get_or_insert(Duration::ZERO);
                let address = joining.address.clone().unwrap();
                assert_eq!(*peer_url, names::peer_url(&address));
                self.next_member += 1;
                let mut m = member(self.next_member, machine, &address);
                m.is_leader = false;
                m.is_learner = true;
                members_mut(&mut self.o).push(m);
            }
            Step::Membership(MembershipStep::PromoteLearner { member_id, .. }) => {
                let m = members_mut(&mut self.o)
                    .iter_mut()
                    .find(|m| m.id == *member_id)
                    .unwrap();
                assert!(m.is_learner, "promoted a voter");
                m.is_learner = false;
            }
            Step::Machines(MachineStep::DeleteMachine { machine, .. }) => {
                let m = self.o.machines.iter_mut().find(|m| &m.name == machine).unwrap();
                assert!(!m.deleting, "deleted twice: {machine}");
                m.deleting = true;
            }
            Step::Membership(MembershipStep::MoveLeader { to, .. }) => {
                for m in members_mut(&mut self.o) {
                    m.is_leader = m.id == *to;
                }
            }
            Step::Membership(MembershipStep::RemoveMember { member_id, .. }) => {
                let members = members_mut(&mut self.o);
                let gone = members.iter().find(|m| m.id == *member_id).unwrap();
                assert!(!gone.is_leader, "removed the leader without moving it");
                self.removed.push(gone.name.clone());
                members.retain(|m| m.id != *member_id);
            }
            Step::Membership(MembershipStep::ReleaseHook { machine }) => {
                self.o.machines.retain(|m| &m.name != machine)
            }
            Step::ControlPlane(ControlPlaneStep::WriteKcpEndpoints { endpoints, .. }) => {
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
            Step::Hold(hold) if hold.reason == reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT => {
                if let KcpView::Found { rollout_complete, .. } = &mut self.o.kcp {
                    *rollout_complete = true;
                }
            }
            Step::Secrets(SecretStep::UpdateInitSecretUrls { client_urls, .. }) => {
                self.o.init_secret = Some(InitSecret {
                    address: Some("10.0.0.1".into()),
                    client_urls: client_urls.clone(),
                });
            }
            Step::Alarms(AlarmStep::Compact { .. }) => {
                for m in members_mut(&mut self.o) {
                    m.history_compacted = Some(true);
                }
            }
            Step::Alarms(AlarmStep::Defragment {
                member_id, revision, ..
            }) => {
                let live = self.live_data;
                let now = self.o.certificates.now;
                let m = members_mut(&mut self.o)
                    .iter_mut()
                    .find(|m| m.id == *member_id)
                    .unwrap();
                assert_eq!(m.history_compacted, Some(true), "defragmented before compaction");
                m.last_defragmentation = Some(etcdadm_shared::api::cluster::Defragmentation {
                    time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
                    revision: *revision,
                    size_before: m.db_size.unwrap_or(0),
                    size_after: live,
                    disarmed: None,
                });
                m.db_size = Some(live);
                m.defragmented_at = Some(*revision);
            }
            Step::Alarms(AlarmStep::Disarm {
                kind,
                member_ids,
                record,
                ..
            }) => {
                self.o
                    .alarms
                    .retain(|a| !(a.kind == *kind && member_ids.contains(&a.member_id)));
                if let DisarmRecord::SpendDefragmentations(spent) = record {
                    let now = self.o.certificates.now;
                    for m in members_mut(&mut self.o) {
                        if spent.contains(&m.id)
                            && let Some(last) = m.last_defragmentation.as_mut()
                        {
                            last.disarmed = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
                        }
                    }
                }
            }
            other => panic!("unexpected step {other:?}"),
        }
        self.max_members = self.max_members.max(self.o.members().len());
        self.max_machines = self.max_machines.max(self.o.machines.len());
        let learners = self.o.members().iter().filter(|m| m.is_learner).count();
        self.max_learners = self.max_learners.max(learners);
        let unjoined = self
            .o
            .active_machines()
            .filter(|m| {
                !self
                    .o
                    .member_of(&m.name)
                    .is_some_and(|member| member.is_started() && !member.is_learner)
            })
            .count();
        self.max_unjoined = self.max_unjoined.max(unjoined);
    }

    /// Plan and apply until steady; returns the steps taken.
    pub fn run(&mut self) -> Vec<Step> {
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

    pub fn member_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.o.members().iter().map(|m| m.name.clone()).collect();
        names.sort();
        names
    }
}

/// New Machines of `o`'s spec join as voters by themselves (the eks-anywhere flavor): created
/// one at a time, never ahead.
pub fn voter_joins(o: &mut Observation) {
    o.etcd_cluster.spec.etcdadm_config_spec.etcdadm_flavor =
        Some(etcdadm_shared::api::config::EtcdadmFlavor::EksAnywhere);
}

/// `provisioning.parallelMachines` of `o`'s spec.
pub fn parallel_machines(o: &mut Observation, n: i32) {
    o.etcd_cluster.spec.provisioning = Some(etcdadm_shared::api::cluster::Provisioning {
        parallel_machines: Some(n),
    });
}

pub fn zones() -> Vec<String> {
    vec!["a".to_string(), "b".into(), "c".into()]
}

/// `n` healthy members spread over zones a, b, c, optionally with a KCP that uses them.
pub fn zoned(n: usize, with_kcp: bool) -> Observation {
    let mut o = running(n);
    o.cluster = cluster_found(zones());
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

pub fn outdate_all(o: &mut Observation) {
    for m in &mut o.machines {
        m.outdated = Some("etcdadmConfigSpec changed (cloudInitConfig.version)".into());
    }
}

pub fn new_members_only(w: &World) -> bool {
    w.member_names().iter().all(|n| n.starts_with("c1-etcd-n"))
}

pub fn zone_counts(o: &Observation) -> Vec<usize> {
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
