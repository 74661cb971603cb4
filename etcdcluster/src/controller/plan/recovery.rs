//! Quorum-loss recovery (SPEC-day2.md section 3): the annotation
//! `etcdcluster.cluster.x-k8s.io/recover=<latest|member/<machine>|snapshot/<name>>` asks to
//! replace a cluster that lost quorum with one restored from a snapshot. Everything the request
//! needs is checked here, and a request that fails a check is refused with a condition and a
//! Warning Event, nothing deleted, the annotation left in place so the user sees why.
//!
//! Membership rule 3 (no membership change without quorum) protects a cluster that can still
//! come back; a recovery instead replaces the cluster, so the deletion of the dead cluster's
//! Machines (hooks released without MemberRemove) is outside that rule, and is allowed only when
//! quorum is really lost. Every step that is not the recovery's own keeps all the rules.
//!
//! This version refuses a request that passes every check too: the sequence that snapshots the
//! survivor, deletes the dead Machines and restores a first member is not built yet, and a
//! request is never silently ignored. The answer is a condition of its own beside the plan's
//! step, never the step: a refused request on a healthy cluster must not stop its scaling,
//! rollouts or remediation, and a cluster that lost quorum changes nothing anyway (rule 3).

use etcdadm_shared::names::RECOVER_ANNOTATION;

use super::gates;
use super::observed::Observed;
use super::step::{Step, reason};

/// Where a recovery's data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoverySource {
    /// The surviving member with the highest revision, else the newest Succeeded snapshot.
    Latest,
    /// A snapshot of this member Machine's member (served from its own backend, without quorum).
    Member(String),
    /// This EtcdadmSnapshot.
    Snapshot(String),
}

impl RecoverySource {
    /// `latest`, `member/<machine>` or `snapshot/<name>`.
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        let named = |prefix: &str| {
            value
                .strip_prefix(prefix)
                .filter(|name| !name.is_empty() && !name.contains('/'))
                .map(str::to_string)
        };
        if value == "latest" {
            Ok(RecoverySource::Latest)
        } else if let Some(machine) = named("member/") {
            Ok(RecoverySource::Member(machine))
        } else if let Some(snapshot) = named("snapshot/") {
            Ok(RecoverySource::Snapshot(snapshot))
        } else {
            Err("is not a recovery source: use latest, member/<machine> or snapshot/<name>".into())
        }
    }

    /// The source as the annotation writes it.
    pub fn describe(&self) -> String {
        match self {
            RecoverySource::Latest => "latest".into(),
            RecoverySource::Member(machine) => format!("member/{machine}"),
            RecoverySource::Snapshot(name) => format!("snapshot/{name}"),
        }
    }
}

/// A recovery request, as far as the plan needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecoveryView {
    /// The annotation's value.
    pub requested: String,
    /// `spec.backup.store` is set: a survivor's snapshot has somewhere to go.
    pub store_configured: bool,
    /// For `snapshot/<name>`: why that EtcdadmSnapshot cannot be restored from.
    pub snapshot_problem: Option<String>,
}

