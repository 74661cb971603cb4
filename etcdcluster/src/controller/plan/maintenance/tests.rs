//! Tests of `maintenance`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::plan::recovery::Recovery;
use crate::controller::plan::restore::view::RestoreFrom;
use crate::controller::plan::safe_changes::SafeChangeView;
use crate::controller::plan::{Step, plan};
use crate::controller::testing::*;
use etcdadm_shared::api::MemberStatus;
use serde_json::json;

const MIB: i64 = 1 << 20;

/// `running(3)` (m0 the leader) at noon, every member a 300 MiB database of which 100 MiB is
/// in use (67% free), never defragmented, revision 900.
fn fragmented() -> Observation {
    let mut o = running(3);
    o.certificates.now = "2026-03-01T12:00:00Z".parse().unwrap();
    for m in members_mut(&mut o) {
        m.db_size = Some(300 * MIB);
        m.db_size_in_use = Some(100 * MIB);
        m.revision = Some(900);
    }
    o.etcd_cluster.status = Some(EtcdadmClusterStatus {
        members: o
            .members()
            .iter()
            .map(|m| MemberStatus {
                name: m.name.clone(),
                member_id: Some(member_id_hex(m.id)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    o.etcd_cluster.spec.replicas = Some(3);
    o
}

fn policy(o: &mut Observation, policy: serde_json::Value) {
    o.etcd_cluster.spec.maintenance = serde_json::from_value(json!({ "defragmentation": policy })).unwrap();
}

/// Apply a routine defragmentation as etcd and the status would: the member shrinks to what
/// it uses, the status records when.
fn take(o: &mut Observation, step: &Step) -> String {
    let Step::Maintenance(MaintenanceStep::Defragment { target, .. }) = step else {
        panic!("not a defragmentation: {step:?}");
    };
    let now = o.certificates.now;
    let member = members_mut(o)
        .iter_mut()
        .find(|m| m.id == target.member_id)
        .unwrap();
    member.db_size = member.db_size_in_use;
    let status = o.etcd_cluster.status.as_mut().unwrap();
    record_defragmentation(
        status,
        target.member_id,
        Defragmentation {
            time: Time(now),
            revision: target.revision,
            size_before: i64::try_from(target.db_size).unwrap(),
            size_after: 100 * MIB,
            disarmed: None,
        },
    );
    target.member.clone()
}

#[test]
fn fragmented_members_go_one_at_a_time_followers_first_the_leader_last() {
    let mut o = fragmented();
    let mut order = vec![];
    for _ in 0..5 {
        let step = plan(&o);
        if step == Step::Steady {
            break;
        }
        assert_eq!(step.reason().0, "Ready", "Ready stays True: {step:?}");
        let event = step.event(&o).unwrap();
        assert!(!event.warning);
        assert_eq!(event.reason, "MemberDefragmented");
        order.push(take(&mut o, &step));
    }
    assert_eq!(
        order,
        [
            "member of Machine c1-etcd-m1",
            "member of Machine c1-etcd-m2",
            "member of Machine c1-etcd-m0"
        ]
    );
    assert!(o.members()[0].is_leader);
}

#[test]
fn thresholds_are_openshifts_unless_the_policy_says_otherwise() {
    let step_for = |size: i64, in_use: i64, quota: Option<u64>, p: serde_json::Value| {
        let mut o = fragmented();
        policy(&mut o, p);
        for m in members_mut(&mut o) {
            m.db_size = Some(size);
            m.db_size_in_use = Some(in_use);
            m.quota_backend_bytes = quota;
        }
        match plan(&o) {
            Step::Maintenance(MaintenanceStep::Defragment { why, .. }) => Some(why),
            Step::Steady => None,
            other => panic!("{other:?}"),
        }
    };
    let defaults = json!({});
    // 45% free of at least 100 MiB.
    assert_eq!(
        step_for(200 * MIB, 110 * MIB, None, defaults.clone()).as_deref(),
        Some("45% of its 200.0 MiB is free space")
    );
    assert_eq!(
        step_for(200 * MIB, 111 * MIB, None, defaults.clone()),
        None,
        "44%"
    );
    assert_eq!(
        step_for(99 * MIB, 10 * MIB, None, defaults.clone()),
        None,
        "too small to matter"
    );
    // 80% of the quota with 100 MiB free: 820 of a 1 GiB quota, 120 MiB free (14%).
    let gib = Some(1 << 30);
    assert_eq!(
        step_for(820 * MIB, 700 * MIB, gib, defaults.clone()).as_deref(),
        Some("its 820.0 MiB is 80% of its 1.0 GiB quota, 120.0 MiB of it free")
    );
    assert_eq!(
        step_for(820 * MIB, 730 * MIB, gib, defaults.clone()),
        None,
        "90 MiB free"
    );
    assert_eq!(
        step_for(800 * MIB, 600 * MIB, gib, defaults),
        None,
        "78% of the quota, 25% free"
    );
    // The policy's own thresholds.
    let strict = json!({"fragmentedPercent": 60, "minimumSize": "1Gi", "quotaPercent": 50, "minimumReclaimable": "10Mi"});
    assert_eq!(
        step_for(600 * MIB, 200 * MIB, gib, strict.clone()).as_deref(),
        Some("its 600.0 MiB is 58% of its 1.0 GiB quota, 400.0 MiB of it free")
    );
    assert_eq!(step_for(400 * MIB, 300 * MIB, gib, strict), None);
}

#[test]
fn each_member_waits_its_interval_after_its_last_defragmentation() {
    let mut o = fragmented();
    let step = plan(&o);
    take(&mut o, &step);
    // It did not shrink (its space was history not yet compacted): not again for 10 minutes.
    members_mut(&mut o)[1].db_size = Some(300 * MIB);
    let next = plan(&o);
    assert!(
        matches!(&next, Step::Maintenance(MaintenanceStep::Defragment { target, .. }) if target.member.ends_with("m2")),
        "{next:?}"
    );
    take(&mut o, &next);
    members_mut(&mut o)[2].db_size = Some(300 * MIB);
    let last = plan(&o);
    take(&mut o, &last);
    members_mut(&mut o)[0].db_size = Some(300 * MIB);
    assert_eq!(plan(&o), Step::Steady);
    o.certificates.now = "2026-03-01T12:09:59Z".parse().unwrap();
    assert_eq!(plan(&o), Step::Steady);
    o.certificates.now = "2026-03-01T12:10:00Z".parse().unwrap();
    assert!(matches!(plan(&o), Step::Maintenance(_)));
    policy(&mut o, json!({"interval": "1h"}));
    assert_eq!(plan(&o), Step::Steady);
}

#[test]
fn only_inside_the_window() {
    let mut o = fragmented();
    policy(
        &mut o,
        json!({"window": {"start": "0 2 * * *", "duration": "3h"}}),
    );
    assert_eq!(plan(&o), Step::Steady, "noon is outside 02:00-05:00");
    o.certificates.now = "2026-03-01T04:59:00Z".parse().unwrap();
    assert!(matches!(plan(&o), Step::Maintenance(_)));
    policy(&mut o, json!({"window": {"start": "not cron", "duration": "3h"}}));
    assert_eq!(plan(&o), Step::Steady, "a window nobody can read never opens");
}

#[test]
fn off_for_one_member_unless_asked_and_off_when_asked() {
    let mut one = fragmented();
    one.etcd_cluster.spec.replicas = Some(1);
    assert!(routine(&one).is_none());
    policy(&mut one, json!({"mode": "Automatic"}));
    assert!(routine(&one).is_some());
    let mut off = fragmented();
    policy(&mut off, json!({"mode": "Off"}));
    assert_eq!(plan(&off), Step::Steady);
}

#[test]
fn never_while_anything_else_is_under_way() {
    type Change = Box<dyn Fn(&mut Observation)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "a learner joining",
            Box::new(|o| members_mut(o)[2].is_learner = true),
        ),
        (
            "an unhealthy member",
            Box::new(|o| members_mut(o)[1].healthy = false),
        ),
        (
            "a rollout owed",
            Box::new(|o| o.machines[1].outdated = Some("etcdadmConfigSpec changed".into())),
        ),
        (
            "a Machine being deleted",
            Box::new(|o| o.machines[2].deleting = true),
        ),
        ("a scale-up", Box::new(|o| o.replicas = 5)),
        (
            "an alarm",
            Box::new(|o| {
                o.alarms = vec![Alarm {
                    member_id: 2,
                    kind: AlarmKind::NoSpace,
                }]
            }),
        ),
        (
            "a snapshot",
            Box::new(|o| {
                o.view_mut::<SafeChangeView>().unwrap().snapshot_in_flight =
                    Some("c1-etcd-202603011200".into())
            }),
        ),
        (
            "a recovery asked for",
            Box::new(|o| {
                o.view_mut::<Recovery>().unwrap().view = Some(RecoveryView {
                    requested: Some("latest".into()),
                    ..Default::default()
                })
            }),
        ),
        (
            "a restore not recorded",
            Box::new(|o| o.view_mut::<RestoreFrom>().unwrap().view = Some(RestoreView::default())),
        ),
        (
            "the control plane rolling",
            Box::new(|o| {
                o.creation_complete = true;
                let urls = voting_endpoints(o);
                let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
                o.kcp = kcp(&refs, false, true);
                if let KcpView::Found { rollout_complete, .. } = &mut o.kcp {
                    *rollout_complete = false;
                }
            }),
        ),
    ];
    for (what, change) in cases {
        let mut o = fragmented();
        change(&mut o);
        assert!(routine(&o).is_none(), "defragmented during {what}");
        assert!(
            !matches!(plan(&o), Step::Maintenance(_)),
            "{what}: {:?}",
            plan(&o)
        );
    }
}

#[test]
fn a_member_of_unknown_size_is_skipped() {
    let mut o = fragmented();
    members_mut(&mut o)[1].db_size_in_use = None;
    let step = routine(&o).unwrap();
    let MaintenanceStep::Defragment { target, .. } = &step;
    assert_eq!(target.member, "member of Machine c1-etcd-m2");
    assert_eq!((target.db_size, target.revision), (300 << 20, 900));
}
