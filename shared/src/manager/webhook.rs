//! The admission webhook server: HTTPS (rustls with ring) on `--webhook-port`, the serving
//! certificate read from `--webhook-cert-dir` and re-read periodically so cert-manager's
//! rotations apply without a restart, and one AdmissionReview endpoint per registered path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

use super::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, DynamicObject};
use super::metrics::Metrics;
use super::shutdown::ShutdownSignal;

/// Certificate file in the cert directory.
pub const CERT_FILE: &str = "tls.crt";
/// Key file in the cert directory.
pub const KEY_FILE: &str = "tls.key";
/// How often the certificate files are re-read.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(30);
/// AdmissionReviews carry the object twice (old and new), each up to etcd's 1.5 MiB.
const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;
/// In-flight reviews get this long to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// An admission handler: the request in, the answer out. Pure functions are the norm.
pub type AdmissionHandler = Arc<dyn Fn(AdmissionRequest<DynamicObject>) -> AdmissionResponse + Send + Sync>;

/// The webhook paths a binary serves.
#[derive(Clone, Default)]
pub struct WebhookRoutes {
    routes: Vec<(String, AdmissionHandler)>,
}

impl std::fmt::Debug for WebhookRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|(path, _)| path))
            .finish()
    }
}

impl WebhookRoutes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve `handler` at `path` (e.g. `/validate-<group>-<version>-<kind>`).
    pub fn route(
        mut self,
        path: &str,
        handler: impl Fn(AdmissionRequest<DynamicObject>) -> AdmissionResponse + Send + Sync + 'static,
    ) -> Self {
        self.routes.push((path.to_string(), Arc::new(handler)));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The registered paths.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|(path, _)| path.as_str())
    }

    /// The HTTP router: `POST <path>` with an `admission.k8s.io/v1` AdmissionReview.
    pub fn router(&self, metrics: &Metrics) -> Router {
        let mut router = Router::new();
        for (path, handler) in &self.routes {
            let handler = handler.clone();
            let metrics = metrics.clone();
            let label = path.clone();
            router = router.route(
                path,
                post(move |body: Bytes| {
                    let handler = handler.clone();
                    let metrics = metrics.clone();
                    let label = label.clone();
                    async move { review(&handler, &metrics, &label, &body) }
                }),
            );
        }
        router.layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
    }
}

/// Answer one AdmissionReview. Unreadable reviews get an `invalid` response (allowed: false),
/// which the API server reports as a webhook failure.
fn review(handler: &AdmissionHandler, metrics: &Metrics, path: &str, body: &[u8]) -> Response {
    let request = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))
        .and_then(|review| {
            let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
            request.map_err(|e| format!("the AdmissionReview has no request: {e}"))
        });
    let (response, outcome) = match request {
        Ok(request) => {
            let response = handler(request);
            let outcome = if response.allowed { "allowed" } else { "denied" };
            (response, outcome)
        }
        Err(message) => {
            warn!(path, %message, "unreadable admission request");
            (AdmissionResponse::invalid(message), "invalid")
        }
    };
    metrics.admission_answered(path, outcome);
    match encode_review(response) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the AdmissionReview failed: {e}"),
        )
            .into_response(),
    }
}

