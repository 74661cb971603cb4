//! The one observation of an EtcdadmCluster reconcile: its Cluster, Machines, etcd members and
//! control plane as one value, built in one pass from the API reads (`read`) and the health
//! check (`health`), and the questions about it every concern asks (voters, endpoints, which
//! Machine a member runs on). The plan, `apply` and the status all read this and nothing else.

mod assemble;
pub mod ca_secrets;
pub mod clock;
pub mod concerns;
pub mod health;
pub mod memo;
pub mod outdated;
pub mod read;
pub mod restore_source;
pub mod views;

use std::any::Any;
use std::borrow::Cow;
use std::time::Duration;

use kube::api::ApiResource;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::AlarmRepair;
use etcdadm_shared::names;

pub use self::clock::{
    RemediationRecord, UnhealthyClock, join_deadline, learner_listed_wait, remediation_policy,
};
pub use self::concerns::ByType;
pub use self::read::{Concerns, Reads};
pub use self::views::*;

/// Everything the plan reads, and what the steps it chooses act on.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The EtcdadmCluster as read (its status is the one the next status is computed from).
    pub etcd_cluster: EtcdadmCluster,
    pub namespace: String,
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
    /// The infra machine kind cloned from `spec.infrastructureTemplate`, when the spec names one.
    pub infra_machine: Option<ApiResource>,
    /// `Machine.spec.version` of new members: `machineTemplate.version`, else the KCP's.
    pub machine_version: Option<String>,
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
    /// Every alarm raised in the etcd cluster, by member ID (also of members no longer listed).
    pub alarms: Vec<Alarm>,
    /// `spec.maintenance.alarms`, defaulted: whether alarms are repaired here.
    pub alarm_repair: AlarmRepair,
    pub init_secret: Option<InitSecret>,
    /// `status.initialized` as stored.
    pub initialized: bool,
    /// `status.creationComplete` as stored.
    pub creation_complete: bool,
    pub kcp: KcpView,
    /// Control plane Machines of the Cluster (only counted while deleting).
    pub control_plane_machines: usize,
    /// Each concern's own view, by type (`view`).
    pub views: ByType,
    /// The name a member Machine created now gets (`<etcdadmcluster>-<5 random>`, drawn anew
    /// for every observation).
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

