//! What the plan reads: the EtcdadmCluster, its Cluster, Machines, etcd members and control
//! plane as one value, and the questions about it every concern asks (voters, endpoints, which
//! Machine a member runs on).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::certificates::CertificateView;
pub use etcdadm_shared::contract::ca::CaView;
pub use etcdadm_shared::contract::init_secret::InitSecret;
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
    /// Status recorded an etcd member for it, a voter (a learner has not joined yet): it joined
    /// once.
    pub was_member: bool,
    /// How long it has been without a healthy member, by the remediation clock (time while
    /// the cluster had no quorum does not count).
    pub unhealthy_for: Duration,
    /// Time since the Machine was created.
    pub age: Duration,
    /// The remediation this Machine was created to replace (its `remediation-for` record).
    pub replaces: Option<LastRemediation>,
    /// Its EtcdadmConfig asks for a learner join (`EtcdadmConfig::joins_as_learner`): unless it
    /// is the first member, its member is pre-added as a learner and promoted by us.
    pub learner_join: bool,
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
    /// `notAfter` of the server certificate it presented in this round's handshake.
    pub certificate_expiry: Option<Timestamp>,
    /// The revision of its own store, when it answered Status this round (no quorum needed).
    pub revision: Option<i64>,
}

impl MemberView {
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    pub(super) fn is_joining(&self) -> bool {
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
        /// `spec.rollout.after`: Machines created before it are replaced.
        rollout_after: Option<Timestamp>,
    },
}

/// Remediation settings after defaults and the reference annotation (see
/// [`remediation_policy`](super::remediation::remediation_policy)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemediationPolicy {
    pub enabled: bool,
    pub unhealthy_after: Duration,
    /// How long a new Machine may take to become a healthy member before it is replaced (see
    /// [`join_deadline`](super::growth::join_deadline)).
    pub join_deadline: Duration,
}

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

/// `spec.restore`: the snapshot the first member's data comes from, as far as the plan needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreView {
    /// The EtcdadmSnapshot named by `spec.restore.snapshot.name`.
    pub snapshot: Option<String>,
    /// `<bucket>/<key>` of the object, when known.
    pub location: Option<String>,
    /// The revision the snapshot holds, when an EtcdadmSnapshot says.
    pub revision: Option<i64>,
    /// etcd version of the member it was taken from, when an EtcdadmSnapshot says.
    pub etcd_version: Option<String>,
    /// Why it cannot be restored from (missing, not Succeeded, no store, store unusable).
    pub problem: Option<String>,
    /// Age of the restore Secret holding its download URL, when it exists.
    pub secret_age: Option<Duration>,
    /// `status.restoredFrom` is recorded: the restore is done.
    pub recorded: bool,
}

impl RestoreView {
    /// `EtcdadmSnapshot <name> (<bucket>/<key>)`, or the object alone.
    pub fn describe(&self) -> String {
        let location = self.location.as_deref().unwrap_or("an unknown location");
        match &self.snapshot {
            Some(name) => format!("EtcdadmSnapshot {name} ({location})"),
            None => location.to_string(),
        }
    }
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
    /// What new members run and the field that says it (`cloudInitConfig.version`, or the tag of
    /// `bottlerocketConfig.etcdImage`).
    pub spec_version: Option<(String, String)>,
    /// The etcd versions the started members run: as each answered this round, else as
    /// `status.members` last recorded; sorted, each once.
    pub running_versions: Vec<String>,
    pub cluster: ClusterView,
    pub ca: CaView,
    /// The certificates' expiry and the renewal window.
    pub certificates: CertificateView,
    /// Member Machines, oldest first.
    pub machines: Vec<MachineView>,
    /// Infra machines or EtcdadmConfigs of ours that have no Machine (an interrupted creation),
    /// oldest first.
    pub leftovers: Vec<String>,
    pub etcd: EtcdView,
    pub init_secret: Option<InitSecret>,
    /// `status.initialized` as stored.
    pub initialized: bool,
    /// `status.creationComplete` as stored.
    pub creation_complete: bool,
    pub kcp: KcpView,
    /// Control plane Machines of the Cluster (only counted while deleting).
    pub control_plane_machines: usize,
    /// `spec.restore`, when set.
    pub restore: Option<RestoreView>,
    /// The `recover` annotation's request, or the recovery under way.
    pub recovery: Option<super::recovery::RecoveryView>,
    /// The name a member Machine created now gets (`<etcdadmcluster>-<5 random>`, drawn anew
    /// for every plan).
    pub new_member_name: String,
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

impl Observed {
    pub(super) fn active_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.machines.iter().filter(|m| !m.deleting)
    }

    pub(super) fn members(&self) -> &[MemberView] {
        match &self.etcd {
            EtcdView::Members(members) => members,
            _ => &[],
        }
    }

    pub(super) fn member_of(&self, machine: &str) -> Option<&MemberView> {
        self.members()
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine))
    }

    pub(super) fn voters(&self) -> Vec<&MemberView> {
        self.members().iter().filter(|m| !m.is_learner).collect()
    }

    /// A Machine whose member joined once and is now unhealthy or gone from etcd.
    pub(super) fn is_dead(&self, machine: &MachineView) -> bool {
        match self.member_of(&machine.name) {
            Some(member) => member.is_started() && !member.healthy && member.ever_healthy,
            None => machine.was_member,
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

/// Active Machines matching the spec (`status.updatedReplicas`).
pub fn up_to_date_machines(o: &Observed) -> usize {
    o.active_machines().filter(|m| m.outdated.is_none()).count()
}

/// The client URL a member is reached at: its Machine's address when it runs on one, else what
/// it advertises.
pub(super) fn member_client_url(o: &Observed, member: &MemberView) -> Option<String> {
    let from_machine = member.machine.as_deref().and_then(|name| {
        o.machines
            .iter()
            .find(|machine| machine.name == name)
            .and_then(|machine| machine.address.as_deref())
            .map(names::client_url)
    });
    from_machine.or_else(|| member.client_urls.first().cloned())
}

pub(super) fn sorted_urls<'a>(o: &Observed, members: impl Iterator<Item = &'a MemberView>) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use etcdadm_shared::names;

    use super::super::testing::*;
    use super::super::*;
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
}
