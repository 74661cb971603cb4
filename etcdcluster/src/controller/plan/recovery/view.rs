//! What the recovery concern reads and sees: the `recover` annotation's request, the recovery
//! under way in `status.recovery` with its snapshot now, the snapshot a request would restore
//! from, and the automatic recovery's clock.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Client, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::cluster::RecoveryStatus;
use etcdadm_shared::api::cluster::condition::ENDPOINTS_AVAILABLE;
use etcdadm_shared::api::conditions::{self, READY};
use etcdadm_shared::api::snapshot::EtcdadmSnapshot;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;

use crate::controller::decision::ConcernView;
use crate::controller::observation::clock::UnhealthyClock;
use crate::controller::observation::restore_source;
use crate::controller::observation::{
    Automatic, Reads, RecoveryRecord, RecoverySource, RecoveryView, UnderWay,
};

/// What this concern sees: the `recover` annotation's request or the recovery under way, and
/// the automatic recovery's clock (none of it while neither is there and no automatic recovery
/// is configured).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovery {
    pub view: Option<RecoveryView>,
}

impl ConcernView for Recovery {
    type Read = Option<RecoveryView>;

    async fn read(client: &Client, namespace: &str, etcd: &EtcdadmCluster) -> Result<Self::Read, Error> {
        recovery_view(client, namespace, etcd).await
    }

    /// A recovery (it waits on its EtcdadmSnapshot, whose changes end no reuse) is looked at
    /// afresh.
    fn keep(read: &Self::Read, _: &EtcdadmCluster) -> bool {
        !read
            .as_ref()
            .is_some_and(|r| r.requested.is_some() || r.under_way.is_some())
    }

    fn view(read: &Self::Read, reads: &Reads, clock: &UnhealthyClock) -> Self {
        let e = &reads.etcd_cluster;
        Recovery {
            view: read.clone().map(|mut view| {
                view.automatic = e.spec.automatic_recovery_after().map(|after| Automatic {
                    after,
                    unserved_for: unserved_since(e).map_or(Duration::ZERO, |t| clock.since(t)),
                });
                view
            }),
        }
    }
}

/// The `recover` annotation's request and the recovery under way, with the snapshots they need.
async fn recovery_view(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<Option<RecoveryView>, Error> {
    let requested = etcd.annotations().get(names::RECOVER_ANNOTATION).cloned();
    let record = etcd.status.as_ref().and_then(|s| s.recovery.clone());
    let automatic = etcd.spec.automatic_recovery_after().is_some();
    if requested.is_none() && record.is_none() && !automatic {
        return Ok(None);
    }
    // An automatic recovery may need the newest snapshot only while no member serves clients.
    let asked = requested
        .clone()
        .or_else(|| (automatic && unserved_since(etcd).is_some()).then(|| "latest".to_string()));
    let under_way = match record {
        Some(record) => Some(under_way(client, namespace, record).await?),
        None => None,
    };
    let snapshot = match (&under_way, asked.as_deref().map(RecoverySource::parse)) {
        (None, Some(Ok(RecoverySource::Snapshot(name)))) => {
            Some(restore_source::snapshot_check(client, namespace, &name).await?)
        }
        (None, Some(Ok(RecoverySource::Latest))) => {
            restore_source::newest_snapshot(client, namespace, &etcd.name_any()).await?
        }
        _ => None,
    };
    Ok(Some(RecoveryView {
        requested,
        store_configured: etcd.spec.backup.is_some(),
        snapshot,
        under_way,
        automatic: None,
    }))
}

/// Since when no voting member has served clients (`EndpointsAvailable` False), if none does.
fn unserved_since(etcd: &EtcdadmCluster) -> Option<Timestamp> {
    let status = etcd.status.as_ref()?;
    conditions::find(&status.conditions, ENDPOINTS_AVAILABLE)
        .filter(|c| c.status == conditions::ConditionStatus::False)
        .map(|c| c.last_transition_time.0)
}

/// `status.recovery` as the plan reads it, with its snapshot's phase now.
async fn under_way(client: &Client, namespace: &str, record: RecoveryStatus) -> Result<UnderWay, Error> {
    let snapshot = Api::<EtcdadmSnapshot>::namespaced(client.clone(), namespace)
        .get_opt(&record.snapshot)
        .await?;
    let snapshot_failure = snapshot.as_ref().and_then(|s| {
        let status = s.status.as_ref()?;
        conditions::find(&status.conditions, READY).and_then(|c| c.message.clone())
    });
    Ok(UnderWay {
        record: RecoveryRecord {
            source: RecoverySource::parse(&record.source).unwrap_or_default(),
            requested: record.requested,
            phase: record.phase,
            snapshot: record.snapshot,
            survivor_revision: record.survivor_revision,
        },
        snapshot_phase: snapshot.as_ref().map(EtcdadmSnapshot::phase),
        snapshot_failure,
    })
}
