//! Routine defragmentation (docs/day2.md, "Routine maintenance"): a member whose database is
//! mostly free space, or close to its quota with much of it free, gets the space back, one
//! member at a time, followers first and the leader last, only while the cluster is Ready and
//! nothing else is under way, each member at most once per interval and inside the window. The
//! defragmentation itself (also the NOSPACE repair's, `alarms.rs`) is here: one member, its size
//! read after, the result recorded in `status.members[].lastDefragmentation`.

use crate::controller::decision::ConcernMetrics;
use crate::metrics::ClusterLabels;
use etcdadm_shared::manager::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use etcdadm_shared::api::EtcdadmClusterStatus;
use etcdadm_shared::api::cluster::{Defragmentation, DefragmentationSettings};
use etcdadm_shared::api::quantity::human;
use etcdadm_shared::error::Error;
use etcdadm_shared::etcd::{defragment_timeout, member_id_hex};

use crate::controller::decision::reason::READY;
use crate::controller::decision::{After, Applied, ConcernStep, EventNote, Outputs};
use crate::controller::observation::{MemberView, Observation, is_ready, member_client_url};
use crate::controller::plan::recovery::Recovery;
use crate::controller::plan::restore::view::RestoreFrom;
use crate::controller::plan::safe_changes::SafeChangeView;

/// After a defragmentation, the next look comes with a fresh health check (every member healthy
/// again before the next one), soon.
const NEXT_MEMBER_POLL: Duration = Duration::from_secs(1);

/// One member to defragment: what the effect needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Defragment {
    /// The member, for people (`member of Machine c1-etcd-m1`).
    pub member: String,
    pub member_id: u64,
    pub url: String,
    /// Its database size before, which sets the call's deadline.
    pub db_size: u64,
    /// Its revision, recorded with the result.
    pub revision: i64,
}

/// Why a defragmentation is run, as the metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Policy,
    NoSpace,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Policy => "policy",
            Trigger::NoSpace => "nospace",
        }
    }
}

/// Routine maintenance's steps.
#[derive(Clone, Debug, PartialEq)]
pub enum MaintenanceStep {
    /// Defragment one member on the policy; `why` names the threshold it crossed.
    Defragment { target: Defragment, why: String },
}

impl ConcernStep for MaintenanceStep {
    type View = ();
    type Metrics = MaintenanceMetrics;

    fn reason(&self) -> (&'static str, String) {
        match self {
            // Ready stays True: the cluster serves throughout.
            MaintenanceStep::Defragment { target, why } => {
                (READY, format!("defragmenting the {} ({why})", target.member))
            }
        }
    }

    fn event(&self, _: &Observation) -> Option<EventNote> {
        match self {
            MaintenanceStep::Defragment { target, why } => Some(EventNote::normal(
                "MemberDefragmented",
                format!(
                    "defragmented the {} on the maintenance policy ({why})",
                    target.member
                ),
            )),
        }
    }

    /// A defragmentation waits as long as the database is large.
    fn time_allowed(&self) -> Duration {
        match self {
            MaintenanceStep::Defragment { target, .. } => defragment_timeout(target.db_size),
        }
    }

    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            MaintenanceStep::Defragment { target, .. } => defragment(out, o, target, Trigger::Policy).await,
        }
    }

    fn after(&self, _: &Observation) -> After {
        After::Requeue(NEXT_MEMBER_POLL)
    }
}

/// Defragment `target` and read its size after: both recorded in its
/// `status.members[].lastDefragmentation` once done; counted in the metrics as `trigger`'s.
pub async fn defragment(
    out: &Outputs<'_>,
    o: &Observation,
    target: &Defragment,
    trigger: Trigger,
) -> Result<Applied, Error> {
    let deadline = defragment_timeout(target.db_size);
    let client = out.etcd_clients.client(&o.cache_key(), &target.url, deadline)?;
    let started = Instant::now();
    client.defragment(deadline).await?;
    let took = started.elapsed();
    let after = client.status().await?;
    let record = Defragmentation {
        time: Time(Timestamp::now()),
        revision: target.revision,
        size_before: i64::try_from(target.db_size).unwrap_or(i64::MAX),
        size_after: i64::try_from(after.db_size).unwrap_or(i64::MAX),
    };
    let reclaimed = target.db_size.saturating_sub(after.db_size);
    out.concern_metrics(&o.etcd_cluster, |m: &MaintenanceMetrics, ns, name| {
        m.defragmented(ns, name, trigger.as_str(), reclaimed, took)
    });
    // Recorded once done: only the outcome tells it.
    let member_id = target.member_id;
    Ok(Applied::Recorded(Box::new(move |status| {
        record_defragmentation(status, member_id, record)
    })))
}

/// The member's status entry keeps its last defragmentation.
fn record_defragmentation(status: &mut EtcdadmClusterStatus, member_id: u64, record: Defragmentation) {
    let id = member_id_hex(member_id);
    if let Some(entry) = status
        .members
        .iter_mut()
        .find(|m| m.member_id.as_deref() == Some(id.as_str()))
    {
        entry.last_defragmentation = Some(record);
    }
}

// Decisions.

