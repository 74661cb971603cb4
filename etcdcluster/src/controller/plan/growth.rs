//! Growth: new members and how they join. The first Machine's address is published for joins,
//! one Machine is created at a time (in the failure domain with the fewest members, finishing
//! an interrupted creation first), and a join that misses its deadline is given up on.

use std::time::Duration;

use etcdadm_shared::duration;
use etcdadm_shared::names;

use super::observed::{Observed, healthy_client_urls};
use super::placement::pick_failure_domain;
use super::step::{Growth, Removal, Step, reason};
use super::versions;

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

/// Publish `<cluster>-etcd-init` once the first Machine has an address.
pub(super) fn publish_init_secret(o: &Observed) -> Option<Step> {
    if o.init_secret.is_some() {
        return None;
    }
    let first = o.active_machines().next()?;
    let address = first.address.clone()?;
    let healthy_urls = healthy_client_urls(o);
    let client_urls = if healthy_urls.is_empty() {
        vec![names::client_url(&address)]
    } else {
        healthy_urls
    };
    Some(Step::PublishInitSecret { address, client_urls })
}

/// Keep the init Secret's join URLs on the healthy voters (called once every member is healthy,
/// so a new member never joins through a removed one).
pub(super) fn init_secret_urls(o: &Observed) -> Option<Step> {
    let secret = o.init_secret.as_ref()?;
    let healthy_urls = healthy_client_urls(o);
    (!healthy_urls.is_empty() && secret.client_urls != healthy_urls).then_some(Step::UpdateInitSecretUrls {
        client_urls: healthy_urls,
    })
}

/// added, added but never started, or started but never healthy) is deleted; its hook removes
/// an added member first, which a quorum of started voters always allows, and a new Machine
/// replaces it. Before that, the join is waited for (rules 1 and 2). The first member is left
/// alone: without a healthy member there is no cluster to keep safe or to join anew.
pub(super) fn failed_join(o: &Observed) -> Option<Step> {
    if !o.initialized_now() {
        return None;
    }
    let deadline = o.remediation.join_deadline;
    let (machine, state) = o
        .active_machines()
        .filter(|m| !m.was_member && m.age > deadline)
        .find_map(|m| {
            let state = match (&m.address, o.member_of(&m.name)) {
                (None, _) => "it has no address",
                (Some(_), None) => "it never became an etcd member",
                (Some(_), Some(member)) if !member.is_started() => "its member was added but never started",
                (Some(_), Some(member)) if !member.healthy && !member.ever_healthy => {
                    "its member started but was never healthy"
                }
                (Some(_), Some(_)) => return None,
            };
            Some((m, state))
        })?;
    let limit = duration::format(deadline);
    if !o.remediation.enabled {
        return Some(Step::Wait {
            reason: reason::MEMBER_JOIN_FAILED,
            message: format!(
                "Machine {} did not join within {limit} ({state}); remediation is disabled: delete the Machine to replace it",
                machine.name
            ),
        });
    }
    Some(Step::DeleteMachine {
        machine: machine.name.clone(),
        purpose: Removal::FailedJoin,
        message: format!(
            "Machine {} did not become a healthy etcd member within {limit} ({state}): deleting it (a member it added is removed first); a new one replaces it",
            machine.name
        ),
    })
}

/// Why no member Machine can be made from the spec now: the problem admission would have
/// refused, the version the members cannot move to, or the missing template it is cloned from.
pub(super) fn creation_blocked(o: &Observed) -> Option<Step> {
    if let Some(problem) = &o.member_spec_problem {
        return Some(Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: format!("no member Machine is created from this spec until it is fixed: {problem}"),
        });
    }
    if let Some(refusal) = versions::refusal(o) {
        return Some(refusal);
    }
    o.missing_infra_template.as_ref().map(|template| Step::Wait {
        reason: reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND,
        message: format!(
            "infrastructure template {template} not found: member Machines are cloned from it once it exists"
        ),
    })
}

/// One new member Machine for `purpose`, unless none can be made from the spec.
pub(super) fn create_machine(o: &Observed, allowed_domains: &[String], purpose: Growth) -> Step {
    if let Some(blocked) = creation_blocked(o) {
        return blocked;
    }
    let (name, resume) = match o.leftovers.first() {
        Some(leftover) => (leftover.clone(), true),
        None => (o.new_member_name.clone(), false),
    };
    Step::CreateMachine {
        name,
        resume,
        failure_domain: pick_failure_domain(allowed_domains, &o.machines),
        purpose: if o.replacement_pending() {
            Growth::Replacement
        } else {
            purpose
        },
    }
}