impl Observation {
    /// Concern view `V`, as assembled (a default one when there is none).
    pub fn view<V: Any + Clone + Default>(&self) -> Cow<'_, V> {
        self.views
            .get::<V, V>()
            .map_or_else(|| Cow::Owned(V::default()), Cow::Borrowed)
    }

    /// Concern view `V` to change (a default one kept first when there is none).
    pub fn view_mut<V: Any + Clone + Default + Send + Sync>(&mut self) -> Option<&mut V> {
        self.views.get_mut::<V, V>()
    }

    /// `<namespace>/<cluster>`, the key of per-cluster caches.
    pub fn cache_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn active_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.machines.iter().filter(|m| !m.deleting)
    }

    pub fn members(&self) -> &[MemberView] {
        match &self.etcd {
            EtcdView::Members(members) => members,
            _ => &[],
        }
    }

    pub fn member_of(&self, machine: &str) -> Option<&MemberView> {
        self.members()
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine))
    }

    pub fn voters(&self) -> Vec<&MemberView> {
        self.members().iter().filter(|m| !m.is_learner).collect()
    }

    /// Whether new Machines join as learners the controller adds, so they may boot ahead of
    /// their turn (docs/safety.md, "Boot ahead"); voter joins are created one at a time.
    pub fn learner_joins(&self) -> bool {
        self.etcd_cluster.spec.etcdadm_config_spec.learner_joins()
    }

    /// `provisioning.parallelMachines`, when set.
    pub fn parallel_machines(&self) -> Option<usize> {
        self.etcd_cluster.spec.parallel_machines()
    }

    /// A Machine waiting for its turn to join (docs/safety.md, "Boot ahead"): it joins as a
    /// learner into an initialized cluster, its turn has not come, and etcd holds nothing of it
    /// (booting, or booted and waiting to be listed). It is no membership change in flight.
    pub fn awaits_turn(&self, machine: &MachineView) -> bool {
        machine.learner_join
            && !machine.was_member
            && machine.join_started.is_none()
            && self.initialized_now()
            && self.member_of(&machine.name).is_none()
    }

    /// Active Machines waiting for their turn to join, oldest first.
    pub fn waiting_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.active_machines().filter(|m| self.awaits_turn(m))
    }

    /// Active Machines whose join has begun or is done: the ones membership counts.
    pub fn joined_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.active_machines().filter(|m| !self.awaits_turn(m))
    }

    /// Active Machines whose join has begun and is not done: no started voting member yet.
    pub fn joining_machines(&self) -> impl Iterator<Item = &MachineView> {
        self.joined_machines().filter(|m| {
            !m.was_member
                && !self
                    .member_of(&m.name)
                    .is_some_and(|member| member.is_started() && !member.is_learner)
        })
    }

    /// A Machine whose member joined once and is now unhealthy or gone from etcd.
    pub fn is_dead(&self, machine: &MachineView) -> bool {
        match self.member_of(&machine.name) {
            Some(member) => member.is_started() && !member.healthy && member.ever_healthy,
            None => machine.was_member,
        }
    }

    /// Whether alarm `kind` is raised anywhere in the cluster.
    pub fn alarm_raised(&self, kind: AlarmKind) -> bool {
        self.alarms.iter().any(|a| a.kind == kind)
    }

    /// Initialized as stored, or a member passes its health check now.
    pub fn initialized_now(&self) -> bool {
        self.initialized || self.members().iter().any(|m| m.healthy)
    }

    /// Outdated members are replaced one at a time with a new one added first (`maxSurge` 1,
    /// or a single member, which cannot be replaced remove-first).
    pub fn surge(&self) -> bool {
        self.max_surge >= 1 || self.replicas <= 1
    }

    /// A remediation happened and no Machine was created since: the next one replaces it.
    pub fn replacement_pending(&self) -> bool {
        self.last_remediation
            .as_ref()
            .is_some_and(|last| self.active_machines().all(|m| m.age >= last.ago))
    }

    /// The KCP uses this etcd (external etcd, given our endpoints once creation completed):
    /// its name, its endpoints, and whether its own rollout is finished.
    pub fn kcp_in_use(&self) -> Option<(&str, &[String], bool)> {
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

    /// The cluster's revision now: the highest a member reported this round.
    pub fn revision(&self) -> Option<i64> {
        self.members().iter().filter_map(|m| m.revision).max()
    }

    /// The health check's settings: how often, and how long each member may take to answer.
    pub fn health_interval(&self) -> Duration {
        self.etcd_cluster.spec.health_settings().interval
    }
}

/// `ready`: membership == Machines == replicas, and every one a healthy, started voter.
pub fn is_ready(o: &Observation) -> bool {
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
pub fn up_to_date_machines(o: &Observation) -> usize {
    o.active_machines().filter(|m| m.outdated.is_none()).count()
}

/// The client URL a member is reached at: its Machine's address when it runs on one, else what
/// it advertises.
pub fn member_client_url(o: &Observation, member: &MemberView) -> Option<String> {
    let from_machine = member.machine.as_deref().and_then(|name| {
        o.machines
            .iter()
            .find(|machine| machine.name == name)
            .and_then(|machine| machine.address.as_deref())
            .map(names::client_url)
    });
    from_machine.or_else(|| member.client_urls.first().cloned())
}

/// The client URLs of `members`, sorted, each once.
pub fn sorted_urls<'a>(o: &Observation, members: impl Iterator<Item = &'a MemberView>) -> Vec<String> {
    let mut urls: Vec<String> = members.filter_map(|m| member_client_url(o, m)).collect();
    urls.sort();
    urls.dedup();
    urls
}

/// Client URLs of the started voting members, sorted: what KCP and `status.endpoints` list.
pub fn voting_endpoints(o: &Observation) -> Vec<String> {
    sorted_urls(o, o.members().iter().filter(|m| !m.is_learner && m.is_started()))
}

/// Client URLs of the healthy voting members, sorted: where joining members may go.
pub fn healthy_client_urls(o: &Observation) -> Vec<String> {
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
    use super::*;
    use crate::controller::testing::*;
    use etcdadm_shared::names;

    use crate::controller::plan::{Step, plan};

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
