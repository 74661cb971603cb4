//! Tests of `restore`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::observation::RestoreSecretView;
use crate::controller::plan::restore::view::RestoreFrom;
use crate::controller::testing::reason;
use crate::controller::testing::*;
use std::time::Duration;

use super::{RESTORE_URL_RENEW_AFTER, RESTORE_URL_TTL};
use crate::controller::plan::versions::VERSION_FIELD;

fn restoring(secret_age: Option<Duration>) -> Observation {
    let mut o = base();
    let mut restore = RestoreView {
        snapshot: Some("c0-snap".into()),
        location: Some("backups/c0/s.db".into()),
        revision: Some(1042),
        etcd_version: Some("3.5.9".into()),
        problem: None,
        secret_age: None,
        secret: None,
        recorded: false,
        download: Some(download()),
        deltas: None,
        deltas_unusable_age: None,
    };
    if let Some(age) = secret_age {
        with_our_secret(&mut restore, age);
    }
    o.view_mut::<RestoreFrom>().unwrap().view = Some(restore);
    o
}

#[test]
fn the_download_url_is_written_before_the_first_machine_which_restores() {
    assert_eq!(plan(&restoring(None)), write_restore_secret());
    // A Secret older than the renewal age is renewed (ours, at the version seen) before
    // the Machine needs it, so a boot gets most of the URL's life.
    const { assert!(RESTORE_URL_RENEW_AFTER.as_secs() * 4 <= RESTORE_URL_TTL.as_secs()) };
    assert_eq!(
        plan(&restoring(Some(RESTORE_URL_RENEW_AFTER + Duration::from_secs(1)))),
        Step::Restore(RestoreStep::WriteRestoreSecret {
            download: Box::new(download()),
            checksum: ChecksumPlan::Known(snapshot_checksum()),
            existing: Some("7".into()),
        })
    );
    let step = plan(&restoring(Some(Duration::from_secs(5))));
    assert_eq!(
        step,
        created_machine("c1-etcd-fresh", false, None, Growth::Restore)
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
    let written = write_restore_secret().event(&o).unwrap();
    assert!(
        written.note.contains(&format!(
            "checks the file's SHA-256 {} (from the EtcdadmSnapshot)",
            "ab".repeat(32)
        )),
        "{}",
        written.note
    );
}

#[test]
fn without_a_recorded_sha256_the_controller_computes_one_and_keeps_it() {
    let mut o = restoring(None);
    let download = o
        .view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .download
        .as_mut()
        .unwrap();
    download.checksum = None;
    download.size = Some(4128);
    let step = plan(&o);
    assert!(
        matches!(
            &step,
            Step::Restore(RestoreStep::WriteRestoreSecret {
                checksum: ChecksumPlan::Compute { size: 4128 },
                existing: None,
                ..
            })
        ),
        "{step:?}"
    );
    assert!(
        step.event(&o)
            .unwrap()
            .note
            .contains("computed by reading the object")
    );
    // Neither a SHA-256 nor a size: nothing to check against, nothing created.
    o.view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .download
        .as_mut()
        .unwrap()
        .size = None;
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::RESTORE_SOURCE_UNUSABLE);
    assert!(step.is_refusal() && !step.writes());
}

#[test]
fn a_restore_secret_that_is_not_ours_is_refused_and_never_touched() {
    let mut o = restoring(Some(Duration::from_secs(5)));
    o.view_mut::<RestoreFrom>().unwrap().view.as_mut().unwrap().secret = Some(RestoreSecretView {
        ours: false,
        uid: "someone-else".into(),
        resource_version: "3".into(),
        checksum: None,
        deltas_unusable: None,
    });
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::RESTORE_SECRET_NOT_OURS);
    assert!(step.is_refusal() && !step.writes());
    assert!(
        wait_message(&step).contains("Secret c1-etcd-restore exists"),
        "{step:?}"
    );
    // Once the cluster runs, a foreign Secret of that name is left alone too.
    let mut done = running(3);
    done.view_mut::<RestoreFrom>().unwrap().view = o.view::<RestoreFrom>().view.clone();
    assert_eq!(plan(&done), Step::Steady);
}