/// The next member to defragment on the policy, when one is due and the cluster is settled:
/// Ready (every member a healthy voter, none joining or leaving), no alarm (the alarms concern
/// repairs those), no Machine outdated or being deleted, no remediation owed, no recovery or
/// restore, the control plane not rolling, no snapshot waiting or being taken. Followers first
/// (by name), the leader last.
pub fn routine(o: &Observation) -> Option<MaintenanceStep> {
    let settings = o.etcd_cluster.spec.defragmentation_settings();
    let now = o.certificates.now;
    if !settings.enabled || !settings.window.is_open(now) || busy(o) {
        return None;
    }
    let mut due: Vec<(&MemberView, String)> = o
        .voters()
        .into_iter()
        .filter(|m| !recently_defragmented(o, m, settings.interval, now))
        .filter_map(|m| qualifies(m, &settings).map(|why| (m, why)))
        .collect();
    due.sort_by_key(|(m, _)| (m.is_leader, m.name.clone()));
    let (member, why) = due.into_iter().next()?;
    Some(MaintenanceStep::Defragment {
        target: Defragment {
            member: member.describe(),
            member_id: member.id,
            url: member_client_url(o, member)?,
            db_size: size(member.db_size)?,
            revision: member.revision?,
        },
        why,
    })
}

/// Something else is under way, or the cluster is not whole: no defragmentation now.
fn busy(o: &Observation) -> bool {
    !is_ready(o)
        || !o.alarms.is_empty()
        || o.voters().iter().any(|m| !m.healthy)
        || o.machines.iter().any(|m| m.deleting || m.outdated.is_some())
        || o.replacement_pending()
        || o.view::<Recovery>()
            .view
            .as_ref()
            .is_some_and(|r| r.requested.is_some() || r.under_way.is_some())
        || o.view::<RestoreFrom>().view.as_ref().is_some_and(|r| !r.recorded)
        || o.kcp_in_use().is_some_and(|(_, _, rolled)| !rolled)
        || o.view::<SafeChangeView>().snapshot_in_flight.is_some()
}

/// Defragmented by this controller less than `interval` ago (`status.members[].lastDefragmentation`).
fn recently_defragmented(o: &Observation, member: &MemberView, interval: Duration, now: Timestamp) -> bool {
    let id = member_id_hex(member.id);
    o.etcd_cluster
        .status
        .as_ref()
        .and_then(|s| {
            s.members
                .iter()
                .find(|m| m.member_id.as_deref() == Some(id.as_str()))
        })
        .and_then(|m| m.last_defragmentation.as_ref())
        .is_some_and(|last| now.duration_since(last.time.0).unsigned_abs() < interval)
}

fn size(bytes: Option<i64>) -> Option<u64> {
    bytes.and_then(|b| u64::try_from(b).ok())
}

/// Why `member` is worth defragmenting, if it is: its free space is at least
/// `fragmented_percent` of a database of at least `minimum_size`, or its database reached
/// `quota_percent` of its quota with at least `minimum_reclaimable` free.
fn qualifies(member: &MemberView, settings: &DefragmentationSettings) -> Option<String> {
    let (total, in_use) = (size(member.db_size)?, size(member.db_size_in_use)?);
    let free = total.saturating_sub(in_use);
    let percent_of = |part: u64, whole: u64| u128::from(part) * 100 / u128::from(whole.max(1));
    let fragmented = percent_of(free, total);
    if total >= settings.minimum_size && fragmented >= u128::from(settings.fragmented_percent) {
        return Some(format!("{fragmented}% of its {} is free space", human(total)));
    }
    let quota = member.quota();
    let full = percent_of(total, quota);
    if full >= u128::from(settings.quota_percent) && free >= settings.minimum_reclaimable {
        return Some(format!(
            "its {} is {full}% of its {} quota, {} of it free",
            human(total),
            human(quota),
            human(free)
        ));
    }
    None
}

// Metrics.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DefragmentationLabels {
    pub namespace: String,
    pub name: String,
    /// `policy` (routine maintenance) or `nospace` (an alarm's repair).
    pub trigger: String,
}

/// Defragmentations: how many, what they returned, how long they took.
#[derive(Clone, Debug)]
pub struct MaintenanceMetrics {
    defragmentations: Family<DefragmentationLabels, Counter>,
    reclaimed: Family<DefragmentationLabels, Counter>,
    duration: Family<ClusterLabels, Histogram, fn() -> Histogram>,
}

/// 50 ms .. ~100 s: etcd's defragmentation pause grows with the database.
fn defragmentation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 12))
}

impl Default for MaintenanceMetrics {
    fn default() -> Self {
        MaintenanceMetrics {
            defragmentations: Family::default(),
            reclaimed: Family::default(),
            duration: Family::new_with_constructor(defragmentation_histogram),
        }
    }
}

impl ConcernMetrics for MaintenanceMetrics {
    fn register(&self, registry: &Metrics) {
        registry.register(
            "etcdadm_defragmentations",
            "Members defragmented, by trigger (policy, nospace)",
            self.defragmentations.clone(),
        );
        registry.register(
            "etcdadm_defragmentation_reclaimed_bytes",
            "Bytes defragmentations returned to the file system, by trigger",
            self.reclaimed.clone(),
        );
        registry.register(
            "etcdadm_defragmentation_duration_seconds",
            "Time one member's defragmentation took",
            self.duration.clone(),
        );
    }
}

impl MaintenanceMetrics {
    /// One member defragmented by `trigger` (`policy`, `nospace`): what it returned and how
    /// long it took.
    pub fn defragmented(&self, namespace: &str, name: &str, trigger: &str, reclaimed: u64, took: Duration) {
        let labels = DefragmentationLabels {
            namespace: namespace.into(),
            name: name.into(),
            trigger: trigger.into(),
        };
        self.defragmentations.get_or_create(&labels).inc();
        self.reclaimed.get_or_create(&labels).inc_by(reclaimed);
        self.duration
            .get_or_create(&ClusterLabels::new(namespace, name))
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests;
