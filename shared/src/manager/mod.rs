//! The runtime both manager binaries stand on: flags, logging, the Kubernetes client, probes
//! and metrics servers, admission webhooks, leader election and one shutdown signal.
//!
//! A binary flattens [`ManagerArgs`] into its `run` subcommand and hands its controllers to a
//! [`Manager`]:
//!
//! ```no_run
//! # use etcdadm_shared::manager::{Manager, ManagerArgs, ManagerContext, WebhookRoutes};
//! # fn example(args: ManagerArgs) -> std::process::ExitCode {
//! Manager::new(args, "my-manager", "my-manager-leader-election")
//!     .webhooks(WebhookRoutes::new())
//!     .main(|ctx: ManagerContext| async move {
//!         // run controllers with ctx.client, ctx.settings, ctx.metrics, until ctx.shutdown
//!         ctx.readiness.set_synced();
//!         ctx.shutdown.wait().await;
//!     })
//! # }
//! ```
//!
//! What [`Manager::run`] does, in order: checks the flags; installs the ring crypto provider;
//! builds the client; starts `/healthz` + `/readyz` (`--health-addr`) and `/metrics`
//! (`--diagnostics-address`, over HTTPS for callers the API server authorizes unless
//! `--insecure-diagnostics`); starts the webhook server once its certificate exists; with
//! `--leader-elect`, campaigns for the Lease and starts the controllers only once it leads. On
//! SIGINT/SIGTERM the controllers stop first, then the lease is released, then the servers
//! stop. If leadership is lost, it returns an error at once (the binary exits non-zero and
//! Kubernetes restarts it as a standby).

pub mod admission;
pub mod args;
pub mod client;
pub mod diagnostics;
pub mod events;
pub mod health;
pub mod invalid;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod reconcile;
mod settings;
pub mod shutdown;
pub mod webhook;

#[cfg(feature = "testing")]
pub mod testing;

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use kube::Client;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

pub use self::args::{ArgsError, ListenAddress, LogFormat, ManagerArgs, WATCH_FILTER_LABEL};
pub use self::health::Readiness;
pub use self::leader::{LeaderElectionError, LeaderElector, Leadership, LeaseConfig};
pub use self::metrics::{Metrics, ReconcileTimer};
pub use self::settings::ControllerSettings;
pub use self::shutdown::{Shutdown, ShutdownSignal};
pub use self::webhook::{WebhookRoutes, WebhookServer};

/// How long servers get to finish after the controllers stopped.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(15);

