//! Remediation: a member dead for longer than `unhealthyAfter` is replaced, one at a time, under
//! rule 3, with backoff after a failed replacement. Here too: the clock that says how long a
//! member has been unhealthy, the policy (spec settings and the reference's retries
//! annotation) and the record a remediation leaves behind.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::conditions::{self, ConditionStatus};
use etcdadm_shared::api::{EtcdadmCluster, MemberStatus};
use etcdadm_shared::duration;
use etcdadm_shared::names;

use super::gates::removal_refusal;
use super::growth::join_deadline;
use super::observed::{LastRemediation, Observed, RemediationPolicy, member_client_url};
use super::step::{Removal, Step, reason};

/// On the EtcdadmCluster: the last remediation, JSON `{"machine", "timestamp", "retryCount"}`
/// (as KCP records its own), read for the backoff after a failed replacement.
pub const REMEDIATION_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/remediation";
/// On the Machine created to replace a remediated one: a copy of that remediation's record.
pub const REMEDIATION_FOR_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/remediation-for";
/// Condition whose last transition to True marks when the cluster last (re)gained quorum.
pub const ENDPOINTS_AVAILABLE: &str = "EndpointsAvailable";

/// A replacement that fails within this time of its creation is a failed replacement (the next
/// remediation backs off), as KCP's `minHealthyPeriod` default.
pub const MIN_HEALTHY_PERIOD: Duration = Duration::from_secs(3600);

/// 4), Machines whose member left etcd deleted: each once unhealthy for `unhealthyAfter`, one
/// at a time, under rule 3, with backoff after a failed replacement.
pub(super) fn replace_overdue(o: &Observed) -> Option<Step> {
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

impl Observed {
    /// A remediation happened and no Machine was created since: the next one replaces it.
    pub(super) fn replacement_pending(&self) -> bool {
        self.last_remediation
            .as_ref()
            .is_some_and(|last| self.active_machines().all(|m| m.age >= last.ago))
    }
}

/// Time between a remediation and the next one when the replacement it made failed: doubles
/// with each failed replacement, from twice `unhealthyAfter`, capped at an hour (or
/// `unhealthyAfter` if that is longer).
pub fn remediation_backoff(unhealthy_after: Duration, previous_retries: u32) -> Duration {
    let cap = unhealthy_after.max(Duration::from_secs(3600));
    let factor = 2u32.saturating_pow(previous_retries.saturating_add(1).min(20));
    unhealthy_after.saturating_mul(factor).min(cap)
}

/// The record of a remediation: on the EtcdadmCluster (the last one) and on the Machine created
/// to replace the remediated one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemediationRecord {
    pub machine: String,
    pub timestamp: Time,
    #[serde(default)]
    pub retry_count: u32,
}