/// The answer to a recovery request, if one is made: always a refusal in this version.
pub fn answer(o: &Observed) -> Option<Step> {
    let request = o.recovery.as_ref()?;
    let refuse = |why: String| Step::Refuse {
        reason: reason::RECOVERY_REFUSED,
        message: format!(
            "{RECOVER_ANNOTATION}={:?} {why}; nothing is changed or deleted (remove the annotation \
             once read)",
            request.requested
        ),
    };
    let source = match RecoverySource::parse(&request.requested) {
        Ok(source) => source,
        Err(why) => return Some(refuse(why)),
    };
    let lost = o.initialized_now()
        && matches!(gates::quorum_lost(o), Some(Step::Wait { reason, .. }) if reason == reason::QUORUM_LOST);
    if !lost {
        let voters = o.voters();
        let healthy = voters.iter().filter(|m| m.healthy).count();
        return Some(refuse(format!(
            "is refused: quorum is not lost ({healthy} of {} voting members healthy, {} needed), and a \
             recovery replaces a cluster only when a majority of its members is gone for good",
            voters.len(),
            gates::quorum(voters.len())
        )));
    }
    match &source {
        RecoverySource::Latest | RecoverySource::Member(_) if !request.store_configured => {
            return Some(refuse(
                "is refused: a survivor's snapshot needs an object store, and spec.backup.store is not \
                 set; set it, or recover from snapshot/<name>"
                    .into(),
            ));
        }
        RecoverySource::Member(machine) if !o.machines.iter().any(|m| m.name == *machine) => {
            return Some(refuse(format!(
                "is refused: Machine {machine} is not a member Machine of this EtcdadmCluster"
            )));
        }
        RecoverySource::Snapshot(_) => {
            if let Some(problem) = &request.snapshot_problem {
                return Some(refuse(format!("is refused: {problem}")));
            }
        }
        RecoverySource::Latest | RecoverySource::Member(_) => {}
    }
    Some(Step::Refuse {
        reason: reason::RECOVERY_NOT_AVAILABLE,
        message: format!(
            "{RECOVER_ANNOTATION}={}: quorum is lost and the source can be used, but this version \
             cannot run the recovery sequence yet; nothing is changed or deleted. Meanwhile, create \
             a new EtcdadmCluster with spec.restore from the newest Succeeded EtcdadmSnapshot",
            source.describe()
        ),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
    use super::{RecoverySource, RecoveryView};

    /// Three members, two of them dead: quorum lost.
    fn lost(requested: &str) -> Observed {
        let mut o = running(3);
        for i in [1, 2] {
            members_mut(&mut o)[i] = unhealthy(members_mut(&mut o)[i].clone(), "connection refused");
        }
        o.recovery = Some(RecoveryView {
            requested: requested.into(),
            store_configured: true,
            snapshot_problem: None,
        });
        o
    }

    #[test]
    fn sources_parse_and_anything_else_is_named_wrong() {
        assert_eq!(RecoverySource::parse("latest"), Ok(RecoverySource::Latest));
        assert_eq!(
            RecoverySource::parse(" member/c1-etcd-m1 "),
            Ok(RecoverySource::Member("c1-etcd-m1".into()))
        );
        assert_eq!(
            RecoverySource::parse("snapshot/nightly"),
            Ok(RecoverySource::Snapshot("nightly".into()))
        );
        for bad in [
            "",
            "Latest",
            "member/",
            "snapshot/",
            "member/a/b",
            "machine/m1",
            "true",
        ] {
            assert!(RecoverySource::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_refusal_names_its_cause_and_writes_nothing() {
        let healthy = {
            let mut o = running(3);
            o.recovery = lost("latest").recovery;
            o
        };
        let one_dead = {
            let mut o = running(3);
            members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
            o.recovery = lost("latest").recovery;
            o
        };
        let never_initialized = {
            let mut o = base();
            o.recovery = lost("latest").recovery;
            o
        };
        let no_store = |requested: &str| {
            let mut o = lost(requested);
            o.recovery.as_mut().unwrap().store_configured = false;
            o
        };
        let bad_snapshot = {
            let mut o = lost("snapshot/nightly");
            o.recovery.as_mut().unwrap().snapshot_problem =
                Some("EtcdadmSnapshot nightly is Failed, not Succeeded".into());
            o
        };
        let cases: Vec<(&str, Observed, &str, &str)> = vec![
            (
                "not a source",
                lost("yes please"),
                reason::RECOVERY_REFUSED,
                "is not a recovery source",
            ),
            (
                "healthy",
                healthy,
                reason::RECOVERY_REFUSED,
                "quorum is not lost (3 of 3",
            ),
            (
                "one of three dead",
                one_dead,
                reason::RECOVERY_REFUSED,
                "quorum is not lost (2 of 3",
            ),
            (
                "never initialized",
                never_initialized,
                reason::RECOVERY_REFUSED,
                "quorum is not lost",
            ),
            (
                "latest, no store",
                no_store("latest"),
                reason::RECOVERY_REFUSED,
                "needs an object store",
            ),
            (
                "member, no store",
                no_store("member/c1-etcd-m0"),
                reason::RECOVERY_REFUSED,
                "needs an object store",
            ),
            (
                "member of no Machine",
                lost("member/c9"),
                reason::RECOVERY_REFUSED,
                "Machine c9 is not a member Machine",
            ),
            (
                "unusable snapshot",
                bad_snapshot,
                reason::RECOVERY_REFUSED,
                "is Failed, not Succeeded",
            ),
            (
                "usable, sequence not built",
                lost("member/c1-etcd-m0"),
                reason::RECOVERY_NOT_AVAILABLE,
                "cannot run the recovery sequence yet",
            ),
            (
                "a named snapshot needs no store",
                no_store("snapshot/nightly"),
                reason::RECOVERY_NOT_AVAILABLE,
                "snapshot/nightly",
            ),
        ];
        for (what, o, why, says) in cases {
            let step = super::answer(&o).unwrap();
            assert_eq!(wait_reason(&step), why, "{what}: {step:?}");
            assert!(step.is_refusal() && !step.writes(), "{what}");
            let message = wait_message(&step);
            assert!(message.contains(says), "{what}: {message}");
            assert!(
                message.contains("etcdcluster.cluster.x-k8s.io/recover="),
                "{what}: {message}"
            );
            assert!(
                message.contains("nothing is changed or deleted"),
                "{what}: {message}"
            );
        }
    }

    #[test]
    fn quorum_loss_is_waited_out_with_or_without_the_annotation() {
        let mut o = lost("latest");
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
        o.recovery = None;
        assert_eq!(wait_reason(&plan(&o)), reason::QUORUM_LOST);
        assert_eq!(super::answer(&o), None);
    }

    #[test]
    fn a_refused_request_never_holds_back_a_healthy_clusters_changes() {
        let mut o = running(3);
        o.recovery = lost("latest").recovery;
        o.replicas = 5;
        assert_eq!(wait_reason(&super::answer(&o).unwrap()), reason::RECOVERY_REFUSED);
        assert!(matches!(plan(&o), Step::CreateMachine { .. }), "{:?}", plan(&o));
    }
}
