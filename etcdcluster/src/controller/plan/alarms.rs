//! etcd's alarms (docs/day2.md, "Alarms"): a full database (NOSPACE) is repaired by compacting
//! the history and defragmenting the members one at a time before any disarm (`nospace`); a
//! CORRUPT alarm is confirmed with the members' hashes first (`corrupt`): a member whose data
//! differs is replaced by remediation and the alarm disarmed once it is gone, an unconfirmed
//! alarm is disarmed. Alarmed members serve, so an alarm is never taken for a lost quorum.

pub mod corrupt;
mod nospace;

use crate::controller::decision::ConcernMetrics;
use crate::controller::observation::EtcdView;
use etcdadm_shared::manager::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use std::time::Duration;

use etcdadm_shared::api::EtcdadmClusterStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::api::cluster::{AlarmRepair, UnconfirmedCorrupt};
use etcdadm_shared::api::quantity::human;
use etcdadm_shared::error::Error;
use etcdadm_shared::etcd::{Refusal, defragment_timeout, member_id_hex};

use crate::controller::decision::{After, Applied, ConcernStep, EventNote, Hold, Outputs, StatusPart};
use crate::controller::observation::{AlarmKind, MemberView, Observation, member_client_url};
use crate::controller::plan::maintenance::{self, Defragment, Trigger};

/// Condition reasons of the alarms.
pub mod reason {
    pub const DATABASE_QUOTA_EXCEEDED: &str = "DatabaseQuotaExceeded";
    pub const MEMBER_CORRUPT: &str = "MemberCorrupt";
    /// A CORRUPT alarm that the members' hashes did not confirm, disarmed.
    pub const CORRUPT_NOT_CONFIRMED: &str = "CorruptAlarmNotConfirmed";
    /// CORRUPT raised again and again on agreeing hashes: left to a person.
    pub const CORRUPT_REPEATED: &str = "CorruptAlarmRepeated";
}

/// How the condition names a full database.
pub(super) const FULL: &str = "etcd's database reached its quota (NOSPACE) and etcd refuses writes";

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
    /// Disarm alarm `kind` of `member_ids` through the member at `via`, then record what the
    /// disarm stood on.
    Disarm {
        kind: AlarmKind,
        member_ids: Vec<u64>,
        via: String,
        why: String,
        record: DisarmRecord,
    },
}

/// What a disarm records in the status once done.
#[derive(Clone, Debug, PartialEq)]
pub enum DisarmRecord {
    /// Nothing (the member CORRUPT named is gone).
    Nothing,
    /// NOSPACE: these members' last defragmentations are spent (`disarmed`): the next disarm
    /// needs new ones that shrank their databases.
    SpendDefragmentations(Vec<u64>),
    /// CORRUPT not confirmed: every member's hash agreed at `revision`; the `count`th such
    /// disarm in a row (`status.unconfirmedCorrupt`).
    Unconfirmed { revision: i64, count: i32 },
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
            AlarmStep::Disarm {
                record: DisarmRecord::Unconfirmed { .. },
                why,
                ..
            } => (reason::CORRUPT_NOT_CONFIRMED, format!("disarming CORRUPT: {why}")),
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
                member_ids,
                why,
                record: DisarmRecord::Unconfirmed { count, .. },
                ..
            } => EventNote::warning(
                "CorruptAlarmNotConfirmed",
                format!(
                    "disarmed CORRUPT ({}) without replacing anything: {why} ({count} of at most {} in a row; then it is left to a person)",
                    ids(member_ids),
                    corrupt::MAX_UNCONFIRMED
                ),
            ),
            AlarmStep::Disarm {
                kind,
                member_ids,
                why,
                ..
            } => EventNote::normal(
                "AlarmDisarmed",
                format!("disarmed {} ({}): {why}", kind.as_str(), ids(member_ids)),
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
                record,
                ..
            } => {
                let client =
                    out.etcd_clients
                        .client(&key, via, o.etcd_cluster.spec.health_settings().timeout)?;
                for id in member_ids {
                    client.alarm_disarm(*id, *kind).await?;
                }
                if *record == DisarmRecord::Nothing {
                    return Ok(Applied::Done);
                }
                let record = record.clone();
                let now = Time(Timestamp::now());
                Ok(Applied::Recorded(Box::new(move |status| {
                    record_disarm(status, record, now)
                })))
            }
        }
    }

    fn after(&self, _: &Observation) -> After {
        After::Requeue(REPAIR_POLL)
    }
}

/// What a disarm stood on, in the status: spent defragmentations, or the unconfirmed CORRUPT.
fn record_disarm(status: &mut EtcdadmClusterStatus, record: DisarmRecord, now: Time) {
    match record {
        DisarmRecord::Nothing => {}
        DisarmRecord::SpendDefragmentations(members) => {
            let ids: Vec<String> = members.iter().map(|id| member_id_hex(*id)).collect();
            for entry in &mut status.members {
                if entry.member_id.as_ref().is_some_and(|id| ids.contains(id))
                    && let Some(last) = entry.last_defragmentation.as_mut()
                {
                    last.disarmed = Some(now.clone());
                }
            }
        }
        DisarmRecord::Unconfirmed { revision, count } => {
            status.unconfirmed_corrupt = Some(UnconfirmedCorrupt {
                count,
                last: now,
                revision,
            });
        }
    }
}

fn ids(member_ids: &[u64]) -> String {
    member_ids
        .iter()
        .map(|id| member_id_hex(*id))
        .collect::<Vec<_>>()
        .join(", ")
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
    corrupt_gone(o)
        .or_else(|| corrupt::unconfirmed(o))
        .or_else(|| nospace::repair(o))
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
        record: DisarmRecord::Nothing,
    })
}

/// What is left of a raised alarm once no repair step can be taken now: why etcd still refuses
/// writes, as a hold for the Ready condition.
pub fn remaining(o: &Observation) -> Option<Hold> {
    let manual = "spec.maintenance.alarms is Manual, so it is left to you";
    corrupt::remaining(o, manual).or_else(|| nospace::remaining(o, manual))
}

/// The members alarm `kind` is raised on, by ID.
pub(super) fn alarmed(o: &Observation, kind: AlarmKind) -> Vec<u64> {
    o.alarms
        .iter()
        .filter(|a| a.kind == kind)
        .map(|a| a.member_id)
        .collect()
}

/// A healthy voter to ask, the leader first.
pub(super) fn serving_url(o: &Observation) -> Option<String> {
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
                AlarmKind::NoSpace => format!("the database reached its quota ({})", nospace::sizes(o)),
                AlarmKind::Corrupt => {
                    "a member's data may differ from the others' (confirmed with their hashes before anything is replaced)".to_string()
                }
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
mod tests;