#[test]
fn an_unusable_source_or_another_minor_version_is_refused_and_nothing_is_created() {
    let mut unusable = restoring(None);
    unusable
        .view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .problem = Some("EtcdadmSnapshot c0-snap is Failed, not Succeeded".into());
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
    assert!(matches!(
        plan(&same_minor),
        Step::Machines(MachineStep::CreateMachine { .. })
    ));
}

#[test]
fn once_a_machine_exists_the_first_member_is_waited_for_as_usual() {
    let mut o = restoring(Some(Duration::from_secs(5)));
    o.machines.push(machine("c1-etcd-a", None, None));
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
    // A problem with the source no longer matters: the Machine has its URL.
    o.view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .problem = Some("EtcdadmSnapshot c0-snap not found".into());
    assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
}

/// `running(3)` restored from `c0-snap` at revision 1042 (`bumped` or not), now at
/// `revision`, Ready, with a KubeadmControlPlane using it last rolled for `rolled`.
fn restored(bumped: bool, revision: i64, rolled: Option<&str>) -> Observation {
    let mut o = running(3);
    for m in members_mut(&mut o) {
        m.revision = Some(revision);
    }
    let urls = voting_endpoints(&o);
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    o.kcp = kcp(&refs, false, true);
    if let KcpView::Found { rollout_after, .. } = &mut o.kcp {
        *rollout_after = rolled.map(|t| t.parse().unwrap());
    }
    o.creation_complete = true;
    o.etcd_cluster.status = Some(EtcdadmClusterStatus {
        restored_from: Some(RestoredFrom {
            snapshot: Some("c0-snap".into()),
            revision: Some(1042),
            time: Some(Time("2026-11-25T10:00:00Z".parse().unwrap())),
            revision_bumped: Some(bumped),
            ..Default::default()
        }),
        ..Default::default()
    });
    o
}

#[test]
fn the_restore_secret_asks_for_the_bump_and_the_member_tells_whether_it_happened() {
    let o = restored(true, 1042 + RESTORE_REVISION_BUMP + 7, None);
    assert!(revision_bumped(&o, Some(1042)));
    let not = restored(false, 1049, None);
    assert!(!revision_bumped(&not, Some(1042)));
    // An object with no known revision: bumped when above the bump itself.
    assert!(revision_bumped(&o, None) && !revision_bumped(&not, None));
    let bumped = revisions_condition(o.etcd_cluster.status.as_ref().unwrap()).unwrap();
    assert_eq!(bumped.status, etcdadm_shared::api::ConditionStatus::True);
    let fallback = revisions_condition(not.etcd_cluster.status.as_ref().unwrap()).unwrap();
    assert_eq!(
        (fallback.reason.as_str(), fallback.severity),
        ("RevisionsNotBumped", Some(Severity::Warning))
    );
    assert!(fallback.message.contains("etcd 3.5.10"), "{}", fallback.message);
    // Nothing restored: no condition.
    assert_eq!(revisions_condition(&EtcdadmClusterStatus::default()), None);
}

