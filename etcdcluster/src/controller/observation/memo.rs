//! Reads reused between reconciles, so a steady cluster's periodic health round costs no
//! API read while the watch cache holds the EtcdadmCluster version kept, and one read (the
//! EtcdadmCluster) otherwise, instead of seven. A watch event on a Machine, Cluster or KCP of the
//! cluster, a change to the EtcdadmCluster's spec or metadata, a write of our own, or age ends a
//! reuse; and a step that writes is only ever planned on a fresh read (see `reconcile`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ObjectMeta};

use etcdadm_shared::api::EtcdadmCluster;

use etcdadm_shared::error::Error;

use super::read::{Concerns, Reads, read};

/// The shortest time an observation is reused for: with [`lifetime`], the bound on noticing a
/// change to what is not watched (EtcdadmConfigs, infrastructure machines, Secret contents),
/// which only people editing by hand make. Every re-read lists a cluster's Machines,
/// EtcdadmConfigs and infrastructure machines by label, which an API server answers by scanning
/// the namespace: at 3,000 clusters a one-minute bound made it 110 such lists a second.
pub const OBSERVATION_TTL: Duration = Duration::from_secs(300);

/// How long the observation of `key` is reused: between [`OBSERVATION_TTL`] and half as long
/// again, fixed per cluster, so clusters adopted in the same minute are not re-read in the same
/// minute ever after.
pub fn lifetime(key: &str) -> Duration {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let spread = (hasher.finish() % 1_000) as f64 / 2_000.0;
    OBSERVATION_TTL + OBSERVATION_TTL.mul_f64(spread)
}

/// Observations per cluster key (`<namespace>/<name>`).
#[derive(Default)]
pub struct Observations {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    kept: HashMap<String, Kept>,
    /// Bumped by every invalidation: an observation started before one is not kept.
    epochs: HashMap<String, u64>,
}

struct Kept {
    reads: Reads,
    /// When its [`lifetime`] ends.
    until: Instant,
}

impl Observations {
    /// The EtcdadmCluster `namespace/name` and everything around it, read now or (unless
    /// `afresh`) as kept from an earlier reconcile; whether it was all read now. `None` once the
    /// cluster is gone. `cached` is the watch cache's copy: when it is the very version kept,
    /// nothing is read; otherwise the EtcdadmCluster is read live (the cache may lag a write of
    /// our own).
    pub async fn read(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        cached: &EtcdadmCluster,
        afresh: bool,
        concerns: &dyn Concerns,
    ) -> Result<Option<(Reads, bool)>, Error> {
        let key = format!("{namespace}/{name}");
        let now = Instant::now();
        if !afresh && let Some(kept) = self.unchanged(&key, cached, now) {
            return Ok(Some((kept, false)));
        }
        let Some(etcd) = Api::<EtcdadmCluster>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?
        else {
            return Ok(None);
        };
        if !afresh && let Some(kept) = self.reuse(&key, &etcd, now) {
            return Ok(Some((kept, false)));
        }
        let epoch = self.epoch(&key);
        let obs = read(client, namespace, etcd, concerns).await?;
        if concerns.keep(&obs) {
            self.keep(&key, epoch, &obs, now);
        }
        Ok(Some((obs, true)))
    }