/// Why a manager stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("connecting to the Kubernetes API: {0}")]
    Client(#[from] kube::Error),
    #[error(transparent)]
    LeaderElection(#[from] LeaderElectionError),
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
    #[error("{what} on {addr}: {source}")]
    Server {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the controllers stopped without a shutdown signal")]
    ControllersStopped,
    #[error("{0}")]
    Setup(String),
}

/// Everything controllers get from the manager.
#[derive(Clone)]
pub struct ManagerContext {
    pub client: Client,
    pub settings: ControllerSettings,
    pub metrics: Metrics,
    pub readiness: Readiness,
    /// Resolves when the controllers must stop.
    pub shutdown: ShutdownSignal,
    /// Where `/healthz` and `/readyz` listen, if enabled.
    pub health_addr: Option<SocketAddr>,
    /// Where `/metrics` listens, if enabled.
    pub diagnostics_addr: Option<SocketAddr>,
}

/// A manager binary's runtime; see the module documentation.
pub struct Manager {
    args: ManagerArgs,
    name: String,
    default_lease_name: String,
    metrics: Metrics,
    webhooks: WebhookRoutes,
    client: Option<Client>,
    shutdown: Option<Shutdown>,
    identity: Option<String>,
    webhook_reload_interval: Duration,
}

impl Manager {
    /// A manager for binary `name`, whose Lease is `default_lease_name` unless
    /// `--leader-election-id` says otherwise.
    pub fn new(args: ManagerArgs, name: &str, default_lease_name: &str) -> Self {
        Manager {
            args,
            name: name.to_string(),
            default_lease_name: default_lease_name.to_string(),
            metrics: Metrics::new(),
            webhooks: WebhookRoutes::new(),
            client: None,
            shutdown: None,
            identity: None,
            webhook_reload_interval: webhook::DEFAULT_RELOAD_INTERVAL,
        }
    }

    /// The metrics registry, to register controller families before running.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The admission webhooks to serve on `--webhook-port`.
    pub fn webhooks(mut self, routes: WebhookRoutes) -> Self {
        self.webhooks = routes;
        self
    }

    /// Use this client instead of one from the kubeconfig (tests, the sim).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Stop on this trigger instead of SIGINT/SIGTERM (tests).
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// How often the webhook certificate is looked for and re-read (default 30 s).
    pub fn webhook_reload_interval(mut self, interval: Duration) -> Self {
        self.webhook_reload_interval = interval;
        self
    }

    /// The leader election identity (default: pod name plus a random suffix).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Set up logging, run on a new tokio runtime, and turn the outcome into an exit code
    /// (non-zero on any error, including lost leadership).
    pub fn main<C, F>(self, controllers: C) -> ExitCode
    where
        C: FnOnce(ManagerContext) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        if let Err(e) = logging::init(self.args.log_format, self.args.verbosity) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        let runtime = match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime,
            Err(e) => {
                error!(error = %e, "starting the async runtime failed");
                return ExitCode::FAILURE;
            }
        };
        let name = self.name.clone();
        let result = runtime.block_on(self.run(controllers));
        // Tasks still running (servers past their grace period) are dropped with the runtime.
        runtime.shutdown_timeout(Duration::from_secs(1));
        match result {
            Ok(()) => {
                info!(manager = %name, "stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                error!(manager = %name, error = %e, "exiting");
                ExitCode::FAILURE
            }
        }
    }

    /// Run until shutdown (Ok) or a failure (Err); see the module documentation.
    pub async fn run<C, F>(self, controllers: C) -> Result<(), ManagerError>
    where
        C: FnOnce(ManagerContext) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        // The manager's life in order (servers, elector, controllers, shutdown), read at once.
        let Manager {
            args,
            name,
            default_lease_name,
            metrics,
            webhooks,
            client,
            shutdown,
            identity,
            webhook_reload_interval,
        } = self;
        args.validate()?;
        // kube and reqwest are built without a default provider: one process-wide choice.
        let _ = rustls::crypto::ring::default_provider().install_default();

        let shutdown = match shutdown {
            Some(shutdown) => shutdown,
            None => {
                let shutdown = Shutdown::new();
                shutdown
                    .trigger_on_os_signals()
                    .map_err(|e| ManagerError::Setup(format!("installing signal handlers: {e}")))?;
                shutdown
            }
        };
        // The reconcilers' client, and the metrics guard's own: its reviews share none of the
        // reconcilers' rate limit or connections.
        let (client, review_client) = match client {
            Some(client) => (client.clone(), client),
            None => {
                let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
                let reviews = client::for_reviews(config.clone())?;
                (
                    client::from_config(config, args.kube_api_qps, args.kube_api_burst)?,
                    reviews,
                )
            }
        };
        if let Some((requests, per)) = client::rate_limit(args.kube_api_qps, args.kube_api_burst) {
            info!(requests, per = ?per, "Kubernetes API requests are rate limited");
        }

        let webhooks_enabled = args.webhook_port != 0 && !webhooks.is_empty();
        if args.webhook_port != 0 && webhooks.is_empty() {
            info!(
                port = args.webhook_port,
                "no admission webhooks registered; the webhook port stays closed"
            );
        }
        let readiness = Readiness::new(args.leader_elect, webhooks_enabled);
        let mut servers: JoinSet<Result<(), ManagerError>> = JoinSet::new();
        let health_addr = match args.health_addr.socket_addr() {
            Some(addr) => Some(
                spawn_http(
                    &mut servers,
                    "health probes",
                    addr,
                    health::router(readiness.clone()),
                    shutdown.signal(),
                )
                .await?,
            ),
            None => None,
        };
        let diagnostics_addr = match args.diagnostics_address.socket_addr() {
            Some(addr) if args.insecure_diagnostics => {
                warn!(%addr, "--insecure-diagnostics: metrics are served over plain HTTP to anyone who reaches the port");
                Some(spawn_http(&mut servers, "metrics", addr, metrics.router(), shutdown.signal()).await?)
            }
            Some(addr) => {
                let router = diagnostics::guarded(metrics.router(), review_client.clone());
                Some(spawn_guarded_metrics(
                    &mut servers,
                    addr,
                    router,
                    shutdown.signal(),
                )?)
            }
            None => None,
        };
        if webhooks_enabled {
            let addr = SocketAddr::from(([0, 0, 0, 0], args.webhook_port));
            let server = WebhookServer::new(addr, &args.webhook_cert_dir, &webhooks, &metrics)
                .reload_interval(webhook_reload_interval);
            let readiness = readiness.clone();
            let signal = shutdown.signal();
            servers.spawn(async move {
                if !server.wait_for_certificate(&signal).await {
                    return Ok(());
                }
                let bound = server.bind().await?;
                readiness.set_webhook_ready();
                bound.serve(signal).await?;
                Ok(())
            });
        }

        let context = ManagerContext {
            client: client.clone(),
            settings: ControllerSettings::from_args(&args),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            shutdown: shutdown.signal(),
            health_addr,
            diagnostics_addr,
        };
        let elector = if args.leader_elect {
            let config = LeaseConfig {
                name: args.lease_name(&default_lease_name),
                namespace: args.leader_election_namespace.clone(),
                identity: identity.unwrap_or_else(leader::default_identity),
                lease_duration: args.leader_elect_lease_duration,
                renew_deadline: args.leader_elect_renew_deadline,
                retry_period: args.leader_elect_retry_period,
            };
            info!(manager = %name, lease = %config.name, namespace = %config.namespace, identity = %config.identity, "campaigning for leadership");
            Some(LeaderElector::new(client, config)?)
        } else {
            None
        };

        let outcome = run_controllers(
            elector,
            controllers,
            context,
            &shutdown,
            &readiness,
            &metrics,
            &mut servers,
        )
        .await;
        // Whatever ended the controllers, everything else stops now.
        shutdown.trigger();
        let drained = tokio::time::timeout(SERVER_STOP_GRACE, async {
            while let Some(joined) = servers.join_next().await {
                if let Ok(Err(e)) = joined {
                    warn!(error = %e, "server stopped with an error");
                }
            }
        })
        .await;
        if drained.is_err() {
            warn!("servers did not stop within {SERVER_STOP_GRACE:?}; abandoning them");
            servers.abort_all();
        }
        outcome
    }
}

