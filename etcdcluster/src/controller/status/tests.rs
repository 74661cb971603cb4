//! Tests of `status`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::observation::{
    CaView, InitSecret, MachineView, RecoveryRecord, RecoverySource, RecoveryView, RestoreView,
};
use crate::controller::plan::recovery::Recovery;
use crate::controller::plan::restore::view::RestoreFrom;
use crate::controller::testing::{RecoveryAction, RecoveryStep, base, reason};
use etcdadm_shared::api::cluster::RecoveryPhase;
use etcdadm_shared::api::cluster::condition::{
    CERTIFICATES_EXPIRING, MACHINES_SPEC_UP_TO_DATE, RECOVERY, RESIZE_COMPLETED,
};

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn observed(healthy: [bool; 2]) -> Observation {
    let machines: Vec<MachineView> = (0..2)
        .map(|i| MachineView {
            name: format!("m{i}"),
            address: Some(format!("10.0.0.{}", i + 1)),
            has_hook: true,
            ..Default::default()
        })
        .collect();
    let members = (0..2)
        .map(|i| MemberView {
            id: i as u64 + 10,
            name: format!("m{i}"),
            peer_urls: vec![names::peer_url(&format!("10.0.0.{}", i + 1))],
            client_urls: vec![names::client_url(&format!("10.0.0.{}", i + 1))],
            healthy: healthy[i],
            ever_healthy: true,
            is_leader: i == 0,
            message: (!healthy[i]).then(|| "connection refused".to_string()),
            machine: Some(format!("m{i}")),
            ..Default::default()
        })
        .collect();
    let mut o = base();
    o.machines = machines;
    o.etcd = EtcdView::Members(members);
    o.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: (0..2)
            .filter(|i| healthy[*i])
            .map(|i| names::client_url(&format!("10.0.0.{}", i + 1)))
            .collect(),
    });
    o
}

fn with_status(status: EtcdadmClusterStatus) -> EtcdadmCluster {
    let mut etcd = EtcdadmCluster::new("c1-etcd", Default::default());
    etcd.metadata.generation = Some(4);
    etcd.status = Some(status);
    etcd
}

