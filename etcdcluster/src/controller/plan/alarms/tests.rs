//! Tests of `alarms`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::controller::testing::reason;
use crate::controller::testing::*;
use etcdadm_shared::etcd::HashKv;

const QUOTA: u64 = 16 << 20;

/// `running(3)` (m0 the leader) with a 16 MiB quota, every database at 17 MiB of history
/// not yet compacted, and NOSPACE raised by m0 and m1.
fn full() -> Observation {
    let mut o = running(3);
    for m in members_mut(&mut o) {
        m.quota_backend_bytes = Some(QUOTA);
        m.quota_reported = true;
        m.db_size = Some(17 << 20);
        m.db_size_in_use = Some(16 << 20);
        m.revision = Some(500);
        m.history_compacted = Some(false);
        m.alarms = if m.id < 3 { vec!["NOSPACE".into()] } else { vec![] };
    }
    o.alarms = [1, 2]
        .map(|member_id| Alarm {
            member_id,
            kind: AlarmKind::NoSpace,
        })
        .into();
    o
}

fn kinds(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|step| match step {
            Step::Alarms(AlarmStep::Compact { revision, .. }) => format!("compact@{revision}"),
            Step::Alarms(AlarmStep::Defragment { member, .. }) => format!("defrag {member}"),
            Step::Alarms(AlarmStep::Disarm { kind, member_ids, .. }) => {
                format!("disarm {} {member_ids:?}", kind.as_str())
            }
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn nospace_on_every_member_is_repaired_in_order_never_read_as_quorum_loss() {
    let o = full();
    let step = plan(&o);
    let (why, message) = step.reason();
    assert_eq!(why, reason::DATABASE_QUOTA_EXCEEDED);
    assert!(
        message.contains("c1-etcd-m0 17.0 MiB of 16.0 MiB, c1-etcd-m1 17.0 MiB of 16.0 MiB"),
        "{message}"
    );
    let mut w = World::new(o);
    let steps = w.run();
    assert_eq!(
        kinds(&steps),
        [
            "compact@500",
            "defrag member of Machine c1-etcd-m1",
            "defrag member of Machine c1-etcd-m2",
            "defrag member of Machine c1-etcd-m0",
            "disarm NOSPACE [1, 2]",
        ],
        "followers first, the leader last, disarmed once all are small"
    );
    assert!(w.o.alarms.is_empty());
    assert_eq!(w.member_names().len(), 3, "no member replaced");
    for step in &steps {
        assert_eq!(step.event(&w.o).map(|e| e.warning), Some(false), "{step:?}");
    }
}

#[test]
fn a_silent_member_with_nospace_on_the_others_gets_compaction_then_remediation_first() {
    let mut o = full();
    members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
    members_mut(&mut o)[2].db_size = None;
    members_mut(&mut o)[2].unhealthy_for = Duration::from_secs(10);
    let step = plan(&o);
    assert!(
        matches!(step, Step::Alarms(AlarmStep::Compact { .. })),
        "{step:?}"
    );
    let mut w = World::new(o);
    w.apply(&step);
    // Two of three serve: no quorum loss; nothing defragmented while one is silent (a
    // defragmenting member stalls, and with one down that would stall the cluster).
    let step = plan(&w.o);
    assert_eq!(
        wait_reason(&step),
        reason::WAITING_FOR_HEALTHY_MEMBERS,
        "{step:?}"
    );
    // Once overdue, the silent member is replaced as any dead member is.
    members_mut(&mut w.o)[2].unhealthy_for = w.o.remediation.unhealthy_after * 2;
    assert!(
        matches!(
            plan(&w.o),
            Step::Machines(MachineStep::DeleteMachine { ref machine, purpose: Removal::Remediation { .. }, .. }) if machine == "c1-etcd-m2"
        ),
        "{:?}",
        plan(&w.o)
    );
}

#[test]
fn data_beyond_the_quota_is_said_once_repaired_and_never_disarmed_in_a_loop() {
    let mut w = World::new(full());
    w.live_data = 15 << 20;
    for _ in 0..4 {
        let step = plan(&w.o);
        w.apply(&step);
    }
    for _ in 0..3 {
        let step = plan(&w.o);
        let hold = step.hold().unwrap_or_else(|| panic!("{step:?}"));
        assert_eq!(hold.reason, reason::DATABASE_QUOTA_EXCEEDED);
        assert_eq!(hold.kind, crate::controller::decision::HoldKind::Refuse);
        assert!(hold.message.contains("raise the quota"), "{}", hold.message);
        assert!(
            hold.message.contains("c1-etcd-m0 15.0 MiB of 16.0 MiB"),
            "{}",
            hold.message
        );
    }
    assert_eq!(w.o.alarms.len(), 2, "never disarmed");
}

#[test]
fn manual_repair_reports_and_touches_nothing() {
    let mut o = full();
    o.alarm_repair = AlarmRepair::Manual;
    let step = plan(&o);
    let hold = step.hold().unwrap();
    assert_eq!(hold.reason, reason::DATABASE_QUOTA_EXCEEDED);
    assert!(hold.message.contains("Manual"), "{}", hold.message);
    o.alarms = vec![Alarm {
        member_id: 2,
        kind: AlarmKind::Corrupt,
    }];
    let hold = plan(&o);
    assert_eq!(wait_reason(&hold), reason::MEMBER_CORRUPT);
}

/// `running(3)` with CORRUPT raised on m1 (member 2), every member hashed at revision 500:
/// `hashes[i]` is member i's.
fn corrupt(hashes: [u32; 3]) -> Observation {
    let mut o = running(3);
    o.alarms = vec![Alarm {
        member_id: 2,
        kind: AlarmKind::Corrupt,
    }];
    for (i, m) in members_mut(&mut o).iter_mut().enumerate() {
        m.revision = Some(500);
        m.hash = Some(HashKv {
            revision: 500,
            compact_revision: 100,
            hash: hashes[i],
        });
    }
    members_mut(&mut o)[1].alarms = vec!["CORRUPT".into()];
    o
}

#[test]
fn a_member_whose_hash_differs_from_the_majority_is_replaced_alone_and_the_alarm_disarmed_after() {
    let mut w = World::new(corrupt([7, 9, 7]));
    let steps = w.run();
    let deleted: Vec<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Machines(MachineStep::DeleteMachine { machine, message, .. }) => {
                assert!(message.contains("HashKV at revision 500"), "{message}");
                Some(machine.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["c1-etcd-m1"]);
    let removed = steps
        .iter()
        .position(|s| {
            matches!(
                s,
                Step::Membership(MembershipStep::RemoveMember { member_id: 2, .. })
            )
        })
        .unwrap();
    let disarmed = steps
        .iter()
        .position(|s| {
            matches!(
                s,
                Step::Alarms(AlarmStep::Disarm {
                    kind: AlarmKind::Corrupt,
                    ..
                })
            )
        })
        .unwrap();
    assert!(removed < disarmed, "{steps:#?}");
    assert!(w.o.alarms.is_empty());
    assert_eq!(w.member_names().len(), 3);
}

#[test]
fn the_alarm_names_one_member_and_the_hashes_another_only_the_differing_one_goes() {
    // CORRUPT names m1, whose hash agrees with m0's; m2's differs: m2 is replaced, never m1.
    let step = plan(&corrupt([7, 7, 9]));
    assert!(
        matches!(&step, Step::Machines(MachineStep::DeleteMachine { machine, .. }) if machine == "c1-etcd-m2"),
        "{step:?}"
    );
}

#[test]
fn a_forged_corrupt_with_equal_hashes_is_disarmed_replacing_nothing_and_said() {
    let o = corrupt([7, 7, 7]);
    let step = plan(&o);
    let Step::Alarms(AlarmStep::Disarm {
        kind: AlarmKind::Corrupt,
        member_ids,
        record,
        ..
    }) = &step
    else {
        panic!("{step:?}")
    };
    assert_eq!(member_ids, &[2]);
    assert_eq!(
        record,
        &DisarmRecord::Unconfirmed {
            revision: 500,
            count: 1
        }
    );
    let (why, message) = step.reason();
    assert_eq!(why, reason::CORRUPT_NOT_CONFIRMED);
    assert!(message.contains("hashes the same at revision 500"), "{message}");
    let event = step.event(&o).unwrap();
    assert!(event.warning);
    assert_eq!(event.reason, "CorruptAlarmNotConfirmed");
    let mut w = World::new(o);
    let steps = w.run();
    assert_eq!(steps.len(), 1, "{steps:#?}");
    assert!(w.o.alarms.is_empty(), "writable again");
    assert_eq!(w.member_names(), ["c1-etcd-m0", "c1-etcd-m1", "c1-etcd-m2"]);
}

/// `o` with `status.unconfirmedCorrupt` recording `count` disarms, the last `ago` before now.
fn disarmed_before(o: &mut Observation, count: i32, ago: Duration) {
    let now = o.certificates.now;
    let last = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(ago).unwrap())
        .unwrap();
    o.etcd_cluster.status.get_or_insert_default().unconfirmed_corrupt =
        Some(etcdadm_shared::api::cluster::UnconfirmedCorrupt {
            count,
            last: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(last),
            revision: 400,
        });
}

#[test]
fn a_corrupt_alarm_raised_again_and_again_on_equal_hashes_is_left_to_a_person() {
    let mut o = corrupt([7, 7, 7]);
    o.certificates.now = k8s_openapi::jiff::Timestamp::from_second(1_000_000).unwrap();
    // count disarms so far, the last this long ago => the next step's count, or left to a person.
    let table: [(i32, u64, Option<i32>); 5] = [
        (1, 600, Some(2)),
        (2, 600, Some(3)),
        (corrupt::MAX_UNCONFIRMED, 600, None),
        (corrupt::MAX_UNCONFIRMED, 3599, None),
        (corrupt::MAX_UNCONFIRMED, 3601, Some(1)),
    ];
    for (count, ago, next) in table {
        disarmed_before(&mut o, count, Duration::from_secs(ago));
        let step = plan(&o);
        match next {
            Some(next) => assert!(
                matches!(
                    &step,
                    Step::Alarms(AlarmStep::Disarm { record: DisarmRecord::Unconfirmed { count, .. }, .. }) if *count == next
                ),
                "{count} {ago}: {step:?}"
            ),
            None => {
                let hold = step.hold().unwrap_or_else(|| panic!("{step:?}"));
                assert_eq!(hold.reason, reason::CORRUPT_REPEATED);
                assert_eq!(hold.kind, crate::controller::decision::HoldKind::Refuse);
                assert!(hold.message.contains("Left to you"), "{}", hold.message);
                assert!(!step.writes());
            }
        }
    }
}

#[test]
fn corrupt_is_never_acted_on_without_a_majority_of_comparable_hashes() {
    // Nothing is replaced and nothing disarmed: (a member's hash unknown | hashes compacted at
    // different revisions | no majority agrees) => hold kind.
    use crate::controller::decision::HoldKind;
    let mut missing = corrupt([7, 9, 7]);
    members_mut(&mut missing)[2].hash = None;
    members_mut(&mut missing)[2] = unhealthy(members_mut(&mut missing)[2].clone(), "timed out");
    let mut compacted = corrupt([7, 7, 7]);
    members_mut(&mut compacted)[0]
        .hash
        .as_mut()
        .unwrap()
        .compact_revision = 90;
    let split = corrupt([7, 8, 9]);
    let mut one_of_three = corrupt([7, 7, 7]);
    members_mut(&mut one_of_three)[0].hash = None;
    for (o, kind) in [
        (missing, None),
        (compacted, Some(HoldKind::Wait)),
        (split, Some(HoldKind::Refuse)),
        (one_of_three, Some(HoldKind::Wait)),
    ] {
        let step = plan(&o);
        assert!(
            !matches!(step, Step::Machines(_) | Step::Membership(_) | Step::Alarms(_)),
            "{step:?}"
        );
        if let Some(kind) = kind {
            let hold = step.hold().unwrap_or_else(|| panic!("{step:?}"));
            assert_eq!(hold.reason, reason::MEMBER_CORRUPT, "{hold:?}");
            assert_eq!(hold.kind, kind, "{hold:?}");
        }
    }
}

#[test]
fn a_corrupt_replacement_follows_the_remediation_backoff() {
    let mut o = corrupt([7, 9, 7]);
    o.machines[1].age = Duration::from_secs(30);
    o.machines[1].replaces = Some(LastRemediation {
        machine: "c1-etcd-old".into(),
        ago: Duration::from_secs(30),
        retries: 0,
    });
    let step = plan(&o);
    assert_eq!(wait_reason(&step), reason::REMEDIATION_BACKOFF, "{step:?}");
    assert!(
        wait_message(&step).contains("differs from the majority's"),
        "{step:?}"
    );
    o.machines[1].replaces.as_mut().unwrap().ago = o.remediation.unhealthy_after * 3;
    assert!(matches!(
        plan(&o),
        Step::Machines(MachineStep::DeleteMachine {
            purpose: Removal::Remediation { retries: 1 },
            ..
        })
    ));
}

#[test]
fn corrupt_waits_when_its_replacement_would_lose_quorum() {
    let mut o = corrupt([7, 9, 7]);
    members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
    let step = plan(&o);
    let hold = step.hold().unwrap_or_else(|| panic!("{step:?}"));
    assert_eq!(hold.reason, reason::REMOVAL_WOULD_LOSE_QUORUM);
    assert!(hold.message.contains("CORRUPT"), "{}", hold.message);
    assert!(!step.writes());
}

/// etcd as the NOSPACE repair meets it: `real` is the quota etcd runs with; after a disarm, the
/// next write raises NOSPACE again (on m0, nothing written) while any database is at or above
/// 90% of it. Planned and applied for `rounds`; the disarms made.
fn run_against_etcd(w: &mut World, real: u64, rounds: usize) -> usize {
    let mut disarms = 0;
    for _ in 0..rounds {
        let step = plan(&w.o);
        if step == Step::Steady {
            break;
        }
        if step.hold().is_some() {
            continue;
        }
        w.apply(&step);
        if let Step::Alarms(AlarmStep::Disarm {
            kind: AlarmKind::NoSpace,
            ..
        }) = step
        {
            disarms += 1;
            let full = w.o.voters().iter().any(|m| {
                m.db_size
                    .is_some_and(|b| u64::try_from(b).unwrap() * 10 >= real * 9)
            });
            if full {
                w.o.alarms.push(Alarm {
                    member_id: 1,
                    kind: AlarmKind::NoSpace,
                });
            }
        }
    }
    disarms
}

#[test]
fn a_nospace_disarm_loop_is_impossible_whatever_quota_is_believed() {
    const MIB: u64 = 1 << 20;
    // (what the members report: Some(quota) or nothing; what the EtcdadmConfig says; the quota
    // etcd really runs with; live data after compaction) => (disarms, writable at the end).
    type Case = (Option<u64>, Option<u64>, u64, u64, usize, bool);
    let table: [Case; 7] = [
        // The quota set by hand (postEtcdadmCommands), read from /metrics: repaired.
        (Some(16 * MIB), None, 16 * MIB, MIB, 1, true),
        // The same, with data that fills it: never disarmed, left to a person.
        (Some(16 * MIB), None, 16 * MIB, 15 * MIB, 0, false),
        // Nothing reported: judged against the size it had under the alarm.
        (None, None, 16 * MIB, MIB, 1, true),
        (None, None, 16 * MIB, 15 * MIB, 0, false),
        // Believed larger than it is, nothing reported, and a defragmentation that frees a
        // little: one disarm (below 90% of the size under the alarm), raised again by the next
        // write, and none again without a shrink in between.
        (None, Some(2048 * MIB), 16 * MIB, 14 * MIB + MIB / 2, 1, false),
        // Believed smaller than it is (reported): the member's word wins.
        (Some(64 * MIB), Some(16 * MIB), 64 * MIB, 15 * MIB, 1, true),
        (None, Some(16 * MIB), 16 * MIB, MIB, 1, true),
    ];
    for (reported, believed, real, live, disarms, writable) in table {
        let mut o = full();
        for m in members_mut(&mut o) {
            m.quota_backend_bytes = reported.or(believed);
            m.quota_reported = reported.is_some();
            m.db_size = Some(i64::try_from(real + real / 64).unwrap());
        }
        let mut w = World::new(o);
        w.live_data = i64::try_from(live).unwrap();
        let first = plan(&w.o);
        assert!(
            matches!(first, Step::Alarms(AlarmStep::Compact { .. })),
            "compacted before any disarm: {first:?}"
        );
        let made = run_against_etcd(&mut w, real, 60);
        let case = (reported, believed, real, live);
        assert_eq!(made, disarms, "{case:?}");
        assert_eq!(w.o.alarms.is_empty(), writable, "{case:?}");
        if !writable {
            let hold = plan(&w.o).hold().cloned().unwrap();
            assert_eq!(hold.reason, reason::DATABASE_QUOTA_EXCEEDED, "{case:?}");
            assert_eq!(hold.kind, crate::controller::decision::HoldKind::Refuse);
        }
    }
}

#[test]
fn nospace_is_never_disarmed_on_a_believed_quota_without_compaction_and_defragmentation() {
    // The cluster: 16 MiB set by hand, 2 GiB believed, 16.1 MiB in use; the member's
    // quota unread. Every member is compacted and defragmented before the disarm.
    let mut o = full();
    for m in members_mut(&mut o) {
        m.quota_backend_bytes = None;
        m.quota_reported = false;
        m.db_size = Some(16_900_000);
    }
    let mut w = World::new(o);
    let steps = w.run();
    assert_eq!(
        kinds(&steps),
        [
            "compact@500",
            "defrag member of Machine c1-etcd-m1",
            "defrag member of Machine c1-etcd-m2",
            "defrag member of Machine c1-etcd-m0",
            "disarm NOSPACE [1, 2]",
        ]
    );
    // Raised again with nothing written: never disarmed again; the condition says why.
    w.o.alarms.push(Alarm {
        member_id: 1,
        kind: AlarmKind::NoSpace,
    });
    for _ in 0..3 {
        let hold = plan(&w.o).hold().cloned().unwrap();
        assert!(hold.message.contains("raised it again"), "{}", hold.message);
    }
    // After writes and a new fill, a new compaction and defragmentation earn one more disarm.
    for m in members_mut(&mut w.o) {
        m.revision = Some(900);
        m.db_size = Some(16_900_000);
        m.history_compacted = Some(false);
    }
    let steps = w.run();
    assert_eq!(steps.len(), 5, "{steps:#?}");
    assert!(w.o.alarms.is_empty());
}
