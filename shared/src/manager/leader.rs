//! Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: every write is
//! a replace guarded by the Lease's resourceVersion, so of two candidates exactly one wins; a
//! follower takes over only after the holder stayed silent for the lease duration (measured on
//! its own clock, so clock skew does not matter); a leader that cannot renew within the renew
//! deadline gives up, and the process exits so that it never reconciles without the lease.
//!
//! Why not `kube-lease-manager` (0.13, compatible with kube 5): it locks through server-side
//! apply field ownership, which the sim API server (`test/sim/apiserver`) does not model
//! (ownership survives a release there, so no second replica could ever take over); and in its
//! watch mode renewal errors are hidden, with no deadline after which the leader gives up.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use rand::Rng;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Lease timing, as client-go names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace (must exist).
    pub namespace: String,
    /// This replica's identity, unique among replicas.
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up.
    pub renew_deadline: Duration,
    /// Pause between attempts (renewals and acquisitions).
    pub retry_period: Duration,
}

/// What this replica knows about leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// No valid holder observed (yet): nobody is known to lead.
    Unknown,
    /// Another replica holds a valid lease.
    Follower { leader: String },
    /// This replica holds the lease.
    Leader,
}

impl Leadership {
    /// Whether some replica is known to lead.
    pub fn leader_known(&self) -> bool {
        !matches!(self, Leadership::Unknown)
    }
}

/// Why leader election ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("leadership of Lease {namespace}/{name} lost: {reason}")]
    Lost {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("invalid leader election settings: {0}")]
    Config(String),
}

/// A unique identity for this process: the pod name (or host name) plus a random suffix, so a
/// restarted container never mistakes its predecessor's lease for its own.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{host}_{:016x}", rand::random::<u64>())
}

/// Campaigns for and holds one Lease; see the module documentation.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    state: watch::Sender<Leadership>,
    /// The last lease record seen and when (on our clock) it was first seen.
    observed: Option<(LeaseSpec, Instant)>,
}

enum Attempt {
    /// We hold the lease now.
    Held,
    /// Someone else holds a lease that has not expired.
    HeldBy(String),
    /// Another writer got there first; look again.
    Contended,
}

impl LeaderElector {
    /// An elector for `config`, checking the timings as client-go does.
    pub fn new(client: Client, config: LeaseConfig) -> Result<Self, LeaderElectionError> {
        if config.retry_period.is_zero()
            || config.renew_deadline.as_secs_f64() <= config.retry_period.as_secs_f64() * 1.2
            || config.lease_duration <= config.renew_deadline
        {
            return Err(LeaderElectionError::Config(format!(
                "need lease duration ({:?}) > renew deadline ({:?}) > 1.2 × retry period ({:?}) > 0",
                config.lease_duration, config.renew_deadline, config.retry_period
            )));
        }
        if config.identity.is_empty() || config.name.is_empty() {
            return Err(LeaderElectionError::Config(
                "the lease name and identity must not be empty".into(),
            ));
        }
        let (state, _) = watch::channel(Leadership::Unknown);
        Ok(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            state,
            observed: None,
        })
    }

    /// Leadership as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Campaign, then hold the lease, until `stop` resolves; a held lease is then released so a
    /// standby takes over at once. Returns [`LeaderElectionError::Lost`] when the lease was held
    /// and then lost (not renewed within the deadline, or taken by another holder): the caller
    /// must stop reconciling at once.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), LeaderElectionError> {
        tokio::pin!(stop);
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => break,
                Ok(Attempt::HeldBy(leader)) => self.publish(Leadership::Follower { leader }),
                Ok(Attempt::Contended) => {}
                Err(e) => warn!(lease = %self.config.name, error = %e, "acquiring the lease failed"),
            }
            let pause = jittered(self.config.retry_period);
            tokio::select! {
                _ = &mut stop => {
                    self.publish(Leadership::Unknown);
                    return Ok(());
                }
                _ = tokio::time::sleep(pause) => {}
            }
        }
        info!(lease = %self.config.name, identity = %self.config.identity, "acquired the lease");
        self.publish(Leadership::Leader);
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                _ = &mut stop => {
                    self.release().await;
                    self.publish(Leadership::Unknown);
                    return Ok(());
                }
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let remaining = self.config.renew_deadline.saturating_sub(last_renewal.elapsed());
            match tokio::time::timeout(remaining, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => last_renewal = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return Err(self.lost(format!("the Lease is now held by {holder}")));
                }
                Ok(Ok(Attempt::Contended)) => {
                    debug!(lease = %self.config.name, "renewal conflicted; retrying")
                }
                Ok(Err(e)) => warn!(lease = %self.config.name, error = %e, "renewing the lease failed"),
                Err(_) => {}
            }
            if last_renewal.elapsed() >= self.config.renew_deadline {
                return Err(self.lost(format!(
                    "not renewed within the renew deadline ({:?})",
                    self.config.renew_deadline
                )));
            }
        }
    }

    fn lost(&self, reason: String) -> LeaderElectionError {
        self.publish(Leadership::Unknown);
        LeaderElectionError::Lost {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            reason,
        }
    }

    fn publish(&self, state: Leadership) {
        self.state.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }

    fn lease_seconds(&self) -> i32 {
        let secs = self.config.lease_duration.as_secs_f64().ceil();
        if secs >= f64::from(i32::MAX) {
            i32::MAX
        } else {
            (secs as i32).max(1)
        }
    }

    /// One client-go `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let me = self.config.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(self.lease_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(created.spec.unwrap_or_default());
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Contended),
                Err(e) => Err(e),
            };
        };
        let record = lease.spec.clone().unwrap_or_default();
        let observed_at = self.observe(record.clone());
        let holder = record.holder_identity.clone().filter(|h| !h.is_empty());
        let held_by_me = holder.as_deref() == Some(me.as_str());
        if let Some(holder) = &holder
            && !held_by_me
        {
            let valid_for = record
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map_or(self.config.lease_duration, |s| {
                    Duration::from_secs(s.unsigned_abs().into())
                });
            if observed_at.elapsed() < valid_for {
                return Ok(Attempt::HeldBy(holder.clone()));
            }
            info!(lease = %self.config.name, previous = %holder, "the lease expired; taking it over");
        }
        let mut spec = record;
        if !held_by_me {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me);
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(self.lease_seconds());
        lease.spec = Some(spec);
        // `lease` carries the resourceVersion we read: the replace fails with 409 if anyone wrote
        // in between.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observe(written.spec.unwrap_or_default());
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Contended),
            Err(e) => Err(e),
        }
    }

    /// Remember `record`; returns when (on our clock) this exact record was first seen.
    fn observe(&mut self, record: LeaseSpec) -> Instant {
        match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                let now = Instant::now();
                self.observed = Some((record, now));
                now
            }
        }
    }

    /// Give the lease up if we still hold it (best effort: it expires anyway).
    async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
                return Ok(false);
            };
            let mut spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            lease.spec = Some(spec);
            self.api
                .replace(&lease.name_any(), &PostParams::default(), &lease)
                .await
                .map(|_| true)
        }
        .await;
        match result {
            Ok(true) => info!(lease = %self.config.name, "released the lease"),
            Ok(false) => {}
            Err(e) => {
                warn!(lease = %self.config.name, error = %e, "releasing the lease failed; it expires on its own")
            }
        }
    }
}

/// `period` plus up to 20 % (client-go's jitter factor 1.2), so candidates do not march in step.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..0.2))
}
