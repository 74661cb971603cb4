//! Liveness and readiness probes: `/healthz` says the process serves HTTP, `/readyz` says this
//! replica does its job (the leader's caches are synced, a standby knows who leads, the webhook
//! certificate is loaded).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// Shared readiness state; the manager and the controllers report into it.
///
/// Ready means:
/// - without leader election: the controllers reported their caches synced;
/// - with leader election: a leader is known, and if it is this replica, its caches are synced
///   (a standby runs no controllers; it is ready as a warm spare and webhook server, otherwise a
///   rolling update of a two-replica Deployment would wait forever for the new pod);
/// - with webhooks enabled: additionally, the serving certificate is loaded.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<State>,
}

#[derive(Debug)]
struct State {
    leader_election: bool,
    webhooks: bool,
    synced: AtomicBool,
    leader_known: AtomicBool,
    leading: AtomicBool,
    webhook_certificate: AtomicBool,
}

impl Readiness {
    /// Readiness for a replica with or without leader election and webhooks.
    pub fn new(leader_election: bool, webhooks: bool) -> Self {
        Readiness {
            inner: Arc::new(State {
                leader_election,
                webhooks,
                synced: AtomicBool::new(false),
                leader_known: AtomicBool::new(false),
                leading: AtomicBool::new(false),
                webhook_certificate: AtomicBool::new(false),
            }),
        }
    }

    /// The controllers' caches hold a first full list.
    pub fn set_synced(&self) {
        self.inner.synced.store(true, Ordering::SeqCst);
    }

    /// Whether some replica (this one or another) currently holds the lease.
    pub fn set_leader_known(&self, known: bool) {
        self.inner.leader_known.store(known, Ordering::SeqCst);
    }

    /// Whether this replica holds the lease.
    pub fn set_leading(&self, leading: bool) {
        self.inner.leading.store(leading, Ordering::SeqCst);
    }

    /// The webhook serving certificate is loaded and the webhook server listens.
    pub fn set_webhook_ready(&self) {
        self.inner.webhook_certificate.store(true, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.checks().iter().all(|(_, ok, _)| *ok)
    }

    /// Each check: name, passed, detail.
    fn checks(&self) -> Vec<(&'static str, bool, &'static str)> {
        let s = &self.inner;
        let synced = s.synced.load(Ordering::SeqCst);
        let mut checks = Vec::with_capacity(3);
        if s.leader_election {
            let known = s.leader_known.load(Ordering::SeqCst);
            let leading = s.leading.load(Ordering::SeqCst);
            checks.push((
                "leader",
                known,
                match (known, leading) {
                    (true, true) => "this replica leads",
                    (true, false) => "another replica leads",
                    (false, _) => "no leader known yet",
                },
            ));
            if leading {
                checks.push(("caches", synced, if synced { "synced" } else { "syncing" }));
            }
        } else {
            checks.push(("caches", synced, if synced { "synced" } else { "syncing" }));
        }
        if s.webhooks {
            let loaded = s.webhook_certificate.load(Ordering::SeqCst);
            checks.push((
                "webhook",
                loaded,
                if loaded {
                    "serving"
                } else {
                    "waiting for the serving certificate"
                },
            ));
        }
        checks
    }

    /// The `/readyz` body: one `name: ok|failed (detail)` line per check.
    pub fn report(&self) -> String {
        self.checks()
            .into_iter()
            .map(|(name, ok, detail)| format!("{name}: {} ({detail})\n", if ok { "ok" } else { "failed" }))
            .collect()
    }
}

/// `/healthz` (200 while the process serves) and `/readyz` (200 when [`Readiness::is_ready`]).
pub fn router(readiness: Readiness) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route(
        "/readyz",
        get(move || {
            let readiness = readiness.clone();
            async move {
                let status = if readiness.is_ready() {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (status, readiness.report())
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_leader_election_ready_means_synced() {
        let r = Readiness::new(false, false);
        assert!(!r.is_ready());
        assert_eq!(r.report(), "caches: failed (syncing)\n");
        r.set_synced();
        assert!(r.is_ready());
    }

    #[test]
    fn a_standby_is_ready_once_a_leader_is_known() {
        let r = Readiness::new(true, false);
        assert!(!r.is_ready());
        r.set_leader_known(true);
        assert!(r.is_ready(), "{}", r.report());
        r.set_leader_known(false);
        assert!(!r.is_ready());
    }

    #[test]
    fn the_leader_is_ready_once_synced() {
        let r = Readiness::new(true, false);
        r.set_leader_known(true);
        r.set_leading(true);
        assert!(!r.is_ready());
        assert!(r.report().contains("caches: failed (syncing)"), "{}", r.report());
        r.set_synced();
        assert!(r.is_ready());
    }

    #[test]
    fn webhooks_need_their_certificate() {
        let r = Readiness::new(false, true);
        r.set_synced();
        assert!(!r.is_ready());
        r.set_webhook_ready();
        assert!(r.is_ready());
    }
}
