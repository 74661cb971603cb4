//! An in-memory Kubernetes API server: the FakeApi of unit tests and the sim's management plane.
//!
//! One store serves two front ends: [`ApiServer::client`] hands out a `kube::Client` that calls
//! the server in-process, and [`ApiServer::serve`] listens on HTTP for separate processes
//! (controllers, kubectl) that connect through the kubeconfig [`ApiServer::write_kubeconfig`]
//! writes. What the server does not implement is answered with a Kubernetes `Status` error
//! (404, 405, 406, 415, 422), never with a pretended success.
//!
//! Semantics, and where they are simplified:
//! - get, list (label and field selectors, `limit`/`continue` paging over a snapshot), watch
//!   (resume from a resourceVersion, bookmarks, `sendInitialEvents`, 410 Gone once the
//!   history has moved on), all-namespaces list and watch;
//! - create (generateName, namespace must exist and not be terminating), replace with
//!   resourceVersion preconditions (custom resources require one, as the real server does),
//!   patch (merge, JSON, strategic merge for built-in kinds only, server-side apply);
//! - server-side apply is a field-managed merge: maps merge, lists are atomic, fields a manager
//!   stops applying are removed unless another applier owns them, conflicts with other appliers
//!   are 409 unless `force`. Only apply requests own fields (updates and other patches do not),
//!   and `managedFields` is not returned;
//! - delete with finalizers, `Background` and `Orphan` propagation (`Foreground` is refused with
//!   422), ownerReference cascade and namespace cleanup shortly after, in a background task;
//! - status and scale subresources as the CRD declares them; `metadata.generation` for custom
//!   resources; names are checked (DNS-1123), built-in kinds are validated against their
//!   k8s-openapi types, custom resources are pruned to their structural schema but neither
//!   their OpenAPI constraints nor their CEL rules (`x-kubernetes-validations`) are enforced;
//!   `fieldValidation=Strict` is refused (400), `Ignore`/`Warn` behave as `Ignore`;
//! - Events are stored once and served through both `v1` and `events.k8s.io/v1`, with the real
//!   server's field mapping (`involvedObject`/`regarding`, `message`/`note`, ...), and the field
//!   selectors each API indexes (`involvedObject.name`, `regarding.name`, `reason`, ...);
//! - responses as the `Accept` header asks: JSON, `Table` (a CRD's `additionalPrinterColumns`
//!   with their priorities, the real server's columns for the built-in kinds served here), or
//!   `PartialObjectMetadata`; YAML and protobuf are answered 406;
//! - OpenAPI v3 documents of the custom resources (`/openapi/v3`), built from their CRD schemas;
//! - the shipped CAPI kinds are served at `v1beta2` only (no v1beta1 conversion).
//!
//! kubectl works for get (also `-o wide` and `-w`), describe (with Events), explain of custom
//! resources, apply, scale, patch, delete and `--server-side` apply, with these caveats: there is
//! no `/openapi/v2` and the built-in kinds have no OpenAPI documents, so `kubectl apply` needs
//! `--validate=false` and `kubectl explain` knows only the custom resources.

mod builtin_crds;
mod columns;
pub use builtin_crds::shipped_crds;
mod discovery;
mod error;
mod event_views;
mod garbage;
mod http;
mod jsonpath;
mod kubeconfig;
mod meta;
mod negotiate;
mod openapi;
mod patch;
mod printers;
mod pruning;
mod resources;
mod selector;
mod store;
mod table;
mod verbs;
mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

pub use error::ApiServerError;
pub use watch::BOOKMARK_INTERVAL;

use crate::http::{Endpoint, Shared};
use crate::store::Store;

/// Changes kept for watches to resume from, by default.
pub const DEFAULT_HISTORY: usize = 10_000;

/// Namespaces that exist from the start, as in a fresh cluster.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// The in-memory API server. Cheap to clone; clones share the same objects.
#[derive(Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

/// A running HTTP listener. Dropping it stops the listener too, without waiting.
pub struct Served {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The address actually bound (port 0 resolved).
    pub addr: SocketAddr,
    closing: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    /// Stops accepting, ends open watches and waits until every connection is closed.
    pub async fn shutdown(mut self) {
        self.closing.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.closing.send_replace(true);
    }
}

impl ApiServer {
    /// A server with the built-in kinds, the shipped CAPI/sim CRDs and the usual namespaces.
    pub fn new() -> Self {
        Self::with_history(DEFAULT_HISTORY)
    }

