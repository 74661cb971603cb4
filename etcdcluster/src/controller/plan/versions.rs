//! etcd versions (docs/day2.md, "etcd versions"): a cluster moves one minor version at a time
//! and never back, so new members of a version two minors ahead of, or a minor behind, what the
//! members run are refused here too, for specs that reached the controller without admission;
//! and the cluster version etcd itself would report (`status.clusterVersion`, this concern's
//! part of the status; it has no step of its own).

use etcdadm_shared::error::Error;
use etcdadm_shared::validation::{is_etcd_version, major_minor, quoted, version_change_problem};

use crate::controller::decision::{After, Applied, ConcernStep, EventNote, Hold, Outputs, StatusPart};
use crate::controller::observation::{EtcdView, MemberView, Observation};

/// The versions concern takes no step: its refusal holds a Machine's creation, and its part of
/// the status is the cluster version.
#[derive(Clone, Debug, PartialEq)]
pub enum VersionStep {}

impl ConcernStep for VersionStep {
    type View = ();
    type Metrics = ();

    fn reason(&self) -> (&'static str, String) {
        match *self {}
    }

    fn event(&self, _: &Observation) -> Option<EventNote> {
        match *self {}
    }

    async fn apply(&self, _: &Outputs<'_>, _: &Observation) -> Result<Applied, Error> {
        match *self {}
    }

    fn after(&self, _: &Observation) -> After {
        match *self {}
    }

    /// `status.clusterVersion`, once every voting member answered; kept while one does not.
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        if let Some(version) = cluster_version(&part.o.etcd) {
            part.status.cluster_version = Some(version);
        }
    }
}

/// Condition reasons of version changes.
pub mod reason {
    pub const UNSUPPORTED_VERSION_CHANGE: &str = "UnsupportedVersionChange";
}

/// Where a cloud-config spec names the version new members run.
pub const VERSION_FIELD: &str = "spec.etcdadmConfigSpec.cloudInitConfig.version";

/// Why no member of the spec's version may be added (or an old one replaced by one) now: the
/// version does not parse, or it is a minor skip or a downgrade from what a member runs.
pub fn refusal(o: &Observation) -> Option<Hold> {
    let (field, wanted) = o.spec_version.as_ref()?;
    let wanted = wanted.as_str();
    let problem = if is_etcd_version(wanted) {
        let (running, why) = o
            .running_versions
            .iter()
            .find_map(|running| version_change_problem(running, wanted).map(|why| (running, why)))?;
        format!("a member runs {running}, and {why}")
    } else {
        format!("{} is not an etcd version like 3.5.9", quoted(wanted))
    };
    Some(Hold::refuse(
        reason::UNSUPPORTED_VERSION_CHANGE,
        format!("{field}: {problem}; no member Machine is created from this spec until it is fixed"),
    ))
}