/// The AdmissionReview JSON for `response`. kube serialises `response.patch` (Go `[]byte`) as
/// an array of numbers; Kubernetes documents and emits base64 strings, so that is sent instead.
fn encode_review(response: AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    use base64::Engine as _;
    let patch = response.patch.clone();
    let mut review = serde_json::to_value(response.into_review())?;
    if let (Some(patch), Some(field)) = (patch, review.pointer_mut("/response/patch")) {
        *field = serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    serde_json::to_vec(&review)
}

/// Why the webhook server cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook serving certificate in {dir}: {message}")]
    Certificate { dir: PathBuf, message: String },
    #[error("webhook server on {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Where and what the webhook server serves.
pub struct WebhookServer {
    addr: SocketAddr,
    cert_dir: PathBuf,
    reload_interval: Duration,
    router: Router,
}

impl WebhookServer {
    /// Serve `routes` on `addr` with the certificate in `cert_dir`.
    pub fn new(
        addr: SocketAddr,
        cert_dir: impl Into<PathBuf>,
        routes: &WebhookRoutes,
        metrics: &Metrics,
    ) -> Self {
        WebhookServer {
            addr,
            cert_dir: cert_dir.into(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            router: routes.router(metrics),
        }
    }

    /// Re-read the certificate this often (default 30 s).
    pub fn reload_interval(mut self, interval: Duration) -> Self {
        self.reload_interval = interval;
        self
    }

    /// Wait until `tls.crt` and `tls.key` exist, warning at every reload interval; `false` if
    /// shutdown came first.
    pub async fn wait_for_certificate(&self, shutdown: &ShutdownSignal) -> bool {
        let (cert, key) = (self.cert_dir.join(CERT_FILE), self.cert_dir.join(KEY_FILE));
        loop {
            if cert.is_file() && key.is_file() {
                return true;
            }
            warn!(
                dir = %self.cert_dir.display(),
                "webhook serving certificate not found (tls.crt, tls.key); webhooks are not served \
                 until it appears (mount the cert-manager Secret there, or pass --webhook-port=0)"
            );
            tokio::select! {
                _ = shutdown.clone().wait() => return false,
                _ = tokio::time::sleep(self.reload_interval) => {}
            }
        }
    }

    /// Load the certificate and bind the port.
    pub async fn bind(self) -> Result<BoundWebhookServer, WebhookError> {
        let (cert, key) = read_pair(&self.cert_dir)
            .await
            .map_err(|message| self.certificate_error(message))?;
        let config = server_config(&cert, &key).map_err(|message| self.certificate_error(message))?;
        let io = |source| WebhookError::Io {
            addr: self.addr,
            source,
        };
        let listener = std::net::TcpListener::bind(self.addr).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let local_addr = listener.local_addr().map_err(io)?;
        Ok(BoundWebhookServer {
            listener,
            local_addr,
            tls: RustlsConfig::from_config(Arc::new(config)),
            loaded: (cert, key),
            server: self,
        })
    }

    fn certificate_error(&self, message: String) -> WebhookError {
        WebhookError::Certificate {
            dir: self.cert_dir.clone(),
            message,
        }
    }
}

/// A webhook server with its port bound and certificate loaded.
pub struct BoundWebhookServer {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    tls: RustlsConfig,
    loaded: (Vec<u8>, Vec<u8>),
    server: WebhookServer,
}

impl BoundWebhookServer {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serve until `shutdown`, then let in-flight reviews finish (up to 10 s).
    pub async fn serve(self, shutdown: ShutdownSignal) -> Result<(), WebhookError> {
        let BoundWebhookServer {
            listener,
            local_addr,
            tls,
            loaded,
            server,
        } = self;
        let handle = axum_server::Handle::new();
        let stopping = handle.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.wait().await;
            stopping.graceful_shutdown(Some(SHUTDOWN_GRACE));
        });
        tokio::spawn(reload_certificates(
            server.cert_dir.clone(),
            server.reload_interval,
            tls.clone(),
            loaded,
            shutdown,
        ));
        info!(addr = %local_addr, "serving admission webhooks");
        axum_server::from_tcp_rustls(listener, tls)
            .map_err(|source| WebhookError::Io {
                addr: local_addr,
                source,
            })?
            .handle(handle)
            .serve(server.router.into_make_service())
            .await
            .map_err(|source| WebhookError::Io {
                addr: local_addr,
                source,
            })
    }
}

/// Re-read the pair every `interval`; swap it in when it changed and is usable. A half-written
/// rotation (new cert, old key) fails the key check and is retried at the next tick.
async fn reload_certificates(
    dir: PathBuf,
    interval: Duration,
    tls: RustlsConfig,
    mut loaded: (Vec<u8>, Vec<u8>),
    shutdown: ShutdownSignal,
) {
    loop {
        tokio::select! {
            _ = shutdown.clone().wait() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let pair = match read_pair(&dir).await {
            Ok(pair) => pair,
            Err(message) => {
                warn!(dir = %dir.display(), %message, "re-reading the webhook certificate failed; keeping the current one");
                continue;
            }
        };
        if pair == loaded {
            continue;
        }
        match server_config(&pair.0, &pair.1) {
            Ok(config) => {
                tls.reload_from_config(Arc::new(config));
                loaded = pair;
                info!(dir = %dir.display(), "webhook serving certificate reloaded");
            }
            Err(message) => {
                warn!(dir = %dir.display(), %message, "the new webhook certificate is not usable yet; keeping the current one")
            }
        }
    }
}

async fn read_pair(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), String> {
    let read = |name: &'static str| {
        let path = dir.join(name);
        async move {
            tokio::fs::read(&path)
                .await
                .map_err(|e| format!("reading {}: {e}", path.display()))
        }
    };
    Ok((read(CERT_FILE).await?, read(KEY_FILE).await?))
}

/// A TLS server configuration with the ring provider, HTTP/2 and HTTP/1.1.
fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{CERT_FILE}: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{CERT_FILE} holds no CERTIFICATE block"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("{KEY_FILE}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("{CERT_FILE} and {KEY_FILE} do not form a usable pair: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