#[test]
fn certificate_expiry_is_recorded_warned_about_once_and_kept_while_a_member_is_silent() {
    const DAY: i64 = 86_400;
    let now = 1000 * DAY;
    let ts = |secs: i64| k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
    let mut o = observed([true, true]);
    o.certificates.now = ts(now);
    o.certificates.ca_expiry = Some(ts(now + 3000 * DAY));
    o.certificates.apiserver_client_expiry = Some(ts(now + 200 * DAY));
    if let EtcdView::Members(members) = &mut o.etcd {
        members[0].certificate_expiry = Some(ts(now + 100 * DAY));
        members[1].certificate_expiry = Some(ts(now + 300 * DAY));
    }
    let step = crate::controller::plan::plan(&o);
    let (status, transitions) = next_status(&with_status(Default::default()), &o, &step, &at(now));
    assert_eq!(status.members[0].certificate_expiry, Some(at(now + 100 * DAY)));
    let certificates = status.certificates.clone().unwrap();
    assert_eq!(certificates.ca_expiry, Some(at(now + 3000 * DAY)));
    assert_eq!(certificates.apiserver_client_expiry, Some(at(now + 200 * DAY)));
    assert_eq!(certificates.next_expiry, Some(at(now + 100 * DAY)));
    let quiet = conditions::find(&status.conditions, CERTIFICATES_EXPIRING).unwrap();
    assert_eq!(quiet.status, conditions::ConditionStatus::False);
    assert!(transitions.iter().all(|t| t.reason != CERTIFICATES_EXPIRING));

    // A member inside the window, the CA inside its year: one Warning condition and Event.
    o.certificates.ca_expiry = Some(ts(now + 300 * DAY));
    if let EtcdView::Members(members) = &mut o.etcd {
        members[0].certificate_expiry = Some(ts(now + 10 * DAY));
        // The other one did not complete a handshake this round.
        members[1].certificate_expiry = None;
    }
    let previous = with_status(status);
    let (status, transitions) = next_status(&previous, &o, &crate::controller::plan::plan(&o), &at(now + 10));
    assert_eq!(
        status.members[1].certificate_expiry,
        Some(at(now + 300 * DAY)),
        "kept"
    );
    let warning = conditions::find(&status.conditions, CERTIFICATES_EXPIRING).unwrap();
    assert_eq!(warning.status, conditions::ConditionStatus::True);
    assert_eq!(warning.severity.as_deref(), Some("Warning"));
    let message = warning.message.clone().unwrap();
    assert!(
        message.contains("member of Machine m0: server certificate expires"),
        "{message}"
    );
    assert!(
        message.contains("the etcd CA in Secret c1-managed-etcd expires"),
        "{message}"
    );
    assert!(message.contains("rotate it by annotating"), "{message}");
    let events: Vec<&EventNote> = transitions
        .iter()
        .filter(|t| t.reason == CERTIFICATES_EXPIRING)
        .collect();
    assert_eq!(events.len(), 1, "{transitions:?}");
    assert!(events[0].warning && events[0].note == message);
    let machines = conditions::find(&status.conditions, MACHINES_SPEC_UP_TO_DATE).unwrap();
    assert_eq!(
        machines.status,
        conditions::ConditionStatus::True,
        "o was not re-observed"
    );
    // The same certificates next round: no second Event.
    let (_, transitions) = next_status(
        &with_status(status),
        &o,
        &crate::controller::plan::plan(&o),
        &at(now + 20),
    );
    assert!(transitions.iter().all(|t| t.reason != CERTIFICATES_EXPIRING));
}

#[test]
fn members_counts_and_contract_fields_are_filled() {
    let o = observed([true, true]);
    let step = crate::controller::plan::plan(&o);
    let (status, transitions) = next_status(&with_status(Default::default()), &o, &step, &at(100));
    assert!(status.initialized, "a member passed its health check");
    assert!(!status.ready, "2 of 3 replicas");
    assert_eq!(status.init_machine_address, "c1-etcd-init");
    assert_eq!(status.endpoints, "https://10.0.0.1:2379,https://10.0.0.2:2379");
    assert_eq!((status.ready_count, status.ready_replicas), (Some(2), Some(2)));
    assert_eq!(
        status.selector.as_deref(),
        Some("cluster.x-k8s.io/cluster-name=c1,cluster.x-k8s.io/etcd-cluster=c1-etcd")
    );
    assert_eq!(status.observed_generation, Some(4));
    let m0 = &status.members[0];
    assert_eq!(m0.member_id.as_deref(), Some("000000000000000a"));
    assert_eq!(m0.client_url.as_deref(), Some("https://10.0.0.1:2379"));
    assert_eq!(m0.peer_url.as_deref(), Some("https://10.0.0.1:2380"));
    assert!(m0.is_leader && m0.healthy && !m0.is_learner);
    assert_eq!(m0.last_healthy_time, Some(at(100)));
    let ready = conditions::find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason.as_deref(), Some(reason::SCALING_UP));
    let reasons: Vec<&str> = transitions.iter().map(|t| t.reason).collect();
    assert_eq!(reasons, ["MemberJoined", "MemberJoined", "Initialized"]);
}

