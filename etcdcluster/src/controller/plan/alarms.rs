//! etcd's alarms (docs/day2.md, "Alarms"): a full database (NOSPACE) is repaired by compacting
//! the history, defragmenting the members one at a time (followers first, the leader last) and
//! disarming the alarm once every voter is below 90% of its quota; a corrupt member (CORRUPT) is
//! replaced by remediation (`remediation::replace_corrupt`) and the alarm disarmed once it is
//! gone. Alarmed members serve, so an alarm is never taken for a lost quorum.

use crate::controller::decision::ConcernMetrics;
use crate::controller::observation::EtcdView;
use etcdadm_shared::manager::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use std::time::Duration;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::AlarmRepair;
use etcdadm_shared::api::quantity::human;
use etcdadm_shared::error::Error;
use etcdadm_shared::etcd::{Refusal, defragment_timeout, member_id_hex};

use crate::controller::decision::{After, Applied, ConcernStep, EventNote, Hold, Outputs, StatusPart};
use crate::controller::observation::{AlarmKind, MemberView, Observation, member_client_url};
use crate::controller::plan::maintenance::{self, Defragment, Trigger};
use crate::controller::rules::quorum;

/// Condition reasons of the alarms.
pub mod reason {
    pub const DATABASE_QUOTA_EXCEEDED: &str = "DatabaseQuotaExceeded";
    pub const MEMBER_CORRUPT: &str = "MemberCorrupt";
}

/// A member at or above this share of its quota (in percent) holds NOSPACE up: disarmed sooner,
/// the alarm would be raised again by the next writes.
const DISARM_BELOW_PERCENT: u64 = 90;

/// How the condition names a full database.
const FULL: &str = "etcd's database reached its quota (NOSPACE) and etcd refuses writes";

/// After a repair step, the next look comes with a fresh health check (so every member is seen
/// healthy again before the next step), soon.
const REPAIR_POLL: Duration = Duration::from_secs(1);

/// One step of an alarm's repair.
#[derive(Clone, Debug, PartialEq)]
pub enum AlarmStep {
    /// Compact the history up to `revision` (cluster-wide) through the member at `via`.
    Compact {
        revision: i64,
        via: String,
        /// The largest member database, which sets the call's deadline.
        db_size: u64,
        /// Each member's size against its quota, for the condition.
        full: String,
    },
    /// Defragment one member; `revision` is its own, recorded with the result.
    Defragment {
        member: String,
        member_id: u64,
        url: String,
        db_size: u64,
        revision: i64,
        full: String,
    },
    /// Disarm alarm `kind` of `member_ids` through the member at `via`.
    Disarm {
        kind: AlarmKind,
        member_ids: Vec<u64>,
        via: String,
        why: String,
    },
}

impl ConcernStep for AlarmStep {
    type View = ();
    type Metrics = AlarmMetrics;