    /// Like [`ApiServer::new`], keeping only `changes` changes for watches to resume from
    /// (a watch from an older resourceVersion gets 410 Gone).
    pub fn with_history(changes: usize) -> Self {
        let mut store = Store::new(changes);
        for crd in builtin_crds::shipped_crds() {
            // The shipped CRDs are checked by a unit test; one failing here would be a bug.
            if let Err(e) = store.register_crd(&crd) {
                tracing::error!(error = %e.message, "shipped CRD rejected");
            }
        }
        if let Some(ns_rt) = store.registry.find("", "v1", "namespaces") {
            for name in INITIAL_NAMESPACES {
                let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
                if let Err(e) = store.create(&ns_rt, "", body, false) {
                    tracing::error!(error = %e.message, "initial namespace rejected");
                }
            }
        }
        let shared = Shared {
            store: Arc::new(Mutex::new(store)),
            requests: std::sync::atomic::AtomicU64::new(0),
            tally: Default::default(),
            never_closing: tokio::sync::watch::channel(false).0,
        };
        ApiServer {
            shared: Arc::new(shared),
        }
    }

    /// Registers every CRD in the `*.yaml`/`*.yml` files of `dir` (e.g. `config/crd/bases`).
    pub fn load_crds_dir(&self, dir: &Path) -> Result<(), ApiServerError> {
        let read_error = |path: &Path, source| ApiServerError::ReadCrds {
            path: path.to_path_buf(),
            source,
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| read_error(dir, e))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(|e| read_error(&path, e))?;
            let crd: CustomResourceDefinition =
                serde_saphyr::from_str(&text).map_err(|e| ApiServerError::ParseCrd {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            self.register_crd(crd)?;
        }
        Ok(())
    }

    /// Serves a CRD's resource, as `kubectl apply -f crd.yaml` would; replaces one of the same name.
    pub fn register_crd(&self, crd: CustomResourceDefinition) -> Result<(), ApiServerError> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        self.shared
            .lock()
            .register_crd(&crd)
            .map_err(|e| ApiServerError::InvalidCrd {
                name,
                message: e.message,
            })
    }

    fn router(&self, closing: tokio::sync::watch::Receiver<bool>) -> axum::Router {
        axum::Router::new().fallback(http::handle).with_state(Endpoint {
            shared: self.shared.clone(),
            closing,
        })
    }

    /// A client that talks to this server in-process; must be called inside a tokio runtime.
    pub fn client(&self, default_ns: &str) -> kube::Client {
        kube::Client::new(self.router(self.shared.never_closing.subscribe()), default_ns)
    }

    /// Listens on `addr` (port 0 picks a free port) until the returned [`Served`] is shut down
    /// or dropped.
    pub async fn serve(&self, addr: SocketAddr) -> Result<Served, ApiServerError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ApiServerError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind { addr, source })?;
        let (closing, closed) = tokio::sync::watch::channel(false);
        let router = self.router(closed.clone());
        let mut shutdown_signal = closed;
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = shutdown_signal.wait_for(|closing| *closing).await;
            };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "API server listener failed");
            }
        });
        Ok(Served {
            url: format!("http://{bound}"),
            addr: bound,
            closing,
            task: Some(task),
        })
    }

    /// Writes a kubeconfig for `url` (context `sim`, namespace `default`, no credentials) that
    /// kubectl and `kube::Config` accept.
    pub fn write_kubeconfig(url: &str, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig::render(url))
    }

    /// Watches currently streaming, both front ends together: lets tests check that watches
    /// end when their clients go away.
    pub fn open_watch_count(&self) -> usize {
        self.shared.lock().notify.receiver_count()
    }

    /// API requests served so far by kind (`GET secrets`, `PATCH machines`, `WATCH machines`),
    /// both front ends together.
    pub fn request_tally(&self) -> std::collections::BTreeMap<String, u64> {
        self.shared.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// API requests served so far, both front ends together.
    pub fn request_count(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }
}

/// `config/crd/bases` of this repository, found from this crate's source location.
pub fn repository_crd_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../config/crd/bases")
}

/// A server with this repository's CRDs loaded and an in-process client for namespace
/// `default`: the FakeApi of reconcile tests. Must be called inside a tokio runtime.
pub fn fake_client() -> Result<(ApiServer, kube::Client), ApiServerError> {
    let server = ApiServer::new();
    server.load_crds_dir(&repository_crd_dir())?;
    let client = server.client("default");
    Ok((server, client))
}
