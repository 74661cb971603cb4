//! CORRUPT (docs/day2.md, "Alarms"): anyone holding a client certificate of the cluster's CA can
//! raise it, so it is confirmed with etcd's own evidence before a member is replaced: each
//! voter's `HashKV` at a common revision. A member whose hash differs from a majority that
//! agrees is replaced (by remediation, with its backoff); when every hash agrees the alarm is
//! not confirmed and is disarmed, and one raised again and again on agreeing hashes is left to a
//! person.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::api::cluster::{AlarmRepair, UnconfirmedCorrupt};
use etcdadm_shared::etcd::member_id_hex;

use super::{AlarmStep, DisarmRecord, reason, serving_url};
use crate::controller::decision::Hold;
use crate::controller::observation::{AlarmKind, MemberView, Observation};
use crate::controller::rules::quorum;

/// CORRUPT alarms disarmed unconfirmed, each within this time of the one before, that make it
/// "again and again".
pub const REPEAT_WINDOW: Duration = Duration::from_secs(3600);
/// The most CORRUPT alarms disarmed unconfirmed in a row (each within [`REPEAT_WINDOW`] of the
/// one before): the next is left to a person.
pub const MAX_UNCONFIRMED: i32 = 3;

/// What etcd's own evidence says of a raised CORRUPT.
#[derive(Debug, PartialEq)]
pub enum Verdict<'a> {
    /// The evidence is not complete yet: why.
    Unknown(String),
    /// A majority of the voters agree; these voters' hashes differ from it.
    Confirmed(Vec<&'a MemberView>),
    /// Every voter hashes the same at `revision`: no member's data differs.
    Agree { revision: i64 },
    /// Every voter answered, and no majority of them agrees.
    Split(String),
}