#[test]
fn a_member_going_unhealthy_is_a_warning_and_keeps_its_last_healthy_time() {
    let before = observed([true, true]);
    let (old, _) = next_status(
        &with_status(Default::default()),
        &before,
        &crate::controller::plan::plan(&before),
        &at(100),
    );
    let after = observed([true, false]);
    let (status, transitions) = next_status(
        &with_status(old.clone()),
        &after,
        &crate::controller::plan::plan(&after),
        &at(200),
    );
    let m1 = &status.members[1];
    assert!(!m1.healthy);
    assert_eq!(m1.last_healthy_time, Some(at(100)));
    assert_eq!(m1.last_transition_time, Some(at(200)));
    assert_eq!(m1.message.as_deref(), Some("connection refused"));
    assert_eq!(status.members[0].last_transition_time, Some(at(100)));
    // With 2 voters, losing one loses quorum: both are worth a warning.
    let reasons: Vec<(bool, &str)> = transitions.iter().map(|t| (t.warning, t.reason)).collect();
    assert_eq!(reasons, [(true, "MemberUnhealthy"), (true, "QuorumLost")]);
    assert_eq!(transitions[0].note, "member m1 is unhealthy: connection refused");
    let members = conditions::find(&status.conditions, MEMBERS_HEALTHY).unwrap();
    assert_eq!(members.reason.as_deref(), Some("MembersUnhealthy"));
    // Unchanged observation: unchanged status, no Events.
    let (again, transitions) = next_status(
        &with_status(status.clone()),
        &after,
        &crate::controller::plan::plan(&after),
        &at(300),
    );
    assert_eq!(again.members, {
        let mut expected = status.members.clone();
        expected[0].last_healthy_time = Some(at(300));
        expected
    });
    assert!(transitions.is_empty());
    // Within the granularity, a healthy member's status does not change at all.
    let (soon, _) = next_status(
        &with_status(again.clone()),
        &after,
        &crate::controller::plan::plan(&after),
        &at(310),
    );
    assert_eq!(soon, {
        let mut expected = again.clone();
        expected.observed_generation = Some(4);
        expected
    });
}

#[test]
fn rollout_resize_and_refusals_show_in_conditions_and_events() {
    let mut o = observed([true, true]);
    o.replicas = 1;
    o.machines[0].outdated = Some("etcdadmConfigSpec changed (cloudInitConfig.version)".into());
    let step = crate::controller::plan::plan(&o);
    let (status, _) = next_status(&with_status(Default::default()), &o, &step, &at(1));
    assert_eq!(status.updated_replicas, Some(1));
    let (spec_status, spec_reason, spec_message) = {
        let c = conditions::find(&status.conditions, MACHINES_SPEC_UP_TO_DATE).unwrap();
        (c.status, c.reason.clone().unwrap(), c.message.clone().unwrap())
    };
    assert_eq!(spec_status, conditions::ConditionStatus::False);
    assert_eq!(spec_reason, reason::ROLLING_UPDATE);
    assert!(
        spec_message.contains("m0 (etcdadmConfigSpec changed"),
        "{spec_message}"
    );
    let resize = conditions::find(&status.conditions, RESIZE_COMPLETED).unwrap();
    assert_eq!(resize.reason.as_deref(), Some(reason::ROLLING_UPDATE));
    // Health lost mid-way: the rollout is paused, with a warning Event.
    let mut sick = observed([true, true]);
    sick.machines[0].outdated = Some("outdated".into());
    sick.machines.push(MachineView {
        name: "m2".into(),
        address: Some("10.0.0.3".into()),
        has_hook: true,
        ..Default::default()
    });
    if let EtcdView::Members(members) = &mut sick.etcd {
        members.push(MemberView {
            id: 12,
            name: "m2".into(),
            peer_urls: vec![names::peer_url("10.0.0.3")],
            client_urls: vec![names::client_url("10.0.0.3")],
            healthy: false,
            ever_healthy: true,
            message: Some("connection refused".into()),
            machine: Some("m2".into()),
            ..Default::default()
        });
    }
    sick.init_secret = Some(InitSecret {
        address: Some("10.0.0.1".into()),
        client_urls: healthy_client_urls(&sick),
    });
    let step = crate::controller::plan::plan(&sick);
    let (status, transitions) = next_status(&with_status(Default::default()), &sick, &step, &at(2));
    let spec = conditions::find(&status.conditions, MACHINES_SPEC_UP_TO_DATE).unwrap();
    assert_eq!(spec.reason.as_deref(), Some(reason::ROLLOUT_PAUSED), "{step:?}");
    assert!(
        transitions
            .iter()
            .any(|t| t.warning && t.reason == reason::ROLLOUT_PAUSED),
        "{transitions:?}"
    );
    // Scaling down: said so.
    let mut down = observed([true, true]);
    down.replicas = 1;
    let (status, _) = next_status(
        &with_status(Default::default()),
        &down,
        &crate::controller::plan::plan(&down),
        &at(3),
    );
    let resize = conditions::find(&status.conditions, RESIZE_COMPLETED).unwrap();
    assert_eq!(resize.reason.as_deref(), Some(reason::SCALING_DOWN));
    assert_eq!(resize.message.as_deref(), Some("2 Machines for 1 replicas"));
}

