//! Which snapshot retention deletes next (docs/day2.md, "Retention"): scheduled and on-demand
//! snapshots by `spec.backup.retention` (the newest `keep`, and the newest of each of the last
//! `hourly` hours, `daily` days and `weekly` weeks), before-change snapshots apart from them
//! (the newest `beforeChange.keep`). Never the newest Succeeded snapshot, never one a restore or
//! a recovery names, never the one a change under way waits for.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::api::snapshot::{
    DEFAULT_BEFORE_CHANGE_KEEP, DEFAULT_FAILED_KEPT, EtcdadmSnapshot, SnapshotPhase,
};
use etcdadm_shared::names::SNAPSHOT_REASON_LABEL;

use etcdadm_shared::api::EtcdadmCluster;

/// Seconds in each tier's period.
const HOUR: i64 = 3_600;
const DAY: i64 = 86_400;
/// 1970-01-01 was a Thursday: shifting by three days makes weeks start on Monday.
const WEEK_SHIFT_DAYS: i64 = 3;

/// The oldest snapshot no rule keeps, of `cluster`'s `snapshots` at `now`; `referenced` names
/// the snapshots a restore or recovery of any cluster names.
pub fn doomed<'a>(
    cluster: &EtcdadmCluster,
    snapshots: &'a [EtcdadmSnapshot],
    now: Timestamp,
    referenced: &[String],
) -> Option<&'a EtcdadmSnapshot> {
    let backup = cluster.spec.backup.as_ref();
    let protected = protected(cluster, snapshots, referenced);
    let (before_change, others): (Vec<&EtcdadmSnapshot>, Vec<&EtcdadmSnapshot>) = snapshots
        .iter()
        .partition(|s| s.labels().contains_key(SNAPSHOT_REASON_LABEL));
    let before_keep = backup.map_or(DEFAULT_BEFORE_CHANGE_KEEP, |b| b.before_change_keep());
    let mut doomed: Vec<&EtcdadmSnapshot> = Vec::new();
    for phase in [SnapshotPhase::Succeeded, SnapshotPhase::Failed] {
        doomed.extend(beyond_newest(&of_phase(&before_change, phase), before_keep));
    }
    if let Some(retention) = backup.and_then(|b| b.retention.as_ref()) {
        let count = |n: Option<i32>| n.and_then(|n| usize::try_from(n.max(1)).ok());
        let succeeded = of_phase(&others, SnapshotPhase::Succeeded);
        let mut kept: BTreeSet<String> = succeeded
            .iter()
            .take(count(retention.keep).unwrap_or(0))
            .map(|s| s.name_any())
            .collect();
        for (tier, period) in [
            (retention.hourly, Period::Hour),
            (retention.daily, Period::Day),
            (retention.weekly, Period::Week),
        ] {
            if let Some(n) = count(tier) {
                kept.extend(newest_per_period(&succeeded, now, period, n));
            }
        }
        doomed.extend(succeeded.into_iter().filter(|s| !kept.contains(&s.name_any())));
        let failed_keep = count(retention.keep).unwrap_or(DEFAULT_FAILED_KEPT);
        doomed.extend(beyond_newest(
            &of_phase(&others, SnapshotPhase::Failed),
            failed_keep,
        ));
    }
    doomed
        .into_iter()
        .filter(|s| !protected.contains(&s.name_any()))
        .min_by_key(|s| finished(s))
}

/// What is never deleted: the newest Succeeded snapshot, those a restore or recovery names, and
/// the one a change under way waits for.
fn protected(
    cluster: &EtcdadmCluster,
    snapshots: &[EtcdadmSnapshot],
    referenced: &[String],
) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = referenced.iter().cloned().collect();
    if let Some(newest) = snapshots
        .iter()
        .filter(|s| s.phase() == SnapshotPhase::Succeeded)
        .max_by_key(|s| finished(s))
    {
        names.insert(newest.name_any());
    }
    if let Some(status) = &cluster.status {
        names.extend(status.before_change.iter().filter_map(|b| b.snapshot.clone()));
        names.extend(status.recovery.iter().map(|r| r.snapshot.clone()));
        names.extend(status.last_recovery.iter().map(|r| r.snapshot.clone()));
        names.extend(status.restored_from.iter().filter_map(|r| r.snapshot.clone()));
    }
    names
}