    /// Something the observation of `key` was made from has changed.
    pub fn invalidate(&self, key: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.kept.remove(key);
            *inner.epochs.entry(key.to_string()).or_default() += 1;
        }
    }

    /// The epoch to hand to [`Observations::keep`] for an observation starting now.
    pub fn epoch(&self, key: &str) -> u64 {
        self.inner
            .lock()
            .map(|inner| inner.epochs.get(key).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Keep `observation`, begun at `epoch`, unless `key` was invalidated since or the cluster is
    /// being deleted (deletion reads what it waits on every time).
    pub fn keep(&self, key: &str, epoch: u64, observation: &Reads, now: Instant) {
        // Deletion and a missing template (its kind is not watched) are looked at afresh (and
        // what a concern says must be: `Concerns::keep`).
        if observation.deleting() || observation.missing_infra_template.is_some() {
            return;
        }
        if let Ok(mut inner) = self.inner.lock()
            && inner.epochs.get(key).copied().unwrap_or_default() == epoch
        {
            inner.kept.insert(
                key.to_string(),
                Kept {
                    reads: observation.clone(),
                    until: now + lifetime(key),
                },
            );
        }
    }

    /// The kept observation of `key`, if its [`lifetime`] has not ended and carries the
    /// resourceVersion of `cached`.
    pub fn unchanged(&self, key: &str, cached: &EtcdadmCluster, now: Instant) -> Option<Reads> {
        let inner = self.inner.lock().ok()?;
        let kept = inner.kept.get(key)?;
        let young = now < kept.until;
        let version = &kept.reads.etcd_cluster.metadata.resource_version;
        (young && version.is_some() && *version == cached.metadata.resource_version)
            .then(|| kept.reads.clone())
    }

    /// The kept observation of `key`, if its [`lifetime`] has not ended and was made of
    /// the same EtcdadmCluster spec and metadata as `etcd` (just read); it then carries `etcd`,
    /// and is kept so.
    pub fn reuse(&self, key: &str, etcd: &EtcdadmCluster, now: Instant) -> Option<Reads> {
        let mut inner = self.inner.lock().ok()?;
        let kept = inner.kept.get_mut(key)?;
        let young = now < kept.until;
        if !young || !same_object(&kept.reads.etcd_cluster.metadata, &etcd.metadata) {
            return None;
        }
        kept.reads.etcd_cluster = etcd.clone();
        Some(kept.reads.clone())
    }

    /// `etcd` is what a status write of our own returned: a kept observation of the same spec
    /// and metadata carries it from now on (its age is unchanged).
    pub fn carry(&self, key: &str, etcd: &EtcdadmCluster) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(kept) = inner.kept.get_mut(key)
            && same_object(&kept.reads.etcd_cluster.metadata, &etcd.metadata)
        {
            kept.reads.etcd_cluster = etcd.clone();
        }
    }

    /// Drop everything about `key` (the cluster is gone).
    pub fn forget(&self, key: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.kept.remove(key);
            inner.epochs.remove(key);
        }
    }
}

