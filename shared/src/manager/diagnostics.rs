//! `/metrics` served the way Cluster API serves its diagnostics: over HTTPS (a self-signed
//! certificate made at start, as controller-runtime does), each request's bearer token checked
//! by a TokenReview and its right to `get` the path by a SubjectAccessReview, so the same RBAC
//! that guards the API guards the metrics (docs/security.md). `--insecure-diagnostics` serves
//! plain HTTP without either, for local use.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use super::shutdown::ShutdownSignal;

/// Reviews sent to the API server at once: a flood of scrapes (or of made-up tokens) queues
/// here instead of reaching the API server all at once.
const CONCURRENT_REVIEWS: usize = 4;
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
}

/// What the guard needs: the API client its reviews go through.
struct Guard {
    client: Client,
    reviews: Semaphore,
}

/// `router` behind the TokenReview and SubjectAccessReview guard.
pub fn guarded(router: Router, client: Client) -> Router {
    let guard = Arc::new(Guard {
        client,
        reviews: Semaphore::new(CONCURRENT_REVIEWS),
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
        Some(token) => guard.review(&token, &path).await,
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
    }
}

impl Guard {
    /// Authenticate `token` (TokenReview), then ask whether its subject may `get` `path`
    /// (SubjectAccessReview).
    async fn review(&self, token: &str, path: &str) -> Verdict {
        let Ok(_turn) = self.reviews.acquire().await else {
            return Verdict::ReviewFailed;
        };
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
