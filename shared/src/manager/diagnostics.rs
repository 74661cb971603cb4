//! `/metrics` served the way Cluster API serves its diagnostics: over HTTPS (a self-signed
//! certificate made at start, as controller-runtime does), each request's bearer token checked
//! by a TokenReview and its right to `get` the path by a SubjectAccessReview, so the same RBAC
//! that guards the API guards the metrics (docs/security.md). `--insecure-diagnostics` serves
//! plain HTTP without either, for local use.
//!
//! Anyone who reaches the port can make the manager ask the API server, so the guard costs the
//! reconcilers nothing: it has a client of its own (not their rate limit), a verdict is kept
//! for [`VERDICT_TTL`] per token and path (by their SHA-256, never the token), each review
//! gives up after [`REVIEW_TIMEOUT`], and with [`CONCURRENT_REVIEWS`] under way and
//! [`QUEUED_REVIEWS`] waiting, more requests are answered 429 at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use super::shutdown::ShutdownSignal;

/// Reviews sent to the API server at once.
pub const CONCURRENT_REVIEWS: usize = 4;
/// Requests waiting for a review beyond those; more are answered 429.
pub const QUEUED_REVIEWS: usize = 16;
/// How long one review (TokenReview and SubjectAccessReview) may take; then 500.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a verdict is kept for a token and path: a scraper every 10 s or more often is
/// reviewed once per this, and a revoked token or right is honoured this much later.
pub const VERDICT_TTL: Duration = Duration::from_secs(10);
/// Verdicts kept at most (made-up tokens fill no more).
const KEPT_VERDICTS: usize = 1024;
/// How long the server gives in-flight scrapes at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Who asks, as the API server authenticated them.
#[derive(Clone, Debug, PartialEq)]
struct Subject {
    user: String,
    uid: Option<String>,
    groups: Option<Vec<String>>,
    extra: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

/// The outcome of checking one request.
#[derive(Clone, Debug, PartialEq)]
enum Verdict {
    Allowed,
    /// No token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A known subject without `get` on the path: 403.
    Forbidden(String),
    /// A review could not be made: 500 (the scrape is retried; nothing is served unchecked).
    ReviewFailed,
    /// Too many requests wait for a review: 429.
    Busy,
}

/// What the guard needs: the API client its reviews go through, their turns, and the verdicts
/// kept.
struct Guard {
    client: Client,
    reviews: Semaphore,
    waiting: AtomicUsize,
    verdicts: Mutex<Verdicts>,
}

/// Verdicts by SHA-256 of token and path, with when each was given.
#[derive(Default)]
struct Verdicts(HashMap<[u8; 32], (Verdict, Instant)>);

impl Verdicts {
    fn get(&self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        self.0
            .get(key)
            .filter(|(_, at)| now.saturating_duration_since(*at) < VERDICT_TTL)
            .map(|(verdict, _)| verdict.clone())
    }

    /// Keep `verdict` (not a failure: that one is asked again), dropping expired ones first
    /// and, when still full, the oldest.
    fn keep(&mut self, key: [u8; 32], verdict: Verdict, now: Instant) {
        if matches!(verdict, Verdict::ReviewFailed | Verdict::Busy) {
            return;
        }
        if self.0.len() >= KEPT_VERDICTS {
            self.0
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < VERDICT_TTL);
        }
        if self.0.len() >= KEPT_VERDICTS
            && let Some(oldest) = self.0.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| *k)
        {
            self.0.remove(&oldest);
        }
        self.0.insert(key, (verdict, now));
    }
}

/// `router` behind the TokenReview and SubjectAccessReview guard, whose reviews go through
/// `client` (the guard's own: give it none of the reconcilers' limits).
pub fn guarded(router: Router, client: Client) -> Router {
    let guard = Arc::new(Guard {
        client,
        reviews: Semaphore::new(CONCURRENT_REVIEWS),
        waiting: AtomicUsize::new(0),
        verdicts: Mutex::default(),
    });
    router.layer(middleware::from_fn_with_state(guard, check))
}

async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let path = request.uri().path().to_string();
    let verdict = match token {
        None => Verdict::Unauthenticated,
        Some(token) => guard.verdict(&token, &path).await,
    };
    match verdict {
        Verdict::Allowed => next.run(request).await,
        Verdict::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response(),
        Verdict::Forbidden(user) => (
            StatusCode::FORBIDDEN,
            format!("Forbidden: {user} may not get {path}\n"),
        )
            .into_response(),
        Verdict::ReviewFailed => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the API server could not review the request\n",
        )
            .into_response(),
        Verdict::Busy => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "too many requests wait for a review; try again\n",
        )
            .into_response(),
    }
}

