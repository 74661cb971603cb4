//! Bad input is never silent (docs/operating.md, "Bad input"): every problem admission would
//! have refused in the spec shows in the `SpecValid` condition, with a Warning Event when it
//! appears or changes, whether or not the plan has anything to make from the spec now.

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::condition::SPEC_VALID;
use etcdadm_shared::api::conditions::{self, ConditionStatus, NewCondition, Severity};

use crate::controller::decision::EventNote;
use crate::controller::decision::reason::INVALID_SPEC;
use crate::controller::observation::Observation;

/// `SpecValid`'s reason while the spec has no problem.
pub const VALID: &str = "Valid";

/// Every problem with the spec, each naming its field: the template's kind, the replica count,
/// and every rule admission applies; `None` when there is none.
pub fn problems(o: &Observation) -> Option<String> {
    let replicas = (o.replicas < 1 || o.replicas % 2 == 0)
        .then(|| format!("spec.replicas: {} must be odd and at least 1", o.replicas));
    let mut found: Vec<String> = vec![];
    for problem in [o.spec_problem.clone(), o.member_spec_problem.clone(), replicas]
        .into_iter()
        .flatten()
    {
        // Admission's own verdict names the replica count too: say it once.
        if problem.starts_with("spec.replicas") && found.iter().any(|f| f.contains("spec.replicas")) {
            continue;
        }
        found.push(problem);
    }
    (!found.is_empty()).then(|| found.join("; "))
}

/// `SpecValid` for `problems`, and the Warning Event when they appear or change since `old`.
pub fn condition(problems: Option<&str>, old: &EtcdadmClusterStatus) -> (NewCondition, Option<EventNote>) {
    let Some(problems) = problems else {
        return (NewCondition::true_(SPEC_VALID, VALID), None);
    };
    let before = conditions::find(&old.conditions, SPEC_VALID);
    let unchanged =
        before.is_some_and(|c| c.status == ConditionStatus::False && c.message.as_deref() == Some(problems));
    let event = (!unchanged).then(|| {
        EventNote::warning(
            INVALID_SPEC,
            format!("the spec has problems admission refuses; fix them: {problems}"),
        )
    });
    (
        NewCondition::false_(SPEC_VALID, Severity::Error, INVALID_SPEC, problems),
        event,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::observation::read::member_spec_problem;
    use crate::controller::plan::{Step, plan};
    use crate::controller::status::next_status;
    use crate::controller::testing::*;
    use etcdadm_shared::api::EtcdadmCluster;
    use etcdadm_shared::api::cluster::{DefragmentationPolicy, Maintenance, MaintenanceWindow};
    use etcdadm_shared::api::quantity::ByteQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// `running(3)` whose stored spec carries `change`, with the problems the controller reads
    /// from it.
    fn with_spec(change: impl Fn(&mut EtcdadmCluster)) -> Observation {
        let mut o = running(3);
        let template = &mut o.etcd_cluster.spec.infrastructure_template;
        template.kind = Some("DevMachineTemplate".into());
        template.name = Some("etcd".into());
        change(&mut o.etcd_cluster);
        o.member_spec_problem = member_spec_problem(&o.etcd_cluster, "default");
        o
    }

    fn window(start: &str) -> impl Fn(&mut EtcdadmCluster) {
        let start = start.to_string();
        move |e: &mut EtcdadmCluster| {
            e.spec.maintenance = Some(Maintenance {
                defragmentation: Some(DefragmentationPolicy {
                    window: Some(MaintenanceWindow {
                        start: start.clone(),
                        duration: "2h".into(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }

    #[test]
    fn each_problem_admission_refuses_is_named_by_its_field() {
        let quota = |e: &mut EtcdadmCluster| {
            e.spec.etcdadm_config_spec.quota_backend_bytes = Some(ByteQuantity::Text("1Ki".into()));
        };
        let mut even = running(3);
        even.replicas = 2;
        let mut namespace = running(3);
        namespace.spec_problem = Some("spec.infrastructureTemplate.namespace: other is not default".into());
        for (what, o, fields) in [
            (
                "a defragmentation window that never parses",
                with_spec(window("61 25 * * *")),
                vec!["spec.maintenance.defragmentation.window.start"],
            ),
            (
                "a quota below 16Mi",
                with_spec(quota),
                vec!["spec.etcdadmConfigSpec.quotaBackendBytes"],
            ),
            ("an even replica count", even, vec!["spec.replicas"]),
            (
                "the template in another namespace",
                namespace,
                vec!["spec.infrastructureTemplate.namespace"],
            ),
        ] {
            let said = problems(&o).unwrap_or_else(|| panic!("{what}: no problem found"));
            for field in fields {
                assert!(said.contains(field), "{what}: {said}");
            }
            assert!(said.matches("spec.replicas").count() <= 1, "{what}: {said}");
        }
        assert_eq!(problems(&with_spec(window("0 2 * * *"))), None);
        assert_eq!(problems(&running(3)), None);
    }

    #[test]
    fn spec_valid_says_each_new_problem_once_with_a_warning() {
        let bad = "spec.maintenance.defragmentation.window.start: minute 61 is outside 0-59";
        let other = "spec.etcdadmConfigSpec.quotaBackendBytes: 1Ki (1024 bytes) is outside 16Mi to 32Gi";
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let stored = |problem: Option<&str>| {
            let mut status = EtcdadmClusterStatus::default();
            let (set, _) = condition(problem, &status);
            conditions::set(&mut status.conditions, set, None, &now);
            status
        };
        // (before, now, SpecValid's status, a Warning Event)
        for (before, problem, status, event) in [
            (None, None, ConditionStatus::True, false),
            (None, Some(bad), ConditionStatus::False, true),
            (Some(bad), Some(bad), ConditionStatus::False, false),
            (Some(bad), Some(other), ConditionStatus::False, true),
            (Some(bad), None, ConditionStatus::True, false),
        ] {
            let (set, note) = condition(problem, &stored(before));
            assert_eq!(set.status, status, "{before:?} -> {problem:?}");
            assert_eq!(note.is_some(), event, "{before:?} -> {problem:?}");
            if let Some(note) = note {
                assert!(note.warning && note.reason == INVALID_SPEC);
                assert!(note.note.contains(problem.unwrap()), "{}", note.note);
            }
        }
    }

    #[test]
    fn a_steady_cluster_with_a_bad_spec_is_looked_after_and_says_so() {
        let o = with_spec(window("61 25 * * *"));
        // Nothing to make from the spec: the plan goes on as before.
        assert_eq!(plan(&o), Step::Steady);
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let (status, events) = next_status(&o.etcd_cluster, &o, &Step::Steady, &now);
        let valid = conditions::find(&status.conditions, SPEC_VALID).unwrap();
        assert_eq!(valid.status, ConditionStatus::False);
        assert_eq!(valid.reason.as_deref(), Some(INVALID_SPEC));
        let message = valid.message.clone().unwrap();
        assert!(
            message.contains("spec.maintenance.defragmentation.window.start"),
            "{message}"
        );
        let warned: Vec<_> = events.iter().filter(|e| e.reason == INVALID_SPEC).collect();
        assert_eq!(warned.len(), 1, "{events:?}");
        assert!(warned[0].warning && warned[0].note.contains("window.start"));
        // The next pass, the problem unchanged: no second Event.
        let mut again = o.clone();
        again.etcd_cluster.status = Some(status);
        let (_, events) = next_status(&again.etcd_cluster, &again, &Step::Steady, &now);
        assert!(events.iter().all(|e| e.reason != INVALID_SPEC), "{events:?}");
    }
}