/// The snapshots of `phase` among `snapshots`, newest first.
fn of_phase<'a>(snapshots: &[&'a EtcdadmSnapshot], phase: SnapshotPhase) -> Vec<&'a EtcdadmSnapshot> {
    let mut found: Vec<&EtcdadmSnapshot> = snapshots.iter().copied().filter(|s| s.phase() == phase).collect();
    found.sort_by_key(|s| std::cmp::Reverse(finished(s)));
    found
}

/// Those of `newest_first` beyond the first `keep`.
fn beyond_newest<'a>(newest_first: &[&'a EtcdadmSnapshot], keep: usize) -> Vec<&'a EtcdadmSnapshot> {
    newest_first.iter().skip(keep).copied().collect()
}

/// A tier's period.
#[derive(Clone, Copy)]
enum Period {
    Hour,
    Day,
    Week,
}

impl Period {
    /// The period (UTC) `time` falls in, as a number that grows by one per period.
    fn of(self, time: Timestamp) -> i64 {
        let seconds = time.as_second();
        match self {
            Period::Hour => seconds.div_euclid(HOUR),
            Period::Day => seconds.div_euclid(DAY),
            Period::Week => (seconds.div_euclid(DAY) + WEEK_SHIFT_DAYS).div_euclid(7),
        }
    }
}

/// The newest snapshot of each of the last `n` periods up to `now` (the current one counted).
fn newest_per_period(
    newest_first: &[&EtcdadmSnapshot],
    now: Timestamp,
    period: Period,
    n: usize,
) -> Vec<String> {
    let current = period.of(now);
    let oldest = current - i64::try_from(n).unwrap_or(i64::MAX) + 1;
    let mut seen = BTreeSet::new();
    newest_first
        .iter()
        .filter_map(|s| {
            let p = period.of(finished(s).0?);
            ((oldest..=current).contains(&p) && seen.insert(p)).then(|| s.name_any())
        })
        .collect()
}