/// Bind `addr` now (so a taken port fails startup) and serve `router` until shutdown.
async fn spawn_http(
    servers: &mut JoinSet<Result<(), ManagerError>>,
    what: &'static str,
    addr: SocketAddr,
    router: axum::Router,
    shutdown: ShutdownSignal,
) -> Result<SocketAddr, ManagerError> {
    let error = |source| ManagerError::Server { what, addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(error)?;
    let local = listener.local_addr().map_err(error)?;
    info!(addr = %local, "serving {what}");
    servers.spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.wait())
            .await
            .map_err(|source| ManagerError::Server {
                what,
                addr: local,
                source,
            })
    });
    Ok(local)
}

/// Bind `addr` now and serve the guarded `/metrics` over HTTPS until shutdown.
fn spawn_guarded_metrics(
    servers: &mut JoinSet<Result<(), ManagerError>>,
    addr: SocketAddr,
    router: axum::Router,
    shutdown: ShutdownSignal,
) -> Result<SocketAddr, ManagerError> {
    const WHAT: &str = "metrics";
    let error = |source| ManagerError::Server {
        what: WHAT,
        addr,
        source,
    };
    let tls = diagnostics::self_signed_tls().map_err(ManagerError::Setup)?;
    let listener = std::net::TcpListener::bind(addr).map_err(error)?;
    listener.set_nonblocking(true).map_err(error)?;
    let local = listener.local_addr().map_err(error)?;
    servers.spawn(async move {
        diagnostics::serve_tls(listener, local, tls, router, shutdown)
            .await
            .map_err(|source| ManagerError::Server {
                what: WHAT,
                addr: local,
                source,
            })
    });
    Ok(local)
}

/// The first server that stops before shutdown is a failure; pending forever otherwise.
async fn server_failure(
    servers: &mut JoinSet<Result<(), ManagerError>>,
    shutdown: &ShutdownSignal,
) -> ManagerError {
    loop {
        match servers.join_next().await {
            Some(Ok(Err(e))) => return e,
            Some(Ok(Ok(()))) if shutdown.is_triggered() => {}
            Some(Ok(Ok(()))) => {
                return ManagerError::Setup("a server stopped without a shutdown signal".into());
            }
            Some(Err(e)) => return ManagerError::Setup(format!("a server task failed: {e}")),
            None => std::future::pending::<()>().await,
        }
    }
}

