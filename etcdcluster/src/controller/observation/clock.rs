//! Time as the plan reads it: how long a member has been unhealthy (the remediation clock, which
//! stops while the cluster had no quorum), the remediation policy the spec and the reference's
//! annotation make, the join deadline, and the remediation records annotations hold.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::cluster::condition::ENDPOINTS_AVAILABLE;
use etcdadm_shared::api::conditions::{self, ConditionStatus};
use etcdadm_shared::api::config::DEFAULT_LEARNER_LISTED_WAIT;
use etcdadm_shared::api::{EtcdadmCluster, MemberStatus};
use etcdadm_shared::names;

use super::views::{LastRemediation, RemediationPolicy};

/// On the EtcdadmCluster: the last remediation, JSON `{"machine", "timestamp", "retryCount"}`
/// (as KCP records its own), read for the backoff after a failed replacement.
pub const REMEDIATION_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/remediation";
/// On the Machine created to replace a remediated one: a copy of that remediation's record.
pub const REMEDIATION_FOR_ANNOTATION: &str = "etcdcluster.cluster.x-k8s.io/remediation-for";

/// A join is never given up on sooner than this many health intervals...
pub const MIN_JOIN_INTERVALS: u32 = 3;
/// ...nor sooner than this (a machine boots and etcd syncs; CAPI's MachineHealthCheck holds
/// `nodeStartupTimeout` to the same minimum).
pub const MIN_JOIN_DEADLINE: Duration = Duration::from_secs(30);

/// How long a new Machine may take to become a healthy member before it is replaced:
/// `unhealthy_after`, and at least [`MIN_JOIN_INTERVALS`] health intervals and
/// [`MIN_JOIN_DEADLINE`].
pub fn join_deadline(unhealthy_after: Duration, interval: Duration) -> Duration {
    unhealthy_after
        .max(interval.saturating_mul(MIN_JOIN_INTERVALS))
        .max(MIN_JOIN_DEADLINE)
}

/// How long a new learner join's user data waits for its member to be listed (docs/safety.md,
/// "Boot ahead"): the default wait (room for a controller restart), plus one join deadline for
/// every other member that may take its turn first (at most `replicas - 1`; each join either
/// ends or is given up on within its deadline). Past it the node gives up without joining and
/// the controller replaces the Machine.
pub fn learner_listed_wait(replicas: i32, join_deadline: Duration) -> Duration {
    let others = u32::try_from(replicas.saturating_sub(1)).unwrap_or(0);
    DEFAULT_LEARNER_LISTED_WAIT.saturating_add(join_deadline.saturating_mul(others))
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
}
