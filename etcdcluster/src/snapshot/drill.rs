//! Restore drills (docs/day2.md, "Restore drills"): whether a cluster's drill is due, and what a
//! drill's comparison concludes, decided from plain values alone. A drill restores the newest
//! Succeeded snapshot and every delta after it into a throwaway etcd beside the controller
//! (`process`, `run`) and compares the copy with the cluster at the revision restored; `drills`
//! runs them, one at a time per controller.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::{DrillResult, EtcdadmSnapshot, S3Store};
use etcdadm_shared::cron::Schedule;
use etcdadm_shared::names;

use super::continuous::newest_succeeded;
use super::plan::{Target, is_paused, object_of, pick_member};

pub mod drills;
pub mod process;
pub mod run;

/// One drill to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Drill {
    /// The schedule time it runs for.
    pub tick: Timestamp,
    pub snapshot: String,
    pub store: S3Store,
    /// The snapshot's object key (its deltas are named after it).
    pub key: String,
    /// The snapshot's revision.
    pub base: i64,
    /// The SHA-256 its status records.
    pub sha256: String,
    /// Bytes of its object.
    pub size: u64,
    /// The last revision its status records as uploaded in deltas.
    pub recorded: Option<i64>,
    /// The member the comparison reads the source from.
    pub member: Target,
    pub sample_keys: usize,
    /// The `drill-now` value it answers (none: run on the schedule).
    pub requested: Option<String>,
}

/// Whether a cluster's drill is due.
#[derive(Clone, Debug, PartialEq)]
pub enum Due {
    /// Run this drill now.
    Now(Box<Drill>),
    /// Not now; look again by `next` (none: nothing to look for).
    Later { next: Option<Duration> },
}

/// The drill `cluster` needs at `now`: the latest schedule time of `spec.backup.verify` that
/// passed after its last drill (or after its creation) and a Succeeded snapshot with an object,
/// a revision and a SHA-256 to drill, and a healthy member to compare with. A time that passed
/// while one of them was missing is drilled once they are there; times missed collapse into one.
pub fn due(cluster: &EtcdadmCluster, snapshots: &[EtcdadmSnapshot], now: Timestamp) -> Due {
    let never = Due::Later { next: None };
    let Some(verify) = cluster.spec.backup.as_ref().and_then(|b| b.verify.as_ref()) else {
        return never;
    };
    if cluster.metadata.deletion_timestamp.is_some() || is_paused(cluster) {
        return never;
    }
    // Admission refuses a schedule that does not parse; the snapshot plan reports one that got by.
    let Ok(schedule) = Schedule::parse(&verify.schedule) else {
        return never;
    };
    let next = schedule
        .next_after(now)
        .map(|t| now.duration_until(t).unsigned_abs());
    let later = Due::Later { next };
    let since = last_drill(snapshots)
        .or_else(|| cluster.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    // Asked for one now, with a value no drill answered yet: now; else the schedule's time.
    let requested = cluster
        .annotations()
        .get(names::DRILL_NOW_ANNOTATION)
        .filter(|token| !answered(snapshots, token))
        .cloned();
    let tick = match (
        &requested,
        schedule.last_at_or_before(now).filter(|tick| *tick > since),
    ) {
        (Some(_), _) => now,
        (None, Some(tick)) => tick,
        (None, None) => return later,
    };
    let drill = newest_succeeded(snapshots).and_then(|newest| {
        let status = newest.status.as_ref()?;
        let (store, key) = object_of(newest)?;
        Some(Drill {
            tick,
            snapshot: newest.name_any(),
            store,
            key,
            base: status.revision?,
            sha256: status.sha256.clone()?,
            size: u64::try_from(status.size?).ok()?,
            recorded: status.deltas.as_ref().map(|d| d.last_revision),
            member: pick_member(cluster)?,
            sample_keys: verify.sample_keys(),
            requested: requested.clone(),
        })
    });
    match drill {
        Some(drill) => Due::Now(Box::new(drill)),
        // Waiting for a snapshot or a healthy member: the next reconcile looks again.
        None => later,
    }
}

/// Whether a drill of any of `snapshots` answered the `drill-now` value `token`.
fn answered(snapshots: &[EtcdadmSnapshot], token: &str) -> bool {
    snapshots.iter().any(|s| {
        s.status
            .as_ref()
            .and_then(|st| st.last_drill.as_ref()?.requested.as_deref())
            == Some(token)
    })
}

/// When the newest drill of any of `snapshots` started.
pub fn last_drill(snapshots: &[EtcdadmSnapshot]) -> Option<Timestamp> {
    snapshots
        .iter()
        .filter_map(|s| Some(s.status.as_ref()?.last_drill.as_ref()?.time.0))
        .max()
}

/// One sampled key: its value in the restored copy, and in the source at the revision restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub key: Vec<u8>,
    pub restored: Vec<u8>,
    pub source: Source,
}

