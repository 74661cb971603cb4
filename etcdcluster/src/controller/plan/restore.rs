//! Restore (SPEC-day2.md section 2): a cluster created with `spec.restore` gets its first
//! member's data from the snapshot, and only while no member ever existed. Its download URL is
//! written to a Secret before the first Machine (which names it), kept fresh until the Machine
//! exists, and deleted once the first member is healthy and `status.restoredFrom` is recorded.

use std::time::Duration;

use etcdadm_shared::validation::major_minor;

use super::growth;
use super::observed::{Observed, RestoreView};
use super::placement;
use super::step::{Growth, Step, reason};

/// How long the presigned download URL is valid: the first Machine has this long from the
/// Secret's write to its download (its user data is rendered with the URL at once).
pub const RESTORE_URL_TTL: Duration = Duration::from_secs(3600);

/// The next restore step, if the restore has one.
pub(super) fn plan(o: &Observed) -> Option<Step> {
    let restore = o.restore.as_ref()?;
    if o.initialized_now() {
        // Status (written before every step) records `restoredFrom` first.
        return restore.secret_age.is_some().then_some(Step::DeleteRestoreSecret);
    }
    if restore.recorded || !o.machines.is_empty() {
        // The first Machine is on its way: its join is waited for like any first member's.
        return None;
    }
    if let Some(problem) = &restore.problem {
        return Some(Step::Refuse {
            reason: reason::RESTORE_SOURCE_UNUSABLE,
            message: format!(
                "spec.restore.snapshot: {problem}; no member Machine is created until it can be restored from"
            ),
        });
    }
    if let Some(refusal) = version_refusal(o, restore) {
        return Some(refusal);
    }
    if restore.secret_age.is_none_or(|age| age > RESTORE_URL_TTL / 2) {
        return Some(Step::WriteRestoreSecret);
    }
    let allowed = match placement::allowed_domains(o) {
        Ok(allowed) => allowed,
        Err(refusal) => return Some(refusal),
    };
    Some(growth::create_machine(o, &allowed, Growth::Restore))
}

/// A snapshot restores into the etcd minor version it was taken from.
fn version_refusal(o: &Observed, restore: &RestoreView) -> Option<Step> {
    let mismatch = minor_mismatch(o, restore.etcd_version.as_deref())?;
    Some(Step::Refuse {
        reason: reason::RESTORE_VERSION_MISMATCH,
        message: format!(
            "spec.restore.snapshot: {} {mismatch}; no member Machine is created until they match",
            restore.snapshot.as_deref().map_or_else(
                || "the snapshot".to_string(),
                |name| format!("EtcdadmSnapshot {name}")
            )
        ),
    })
}

/// Why a snapshot taken from etcd `taken` cannot be restored into the spec's version, when its
/// minor version differs (unknown versions are not judged).
pub(super) fn minor_mismatch(o: &Observed, taken: Option<&str>) -> Option<String> {
    let (field, wanted) = o.spec_version.as_ref()?;
    let taken = taken?;
    let (Some(wanted_mm), Some(taken_mm)) = (major_minor(wanted), major_minor(taken)) else {
        return None;
    };
    (wanted_mm != taken_mm).then(|| {
        format!(
            "was taken from etcd {taken}, and {field} is {wanted}: a restore needs the same minor version"
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use super::super::testing::*;
    use super::super::*;
    use super::RESTORE_URL_TTL;

    fn restoring(secret_age: Option<Duration>) -> Observed {
        let mut o = base();
        o.restore = Some(RestoreView {
            snapshot: Some("c0-snap".into()),
            location: Some("backups/c0/s.db".into()),
            revision: Some(1042),
            etcd_version: Some("3.5.9".into()),
            problem: None,
            secret_age,
            recorded: false,
        });
        o
    }

    #[test]
    fn the_download_url_is_written_before_the_first_machine_which_restores() {
        assert_eq!(plan(&restoring(None)), Step::WriteRestoreSecret);
        // A Secret older than half the URL's life is written anew before the Machine needs it.
        assert_eq!(plan(&restoring(Some(RESTORE_URL_TTL))), Step::WriteRestoreSecret);
        let step = plan(&restoring(Some(Duration::from_secs(5))));
        assert_eq!(
            step,
            Step::CreateMachine {
                name: "c1-etcd-fresh".into(),
                resume: false,
                failure_domain: None,
                purpose: Growth::Restore,
            }
        );
        let o = restoring(Some(Duration::from_secs(5)));
        let event = step.event(&o).unwrap();
        assert!(
            event
                .note
                .contains("restored from EtcdadmSnapshot c0-snap (backups/c0/s.db)"),
            "{}",
            event.note
        );
    }

    #[test]
    fn an_unusable_source_or_another_minor_version_is_refused_and_nothing_is_created() {
        let mut unusable = restoring(None);
        unusable.restore.as_mut().unwrap().problem =
            Some("EtcdadmSnapshot c0-snap is Failed, not Succeeded".into());
        let mut other_minor = restoring(None);
        other_minor.spec_version = Some((VERSION_FIELD.into(), "3.4.23".into()));
        for (o, why, says) in [
            (
                unusable,
                reason::RESTORE_SOURCE_UNUSABLE,
                "is Failed, not Succeeded",
            ),
            (
                other_minor,
                reason::RESTORE_VERSION_MISMATCH,
                "was taken from etcd 3.5.9",
            ),
        ] {
            let step = plan(&o);
            assert_eq!(wait_reason(&step), why, "{step:?}");
            assert!(step.is_refusal() && !step.writes());
            assert!(wait_message(&step).starts_with("spec.restore.snapshot: "));
            assert!(wait_message(&step).contains(says), "{step:?}");
        }
        let mut same_minor = restoring(Some(Duration::from_secs(5)));
        same_minor.spec_version = Some((VERSION_FIELD.into(), "3.5.17".into()));
        assert!(matches!(plan(&same_minor), Step::CreateMachine { .. }));
    }

    #[test]
    fn once_a_machine_exists_the_first_member_is_waited_for_as_usual() {
        let mut o = restoring(Some(Duration::from_secs(5)));
        o.machines.push(machine("c1-etcd-a", None, None));
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
        // A problem with the source no longer matters: the Machine has its URL.
        o.restore.as_mut().unwrap().problem = Some("EtcdadmSnapshot c0-snap not found".into());
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
    }

    #[test]
    fn never_on_a_cluster_that_had_a_member() {
        // Initialized: the Secret goes (status records restoredFrom first), nothing is restored.
        let mut o = running(3);
        o.restore = restoring(Some(Duration::from_secs(5))).restore;
        assert_eq!(plan(&o), Step::DeleteRestoreSecret);
        o.restore.as_mut().unwrap().secret_age = None;
        assert_eq!(plan(&o), Step::Steady);
        // Every Machine deleted after the cluster ran: no restore, whatever the spec says.
        let mut gone = restoring(None);
        gone.initialized = true;
        gone.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(wait_reason(&plan(&gone)), reason::QUORUM_LOST);
    }
}