/// Run the controllers (only while leading, with an elector) until shutdown or failure.
async fn run_controllers<C, F>(
    elector: Option<LeaderElector>,
    controllers: C,
    context: ManagerContext,
    shutdown: &Shutdown,
    readiness: &Readiness,
    metrics: &Metrics,
    servers: &mut JoinSet<Result<(), ManagerError>>,
) -> Result<(), ManagerError>
where
    C: FnOnce(ManagerContext) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    // One select loop over leadership, the controllers and the servers: its arms share state.
    let signal = shutdown.signal();
    let Some(elector) = elector else {
        let mut task = TaskGuard(tokio::spawn(controllers(context)));
        return tokio::select! {
            joined = &mut task.0 => controllers_ended(joined, &signal),
            e = server_failure(servers, &signal) => Err(e),
        };
    };

    let mut leadership = elector.subscribe();
    let (stop_election, election_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut election = TaskGuard(tokio::spawn(elector.run(async move {
        let _ = election_stopped.await;
    })));
    let _reporting = {
        let readiness = readiness.clone();
        let metrics = metrics.clone();
        let mut leadership = leadership.clone();
        TaskGuard(tokio::spawn(async move {
            loop {
                let state = leadership.borrow_and_update().clone();
                readiness.set_leader_known(state.leader_known());
                readiness.set_leading(state == Leadership::Leader);
                metrics.set_leader(state == Leadership::Leader);
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        }))
    };

    // The guard `wait_for` returns is not Send: keep it inside this future.
    let leading = async {
        leadership
            .wait_for(|state| *state == Leadership::Leader)
            .await
            .is_ok()
    };
    let became_leader = tokio::select! {
        leads = leading => leads,
        _ = signal.clone().wait() => false,
        e = server_failure(servers, &signal) => {
            let _ = stop_election.send(());
            let _ = (&mut election.0).await;
            return Err(e);
        }
    };
    if !became_leader {
        let _ = stop_election.send(());
        return match (&mut election.0).await {
            Ok(result) => result.map_err(Into::into),
            Err(e) => Err(ManagerError::Setup(format!(
                "the leader election task failed: {e}"
            ))),
        };
    }

    info!("leading: starting the controllers");
    let mut task = TaskGuard(tokio::spawn(controllers(context)));
    tokio::select! {
        joined = &mut election.0 => {
            // Leadership is gone: stop reconciling now, without waiting for a graceful end.
            task.0.abort();
            match joined {
                Ok(Err(e)) => Err(e.into()),
                Ok(Ok(())) => Err(ManagerError::Setup("leader election stopped while leading".into())),
                Err(e) => Err(ManagerError::Setup(format!("the leader election task failed: {e}"))),
            }
        }
        joined = &mut task.0 => {
            // The controllers finished (on shutdown): only now may another replica take over.
            let ended = controllers_ended(joined, &signal);
            let _ = stop_election.send(());
            match (&mut election.0).await {
                Ok(Err(e)) => Err(e.into()),
                Err(e) => Err(ManagerError::Setup(format!("the leader election task failed: {e}"))),
                Ok(Ok(())) => ended,
            }
        }
        e = server_failure(servers, &signal) => {
            task.0.abort();
            let _ = (&mut task.0).await;
            let _ = stop_election.send(());
            let _ = (&mut election.0).await;
            Err(e)
        }
    }
}

/// Aborts its task when dropped, so that dropping [`Manager::run`]'s future (or returning early)
/// stops the controllers and the lease renewals with it, as a process exit would.
struct TaskGuard<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for TaskGuard<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn controllers_ended(
    joined: Result<(), tokio::task::JoinError>,
    shutdown: &ShutdownSignal,
) -> Result<(), ManagerError> {
    match joined {
        Err(e) => Err(ManagerError::Setup(format!("the controllers failed: {e}"))),
        Ok(()) if shutdown.is_triggered() => Ok(()),
        Ok(()) => Err(ManagerError::ControllersStopped),
    }
}
