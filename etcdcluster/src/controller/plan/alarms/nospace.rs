//! NOSPACE (docs/day2.md, "Alarms"): a raised NOSPACE is etcd's word that a member reached the
//! quota it runs with, whatever quota we believe, so the history is compacted and every voter
//! defragmented before any disarm; a disarm spends the defragmentations it stood on, so NOSPACE
//! is never disarmed twice without the database having shrunk in between.

use etcdadm_shared::api::quantity::human;

use super::{AlarmStep, DisarmRecord, FULL, reason, serving_url};
use crate::controller::decision::Hold;
use crate::controller::observation::{AlarmKind, MemberView, Observation, member_client_url};
use crate::controller::rules::quorum;

/// A member at or above this share of its quota (in percent) holds NOSPACE up: disarmed sooner,
/// the alarm would be raised again by the next writes.
pub const DISARM_BELOW_PERCENT: u64 = 90;

/// Compaction first (with a quorum of voters healthy: it goes through raft), then each voter
/// defragmented once at its revision, followers first and the leader last, with every voter
/// healthy; the alarm disarmed once every voter stands on a defragmentation at its current
/// revision that shrank its database, that no disarm spent yet, and that left it below 90% of
/// the quota it runs with (see [`disarmable`]).
pub fn repair(o: &Observation) -> Option<AlarmStep> {
    // Under CORRUPT etcd refuses compactions too: the corrupt member goes first.
    if !o.alarm_raised(AlarmKind::NoSpace) || o.alarm_raised(AlarmKind::Corrupt) {
        return None;
    }
    let voters = o.voters();
    let healthy = voters.iter().filter(|m| m.healthy).count();
    let via = serving_url(o)?;
    let all_healthy = healthy == voters.len();
    if all_healthy && voters.iter().all(|m| disarmable(m)) {
        return Some(AlarmStep::Disarm {
            kind: AlarmKind::NoSpace,
            member_ids: super::alarmed(o, AlarmKind::NoSpace),
            via,
            why: format!(
                "the history is compacted and every member defragmented to below {DISARM_BELOW_PERCENT}% of the quota it runs with ({})",
                sizes(o)
            ),
            record: DisarmRecord::SpendDefragmentations(voters.iter().map(|m| m.id).collect()),
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
    if !all_healthy || uncompacted {
        return None;
    }
    let mut due: Vec<&&MemberView> = voters
        .iter()
        .filter(|m| m.revision.is_some() && m.defragmented_at != m.revision)
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

/// Whether NOSPACE may be disarmed as far as `member` goes: its history is not known to hold
/// anything left to compact, and its last defragmentation was made at its current revision,
/// shrank its database, was spent by no disarm, and left it below 90% of [`evidenced_quota`].
pub fn disarmable(member: &MemberView) -> bool {
    let Some(last) = member.last_defragmentation.as_ref() else {
        return false;
    };
    let shrank = last.size_after < last.size_before;
    let below = size(member).is_some_and(|bytes| {
        u128::from(bytes) * 100 < u128::from(evidenced_quota(member)) * u128::from(DISARM_BELOW_PERCENT)
    });
    member.history_compacted != Some(false)
        && Some(last.revision) == member.revision
        && last.disarmed.is_none()
        && shrank
        && below
}

/// The quota NOSPACE is judged against: the one the member reports (Status from etcd 3.6, its
/// `/metrics` before); when it reports none, the one we believe, but never more than the size
/// its database had when it was last defragmented under the alarm (etcd raised NOSPACE, so the
/// quota it runs with was below that).
pub fn evidenced_quota(member: &MemberView) -> u64 {
    let believed = member.quota();
    if member.quota_reported {
        return believed;
    }
    member
        .last_defragmentation
        .as_ref()
        .filter(|d| Some(d.revision) == member.revision)
        .and_then(|d| u64::try_from(d.size_before).ok())
        .map_or(believed, |before| believed.min(before))
}

/// Why NOSPACE is still raised once no repair step can be taken now, for the Ready condition.
pub fn remaining(o: &Observation, manual: &str) -> Option<Hold> {
    if !o.alarm_raised(AlarmKind::NoSpace) {
        return None;
    }
    let what = format!("{FULL} ({})", sizes(o));
    let voters = o.voters();
    let spent = voters.iter().any(|m| {
        m.last_defragmentation
            .as_ref()
            .is_some_and(|d| Some(d.revision) == m.revision && d.disarmed.is_some())
    });
    Some(
        if o.alarm_repair == etcdadm_shared::api::cluster::AlarmRepair::Manual {
            Hold::refuse(
                reason::DATABASE_QUOTA_EXCEEDED,
                format!(
                    "{what}; {manual}: `etcdctl compact`, `etcdctl defrag` on each member, then `etcdctl alarm disarm`"
                ),
            )
        } else if voters.iter().any(|m| !m.healthy) {
            Hold::wait(
                reason::DATABASE_QUOTA_EXCEEDED,
                format!("{what}; members are defragmented once every member is healthy"),
            )
        } else if spent {
            Hold::refuse(
                reason::DATABASE_QUOTA_EXCEEDED,
                format!(
                    "{what}; NOSPACE was disarmed after the last defragmentation and etcd raised it again with nothing written since: the data fills the quota etcd runs with. Raise the quota (spec.etcdadmConfigSpec.quotaBackendBytes; members are replaced one at a time) or delete data; the alarm is disarmed again only after a defragmentation shrinks every member's database below {DISARM_BELOW_PERCENT}% of its quota"
                ),
            )
        } else {
            Hold::refuse(
                reason::DATABASE_QUOTA_EXCEEDED,
                format!(
                    "{what}; the history is compacted and every member defragmented, yet the data itself fills {DISARM_BELOW_PERCENT}% of the quota: raise the quota (spec.etcdadmConfigSpec.quotaBackendBytes; members are replaced one at a time) or delete data. The alarm is disarmed once every member is below {DISARM_BELOW_PERCENT}% of its quota"
                ),
            )
        },
    )
}

/// Each member's size against its quota: `m0 17.1 MiB of 16.0 MiB, ...` (a quota the member
/// did not report is marked as believed).
pub fn sizes(o: &Observation) -> String {
    o.voters()
        .iter()
        .map(|m| {
            let name = m.machine.clone().unwrap_or_else(|| m.name.clone());
            let quota = if m.quota_reported {
                human(m.quota())
            } else {
                format!("{} (believed)", human(evidenced_quota(m)))
            };
            match size(m) {
                Some(bytes) => format!("{name} {} of {quota}", human(bytes)),
                None => format!("{name} size unknown (quota {quota})"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn size(member: &MemberView) -> Option<u64> {
    member.db_size.and_then(|b| u64::try_from(b).ok())
}