#[test]
fn an_alarm_makes_ready_false_with_its_reason_sizes_and_one_warning() {
    use crate::controller::observation::{Alarm, AlarmKind};
    let mut o = crate::controller::testing::running(3);
    let ready_status = next_status(&with_status(Default::default()), &o, &Step::Steady, &at(1)).0;
    assert!(ready_status.ready);
    o.alarms = vec![Alarm {
        member_id: 1,
        kind: AlarmKind::NoSpace,
    }];
    if let EtcdView::Members(members) = &mut o.etcd {
        for m in members.iter_mut() {
            m.db_size = Some(2 << 30);
            m.quota_reported = true;
            m.revision = Some(7);
            m.history_compacted = Some(true);
            m.defragmented_at = Some(7);
        }
        members[0].alarms = vec!["NOSPACE".into()];
    }
    let step = crate::controller::plan::plan(&o);
    let (status, transitions) = next_status(&with_status(ready_status), &o, &step, &at(2));
    assert!(!status.ready);
    let ready = conditions::find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason.as_deref(), Some(reason::DATABASE_QUOTA_EXCEEDED));
    let message = ready.message.clone().unwrap_or_default();
    assert!(
        message.contains("c1-etcd-m0 2.0 GiB of 2.0 GiB, c1-etcd-m1 2.0 GiB of 2.0 GiB"),
        "{message}"
    );
    assert_eq!(status.members[0].alarms, ["NOSPACE"]);
    assert_eq!(status.members[0].quota_backend_bytes, Some(2 << 30));
    assert_eq!(
        conditions::find(&status.conditions, MEMBERS_HEALTHY).map(|c| c.status),
        Some(conditions::ConditionStatus::True),
        "members serving with an alarm are healthy"
    );
    let raised: Vec<&EventNote> = transitions.iter().filter(|t| t.reason == "AlarmRaised").collect();
    assert_eq!(raised.len(), 1, "{transitions:?}");
    assert!(
        raised[0].warning && raised[0].note.contains("NOSPACE"),
        "{raised:?}"
    );
    let (_, again) = next_status(&with_status(status), &o, &step, &at(3));
    assert!(!again.iter().any(|t| t.reason == "AlarmRaised"), "{again:?}");
}

#[test]
fn a_refusal_is_an_error_condition_and_one_event() {
    let mut o = observed([true, true]);
    o.ca = CaView::Corrupt("Secret default/c1-managed-etcd has no tls.key".into());
    let step = crate::controller::plan::plan(&o);
    let (status, transitions) = next_status(&with_status(Default::default()), &o, &step, &at(1));
    let ready = conditions::find(&status.conditions, READY).unwrap();
    assert_eq!(ready.reason.as_deref(), Some(reason::CA_CORRUPT));
    assert_eq!(ready.severity.as_deref(), Some("Error"));
    assert!(
        transitions
            .iter()
            .any(|t| t.warning && t.reason == reason::CA_CORRUPT)
    );
    let (_, again) = next_status(&with_status(status), &o, &step, &at(2));
    assert!(!again.iter().any(|t| t.reason == reason::CA_CORRUPT));
}

