//! The observation built from what was read and what the health check found, at one moment:
//! every Machine against the spec, the stored status and the remediation clock; the views of
//! certificates; each concern's own view; the spec's settings after defaults.

use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use rand::Rng;

use etcdadm_shared::api::MemberStatus;
use etcdadm_shared::etcd::member_id_hex;
use etcdadm_shared::names;
use etcdadm_shared::validation::etcd_version;

use super::Observation;
use super::clock::{REMEDIATION_ANNOTATION, RemediationRecord, UnhealthyClock, remediation_policy};
use super::outdated::{DesiredSpec, MemberSpec, outdate_expiring, outdated_reason};
use super::read::{Concerns, MachineRecord, Reads};
use super::views::{CertificateView, Checked, ClusterView, EtcdView, MachineView};

/// Length of the random suffix of member object names.
const NAME_SUFFIX_LEN: usize = 5;

impl MachineRecord {
    /// The Machine as the plan sees it: against the spec, the stored status and the clock.
    fn view(
        &self,
        desired: &DesiredSpec<'_>,
        stored: &[MemberStatus],
        clock: &UnhealthyClock,
    ) -> MachineView {
        let entry = stored
            .iter()
            .find(|s| s.name == self.read.name && s.machine_ref.is_some());
        let member = MemberSpec {
            config: self.config.as_ref(),
            cloned_from: self.cloned_from.clone(),
            created: self.created.map(|t| t.as_second()),
        };
        MachineView {
            outdated: outdated_reason(&member, desired),
            was_member: entry.is_some_and(|s| s.member_id.is_some() && !s.is_learner),
            unhealthy_for: clock.unhealthy_for(entry),
            age: self.created.map(|t| clock.since(t)).unwrap_or_default(),
            replaces: self.remediation_for.as_ref().map(|r| r.view(clock.now())),
            join_started: self.join_started.map(|t| clock.since(t)),
            ..self.read.clone()
        }
    }
}

impl Reads {
    /// `status.members` as stored.
    pub fn stored_members(&self) -> &[MemberStatus] {
        self.etcd_cluster
            .status
            .as_ref()
            .map(|s| s.members.as_slice())
            .unwrap_or_default()
    }

    /// The remediation clock at `now`, from the stored conditions.
    pub fn clock(&self, now: Timestamp) -> UnhealthyClock {
        let conditions = self
            .etcd_cluster
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        UnhealthyClock::new(conditions, now)
    }

    /// The template new members are cloned from: name and `Kind.group`.
    fn desired_template(&self) -> (String, String) {
        let template = &self.etcd_cluster.spec.infrastructure_template;
        let kind = template.kind.clone().unwrap_or_default();
        let group = self
            .infra_machine
            .as_ref()
            .map(|r| r.group.clone())
            .unwrap_or_default();
        let group_kind = if group.is_empty() {
            kind
        } else {
            format!("{kind}.{group}")
        };
        (template.name.clone().unwrap_or_default(), group_kind)
    }

    /// Every member Machine as the plan sees it, in one pass over what was read.
    pub fn machine_views(&self, clock: &UnhealthyClock) -> Vec<MachineView> {
        let spec = &self.etcd_cluster.spec;
        let desired = DesiredSpec {
            config: &spec.etcdadm_config_spec,
            template: self.desired_template(),
            rollout_after: spec.rollout_after.as_ref().map(|t| t.0.as_second()),
            now: clock.now().as_second(),
        };
        self.machines
            .iter()
            .map(|m| m.view(&desired, self.stored_members(), clock))
            .collect()
    }
}