/// The cluster version etcd decides once every voting member answers: the lowest
/// `major.minor` they run, as `major.minor.0`. `None` while one has not answered.
pub fn cluster_version(etcd: &EtcdView) -> Option<String> {
    let EtcdView::Members(members) = etcd else {
        return None;
    };
    let voters: Vec<&MemberView> = members.iter().filter(|m| !m.is_learner).collect();
    let mut versions = Vec::new();
    for member in &voters {
        versions.push(major_minor(member.etcd_version.as_deref()?)?);
    }
    versions
        .into_iter()
        .min()
        .map(|(major, minor)| format!("{major}.{minor}.0"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    fn at(o: &mut Observation, running: &[&str], wanted: &str) {
        o.running_versions = running.iter().map(|v| v.to_string()).collect();
        o.spec_version = Some((VERSION_FIELD.into(), wanted.into()));
    }

    #[test]
    fn a_minor_skip_a_downgrade_or_no_version_at_all_creates_no_machine_and_names_the_field() {
        for (runs, wanted, why) in [
            ("3.4.22", "3.6.0", "skips a minor version"),
            ("3.5.9", "3.4.22", "downgrades the minor version"),
            ("3.5.9", "4.0.0", "changes the major version"),
            ("3.5.9", "3.6", "\"3.6\" is not an etcd version like 3.5.9"),
            ("3.5.9", "v3.5.9", "\"v3.5.9\" is not an etcd version"),
        ] {
            let mut o = running(2);
            at(&mut o, &[runs], wanted);
            let step = plan(&o);
            assert_eq!(
                wait_reason(&step),
                reason::UNSUPPORTED_VERSION_CHANGE,
                "{wanted}: {step:?}"
            );
            assert!(step.is_refusal() && !step.writes());
            let message = wait_message(&step);
            assert!(message.starts_with(VERSION_FIELD), "{message}");
            assert!(message.contains(why), "{message}");
        }
        // A Bottlerocket spec's version is its etcdImage tag, and the refusal names that field.
        let mut o = running(2);
        at(&mut o, &["3.4.22"], "3.6.0-eks-1-31-1");
        let field = "spec.etcdadmConfigSpec.bottlerocketConfig.etcdImage";
        o.spec_version = Some((field.into(), "3.6.0-eks-1-31-1".into()));
        assert!(wait_message(&plan(&o)).starts_with(field));
        // Any member of the cluster counts: one still on 3.4 keeps 3.6 out.
        let mut o = running(2);
        at(&mut o, &["3.4.22", "3.5.9"], "3.6.0");
        assert!(wait_message(&plan(&o)).contains("a member runs 3.4.22"));
    }

    #[test]
    fn one_minor_up_and_patch_releases_either_way_are_allowed() {
        for (runs, wanted) in [
            ("3.4.22", "3.5.9"),
            ("3.5.1", "3.5.9"),
            ("3.5.9", "3.5.1"),
            ("3.5.9", "3.6.0-rc.1"),
        ] {
            let mut o = running(2);
            at(&mut o, &[runs], wanted);
            assert!(
                matches!(plan(&o), Step::Machines(MachineStep::CreateMachine { .. })),
                "{runs} → {wanted}: {:?}",
                plan(&o)
            );
        }
        // Nothing known about what the members run: nothing to compare, nothing refused.
        let mut o = running(2);
        at(&mut o, &[], "3.6.0");
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine { .. })
        ));
    }

    #[test]
    fn a_remove_first_rollout_whose_replacement_cannot_be_made_removes_no_member() {
        let mut o = zoned(3, false);
        o.max_surge = 0;
        outdate_all(&mut o);
        at(&mut o, &["3.4.22"], "3.6.0");
        assert_eq!(wait_reason(&plan(&o)), reason::UNSUPPORTED_VERSION_CHANGE);
        // So does one whose replacement a spec problem or a missing template would stop.
        let mut blocked = o.clone();
        at(&mut blocked, &["3.4.22"], "3.5.9");
        blocked.member_spec_problem = Some("spec.etcdadmConfigSpec.files[0].path: must be absolute".into());
        assert_eq!(wait_reason(&plan(&blocked)), reason::INVALID_SPEC);
        blocked.member_spec_problem = None;
        blocked.missing_infra_template = Some("DevMachineTemplate default/etcd".into());
        assert_eq!(
            wait_reason(&plan(&blocked)),
            reason::INFRASTRUCTURE_TEMPLATE_NOT_FOUND
        );
        // Add-first (maxSurge 1) removes an old member only once its replacement runs.
        let mut surge = zoned(3, false);
        outdate_all(&mut surge);
        surge
            .machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), Some("a")));
        members_mut(&mut surge).push(MemberView {
            is_leader: false,
            ..member(9, "c1-etcd-n1", "10.0.1.1")
        });
        surge.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&surge),
        });
        at(&mut surge, &["3.4.22"], "3.6.0");
        assert!(
            matches!(
                plan(&surge),
                Step::Machines(MachineStep::DeleteMachine {
                    purpose: Removal::Rollout,
                    ..
                })
            ),
            "{:?}",
            plan(&surge)
        );
        at(&mut o, &["3.4.22"], "3.5.9");
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::Rollout,
                ..
            })
        ));
        // Scaling down takes no member of the new version: it goes on.
        let mut o = running(3);
        o.replicas = 1;
        at(&mut o, &["3.4.22"], "3.6.0");
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::DeleteMachine {
                purpose: Removal::ScaleDown,
                ..
            })
        ));
    }

    #[test]
    fn the_cluster_version_is_the_lowest_minor_once_every_voter_answers() {
        let mut o = running(3);
        for (member, version) in members_mut(&mut o).iter_mut().zip(["3.5.9", "3.4.22", "3.5.1"]) {
            member.etcd_version = Some(version.into());
        }
        assert_eq!(cluster_version(&o.etcd).as_deref(), Some("3.4.0"));
        members_mut(&mut o)[1].is_learner = true;
        assert_eq!(
            cluster_version(&o.etcd).as_deref(),
            Some("3.5.0"),
            "learners do not count"
        );
        members_mut(&mut o)[2].etcd_version = None;
        assert_eq!(cluster_version(&o.etcd), None, "a voter did not answer");
        assert_eq!(cluster_version(&EtcdView::NotChecked), None);
    }
}