#[test]
fn a_recovery_request_on_a_ready_cluster_is_answered_in_its_own_condition_and_one_event() {
    let mut o = observed([true, true]);
    o.replicas = 1;
    o.machines.pop();
    if let EtcdView::Members(members) = &mut o.etcd {
        members.pop();
    }
    o.view_mut::<Recovery>().unwrap().view = Some(RecoveryView {
        requested: Some("latest".into()),
        store_configured: true,
        ..Default::default()
    });
    let step = crate::controller::plan::plan(&o);
    let (status, transitions) = next_status(&with_status(Default::default()), &o, &step, &at(1));
    assert!(status.ready, "Ready stays what it is");
    let answer = conditions::find(&status.conditions, RECOVERY).unwrap();
    assert_eq!(answer.reason.as_deref(), Some(reason::RECOVERY_REFUSED));
    assert!(answer.message.as_deref().unwrap().contains("quorum is not lost"));
    let warnings: Vec<&EventNote> = transitions.iter().filter(|t| t.warning).collect();
    assert_eq!(warnings.len(), 1, "{transitions:?}");
    assert_eq!(warnings[0].reason, reason::RECOVERY_REFUSED);
    let (status, again) = next_status(&with_status(status), &o, &step, &at(2));
    assert!(!again.iter().any(|t| t.warning), "{again:?}");
    // The annotation removed: the condition goes with it.
    o.view_mut::<Recovery>().unwrap().view = None;
    let (status, _) = next_status(
        &with_status(status),
        &o,
        &crate::controller::plan::plan(&o),
        &at(3),
    );
    assert!(conditions::find(&status.conditions, RECOVERY).is_none());
}

#[test]
fn a_recovery_is_recorded_before_each_step_and_summed_up_once_back() {
    let o = observed([true, true]);
    let record = RecoveryRecord {
        requested: "latest".into(),
        source: RecoverySource::Member("m0".into()),
        phase: RecoveryPhase::Snapshotting,
        snapshot: "c1-etcd-x-recovery".into(),
        survivor_revision: Some(120),
    };
    let step = |phase, action| {
        Step::Recover(RecoveryStep {
            record: Box::new(RecoveryRecord {
                phase,
                ..record.clone()
            }),
            action,
        })
    };
    let snapshot = step(
        RecoveryPhase::Snapshotting,
        RecoveryAction::SnapshotSurvivor { machine: "m0".into() },
    );
    let (status, _) = next_status(&with_status(Default::default()), &o, &snapshot, &at(1));
    let recorded = status.recovery.clone().unwrap();
    assert_eq!(
        (recorded.source.as_str(), recorded.phase, recorded.started.clone()),
        ("member/m0", RecoveryPhase::Snapshotting, Some(at(1)))
    );
    // The reset forgets `initialized`; the start time stays.
    let mut before = status.clone();
    before.initialized = true;
    let (status, _) = next_status(
        &with_status(before),
        &o,
        &step(RecoveryPhase::Restoring, RecoveryAction::Reset { cluster: None }),
        &at(2),
    );
    assert!(!status.initialized);
    let recorded = status.recovery.clone().unwrap();
    assert_eq!(
        (recorded.phase, recorded.started),
        (RecoveryPhase::Restoring, Some(at(1)))
    );
    // Back: the last recovery is written; the record stays until the annotation is gone.
    let mut back = o.clone();
    back.view_mut::<Recovery>().unwrap().view = Some(RecoveryView {
        requested: Some("latest".into()),
        ..Default::default()
    });
    back.view_mut::<RestoreFrom>().unwrap().view = Some(RestoreView {
        revision: Some(100),
        ..Default::default()
    });
    let finish = step(RecoveryPhase::Restoring, RecoveryAction::Finish);
    let (status, _) = next_status(&with_status(status), &back, &finish, &at(3));
    let last = status.last_recovery.clone().unwrap();
    assert_eq!((last.revision, last.revisions_lost), (Some(100), Some(20)));
    assert_eq!(
        (last.started.clone(), last.time.clone()),
        (Some(at(1)), Some(at(3)))
    );
    assert!(status.recovery.is_some());
    back.view_mut::<Recovery>()
        .unwrap()
        .view
        .as_mut()
        .unwrap()
        .requested = None;
    let (status, _) = next_status(&with_status(status), &back, &finish, &at(4));
    assert!(status.recovery.is_none());
    assert_eq!(status.last_recovery, Some(last), "written once");
}