impl Observation {
    /// The observation at `now`: what `reads` holds, the etcd side from this round's health
    /// check.
    /// `concerns` make each concern's own view.
    pub fn new(reads: &Reads, checked: Checked, now: Timestamp, concerns: &dyn Concerns) -> Observation {
        // One struct literal, every field of the observation from what was read.
        let Checked { view: etcd, alarms } = checked;
        let clock = reads.clock(now);
        let mut machines = reads.machine_views(&clock);
        let e = &reads.etcd_cluster;
        let client = reads.apiserver_client.as_ref();
        let certificates = CertificateView {
            now,
            renew_before: e.spec.certificates_renew_before(),
            ca_expiry: reads
                .ca
                .ca()
                .and_then(|ca| Timestamp::try_from(ca.not_after()).ok()),
            apiserver_client_expiry: client.and_then(|c| c.expiry),
            apiserver_client_renewed: client.and_then(|c| c.renewed),
            apiserver_client_version: client.and_then(|c| c.resource_version.clone()),
        };
        outdate_expiring(&mut machines, &etcd, &certificates);
        let views = concerns.views(reads, &clock);
        for machine in &mut machines {
            if let Some(why) = concerns.outdated(&views, &machine.name) {
                machine.outdated = Some(match machine.outdated.take() {
                    Some(other) => format!("{other}; {why}"),
                    None => why,
                });
            }
        }
        let status = e.status.clone().unwrap_or_default();
        let last_remediation = e
            .annotations()
            .get(REMEDIATION_ANNOTATION)
            .and_then(|text| RemediationRecord::from_annotation(text))
            .map(|r| r.view(clock.now()));
        let has_cluster_owner_ref = match &reads.cluster {
            ClusterView::Found { reference, .. } => {
                e.owner_references().iter().any(|r| r.uid == reference.owner.uid)
            }
            ClusterView::Missing => false,
        };
        Observation {
            etcd_cluster: e.clone(),
            namespace: reads.namespace.clone(),
            name: e.name_any(),
            deleting: e.meta().deletion_timestamp.is_some(),
            has_finalizer: e
                .finalizers()
                .iter()
                .any(|f| f == names::ETCDADM_CLUSTER_FINALIZER),
            has_cluster_owner_ref,
            paused_annotation: e.annotations().contains_key(names::PAUSED_ANNOTATION),
            replicas: e.spec.replicas(),
            max_surge: e.spec.max_surge(),
            remediation: remediation_policy(e),
            last_remediation,
            spec_problem: reads.spec_problem.clone(),
            member_spec_problem: reads.member_spec_problem.clone(),
            missing_infra_template: reads.missing_infra_template.clone(),
            infra_machine: reads.infra_machine.clone(),
            machine_version: e
                .spec
                .machine_version()
                .map(String::from)
                .or_else(|| reads.kcp_version.clone()),
            spec_failure_domains: e.spec.failure_domains.clone(),
            spec_version: etcd_version(&e.spec.etcdadm_config_spec)
                .map(|(field, version)| (format!("spec.etcdadmConfigSpec.{field}"), version.to_string())),
            running_versions: running_versions(&etcd, reads.stored_members()),
            cluster: reads.cluster.clone(),
            ca: reads.ca.clone(),
            certificates,
            machines,
            leftovers: reads.leftovers.clone(),
            etcd,
            alarms,
            alarm_repair: e.spec.alarm_repair(),
            init_secret: reads.init_secret.clone(),
            initialized: status.initialized,
            creation_complete: status.creation_complete,
            kcp: reads.kcp.clone(),
            control_plane_machines: reads.control_plane_machines,
            views,
            new_member_name: member_name(&e.name_any()),
        }
    }
}

/// The etcd versions the started members run: as each answered now, else as last recorded.
fn running_versions(etcd: &EtcdView, stored: &[MemberStatus]) -> Vec<String> {
    let recorded = |id: u64| {
        let id = member_id_hex(id);
        stored
            .iter()
            .find(|s| s.member_id.as_deref() == Some(id.as_str()))
            .and_then(|s| s.etcd_version.clone())
    };
    let mut versions: Vec<String> = match etcd {
        EtcdView::Members(members) => members
            .iter()
            .filter(|m| m.is_started())
            .filter_map(|m| m.etcd_version.clone().or_else(|| recorded(m.id)))
            .collect(),
        EtcdView::NotChecked | EtcdView::Unreachable { .. } => stored
            .iter()
            .filter(|s| s.member_id.is_some())
            .filter_map(|s| s.etcd_version.clone())
            .collect(),
    };
    versions.sort();
    versions.dedup();
    versions
}

/// `<etcdadmcluster>-<5 random lowercase alphanumerics>`: a name for a new member's objects.
fn member_name(etcd: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let suffix: String = (0..NAME_SUFFIX_LEN)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect();
    format!("{etcd}-{suffix}")
}
