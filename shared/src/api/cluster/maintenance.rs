//! etcd's own health kept by the controller: `spec.maintenance` (who repairs alarms, the
//! defragmentation policy and its window), its defaults and checks, and a member's last
//! defragmentation as the status records it.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::api::quantity::ByteQuantity;
use crate::cron::Schedule;
use crate::duration;
use crate::validation::field::{FieldError, quoted};

/// etcd's own health, kept by the controller.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Maintenance {
    /// `Automatic` (default): a NOSPACE alarm is repaired (history compacted, members
    /// defragmented one at a time, the alarm disarmed once every member is below 90% of its
    /// quota); a CORRUPT alarm's member is replaced, then the alarm disarmed. `Manual`: alarms
    /// are reported, and the repair is left to a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarms: Option<AlarmRepair>,
    /// Routine defragmentation: a member whose database is mostly free space gets it back,
    /// one member at a time, only while the cluster is Ready and nothing else is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defragmentation: Option<DefragmentationPolicy>,
}

/// When members are defragmented without an alarm. A member qualifies when its database is at
/// least `fragmentedPercent` free space and at least `minimumSize`, or at least `quotaPercent`
/// of its quota with at least `minimumReclaimable` free.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationPolicy {
    /// `Automatic` or `Off`. Default: Automatic with 3 or more replicas, Off with 1 (defragmenting
    /// the only member stops every client while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DefragmentationMode>,
    /// Free space, in percent of the database, that makes a member fragmented: 1 to 99, default
    /// 45.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 99))]
    pub fragmented_percent: Option<i32>,
    /// The smallest database defragmented for fragmentation alone (default 100Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::api::schema_rules::bytes("minimumSize"))]
    pub minimum_size: Option<ByteQuantity>,
    /// Share of its quota, in percent, at which a member is defragmented whatever its
    /// fragmentation, if `minimumReclaimable` is free: 1 to 100, default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub quota_percent: Option<i32>,
    /// Free space worth a defragmentation near the quota (default 100Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::api::schema_rules::bytes("minimumReclaimable"))]
    pub minimum_reclaimable: Option<ByteQuantity>,
    /// Least time between two defragmentations of one member: a duration of at least 1m,
    /// default 10m. At most 64 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = crate::api::schema_rules::duration_at_least("interval", "1m"))]
    pub interval: Option<String>,
    /// Only inside this window (default: at any time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<MaintenanceWindow>,
}

/// Whether members are defragmented on the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum DefragmentationMode {
    Automatic,
    Off,
}

/// A recurring time window: it opens at each time of `start` and stays open for `duration`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When it opens: a 5-field cron expression, UTC (`0 2 * * *`: at 02:00 every day). At most
    /// 128 characters.
    #[schemars(length(max = 128))]
    pub start: String,
    /// How long it stays open: a duration of at least 1m (`2h`). At most 64 characters.
    #[schemars(
        length(max = 64),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    #[x_kube(validation = crate::api::schema_rules::duration_at_least("duration", "1m"))]
    pub duration: String,
}

/// Defaults of the defragmentation policy (OpenShift's etcd operator's thresholds).
pub const DEFAULT_FRAGMENTED_PERCENT: u64 = 45;
pub const DEFAULT_DEFRAGMENT_MINIMUM_SIZE: u64 = 100 << 20;
pub const DEFAULT_DEFRAGMENT_QUOTA_PERCENT: u64 = 80;
pub const DEFAULT_DEFRAGMENT_MINIMUM_RECLAIMABLE: u64 = 100 << 20;
pub const DEFAULT_DEFRAGMENT_INTERVAL: Duration = Duration::from_secs(600);
/// The shortest interval and window accepted.
pub const MIN_DEFRAGMENT_INTERVAL: Duration = Duration::from_secs(60);

/// The defragmentation policy after defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefragmentationSettings {
    pub enabled: bool,
    pub fragmented_percent: u64,
    pub minimum_size: u64,
    pub quota_percent: u64,
    pub minimum_reclaimable: u64,
    pub interval: Duration,
    pub window: DefragmentationWindow,
}

/// When defragmentation may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefragmentationWindow {
    /// At any time.
    Always,
    /// From each time of the schedule, for the duration.
    Recurring(crate::cron::Schedule, Duration),
    /// A window that does not parse (admission refuses it): never.
    Unreadable,
}

impl DefragmentationWindow {
    /// Whether the window is open at `now`.
    pub fn is_open(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        match self {
            DefragmentationWindow::Always => true,
            DefragmentationWindow::Unreadable => false,
            DefragmentationWindow::Recurring(start, open) => start
                .last_at_or_before(now)
                .and_then(|opened| now.duration_since(opened).try_into().ok())
                .is_some_and(|since: Duration| since < *open),
        }
    }
}

/// Who repairs an etcd alarm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AlarmRepair {
    #[default]
    Automatic,
    Manual,
}

/// Who repairs etcd alarms, with the default applied.
pub(super) fn alarm_repair(maintenance: Option<&Maintenance>) -> AlarmRepair {
    maintenance.and_then(|m| m.alarms).unwrap_or_default()
}