#[test]
fn the_cluster_version_comes_from_the_members_answers_and_stays_while_one_is_silent() {
    let mut o = observed([true, true]);
    if let EtcdView::Members(members) = &mut o.etcd {
        members[0].etcd_version = Some("3.5.9".into());
        members[1].etcd_version = Some("3.5.1".into());
    }
    let (status, _) = next_status(
        &with_status(Default::default()),
        &o,
        &crate::controller::plan::plan(&o),
        &at(1),
    );
    assert_eq!(status.cluster_version.as_deref(), Some("3.5.0"));
    if let EtcdView::Members(members) = &mut o.etcd {
        members[1].etcd_version = None;
    }
    let (later, _) = next_status(
        &with_status(status),
        &o,
        &crate::controller::plan::plan(&o),
        &at(2),
    );
    assert_eq!(later.cluster_version.as_deref(), Some("3.5.0"));
}

#[test]
fn a_voter_whose_machine_went_while_no_member_answers_stays_recorded_until_a_member_list_says() {
    let mut o = observed([true, true]);
    o.initialized = true;
    let step = crate::controller::plan::plan(&o);
    let (status, _) = next_status(&with_status(Default::default()), &o, &step, &at(1));
    assert_eq!(status.members.len(), 2);
    // Machine m1 goes while no member answers: m1 stays, without health, as the voting member
    // last recorded.
    o.machines.truncate(1);
    o.etcd = EtcdView::Unreachable {
        message: "timed out".into(),
    };
    let step = crate::controller::plan::plan(&o);
    let (silent, _) = next_status(&with_status(status.clone()), &o, &step, &at(2));
    let names: Vec<&str> = silent.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m0", "m1"]);
    let kept = &silent.members[1];
    assert!(!kept.healthy && !kept.is_learner, "{kept:?}");
    assert_eq!(kept.member_id.as_deref(), Some("000000000000000b"));
    assert!(
        kept.message.as_deref().unwrap().contains("Machine is gone"),
        "{kept:?}"
    );
    // And the next silent round keeps it too.
    let (still, _) = next_status(&with_status(silent.clone()), &o, &step, &at(3));
    assert_eq!(still.members.len(), 2);
    // A member list answers again: it says who the members are (m1 was removed meanwhile).
    let mut answered = observed([true, true]);
    answered.initialized = true;
    answered.machines.truncate(1);
    if let EtcdView::Members(members) = &mut answered.etcd {
        members.truncate(1);
    }
    let step = crate::controller::plan::plan(&answered);
    let (listed, _) = next_status(&with_status(still), &answered, &step, &at(4));
    let names: Vec<&str> = listed.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m0"]);
    // A learner, or a cluster never initialized, keeps nothing.
    let mut learner = status.clone();
    learner.members[1].is_learner = true;
    let (gone, _) = next_status(&with_status(learner), &o, &step_of(&o), &at(5));
    assert_eq!(gone.members.len(), 1);
    let mut fresh = o.clone();
    fresh.initialized = false;
    let (gone, _) = next_status(&with_status(status), &fresh, &step_of(&fresh), &at(6));
    assert_eq!(gone.members.len(), 1);
}

fn step_of(o: &Observation) -> Step {
    crate::controller::plan::plan(o)
}