/// When a snapshot finished (else when it was created), then its name: oldest first.
fn finished(s: &EtcdadmSnapshot) -> (Option<Timestamp>, String) {
    let status = s.status.as_ref();
    let completed = status.and_then(|st| st.completion_time.as_ref()).map(|t| t.0);
    (
        completed.or_else(|| s.metadata.creation_timestamp.as_ref().map(|t| t.0)),
        s.name_any(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::{Value, json};

    /// Wednesday 2026-11-25, 10:30 UTC.
    const NOW: &str = "2026-11-25T10:30:00Z";

    fn cluster(backup: Value, status: Value) -> EtcdadmCluster {
        let mut spec_backup = json!({"store": {"s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "snaps",
                                                   "credentialsSecretRef": {"name": "s3"}}}});
        json_patch::merge(&mut spec_backup, &backup);
        serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "namespace": "default"},
            "spec": {"infrastructureTemplate": {}, "backup": spec_backup},
            "status": status,
        }))
        .unwrap()
    }

    fn snapshot(name: &str, completed: &str, phase: &str, reason: Option<&str>) -> EtcdadmSnapshot {
        let labels = reason.map_or(json!({}), |r| json!({SNAPSHOT_REASON_LABEL: r}));
        serde_json::from_value(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": completed, "labels": labels},
            "spec": {"clusterName": "c1-etcd"},
            "status": {"phase": phase, "completionTime": completed, "location": format!("snaps/k/{name}.db"),
                       "store": {"s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "snaps",
                                        "credentialsSecretRef": {"name": "s3"}}}},
        }))
        .unwrap()
    }

    fn ok(name: &str, completed: &str) -> EtcdadmSnapshot {
        snapshot(name, completed, "Succeeded", None)
    }

    /// Everything retention deletes, one step at a time (each retired snapshot taken away).
    fn retired(
        cluster: &EtcdadmCluster,
        snapshots: &[EtcdadmSnapshot],
        referenced: &[String],
    ) -> Vec<String> {
        let mut left = snapshots.to_vec();
        let mut gone = vec![];
        while let Some(snapshot) =
            doomed(cluster, &left, NOW.parse().unwrap(), referenced).map(|s| s.name_any())
        {
            left.retain(|s| s.name_any() != snapshot);
            gone.push(snapshot);
        }
        gone.sort();
        gone
    }

    #[test]
    fn each_tier_keeps_the_newest_snapshot_of_each_of_its_periods() {
        // Every half hour from Monday 2026-11-09 00:00 to now (Wednesday 2026-11-25 10:30).
        let start: Timestamp = "2026-11-09T00:00:00Z".parse().unwrap();
        let now: Timestamp = NOW.parse().unwrap();
        let mut all = vec![];
        let mut t = start;
        while t <= now {
            all.push(ok(&format!("s-{}", t.strftime("%m%d-%H%M")), &t.to_string()));
            t = t
                .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(30))
                .unwrap();
        }
        let kept = |backup: Value| -> Vec<String> {
            let gone = retired(&cluster(backup, json!({})), &all, &[]);
            let mut kept: Vec<String> = all
                .iter()
                .map(|s| s.name_any())
                .filter(|n| !gone.contains(n))
                .collect();
            kept.sort();
            kept
        };
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            // The newest of 10:00, 09:00 and 08:00 (10:30 is the newest of the current hour).
            (
                "hourly 3",
                json!({"retention": {"hourly": 3}}),
                vec!["s-1125-0830", "s-1125-0930", "s-1125-1030"],
            ),
            // Today's newest, yesterday's and the day before's last ones.
            (
                "daily 3",
                json!({"retention": {"daily": 3}}),
                vec!["s-1123-2330", "s-1124-2330", "s-1125-1030"],
            ),
            // Weeks start on Monday: this week (from 11-23), last week (11-16..22), the one before.
            (
                "weekly 3",
                json!({"retention": {"weekly": 3}}),
                vec!["s-1115-2330", "s-1122-2330", "s-1125-1030"],
            ),
            // Tiers add up; `keep` adds the newest N on top.
            (
                "keep 2, hourly 2, daily 2",
                json!({"retention": {"keep": 2, "hourly": 2, "daily": 2}}),
                vec!["s-1124-2330", "s-1125-0930", "s-1125-1000", "s-1125-1030"],
            ),
        ];
        for (what, backup, expected) in cases {
            assert_eq!(kept(backup), expected, "{what}");
        }
    }

    #[test]
    fn before_change_snapshots_are_counted_apart_and_the_newest_or_a_referenced_one_never_goes() {
        let before = |name: &str, at: &str| snapshot(name, at, "Succeeded", Some("before-rollout"));
        let snapshots = vec![
            ok("sched-1", "2026-11-25T06:00:00Z"),
            ok("sched-2", "2026-11-25T07:00:00Z"),
            before("bc-1", "2026-11-25T05:00:00Z"),
            before("bc-2", "2026-11-25T05:10:00Z"),
            before("bc-3", "2026-11-25T05:20:00Z"),
            before("bc-4", "2026-11-25T05:30:00Z"),
            snapshot(
                "bc-failed",
                "2026-11-25T04:00:00Z",
                "Failed",
                Some("before-scale-down"),
            ),
        ];
        // Without retention: only before-change snapshots beyond 3 go (failed ones counted apart).
        assert_eq!(retired(&cluster(json!({}), json!({})), &snapshots, &[]), ["bc-1"]);
        // beforeChange.keep 1 and keep 1: the scheduled ones are counted apart.
        let tight = cluster(
            json!({"retention": {"keep": 1}, "beforeChange": {"keep": 1}}),
            json!({}),
        );
        assert_eq!(
            retired(&tight, &snapshots, &[]),
            ["bc-1", "bc-2", "bc-3", "sched-1"]
        );
        // A snapshot a restore names, or a recovery, stays.
        let recovered = cluster(
            json!({"retention": {"keep": 1}, "beforeChange": {"keep": 1}}),
            json!({"lastRecovery": {"requested": "latest", "source": "snapshot/bc-2", "snapshot": "bc-2"}}),
        );
        assert_eq!(
            retired(&recovered, &snapshots, &["sched-1".to_string()]),
            ["bc-1", "bc-3"]
        );
        // The newest Succeeded snapshot stays even when no rule keeps it (hourly 1, none this hour
        // but it).
        let only = vec![
            ok("old", "2026-11-20T00:00:00Z"),
            ok("older", "2026-11-19T00:00:00Z"),
        ];
        let hourly = cluster(json!({"retention": {"hourly": 1}}), json!({}));
        assert_eq!(retired(&hourly, &only, &[]), ["older"]);
    }
}