/// The defragmentation policy with defaults applied. A value admission would refuse counts
/// as its default, except a window that does not parse: that one never opens (nothing is
/// defragmented at times nobody can read).
pub(super) fn defragmentation_settings(
    maintenance: Option<&Maintenance>,
    replicas: i32,
) -> DefragmentationSettings {
    let policy = maintenance
        .and_then(|m| m.defragmentation.clone())
        .unwrap_or_default();
    let percent = |value: Option<i32>, max: u64, default: u64| {
        value
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| (1..=max).contains(v))
            .unwrap_or(default)
    };
    let bytes = |value: &Option<ByteQuantity>, default: u64| {
        value.as_ref().and_then(|q| q.bytes().ok()).unwrap_or(default)
    };
    let window = match &policy.window {
        None => DefragmentationWindow::Always,
        Some(w) => match (
            crate::cron::Schedule::parse(&w.start),
            duration::parse(&w.duration),
        ) {
            (Ok(start), Ok(open)) => DefragmentationWindow::Recurring(start, open),
            _ => DefragmentationWindow::Unreadable,
        },
    };
    DefragmentationSettings {
        enabled: match policy.mode {
            Some(DefragmentationMode::Automatic) => true,
            Some(DefragmentationMode::Off) => false,
            None => replicas >= 3,
        },
        fragmented_percent: percent(policy.fragmented_percent, 99, DEFAULT_FRAGMENTED_PERCENT),
        minimum_size: bytes(&policy.minimum_size, DEFAULT_DEFRAGMENT_MINIMUM_SIZE),
        quota_percent: percent(policy.quota_percent, 100, DEFAULT_DEFRAGMENT_QUOTA_PERCENT),
        minimum_reclaimable: bytes(
            &policy.minimum_reclaimable,
            DEFAULT_DEFRAGMENT_MINIMUM_RECLAIMABLE,
        ),
        interval: policy
            .interval
            .as_deref()
            .and_then(|i| duration::parse(i).ok())
            .unwrap_or(DEFAULT_DEFRAGMENT_INTERVAL)
            .max(MIN_DEFRAGMENT_INTERVAL),
        window,
    }
}

/// One defragmentation of a member's database.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Defragmentation {
    /// When it finished.
    pub time: Time,
    /// The member's revision then: under NOSPACE it moves only by deletes, so a member
    /// defragmented at its current revision has nothing more to return.
    pub revision: i64,
    /// Database size before, in bytes.
    pub size_before: i64,
    /// Database size after, in bytes (the difference is what it returned to the file system).
    pub size_after: i64,
    /// When NOSPACE was disarmed on the strength of this defragmentation: each disarm spends
    /// one that shrank the database, so NOSPACE is never disarmed twice without the database
    /// having shrunk in between (docs/day2.md, "Alarms").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disarmed: Option<Time>,
}

/// CORRUPT alarms disarmed unconfirmed: every member's `HashKV` agreed at a common revision.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnconfirmedCorrupt {
    /// How many were disarmed within an hour of the one before (1 for the first).
    pub count: i32,
    /// When the last was disarmed.
    pub last: Time,
    /// The revision the members' hashes agreed at, the last time.
    pub revision: i64,
}

/// The defragmentation policy's sizes, interval and window parse (percentages are bounded by
/// the schema).
pub(super) fn problems(maintenance: Option<&Maintenance>) -> Vec<FieldError> {
    let Some(policy) = maintenance.and_then(|m| m.defragmentation.as_ref()) else {
        return vec![];
    };
    let base = "spec.maintenance.defragmentation";
    let mut errors = vec![];
    for (field, value) in [
        ("minimumSize", &policy.minimum_size),
        ("minimumReclaimable", &policy.minimum_reclaimable),
    ] {
        if let Some(Err(why)) = value.as_ref().map(|q| q.bytes()) {
            errors.push(FieldError::new(format!("{base}.{field}"), why));
        }
    }
    for (field, value, bound) in [
        ("fragmentedPercent", policy.fragmented_percent, 99),
        ("quotaPercent", policy.quota_percent, 100),
    ] {
        if let Some(percent) = value
            && !(1..=bound).contains(&percent)
        {
            errors.push(FieldError::new(
                format!("{base}.{field}"),
                format!("{percent}: must be 1 to {bound} (percent)"),
            ));
        }
    }
    let minimum = duration::format(MIN_DEFRAGMENT_INTERVAL);
    let mut at_least = |field: String, value: &str| match duration::parse(value) {
        Ok(d) if d >= MIN_DEFRAGMENT_INTERVAL => {}
        Ok(_) => errors.push(FieldError::new(
            field,
            format!("{}: must be at least {minimum}", quoted(value)),
        )),
        Err(e) => errors.push(FieldError::new(field, format!("{}: {e}", quoted(value)))),
    };
    if let Some(interval) = &policy.interval {
        at_least(format!("{base}.interval"), interval);
    }
    if let Some(window) = &policy.window {
        at_least(format!("{base}.window.duration"), &window.duration);
        if let Err(e) = Schedule::parse(&window.start) {
            errors.push(FieldError::new(format!("{base}.window.start"), e.to_string()));
        }
    }
    errors
}