/// The voters' hashes compared: a majority that agrees (same revision, same compacted
/// revision, same hash), and who differs from it.
pub fn verdict(o: &Observation) -> Verdict<'_> {
    let voters = o.voters();
    if voters.is_empty() {
        return Verdict::Unknown("no voting member listed".into());
    }
    let hashed: Vec<&MemberView> = voters.iter().copied().filter(|m| m.hash.is_some()).collect();
    let missing: Vec<String> = voters
        .iter()
        .filter(|m| m.hash.is_none())
        .map(|m| m.describe())
        .collect();
    let mut compacted: Vec<i64> = hashed
        .iter()
        .filter_map(|m| m.hash.map(|h| h.compact_revision))
        .collect();
    compacted.sort_unstable();
    compacted.dedup();
    if compacted.len() > 1 {
        return Verdict::Unknown(format!(
            "the members' histories are compacted at different revisions ({compacted:?}), so their hashes cover different histories"
        ));
    }
    let mut groups: BTreeMap<(i64, u32), Vec<&MemberView>> = BTreeMap::new();
    for m in &hashed {
        if let Some(h) = m.hash {
            groups.entry((h.revision, h.hash)).or_default().push(m);
        }
    }
    let majority = groups
        .iter()
        .find(|(_, members)| members.len() >= quorum(voters.len()));
    match majority {
        Some(((revision, hash), agreeing)) => {
            let differ: Vec<&MemberView> = hashed
                .iter()
                .copied()
                .filter(|m| m.hash.is_some_and(|h| (h.revision, h.hash) != (*revision, *hash)))
                .collect();
            if !differ.is_empty() {
                Verdict::Confirmed(differ)
            } else if missing.is_empty() && agreeing.len() == voters.len() {
                Verdict::Agree { revision: *revision }
            } else {
                Verdict::Unknown(format!(
                    "{} agree; waiting for the hash of the {}",
                    agreeing.len(),
                    missing.join(", ")
                ))
            }
        }
        None if missing.is_empty() => Verdict::Split(
            hashed
                .iter()
                .filter_map(|m| m.hash.map(|h| format!("{} {:08x}", m.describe(), h.hash)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        None => Verdict::Unknown(format!(
            "no majority agrees yet; waiting for the hash of the {}",
            missing.join(", ")
        )),
    }
}

/// The members a raised CORRUPT may replace: those whose hash differs from a majority that
/// agrees (empty unless CORRUPT is raised and confirmed).
pub fn confirmed(o: &Observation) -> Vec<&MemberView> {
    if !o.alarm_raised(AlarmKind::Corrupt) {
        return vec![];
    }
    match verdict(o) {
        Verdict::Confirmed(members) => members,
        _ => vec![],
    }
}

/// CORRUPT raised on members that are still here, every voter's hash agreeing: disarmed (writes
/// resume, nothing replaced), unless it was disarmed unconfirmed [`MAX_UNCONFIRMED`] times in a
/// row already.
pub fn unconfirmed(o: &Observation) -> Option<AlarmStep> {
    if !o.alarm_raised(AlarmKind::Corrupt) {
        return None;
    }
    let Verdict::Agree { revision } = verdict(o) else {
        return None;
    };
    let count = next_count(o)?;
    Some(AlarmStep::Disarm {
        kind: AlarmKind::Corrupt,
        member_ids: super::alarmed(o, AlarmKind::Corrupt),
        via: serving_url(o)?,
        why: format!(
            "not confirmed: every member's data hashes the same at revision {revision} (etcd's HashKV), so no member is replaced"
        ),
        record: DisarmRecord::Unconfirmed { revision, count },
    })
}

/// The count of unconfirmed disarms this one would make, or `None` past [`MAX_UNCONFIRMED`].
fn next_count(o: &Observation) -> Option<i32> {
    let count = match last_unconfirmed(o) {
        Some((last, ago)) if ago < REPEAT_WINDOW => last.count.saturating_add(1),
        _ => 1,
    };
    (count <= MAX_UNCONFIRMED).then_some(count)
}

/// The last unconfirmed disarm as status recorded it, and how long ago.
fn last_unconfirmed(o: &Observation) -> Option<(&UnconfirmedCorrupt, Duration)> {
    let last = o.etcd_cluster.status.as_ref()?.unconfirmed_corrupt.as_ref()?;
    let ago = ago(o.certificates.now, last.last.0);
    Some((last, ago))
}

fn ago(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or(Duration::ZERO)
}

/// Why CORRUPT is still raised once no repair step can be taken now, for the Ready condition.
pub fn remaining(o: &Observation, manual: &str) -> Option<Hold> {
    if !o.alarm_raised(AlarmKind::Corrupt) {
        return None;
    }
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
        "CORRUPT is raised on the {} and etcd refuses writes",
        named.join(", ")
    );
    if o.alarm_repair == AlarmRepair::Manual {
        return Some(Hold::refuse(
            reason::MEMBER_CORRUPT,
            format!(
                "{what}; {manual}: compare the members' `etcdctl endpoint hashkv`, replace a member whose hash differs from the others', then `etcdctl alarm disarm`"
            ),
        ));
    }
    Some(match verdict(o) {
        Verdict::Unknown(why) => Hold::wait(
            reason::MEMBER_CORRUPT,
            format!("{what}; confirming it with each member's HashKV before anything is replaced: {why}"),
        ),
        Verdict::Split(hashes) => Hold::refuse(
            reason::MEMBER_CORRUPT,
            format!(
                "{what}; no majority of the members' hashes agree ({hashes}), so no member is known good: left to you"
            ),
        ),
        Verdict::Agree { revision } => {
            let count = last_unconfirmed(o).map_or(0, |(last, _)| last.count);
            Hold::refuse(
                reason::CORRUPT_REPEATED,
                format!(
                    "{what}; every member's data hashes the same at revision {revision}, as the {count} times before within an hour of each other when it was disarmed: something holding a client certificate of the cluster's CA may be raising it. Left to you: find who raises it, then `etcdctl alarm disarm`"
                ),
            )
        }
        Verdict::Confirmed(_) => Hold::refuse(
            reason::MEMBER_CORRUPT,
            format!(
                "{what}; its data differs from the majority's: a member on no Machine of this EtcdadmCluster is not replaced here: remove it (`etcdctl member remove`), and the alarm is disarmed once it is gone"
            ),
        ),
    })
}