    /// The Events of alarms appearing and clearing.
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        for note in transitions(part.old, part.o) {
            part.event(note);
        }
    }

    fn reason(&self) -> (&'static str, String) {
        match self {
            AlarmStep::Compact { revision, full, .. } => (
                reason::DATABASE_QUOTA_EXCEEDED,
                format!("{FULL} ({full}): compacting the history at revision {revision}"),
            ),
            AlarmStep::Defragment { member, full, .. } => (
                reason::DATABASE_QUOTA_EXCEEDED,
                format!("{FULL} ({full}): defragmenting the {member}"),
            ),
            AlarmStep::Disarm { kind, why, .. } => {
                (kind_reason(*kind), format!("disarming {}: {why}", kind.as_str()))
            }
        }
    }

    fn event(&self, _: &Observation) -> Option<EventNote> {
        Some(match self {
            AlarmStep::Compact { revision, .. } => EventNote::normal(
                "HistoryCompacted",
                format!("compacted etcd's history at revision {revision} to free space (NOSPACE)"),
            ),
            AlarmStep::Defragment { member, db_size, .. } => EventNote::normal(
                "MemberDefragmented",
                format!("defragmented the {member} (was {})", human(*db_size)),
            ),
            AlarmStep::Disarm {
                kind,
                member_ids,
                why,
                ..
            } => EventNote::normal(
                "AlarmDisarmed",
                format!(
                    "disarmed {} ({}): {why}",
                    kind.as_str(),
                    member_ids
                        .iter()
                        .map(|id| member_id_hex(*id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        })
    }

    /// A compaction and a defragmentation wait as long as the database is large.
    fn time_allowed(&self) -> std::time::Duration {
        match self {
            AlarmStep::Compact { db_size, .. } | AlarmStep::Defragment { db_size, .. } => {
                defragment_timeout(*db_size)
            }
            AlarmStep::Disarm { .. } => std::time::Duration::ZERO,
        }
    }

    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        let key = o.cache_key();
        match self {
            AlarmStep::Compact {
                revision,
                via,
                db_size,
                ..
            } => {
                let client = out.etcd_clients.client(&key, via, defragment_timeout(*db_size))?;
                match client.compact(*revision, true).await {
                    Ok(()) => Ok(Applied::Done),
                    Err(e) if e.refusal() == Some(Refusal::Compacted) => Ok(Applied::AlreadyDone),
                    Err(e) => Err(e.into()),
                }
            }
            AlarmStep::Defragment {
                member,
                member_id,
                url,
                db_size,
                revision,
                ..
            } => {
                let target = Defragment {
                    member: member.clone(),
                    member_id: *member_id,
                    url: url.clone(),
                    db_size: *db_size,
                    revision: *revision,
                };
                maintenance::defragment(out, o, &target, Trigger::NoSpace).await
            }
            AlarmStep::Disarm {
                kind,
                member_ids,
                via,
                ..
            } => {
                let client =
                    out.etcd_clients
                        .client(&key, via, o.etcd_cluster.spec.health_settings().timeout)?;
                for id in member_ids {
                    client.alarm_disarm(*id, *kind).await?;
                }
                Ok(Applied::Done)
            }
        }
    }

    fn after(&self, _: &Observation) -> After {
        After::Requeue(REPAIR_POLL)
    }
}

fn kind_reason(kind: AlarmKind) -> &'static str {
    match kind {
        AlarmKind::NoSpace => reason::DATABASE_QUOTA_EXCEEDED,
        AlarmKind::Corrupt => reason::MEMBER_CORRUPT,
    }
}

// Decisions.

/// The next step of an alarm's repair, when one can be taken now; with `spec.maintenance.alarms`
/// Manual, none.
pub fn repair(o: &Observation) -> Option<AlarmStep> {
    if o.alarm_repair == AlarmRepair::Manual || o.alarms.is_empty() {
        return None;
    }
    corrupt_gone(o).or_else(|| no_space(o))
}

/// CORRUPT is disarmed once the member it names is gone from etcd (replaced), never before.
fn corrupt_gone(o: &Observation) -> Option<AlarmStep> {
    if o.members().is_empty() {
        return None;
    }
    let gone: Vec<u64> = o
        .alarms
        .iter()
        .filter(|a| a.kind == AlarmKind::Corrupt && !o.members().iter().any(|m| m.id == a.member_id))
        .map(|a| a.member_id)
        .collect();
    if gone.is_empty() {
        return None;
    }
    Some(AlarmStep::Disarm {
        kind: AlarmKind::Corrupt,
        member_ids: gone,
        via: serving_url(o)?,
        why: "the member it named was replaced and is no longer in the cluster".into(),
    })
}

/// NOSPACE: compaction first (with a quorum of voters healthy: it goes through raft), then each
/// voter at or above 90% of its quota defragmented once at its revision, followers first and
/// the leader last, with every voter healthy; the alarm disarmed once every voter is below 90%.
fn no_space(o: &Observation) -> Option<AlarmStep> {
    // Under CORRUPT etcd refuses compactions too: the corrupt member goes first.
    if !o.alarm_raised(AlarmKind::NoSpace) || o.alarm_raised(AlarmKind::Corrupt) {
        return None;
    }
    let voters = o.voters();
    let healthy = voters.iter().filter(|m| m.healthy).count();
    let via = serving_url(o)?;
    let all_healthy = healthy == voters.len();
    if all_healthy && voters.iter().all(|m| below_disarm(m)) {
        return Some(AlarmStep::Disarm {
            kind: AlarmKind::NoSpace,
            member_ids: alarmed(o, AlarmKind::NoSpace),
            via,
            why: format!(
                "every member is below {DISARM_BELOW_PERCENT}% of its quota ({})",
                sizes(o)
            ),
        });
    }
    let largest = voters.iter().filter_map(|m| size(m)).max().unwrap_or(0);
    let uncompacted = voters
        .iter()
        .any(|m| m.healthy && m.history_compacted == Some(false));
    if uncompacted && healthy >= quorum(voters.len()) {
        let revision = voters.iter().filter_map(|m| m.revision).max()?;
        return Some(AlarmStep::Compact {
            revision,
            via,
            db_size: largest,
            full: sizes(o),
        });
    }
    if !all_healthy {
        return None;
    }
    let mut due: Vec<&&MemberView> = voters
        .iter()
        .filter(|m| !below_disarm(m) && m.revision.is_some() && m.defragmented_at != m.revision)
        .collect();
    due.sort_by_key(|m| (m.is_leader, m.name.clone()));
    let member = due.first()?;
    Some(AlarmStep::Defragment {
        member: member.describe(),
        member_id: member.id,
        url: member_client_url(o, member)?,
        db_size: size(member)?,
        revision: member.revision?,
        full: sizes(o),
    })
}

/// What is left of a raised alarm once no repair step can be taken now: why etcd still refuses
/// writes, as a hold for the Ready condition.
pub fn remaining(o: &Observation) -> Option<Hold> {
    let manual = "spec.maintenance.alarms is Manual, so it is left to you";
    if o.alarm_raised(AlarmKind::Corrupt) {
        let named: Vec<String> = o
            .alarms
            .iter()
            .filter(|a| a.kind == AlarmKind::Corrupt)
            .map(|a| {
                o.members()
                    .iter()
                    .find(|m| m.id == a.member_id)
                    .map_or_else(|| member_id_hex(a.member_id), MemberView::describe)
            })
            .collect();
        let what = format!(
            "etcd raised CORRUPT on the {}: its data differs from the other members' and etcd refuses writes",
            named.join(", ")
        );
        return Some(if o.alarm_repair == AlarmRepair::Manual {
            Hold::refuse(
                reason::MEMBER_CORRUPT,
                format!("{what}; {manual}: replace the member, then `etcdctl alarm disarm`"),
            )
        } else {
            Hold::refuse(
                reason::MEMBER_CORRUPT,
                format!(
                    "{what}; a member on no Machine of this EtcdadmCluster is not replaced here: remove it (`etcdctl member remove`), and the alarm is disarmed once it is gone"
                ),
            )
        });
    }
    if !o.alarm_raised(AlarmKind::NoSpace) {
        return None;
    }
    let what = format!("{FULL} ({})", sizes(o));
    Some(if o.alarm_repair == AlarmRepair::Manual {
        Hold::refuse(
            reason::DATABASE_QUOTA_EXCEEDED,
            format!(
                "{what}; {manual}: `etcdctl compact`, `etcdctl defrag` on each member, then `etcdctl alarm disarm`"
            ),
        )
    } else if o.voters().iter().any(|m| !m.healthy) {
        Hold::wait(
            reason::DATABASE_QUOTA_EXCEEDED,
            format!("{what}; members are defragmented once every member is healthy"),
        )
    } else {
        Hold::refuse(
            reason::DATABASE_QUOTA_EXCEEDED,
            format!(
                "{what}; the history is compacted and every member defragmented, yet the data itself fills {DISARM_BELOW_PERCENT}% of the quota: raise the quota (spec.etcdadmConfigSpec.quotaBackendBytes; members are replaced one at a time) or delete data. The alarm is disarmed once every member is below {DISARM_BELOW_PERCENT}% of its quota"
            ),
        )
    })
}

/// Each member's size against its quota: `m0 17.1 MiB of 16.0 MiB, ...`.
fn sizes(o: &Observation) -> String {
    o.voters()
        .iter()
        .map(|m| {
            let name = m.machine.clone().unwrap_or_else(|| m.name.clone());
            match size(m) {
                Some(bytes) => format!("{name} {} of {}", human(bytes), human(m.quota())),
                None => format!("{name} size unknown (quota {})", human(m.quota())),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn size(member: &MemberView) -> Option<u64> {
    member.db_size.and_then(|b| u64::try_from(b).ok())
}

/// Known to be below 90% of its quota.
fn below_disarm(member: &MemberView) -> bool {
    size(member).is_some_and(|bytes| {
        u128::from(bytes) * 100 < u128::from(member.quota()) * u128::from(DISARM_BELOW_PERCENT)
    })
}

/// The members alarm `kind` is raised on, by ID.
fn alarmed(o: &Observation, kind: AlarmKind) -> Vec<u64> {
    o.alarms
        .iter()
        .filter(|a| a.kind == kind)
        .map(|a| a.member_id)
        .collect()
}

/// A healthy voter to ask, the leader first.
fn serving_url(o: &Observation) -> Option<String> {
    let mut voters = o.voters();
    voters.sort_by_key(|m| !m.is_leader);
    voters
        .into_iter()
        .filter(|m| m.healthy)
        .find_map(|m| member_client_url(o, m))
}

/// The Events of alarms appearing and clearing, from the alarms `status.members` last recorded.
pub fn transitions(old: &EtcdadmClusterStatus, o: &Observation) -> Vec<EventNote> {
    let mut notes = Vec::new();
    for kind in AlarmKind::ALL {
        let was = old
            .members
            .iter()
            .any(|m| m.alarms.iter().any(|a| a == kind.as_str()));
        let is = o.alarm_raised(kind);
        if is && !was {
            let on: Vec<String> = o
                .members()
                .iter()
                .filter(|m| m.has_alarm(kind))
                .map(MemberView::describe)
                .collect();
            let what = match kind {
                AlarmKind::NoSpace => format!("the database reached its quota ({})", sizes(o)),
                AlarmKind::Corrupt => "a member's data differs from the others'".to_string(),
            };
            notes.push(EventNote::warning(
                "AlarmRaised",
                format!(
                    "etcd raised {} on the {}: {what}; writes are refused until it is repaired",
                    kind.as_str(),
                    if on.is_empty() {
                        "cluster".to_string()
                    } else {
                        on.join(", ")
                    }
                ),
            ));
        } else if was && !is && matches!(o.etcd, crate::controller::observation::EtcdView::Members(_)) {
            notes.push(EventNote::normal(
                "AlarmCleared",
                format!("{} is no longer raised: etcd accepts writes", kind.as_str()),
            ));
        }
    }
    notes
}

// Metrics.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlarmLabels {
    pub namespace: String,
    pub name: String,
    pub alarm: String,
}

/// The alarms raised, by kind.
#[derive(Clone, Debug, Default)]
pub struct AlarmMetrics {
    alarms: Family<AlarmLabels, Gauge>,
}

impl ConcernMetrics for AlarmMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_cluster_alarms",
            "Active etcd alarms (NOSPACE, CORRUPT) by kind",
            self.alarms.clone(),
        );
    }

    /// As the health check found them, when it listed the members.
    fn observe(&self, namespace: &str, name: &str, o: &Observation, _: &EtcdadmClusterStatus) {
        if matches!(o.etcd, EtcdView::Members(_)) {
            let kinds: Vec<String> = o.alarms.iter().map(|a| a.kind.as_str().to_string()).collect();
            self.observe_alarms(namespace, name, &kinds);
        }
    }
}

impl AlarmMetrics {
    /// Active alarms of a cluster, by kind (every known kind is set, so a cleared alarm reads 0).
    pub fn observe_alarms(&self, namespace: &str, name: &str, active: &[String]) {
        for alarm in ["NOSPACE", "CORRUPT"] {
            let labels = AlarmLabels {
                namespace: namespace.into(),
                name: name.into(),
                alarm: alarm.into(),
            };
            let count = active.iter().filter(|a| a.as_str() == alarm).count();
            self.alarms.get_or_create(&labels).set(count as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    const QUOTA: u64 = 16 << 20;

    /// `running(3)` (m0 the leader) with a 16 MiB quota, every database at 17 MiB of history
    /// not yet compacted, and NOSPACE raised by m0 and m1.
    fn full() -> Observation {
        let mut o = running(3);
        for m in members_mut(&mut o) {
            m.quota_backend_bytes = Some(QUOTA);
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

    #[test]
    fn corrupt_replaces_only_the_named_member_and_disarms_after_it_is_gone() {
        let mut o = running(3);
        o.alarms = vec![Alarm {
            member_id: 2,
            kind: AlarmKind::Corrupt,
        }];
        members_mut(&mut o)[1].alarms = vec!["CORRUPT".into()];
        let mut w = World::new(o);
        let steps = w.run();
        let deleted: Vec<&str> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Machines(MachineStep::DeleteMachine { machine, .. }) => Some(machine.as_str()),
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
    fn corrupt_waits_when_its_replacement_would_lose_quorum() {
        let mut o = running(3);
        o.alarms = vec![Alarm {
            member_id: 2,
            kind: AlarmKind::Corrupt,
        }];
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        let step = plan(&o);
        let hold = step.hold().unwrap_or_else(|| panic!("{step:?}"));
        assert_eq!(hold.reason, reason::REMOVAL_WOULD_LOSE_QUORUM);
        assert!(hold.message.contains("CORRUPT"), "{}", hold.message);
        assert!(!step.writes());
    }
}
