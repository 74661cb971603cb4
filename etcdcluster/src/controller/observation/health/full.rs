//! What a NOSPACE repair needs of each member besides its health, read as soon as the cluster's
//! alarm list shows NOSPACE (not only once the member's own Status lists it, which can trail the
//! alarm list by a round): the repair judges every voter against the quota etcd runs with.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use tracing::debug;

use etcdadm_shared::etcd::{MemberClient, MemberStatus};

use super::{PROBE_CONCURRENCY, Probe, QUOTA_METRIC};
use crate::controller::observation::views::{Alarm, AlarmKind};

/// Whether NOSPACE is raised as far as the member that answered `status` is concerned: in the
/// cluster's alarm list (the alarm is the cluster's, whichever member raised it) or in its own
/// Status.
pub(super) fn nospace_seen(alarms: &[Alarm], status: &MemberStatus) -> bool {
    alarms.iter().any(|a| a.kind == AlarmKind::NoSpace)
        || status
            .errors
            .iter()
            .any(|e| e.contains(AlarmKind::NoSpace.as_str()))
}

/// For every probed member that answered Status while NOSPACE is raised: whether its history
/// before its revision is compacted, and the quota it publishes when its Status does not say.
pub(super) async fn read_all(probes: &mut BTreeMap<String, Probe>, alarms: &[Alarm]) {
    let asked: Vec<(String, Arc<MemberClient>, MemberStatus)> = probes
        .values()
        .filter_map(|p| {
            let status = p.status.as_ref().ok().filter(|s| nospace_seen(alarms, s))?;
            Some((p.client_url.clone(), p.client.clone()?, status.clone()))
        })
        .collect();
    let read: Vec<(String, Option<bool>, Option<u64>)> = futures::stream::iter(asked)
        .map(|(url, client, status)| async move {
            let (compacted, quota) = tokio::join!(
                client.is_compacted_before(status.revision),
                published_quota(&client, &status)
            );
            (url, compacted.ok(), quota)
        })
        .buffer_unordered(PROBE_CONCURRENCY)
        .collect()
        .await;
    for (url, compacted, quota) in read {
        if let Some(p) = probes.get_mut(&url) {
            p.history_compacted = compacted;
            p.quota_published = quota;
        }
    }
}

/// The quota a member runs with, from its `/metrics` (`etcd_server_quota_backend_bytes`), when
/// its Status does not report it: etcd 3.4 and 3.5 publish it there only.
async fn published_quota(client: &MemberClient, status: &MemberStatus) -> Option<u64> {
    if status.db_size_quota.is_some() {
        return None;
    }
    match client.metric(QUOTA_METRIC).await {
        // A float in the exposition; a quota is a whole, positive number of bytes.
        Ok(Some(value)) if (1.0..1e19).contains(&value) => Some(value as u64),
        Ok(_) => None,
        Err(e) => {
            debug!(url = %client.endpoint(), error = %e, "reading the quota from /metrics failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(errors: &[&str]) -> MemberStatus {
        MemberStatus {
            member_id: 1,
            leader_id: Some(1),
            version: "3.4.23".into(),
            db_size: 1,
            db_size_in_use: 1,
            db_size_quota: None,
            raft_term: 1,
            raft_index: 1,
            revision: 1,
            is_learner: false,
            errors: errors.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn alarm(member_id: u64, kind: AlarmKind) -> Alarm {
        Alarm { member_id, kind }
    }

    #[test]
    fn nospace_is_seen_in_the_alarm_list_for_every_member_or_in_a_members_own_status() {
        let quiet = status(&[]);
        let own = status(&["memberID:2 alarm:NOSPACE "]);
        for (what, alarms, status, seen) in [
            ("nothing raised", vec![], &quiet, false),
            ("only CORRUPT", vec![alarm(2, AlarmKind::Corrupt)], &quiet, false),
            (
                "another member's NOSPACE in the list, before this member's Status says",
                vec![alarm(2, AlarmKind::NoSpace)],
                &quiet,
                true,
            ),
            ("its own Status says, the list read before", vec![], &own, true),
        ] {
            assert_eq!(nospace_seen(&alarms, status), seen, "{what}");
        }
    }
}