/// A sampled key's value in the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The source had no such key.
    Absent,
    Value(Vec<u8>),
    /// Its answer was over the controller's answer cap: larger than any sampled value of the
    /// copy, so another value.
    OverCap,
}

/// Whether etcd's `error` for a sampled key is the controller's answer cap refusing it.
pub fn over_cap(error: &str) -> bool {
    error.contains("length limit exceeded")
}

/// What the comparison found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same key count, every sampled value the same.
    Same,
    /// The key counts differ.
    Count { source: i64, restored: i64 },
    /// A sampled key the restored copy holds is not in the source.
    Extra { key: String },
    /// A sampled key's value differs.
    Value { key: String },
}

impl Verdict {
    /// The drill's result and what it says.
    pub fn outcome(&self, revision: i64, sampled: usize) -> (DrillResult, String) {
        match self {
            Verdict::Same => (
                DrillResult::Passed,
                format!(
                    "the restored copy holds the source's key count at revision {revision} and the same value for {sampled} sampled keys"
                ),
            ),
            Verdict::Count { source, restored } => (
                DrillResult::Failed,
                format!(
                    "the restored copy holds {restored} keys, the source {source} at revision {revision}"
                ),
            ),
            Verdict::Extra { key } => (
                DrillResult::Failed,
                format!("key {key} is in the restored copy but not in the source at revision {revision}"),
            ),
            Verdict::Value { key } => (
                DrillResult::Failed,
                format!(
                    "key {key} holds another value in the restored copy than in the source at revision {revision}"
                ),
            ),
        }
    }
}

/// The comparison of the restored copy with the source: the key count, then each sample in
/// order (the first difference is named). Values only: a replayed key's revisions are the copy's
/// own, not the source's.
pub fn compare(source_count: i64, restored_count: i64, samples: &[Sample]) -> Verdict {
    if source_count != restored_count {
        return Verdict::Count {
            source: source_count,
            restored: restored_count,
        };
    }
    for sample in samples {
        let key = printable(&sample.key);
        match &sample.source {
            Source::Absent => return Verdict::Extra { key },
            Source::OverCap => return Verdict::Value { key },
            Source::Value(value) if *value != sample.restored => return Verdict::Value { key },
            Source::Value(_) => {}
        }
    }
    Verdict::Same
}

/// The positions (0-based, in key order) of the keys sampled out of `total`: `wanted` of them
/// (all when there are fewer), spread evenly from the first.
pub fn sample_positions(total: u64, wanted: usize) -> Vec<u64> {
    let wanted = u64::try_from(wanted).unwrap_or(u64::MAX).min(total);
    (0..wanted)
        .map(|i| {
            // i * total / wanted without overflow: total and wanted fit in u64, their product in u128.
            u64::try_from(u128::from(i) * u128::from(total) / u128::from(wanted)).unwrap_or(total - 1)
        })
        .collect()
}

/// Why the source could not be read at `revision`, from etcd's `error`: compacted (the drill
/// cannot compare what the cluster no longer keeps), or not answering.
pub fn source_unreadable(error: &str, revision: i64) -> String {
    if error.contains("required revision has been compacted") {
        format!(
            "the source cluster compacted revision {revision} before the drill compared with it: \
             nothing is concluded about the backup (a drill compares within etcd's compaction window)"
        )
    } else {
        format!("reading the source cluster at revision {revision}: {error}")
    }
}

/// A key as a message shows it: UTF-8 as is (control characters escaped), else hex; at most
/// 256 characters.
pub fn printable(key: &[u8]) -> String {
    let text = match std::str::from_utf8(key) {
        Ok(text) => text.escape_debug().to_string(),
        Err(_) => format!("0x{}", etcdadm_shared::backup::checksum::hex(key)),
    };
    match text.char_indices().nth(256) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests;