/// Infra machines and configs of interrupted creations nobody needs any more.
pub(super) fn leftovers(o: &Observed) -> Option<Step> {
    (!o.leftovers.is_empty()).then(|| Step::DeleteLeftovers {
        names: o.leftovers.clone(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use etcdadm_shared::names;

    use super::super::testing::*;
    use super::super::*;
    #[test]
    fn a_join_is_waited_for_until_its_deadline_and_its_machine_replaced_after_it() {
        let no_address = |age| {
            let mut o = joining(age, None);
            o.machines[3].address = None;
            o
        };
        type Case = (&'static str, fn(Duration) -> Observed, &'static str);
        let cases: [Case; 4] = [
            ("no address", no_address, reason::WAITING_FOR_MACHINE_ADDRESS),
            (
                "never added",
                |age| joining(age, None),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
            (
                "added, never started",
                |age| joining(age, Some(added_not_started())),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
            (
                "started, never healthy",
                |age| joining(age, Some(started_never_healthy())),
                reason::WAITING_FOR_MEMBER_JOIN,
            ),
        ];
        for (what, make, waiting) in cases {
            let before = plan(&make(JUST_BEFORE));
            assert_eq!(wait_reason(&before), waiting, "{what}: {before:?}");
            let after = plan(&make(JUST_AFTER));
            assert_eq!(failed_join_of(&after), Some("c1-etcd-m3"), "{what}: {after:?}");
            let (reason, message) = after.reason();
            assert_eq!(reason, reason::MEMBER_JOIN_FAILED, "{what}");
            assert!(
                message.contains("did not become a healthy etcd member within 5m"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_member_a_failed_join_added_is_removed_before_anything_else() {
        // Scale-up (3 started voters + 1 never started) and a remove-first rollout (2 + 1): a
        // quorum of started voters remains either way, so the added member can always go.
        for started in [3, 2] {
            let mut o = joining(JUST_AFTER, Some(added_not_started()));
            if started == 2 {
                o.replicas = 3;
                o.machines.remove(2);
                members_mut(&mut o).remove(2);
            }
            o.machines.last_mut().unwrap().deleting = true;
            match plan(&o) {
                Step::RemoveMember {
                    member_id, via_url, ..
                } => {
                    assert_eq!(member_id, 4, "{started} started voters");
                    assert_ne!(via_url, names::client_url("10.0.0.4"));
                }
                step => panic!("{started} started voters: expected the member's removal, got {step:?}"),
            }
            // Once it is gone from etcd, the hook is released.
            members_mut(&mut o).retain(|m| m.id != 4);
            assert_eq!(
                plan(&o),
                Step::ReleaseHook {
                    machine: "c1-etcd-m3".into()
                }
            );
        }
    }

    #[test]
    fn a_healthy_new_member_or_the_first_member_is_never_a_failed_join() {
        let joined = joining(JUST_AFTER, Some(member(4, "c1-etcd-m3", "10.0.0.4")));
        assert_eq!(failed_join_of(&plan(&joined)), None, "{:?}", plan(&joined));
        let mut first = base();
        first.replicas = 3;
        let mut m = machine("c1-etcd-m0", Some("10.0.0.1"), None);
        m.age = JUST_AFTER * 10;
        first.machines.push(m);
        first.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(failed_join_of(&plan(&first)), None);
    }

    #[test]
    fn with_remediation_disabled_a_failed_join_is_reported_not_replaced() {
        let mut o = joining(JUST_AFTER, Some(added_not_started()));
        o.remediation.enabled = false;
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::MEMBER_JOIN_FAILED);
        assert!(step.is_refusal());
        assert!(wait_message(&step).contains("remediation is disabled"));
    }

    #[test]
    fn a_stuck_join_never_blocks_remediation_for_longer_than_its_deadline() {
        // Five members, m1 dead and overdue, a sixth Machine m5 joining: until m5's deadline the
        // join is waited for (one change at a time); past it m5 goes first, then m1 is
        // remediated. (Four healthy of six voters keep a quorum throughout.)
        let mut o = running(5);
        o.replicas = 7;
        let mut dead = unhealthy(member(2, "c1-etcd-m1", "10.0.0.2"), "connection refused");
        dead.unhealthy_for = DEADLINE * 2;
        members_mut(&mut o)[1] = dead;
        o.machines[1].was_member = true;
        o.machines[1].unhealthy_for = DEADLINE * 2;
        let mut m5 = machine("c1-etcd-m5", Some("10.0.0.6"), None);
        m5.age = JUST_BEFORE;
        o.machines.push(m5);
        members_mut(&mut o).push(MemberView {
            id: 6,
            peer_urls: vec![names::peer_url("10.0.0.6")],
            machine: Some("c1-etcd-m5".into()),
            ..Default::default()
        });
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MEMBER_JOIN);
        o.machines[5].age = JUST_AFTER;
        assert_eq!(failed_join_of(&plan(&o)), Some("c1-etcd-m5"));
        o.machines.pop();
        members_mut(&mut o).pop();
        match plan(&o) {
            Step::DeleteMachine {
                machine,
                purpose: Removal::Remediation { .. },
                ..
            } => assert_eq!(machine, "c1-etcd-m1"),
            step => panic!("expected m1's remediation, got {step:?}"),
        }
    }

    #[test]
    fn the_first_machine_is_created_when_nothing_exists() {
        let o = base();
        assert_eq!(
            plan(&o),
            Step::CreateMachine {
                name: "c1-etcd-fresh".into(),
                resume: false,
                failure_domain: None,
                purpose: Growth::ScaleUp,
            }
        );
    }

    #[test]
    fn the_init_secret_is_published_once_the_first_machine_has_an_address() {
        let mut o = base();
        o.machines.push(machine("c1-etcd-a", None, None));
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
        o.machines[0].address = Some("10.0.0.1".into());
        assert_eq!(
            plan(&o),
            Step::PublishInitSecret {
                address: "10.0.0.1".into(),
                client_urls: vec!["https://10.0.0.1:2379".into()]
            }
        );
        // Published, first member not answering yet: no second Machine.
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        o.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_FIRST_MEMBER);
    }

    #[test]
    fn an_interrupted_creation_is_adopted_not_orphaned() {
        let mut o = base();
        o.leftovers = vec!["c1-etcd-abcde".into()];
        assert_eq!(
            plan(&o),
            Step::CreateMachine {
                name: "c1-etcd-abcde".into(),
                resume: true,
                failure_domain: None,
                purpose: Growth::ScaleUp,
            }
        );
        // At full size the leftovers are cleaned up instead, once ready.
        let mut o = running(3);
        o.leftovers = vec!["c1-etcd-abcde".into()];
        assert_eq!(
            plan(&o),
            Step::DeleteLeftovers {
                names: vec!["c1-etcd-abcde".into()]
            }
        );
    }

    #[test]
    fn init_secret_urls_follow_the_healthy_voters_once_ready() {
        let mut o = running(3);
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        let Step::UpdateInitSecretUrls { client_urls } = plan(&o) else {
            panic!("expected an init Secret update: {:?}", plan(&o));
        };
        assert_eq!(client_urls.len(), 3);
    }

    #[test]
    fn a_missing_infrastructure_template_is_named_and_waited_for() {
        let mut o = running(2);
        o.replicas = 3;
        o.missing_infra_template = Some("DevMachineTemplate default/etcd".into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND);
        assert!(step.is_refusal(), "a Warning Event says so");
        assert!(wait_message(&step).contains("DevMachineTemplate default/etcd"));
        o.missing_infra_template = None;
        assert!(matches!(plan(&o), Step::CreateMachine { .. }));
    }

    #[test]
    fn a_member_spec_admission_would_refuse_creates_no_machine_but_stops_nothing_else() {
        let problem = "spec.etcdadmConfigSpec.cloudInitConfig.version: \"v3\" is not an etcd version";
        let mut o = base();
        o.member_spec_problem = Some(problem.into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::INVALID_SPEC);
        let (_, message) = step.reason();
        assert!(message.contains(problem), "{message}");
        // A cluster whose members need nothing new keeps being looked after.
        let mut steady = running(3);
        steady.replicas = 3;
        steady.member_spec_problem = Some(problem.into());
        assert_eq!(plan(&steady), Step::Steady);
    }
}