#[test]
fn the_control_plane_is_rolled_once_after_a_restore_bumped_or_not() {
    for bumped in [true, false] {
        let o = restored(bumped, 2_000_000_000, None);
        let step = plan(&o);
        let Step::Restore(RestoreStep::RollControlPlane { kcp, after }) = &step else {
            panic!("{step:?}")
        };
        assert_eq!(
            (kcp.as_str(), after.to_string().as_str()),
            ("c1-cp", "2026-11-25T10:00:00Z")
        );
        assert!(step.event(&o).unwrap().note.contains("watch caches"));
        // Status records it before the step; the KCP then carries it: never again.
        let mut status = o.etcd_cluster.status.clone().unwrap();
        record_rollout(&mut status, after);
        assert_eq!(
            status.restored_from.as_ref().unwrap().control_plane_rollout,
            Some(Time(*after))
        );
        let mut recorded = o.clone();
        recorded.etcd_cluster.status = Some(status);
        assert_eq!(plan(&recorded), Step::Steady);
        assert_eq!(
            plan(&restored(bumped, 2_000_000_000, Some("2026-11-25T10:00:00Z"))),
            Step::Steady
        );
    }
    // Not before the cluster is Ready, and never for a restore an earlier version recorded.
    let mut sick = restored(true, 2_000_000_000, None);
    members_mut(&mut sick)[0].healthy = false;
    assert_eq!(control_plane_rollout(&sick), None);
    let mut older = restored(true, 2_000_000_000, None);
    if let Some(status) = older.etcd_cluster.status.as_mut() {
        status.restored_from.as_mut().unwrap().revision_bumped = None;
    }
    assert_eq!(plan(&older), Step::Steady);
}

#[test]
fn never_on_a_cluster_that_had_a_member() {
    // Initialized: our Secret goes (status records restoredFrom first), nothing is restored.
    let mut o = running(3);
    o.view_mut::<RestoreFrom>().unwrap().view = restoring(Some(Duration::from_secs(5)))
        .view::<RestoreFrom>()
        .view
        .clone();
    assert_eq!(
        plan(&o),
        Step::Restore(RestoreStep::DeleteRestoreSecret {
            uid: "restore-uid".into()
        })
    );
    o.view_mut::<RestoreFrom>().unwrap().view.as_mut().unwrap().secret = None;
    assert_eq!(plan(&o), Step::Steady);
    // Every Machine deleted after the cluster ran: no restore, whatever the spec says.
    let mut gone = restoring(None);
    gone.initialized = true;
    gone.etcd = EtcdView::Unreachable {
        message: "connection refused".into(),
    };
    assert_eq!(wait_reason(&plan(&gone)), reason::MEMBERS_UNREACHABLE);
}

#[test]
fn status_records_the_sha256_the_member_checked_and_its_source() {
    let o = {
        let mut o = running(3);
        o.etcd_cluster.spec.restore = Some(Default::default());
        o.view_mut::<RestoreFrom>().unwrap().view = restoring(Some(Duration::from_secs(5)))
            .view::<RestoreFrom>()
            .view
            .clone();
        o
    };
    let mut status = EtcdadmClusterStatus::default();
    let now = Time(Timestamp::UNIX_EPOCH);
    record_status(&mut status, &o, true, &now).unwrap();
    let from = status.restored_from.unwrap();
    assert_eq!(from.sha256, Some("ab".repeat(32)));
    assert_eq!(from.sha256_source, Some(ChecksumSource::EtcdadmSnapshot));
    assert_eq!(from.revision, Some(1042));
}

/// `running(1)` restored from `c0-snap` with `spec.restore.to` latest: its member healthy,
/// the deltas not yet recorded as replayed.
fn replaying() -> Observation {
    let mut o = running(1);
    o.etcd_cluster.spec.restore = Some(Default::default());
    let mut view = restoring(Some(Duration::from_secs(5)))
        .view::<RestoreFrom>()
        .view
        .clone()
        .unwrap();
    view.deltas = Some(DeltasPlan {
        key: "c0/s.db".into(),
        base: 1042,
        recorded: Some(1500),
        target: etcdadm_shared::backup::delta::chain::Target::Latest,
    });
    o.view_mut::<RestoreFrom>().unwrap().view = Some(view);
    o
}