impl RemediationRecord {
    /// The record an annotation holds; one that does not parse is no record.
    pub fn from_annotation(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// How it looks from `now`.
    pub fn view(&self, now: Timestamp) -> LastRemediation {
        LastRemediation {
            machine: self.machine.clone(),
            ago: since(now, self.timestamp.0),
            retries: self.retry_count,
        }
    }
}

/// The remediation clock at one moment: how long members have been unhealthy, from the status
/// as stored.
#[derive(Clone, Copy, Debug)]
pub struct UnhealthyClock {
    serving_since: Option<Timestamp>,
    now: Timestamp,
}

impl UnhealthyClock {
    /// The clock at `now`, for an EtcdadmCluster whose stored conditions are `conditions`.
    pub fn new(conditions: &[conditions::Condition], now: Timestamp) -> Self {
        UnhealthyClock {
            serving_since: serving_since(conditions, now),
            now,
        }
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Time from `then` to now (zero for a time to come).
    pub fn since(&self, then: Timestamp) -> Duration {
        since(self.now, then)
    }

    /// How long the member of a stored status entry has been unhealthy.
    pub fn unhealthy_for(&self, entry: Option<&MemberStatus>) -> Duration {
        unhealthy_for(entry, self.serving_since, self.now)
    }
}

fn since(now: Timestamp, then: Timestamp) -> Duration {
    let millis = now.as_millisecond().saturating_sub(then.as_millisecond());
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// How long a stored entry has been unhealthy, counted from its last flip to unhealthy but not
/// before the cluster last regained quorum (while it had none, every member looks unhealthy).
fn unhealthy_for(entry: Option<&MemberStatus>, serving_since: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(entry) = entry.filter(|e| !e.healthy) else {
        return Duration::ZERO;
    };
    let Some(flipped) = entry.last_transition_time.as_ref().map(|t| t.0) else {
        return Duration::ZERO;
    };
    let start = serving_since.map_or(flipped, |s| s.max(flipped));
    since(now, start)
}

/// Since when the cluster has served clients without a break, for the unhealthy clock: when
/// `EndpointsAvailable` last turned True, or `now` while it is stored False (quorum was lost at
/// the last look, so it is at best being regained in this very pass: nobody has been unhealthy
/// while it served). `None` before the condition was ever written.
fn serving_since(conditions: &[conditions::Condition], now: Timestamp) -> Option<Timestamp> {
    conditions::find(conditions, ENDPOINTS_AVAILABLE).map(|c| match c.status {
        ConditionStatus::True => c.last_transition_time.0,
        _ => now,
    })
}

/// `healthCheck` settings plus the reference's `healthcheck-retries` annotation: 0 turns
/// remediation off; N > 0 means N failed checks (N × interval) unless `unhealthyAfter` is set;
/// anything else is ignored (never "remove after one failure").
pub fn remediation_policy(etcd: &EtcdadmCluster) -> RemediationPolicy {
    let settings = etcd.spec.health_settings();
    let mut policy = RemediationPolicy {
        enabled: settings.remediation,
        unhealthy_after: settings.unhealthy_after,
        join_deadline: settings.unhealthy_after,
    };
    let explicit = etcd
        .spec
        .health_check
        .as_ref()
        .is_some_and(|h| h.unhealthy_after.is_some());
    match etcd
        .annotations()
        .get(names::HEALTHCHECK_RETRIES_ANNOTATION)
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        Some(0) => policy.enabled = false,
        Some(retries) if !explicit => {
            policy.unhealthy_after = settings.interval.saturating_mul(retries);
        }
        _ => {}
    }
    policy.join_deadline = join_deadline(policy.unhealthy_after, settings.interval);
    policy
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::collections::BTreeMap;

    use etcdadm_shared::names;

    use super::super::testing::*;
    use super::super::*;
    use super::*;

    fn etcd(annotation: Option<&str>, health: serde_json::Value) -> EtcdadmCluster {
        let mut etcd: EtcdadmCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd"},
            "spec": {"infrastructureTemplate": {}, "healthCheck": health},
        }))
        .unwrap();
        if let Some(value) = annotation {
            etcd.metadata.annotations = Some(BTreeMap::from([(
                names::HEALTHCHECK_RETRIES_ANNOTATION.to_string(),
                value.to_string(),
            )]));
        }
        etcd
    }

    #[test]
    fn the_reference_retries_annotation_is_honoured_but_never_means_one_failure() {
        let policy = remediation_policy(&etcd(None, serde_json::json!({"interval": "2s"})));
        assert_eq!(
            (policy.enabled, policy.unhealthy_after),
            (true, Duration::from_secs(300))
        );
        let off = remediation_policy(&etcd(Some("0"), serde_json::json!({})));
        assert!(!off.enabled);
        let three = remediation_policy(&etcd(Some("3"), serde_json::json!({"interval": "2s"})));
        assert_eq!(
            (three.enabled, three.unhealthy_after),
            (true, Duration::from_secs(6))
        );
        for junk in ["-1", "abc", "", "1.5"] {
            let policy = remediation_policy(&etcd(Some(junk), serde_json::json!({"interval": "2s"})));
            assert_eq!(
                (policy.enabled, policy.unhealthy_after),
                (true, Duration::from_secs(300)),
                "{junk}"
            );
        }
        // The spec's own unhealthyAfter wins over the annotation's count.
        let explicit = remediation_policy(&etcd(Some("3"), serde_json::json!({"unhealthyAfter": "7s"})));
        assert_eq!(explicit.unhealthy_after, Duration::from_secs(7));
        let disabled = remediation_policy(&etcd(None, serde_json::json!({"remediation": "Disabled"})));
        assert!(!disabled.enabled);
    }

    #[test]
    fn a_join_gets_unhealthy_after_and_at_least_three_intervals_and_30_s() {
        let default = remediation_policy(&etcd(None, serde_json::json!({})));
        assert_eq!(default.join_deadline, Duration::from_secs(300));
        let spec = remediation_policy(&etcd(
            None,
            serde_json::json!({"interval": "1s", "unhealthyAfter": "50s"}),
        ));
        assert_eq!(spec.join_deadline, Duration::from_secs(50));
        let slow = remediation_policy(&etcd(
            None,
            serde_json::json!({"interval": "20s", "unhealthyAfter": "40s"}),
        ));
        assert_eq!(
            slow.join_deadline,
            Duration::from_secs(60),
            "three intervals at least"
        );
        let fast = remediation_policy(&etcd(
            None,
            serde_json::json!({"interval": "1s", "unhealthyAfter": "5s"}),
        ));
        assert_eq!(fast.join_deadline, Duration::from_secs(30), "30 s at least");
    }

    #[test]
    fn the_unhealthy_clock_starts_at_the_flip_but_not_before_quorum_came_back() {
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let entry = MemberStatus {
            name: "m1".into(),
            healthy: false,
            last_transition_time: Some(Time(at(100))),
            ..Default::default()
        };
        assert_eq!(
            unhealthy_for(Some(&entry), None, at(130)),
            Duration::from_secs(30)
        );
        assert_eq!(
            unhealthy_for(Some(&entry), Some(at(50)), at(130)),
            Duration::from_secs(30)
        );
        assert_eq!(
            unhealthy_for(Some(&entry), Some(at(125)), at(130)),
            Duration::from_secs(5)
        );
        let healthy = MemberStatus {
            healthy: true,
            ..entry.clone()
        };
        assert_eq!(unhealthy_for(Some(&healthy), None, at(130)), Duration::ZERO);
        assert_eq!(unhealthy_for(None, None, at(130)), Duration::ZERO);
    }

    #[test]
    fn a_member_unhealthy_through_a_quorum_loss_is_not_overdue_the_moment_quorum_returns() {
        // Found by the sim: in the first pass after quorum came back, the stored condition still
        // said False, the clock ran from the member's flip (before the loss), and a member that
        // was only slow to recover was replaced.
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let endpoints = |status: ConditionStatus, since: i64| {
            let mut list = vec![];
            conditions::set(
                &mut list,
                match status {
                    ConditionStatus::True => {
                        conditions::NewCondition::true_(ENDPOINTS_AVAILABLE, "EndpointsAvailable")
                    }
                    _ => conditions::NewCondition::false_(
                        ENDPOINTS_AVAILABLE,
                        conditions::Severity::Info,
                        "NoHealthyMembers",
                        "none",
                    ),
                },
                None,
                &Time(at(since)),
            );
            list
        };
        let entry = MemberStatus {
            name: "m1".into(),
            healthy: false,
            last_transition_time: Some(Time(at(100))),
            ..Default::default()
        };
        let lost = endpoints(ConditionStatus::False, 100);
        let now = at(130);
        assert_eq!(
            unhealthy_for(Some(&entry), serving_since(&lost, now), now),
            Duration::ZERO
        );
        let back = endpoints(ConditionStatus::True, 131);
        assert_eq!(
            unhealthy_for(Some(&entry), serving_since(&back, at(137)), at(137)),
            Duration::from_secs(6)
        );
        assert_eq!(serving_since(&[], now), None);
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
}