impl Guard {
    /// The verdict kept for `token` on `path`, else a review's (kept), unless too many wait.
    async fn verdict(&self, token: &str, path: &str) -> Verdict {
        let key: [u8; 32] = Sha256::new()
            .chain_update(token.as_bytes())
            .chain_update([0])
            .chain_update(path.as_bytes())
            .finalize()
            .into();
        if let Some(verdict) = self
            .verdicts
            .lock()
            .ok()
            .and_then(|v| v.get(&key, Instant::now()))
        {
            return verdict;
        }
        let queued = self.waiting.fetch_add(1, Ordering::SeqCst);
        let verdict = if queued >= CONCURRENT_REVIEWS + QUEUED_REVIEWS {
            Verdict::Busy
        } else {
            self.reviewed(token, path, &key).await
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        verdict
    }

    /// A review in its turn, kept before the turn is given back: a burst of one scraper's
    /// requests waits for the first one's verdict instead of asking again.
    async fn reviewed(&self, token: &str, path: &str, key: &[u8; 32]) -> Verdict {
        let Ok(_turn) = self.reviews.acquire().await else {
            return Verdict::ReviewFailed;
        };
        if let Some(verdict) = self.verdicts.lock().ok().and_then(|v| v.get(key, Instant::now())) {
            return verdict;
        }
        let verdict = tokio::time::timeout(REVIEW_TIMEOUT, self.review(token, path))
            .await
            .unwrap_or_else(|_| {
                warn!("a review for a diagnostics request took longer than {REVIEW_TIMEOUT:?}");
                Verdict::ReviewFailed
            });
        if let Ok(mut verdicts) = self.verdicts.lock() {
            verdicts.keep(*key, verdict.clone(), Instant::now());
        }
        verdict
    }

    /// Authenticate `token` (TokenReview), then ask whether its subject may `get` `path`
    /// (SubjectAccessReview).
    async fn review(&self, token: &str, path: &str) -> Verdict {
        let subject = match self.authenticate(token).await {
            Ok(Some(subject)) => subject,
            Ok(None) => return Verdict::Unauthenticated,
            Err(e) => {
                warn!(error = %e, "TokenReview for a diagnostics request failed");
                return Verdict::ReviewFailed;
            }
        };
        match self.authorize(&subject, path).await {
            Ok(true) => Verdict::Allowed,
            Ok(false) => {
                debug!(user = %subject.user, path, "diagnostics request forbidden");
                Verdict::Forbidden(subject.user)
            }
            Err(e) => {
                warn!(error = %e, "SubjectAccessReview for a diagnostics request failed");
                Verdict::ReviewFailed
            }
        }
    }
    async fn authenticate(&self, token: &str) -> Result<Option<Subject>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        Ok(status.user.and_then(|user| {
            Some(Subject {
                user: user.username?,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
            })
        }))
    }

    async fn authorize(&self, subject: &Subject, path: &str) -> Result<bool, kube::Error> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(subject.user.clone()),
                uid: subject.uid.clone(),
                groups: subject.groups.clone(),
                extra: subject.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        Ok(reviewed.status.is_some_and(|s| s.allowed))
    }
}

/// A TLS configuration with a self-signed certificate for `localhost`, made now: scrapers
/// authenticate themselves by token; the certificate only encrypts (Prometheus scrapes it with
/// `insecure_skip_verify`, as it does Cluster API's).
pub fn self_signed_tls() -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .map_err(|e| format!("making the diagnostics certificate: {e}"))?;
    let chain: Vec<CertificateDer<'static>> = vec![certified.cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the diagnostics certificate: {e}"))
}

/// Serve `router` over TLS on `listener` until `shutdown`.
pub async fn serve_tls(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    router: Router,
    shutdown: ShutdownSignal,
) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let stopping = handle.clone();
    tokio::spawn(async move {
        shutdown.wait().await;
        stopping.graceful_shutdown(Some(SHUTDOWN_GRACE));
    });
    info!(%addr, "serving metrics over HTTPS to callers the API server authorizes");
    axum_server::from_tcp_rustls(listener, RustlsConfig::from_config(Arc::new(tls)))?
        .handle(handle)
        .serve(router.into_make_service())
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn verdicts_are_kept_for_their_time_failures_never_and_no_more_than_the_bound() {
        let mut verdicts = Verdicts::default();
        let t0 = Instant::now();
        verdicts.keep([1; 32], Verdict::Allowed, t0);
        verdicts.keep([2; 32], Verdict::ReviewFailed, t0);
        verdicts.keep([3; 32], Verdict::Busy, t0);
        assert_eq!(
            verdicts.get(&[1; 32], t0 + Duration::from_secs(9)),
            Some(Verdict::Allowed)
        );
        assert_eq!(verdicts.get(&[1; 32], t0 + VERDICT_TTL), None);
        assert_eq!(verdicts.get(&[2; 32], t0), None);
        assert_eq!(verdicts.get(&[3; 32], t0), None);
        for i in 0..(KEPT_VERDICTS + 10) {
            let mut key = [0; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            verdicts.keep(
                key,
                Verdict::Unauthenticated,
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(verdicts.0.len(), KEPT_VERDICTS);
    }

    /// Against an API server that never answers: the reviews under way and those queued wait,
    /// every request beyond them is answered 429 at once, and the waiting ones 500 after the
    /// review timeout.
    #[tokio::test]
    async fn a_full_queue_answers_429_at_once_and_a_silent_api_server_500_after_the_timeout() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let accepted = tokio::spawn(async move {
            let mut held = vec![];
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let router = guarded(
            Router::new().route("/metrics", axum::routing::get(|| async { "m" })),
            client,
        );
        let scrape = |token: usize| {
            let router = router.clone();
            async move {
                let request = Request::get("/metrics")
                    .header(header::AUTHORIZATION, format!("Bearer token-{token}"))
                    .body(axum::body::Body::empty())
                    .unwrap();
                let started = Instant::now();
                let status = router.oneshot(request).await.unwrap().status();
                (status, started.elapsed())
            }
        };
        let waiting: Vec<_> = (0..CONCURRENT_REVIEWS + QUEUED_REVIEWS)
            .map(|i| tokio::spawn(scrape(i)))
            .collect();
        // Let them all reach the guard.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, took) = scrape(999).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(took < REVIEW_TIMEOUT, "answered at once: {took:?}");
        let mut statuses = vec![];
        for task in waiting {
            statuses.push(task.await.unwrap().0);
        }
        assert!(
            statuses.iter().all(|s| *s == StatusCode::INTERNAL_SERVER_ERROR),
            "{statuses:?}"
        );
        accepted.abort();
    }
}