/// The same spec (generation) and the same metadata an observation depends on; status and
/// resourceVersion may differ.
fn same_object(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.uid == b.uid
        && a.generation == b.generation
        && a.labels == b.labels
        && a.annotations == b.annotations
        && a.finalizers == b.finalizers
        && a.owner_references == b.owner_references
        && a.deletion_timestamp == b.deletion_timestamp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const KEY: &str = "ns/etcd";

    fn etcd(generation: i64, ready: bool) -> EtcdadmCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "etcd", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {"replicas": 3, "infrastructureTemplate": {"kind": "T", "name": "t"}},
            "status": {"ready": ready},
        }))
        .unwrap()
    }

    fn observation(etcd: EtcdadmCluster) -> Reads {
        Reads {
            leftovers: vec!["left-behind".into()],
            ..crate::controller::testing::reads_of(etcd, "ns")
        }
    }

    #[test]
    fn a_kept_observation_is_reused_with_the_object_as_just_read() {
        let memo = Observations::default();
        let now = Instant::now();
        memo.keep(KEY, memo.epoch(KEY), &observation(etcd(1, false)), now);
        // Only the status moved (our own write): reused, carrying the new status.
        let reused = memo.reuse(KEY, &etcd(1, true), now).expect("reused");
        assert!(reused.etcd_cluster.status.unwrap().ready);
        assert_eq!(reused.leftovers, vec!["left-behind".to_string()]);
        assert!(memo.reuse("ns/other", &etcd(1, true), now).is_none());
    }

    #[test]
    fn spec_metadata_age_and_events_end_the_reuse() {
        let memo = Observations::default();
        let now = Instant::now();
        memo.keep(KEY, memo.epoch(KEY), &observation(etcd(1, false)), now);
        assert!(memo.reuse(KEY, &etcd(2, false), now).is_none(), "spec changed");
        let mut annotated = etcd(1, false);
        annotated.metadata.annotations.get_or_insert_default().insert(
            "etcdcluster.cluster.x-k8s.io/healthcheck-retries".into(),
            "0".into(),
        );
        assert!(memo.reuse(KEY, &annotated, now).is_none(), "annotations changed");
        assert!(
            memo.reuse(KEY, &etcd(1, false), now + lifetime(KEY)).is_none(),
            "too old"
        );
        assert!(memo.reuse(KEY, &etcd(1, false), now).is_some());
        memo.invalidate(KEY);
        assert!(memo.reuse(KEY, &etcd(1, false), now).is_none(), "a watch event");
    }

    #[test]
    fn lifetimes_are_spread_over_half_the_ttl_again() {
        let lifetimes: Vec<Duration> = (0..200).map(|i| lifetime(&format!("ns/c{i}"))).collect();
        assert!(
            lifetimes
                .iter()
                .all(|l| *l >= OBSERVATION_TTL && *l < OBSERVATION_TTL * 3 / 2)
        );
        let shortest = lifetimes.iter().min().unwrap();
        let longest = lifetimes.iter().max().unwrap();
        assert!(
            *longest - *shortest > OBSERVATION_TTL / 3,
            "{shortest:?}..{longest:?}"
        );
        assert_eq!(lifetime("ns/c1"), lifetime("ns/c1"));
    }

    fn at_version(mut etcd: EtcdadmCluster, version: &str) -> EtcdadmCluster {
        etcd.metadata.resource_version = Some(version.into());
        etcd
    }

    #[test]
    fn the_cached_version_kept_needs_no_read_and_a_status_write_is_carried() {
        let memo = Observations::default();
        let now = Instant::now();
        memo.keep(
            KEY,
            memo.epoch(KEY),
            &observation(at_version(etcd(1, false), "5")),
            now,
        );
        assert!(
            memo.unchanged(KEY, &at_version(etcd(1, false), "5"), now)
                .is_some()
        );
        assert!(
            memo.unchanged(KEY, &at_version(etcd(1, false), "6"), now)
                .is_none(),
            "another version"
        );
        assert!(memo.unchanged(KEY, &etcd(1, false), now).is_none(), "no version");
        assert!(
            memo.unchanged(KEY, &at_version(etcd(1, false), "5"), now + lifetime(KEY))
                .is_none(),
            "too old"
        );
        // Our own status write: the cache will hold its version next.
        memo.carry(KEY, &at_version(etcd(1, true), "7"));
        let carried = memo
            .unchanged(KEY, &at_version(etcd(1, true), "7"), now)
            .expect("carried");
        assert!(carried.etcd_cluster.status.unwrap().ready);
        // A write that changed the spec is not carried.
        memo.carry(KEY, &at_version(etcd(2, true), "8"));
        assert!(
            memo.unchanged(KEY, &at_version(etcd(2, true), "8"), now)
                .is_none()
        );
        // A live read of the same spec is kept as read.
        assert!(memo.reuse(KEY, &at_version(etcd(1, false), "9"), now).is_some());
        assert!(
            memo.unchanged(KEY, &at_version(etcd(1, false), "9"), now)
                .is_some()
        );
        memo.invalidate(KEY);
        assert!(
            memo.unchanged(KEY, &at_version(etcd(1, false), "9"), now)
                .is_none(),
            "a watch event"
        );
    }

    #[test]
    fn an_observation_begun_before_an_event_is_not_kept() {
        let memo = Observations::default();
        let now = Instant::now();
        let epoch = memo.epoch(KEY);
        memo.invalidate(KEY); // a Machine changed while the observation was being read
        memo.keep(KEY, epoch, &observation(etcd(1, false)), now);
        assert!(memo.reuse(KEY, &etcd(1, false), now).is_none());
        memo.keep(KEY, memo.epoch(KEY), &observation(etcd(1, false)), now);
        assert!(memo.reuse(KEY, &etcd(1, false), now).is_some());
        memo.forget(KEY);
        assert!(memo.reuse(KEY, &etcd(1, false), now).is_none());
    }

    #[test]
    fn a_deleting_cluster_is_always_read_afresh() {
        let memo = Observations::default();
        let now = Instant::now();
        let mut deleting = etcd(1, false);
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        memo.keep(KEY, memo.epoch(KEY), &observation(deleting.clone()), now);
        assert!(memo.reuse(KEY, &deleting, now).is_none());
    }
}