#[test]
fn deltas_are_replayed_onto_the_restored_member_before_its_secret_goes_or_anyone_joins() {
    let o = replaying();
    let step = plan(&o);
    let Step::Restore(RestoreStep::ReplayDeltas { member, url }) = &step else {
        panic!("{step:?}")
    };
    assert_eq!(member, &o.members()[0].name);
    assert!(url.starts_with("https://"), "{url}");
    assert!(
        step.event(&o)
            .unwrap()
            .note
            .contains("deltas replayed after it to latest")
    );
    // Status waits for the replay to record the restore, deltas and all.
    let mut status = EtcdadmClusterStatus::default();
    assert_eq!(
        record_status(&mut status, &o, true, &Time(Timestamp::UNIX_EPOCH)),
        None
    );
    assert_eq!(status.restored_from, None);
    // Once recorded, the Secret goes and the cluster grows as any other.
    let mut done = o.clone();
    done.etcd_cluster.status = Some(EtcdadmClusterStatus {
        restored_from: Some(RestoredFrom {
            deltas: Some(DeltasRestored {
                to: "latest".into(),
                objects: 3,
                events: 40,
                revision: 1500,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(!deltas_pending(&done));
    assert_eq!(
        plan(&done),
        Step::Restore(RestoreStep::DeleteRestoreSecret {
            uid: "restore-uid".into()
        })
    );
}

#[test]
fn deltas_wait_for_a_member_that_answers_and_a_store_that_can_be_read() {
    let mut silent = replaying();
    silent.initialized = true;
    members_mut(&mut silent)[0].healthy = false;
    let step = plan(&silent);
    assert!(
        matches!(&step, Step::Hold(h) if h.reason == RESTORING && h.message.contains("restored member to answer")),
        "{step:?}"
    );
    let mut unusable = replaying();
    unusable
        .view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .problem = Some("its store cannot be used: no credentials".into());
    let step = plan(&unusable);
    assert!(
        matches!(&step, Step::Hold(h) if h.reason == reason::RESTORE_SOURCE_UNUSABLE && h.message.contains("no credentials")),
        "{step:?}"
    );
}

#[test]
fn deltas_found_unusable_hold_the_restore_saying_why_until_read_again() {
    let mut o = replaying();
    let restore = o.view_mut::<RestoreFrom>().unwrap().view.as_mut().unwrap();
    restore.secret.as_mut().unwrap().deltas_unusable = Some((
        "delta object c0/s.db.deltas/00000002 is damaged".into(),
        Timestamp::UNIX_EPOCH,
    ));
    restore.deltas_unusable_age = Some(DELTAS_RECHECK_AFTER - Duration::from_secs(1));
    let step = plan(&o);
    assert!(
        matches!(&step, Step::Hold(h) if h.reason == reason::RESTORE_DELTAS_UNUSABLE
            && h.message.contains("00000002 is damaged")
            && h.message.contains("nothing of them was written")),
        "{step:?}"
    );
    assert!(step.is_refusal());
    assert!(deltas_pending(&o), "not Ready");
    // Read again once the time is up.
    o.view_mut::<RestoreFrom>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .deltas_unusable_age = Some(DELTAS_RECHECK_AFTER);
    assert!(matches!(
        plan(&o),
        Step::Restore(RestoreStep::ReplayDeltas { .. })
    ));
}

#[test]
fn a_recovery_records_its_deltas_in_its_own_status() {
    let mut o = replaying();
    o.etcd_cluster.spec.restore = None;
    o.etcd_cluster.status = Some(EtcdadmClusterStatus {
        recovery: Some(etcdadm_shared::api::cluster::RecoveryStatus {
            phase: etcdadm_shared::api::cluster::RecoveryPhase::Restoring,
            snapshot: "c0-snap".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(matches!(
        plan(&o),
        Step::Restore(RestoreStep::ReplayDeltas { .. })
    ));
    if let Some(recovery) = o.etcd_cluster.status.as_mut().and_then(|s| s.recovery.as_mut()) {
        recovery.deltas = Some(DeltasRestored::default());
    }
    assert!(!matches!(
        plan(&o),
        Step::Restore(RestoreStep::ReplayDeltas { .. })
    ));
}
