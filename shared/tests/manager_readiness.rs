//! `/healthz` and `/readyz` of running managers: readiness follows cache sync, leadership
//! (leader and standby) and the webhook certificate appearing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use clap::Parser;
use etcdadm_shared::manager::testing::{SelfSignedCert, fresh_dir, http_client, https_client_trusting};
use etcdadm_shared::manager::{Manager, ManagerArgs, ManagerContext, ManagerError, Shutdown, WebhookRoutes};
use kube::core::admission::AdmissionResponse;
use tokio::sync::{mpsc, oneshot};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn probe(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = http_client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Poll `/readyz` until it answers `status` (the server may still be starting).
async fn wait_for_status(addr: SocketAddr, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let answer = match http_client().get(format!("http://{addr}/readyz")).send().await {
            Ok(response) => Some((response.status().as_u16(), response.text().await.unwrap())),
            Err(_) => None,
        };
        if let Some((got, body)) = &answer
            && *got == status
        {
            return body.clone();
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn manager(flags: &[&str], client: &kube::Client, shutdown: &Shutdown) -> Manager {
    let mut argv = vec!["test", "--diagnostics-address=0"];
    argv.extend_from_slice(flags);
    Manager::new(
        Cli::parse_from(argv).args,
        "test-manager",
        "test-manager-election",
    )
    .client(client.clone())
    .shutdown(shutdown.clone())
}

/// A manager without leader election, probes on a free port, running `controllers`: its task
/// and the address its probes are served on.
async fn spawn_unelected<F>(
    client: &kube::Client,
    shutdown: &Shutdown,
    controllers: impl FnOnce(ManagerContext) -> F + Send + 'static,
) -> (tokio::task::JoinHandle<Result<(), ManagerError>>, SocketAddr)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (addr_tx, addr_rx) = oneshot::channel();
    let task = tokio::spawn(
        manager(
            &["--health-addr=127.0.0.1:0", "--webhook-port=0"],
            client,
            shutdown,
        )
        .run(move |ctx| {
            let _ = addr_tx.send(ctx.health_addr);
            controllers(ctx)
        }),
    );
    (task, addr_rx.await.unwrap().unwrap())
}

#[tokio::test]
async fn without_leader_election_ready_follows_cache_sync() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let shutdown = Shutdown::new();
    let (sync_tx, sync_rx) = oneshot::channel::<()>();
    let (task, addr) = spawn_unelected(&client, &shutdown, move |ctx| async move {
        let _ = sync_rx.await;
        ctx.readiness.set_synced();
        ctx.shutdown.wait().await;
    })
    .await;
    assert_eq!(probe(addr, "/healthz").await, (200, "ok\n".to_string()));
    assert_eq!(
        probe(addr, "/readyz").await,
        (503, "caches: failed (syncing)\n".to_string())
    );
    sync_tx.send(()).unwrap();
    assert_eq!(wait_for_status(addr, 200).await, "caches: ok (synced)\n");

    shutdown.trigger();
    task.await.unwrap().unwrap();
    assert!(
        http_client()
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .is_err(),
        "the probe server stops on shutdown"
    );
}

#[tokio::test]
async fn a_real_controller_on_its_own_watch_makes_the_manager_ready() {
    // Both controllers used to wait for their store in a task of their own, beside the
    // controller waiting on the same store; only one waiter is woken, and /readyz stayed 503.
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::{Action, Controller};
    use std::sync::Arc;

    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let shutdown = Shutdown::new();
    let (task, addr) = spawn_unelected(&client, &shutdown, |ctx| async move {
        let (store, changes) = ctx
            .settings
            .watch_own_kind::<ConfigMap>(&ctx.client, ctx.readiness.clone());
        Controller::for_stream(changes, store)
            .graceful_shutdown_on(ctx.shutdown.wait())
            .run(
                |_: Arc<ConfigMap>, _: Arc<()>| async { Ok::<_, kube::Error>(Action::await_change()) },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            )
            .for_each(|_| async {})
            .await;
    })
    .await;
    assert_eq!(wait_for_status(addr, 200).await, "caches: ok (synced)\n");
    shutdown.trigger();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn with_leader_election_the_leader_needs_synced_caches_and_a_standby_a_known_leader() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let flags = [
        "--leader-elect",
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=300ms",
        "--webhook-port=0",
    ];
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (sync_tx, sync_rx) = oneshot::channel::<()>();
    let shutdown_a = Shutdown::new();
    let addr_a: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let health_a = format!("--health-addr={addr_a}");
    let mut flags_a = flags.to_vec();
    flags_a.push(&health_a);
    let leader = tokio::spawn(manager(&flags_a, &client, &shutdown_a).identity("a").run(
        move |ctx| async move {
            let _ = started_tx.send(());
            let _ = sync_rx.await;
            ctx.readiness.set_synced();
            ctx.shutdown.wait().await;
        },
    ));
    tokio::time::timeout(Duration::from_secs(5), started.recv())
        .await
        .unwrap()
        .unwrap();
    let body = wait_for_status(addr_a, 503).await;
    assert_eq!(
        body,
        "leader: ok (this replica leads)\ncaches: failed (syncing)\n"
    );

    let shutdown_b = Shutdown::new();
    let addr_b: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let health_b = format!("--health-addr={addr_b}");
    let mut flags_b = flags.to_vec();
    flags_b.push(&health_b);
    let standby = tokio::spawn(
        manager(&flags_b, &client, &shutdown_b)
            .identity("b")
            .run(|_ctx| async { panic!("the standby must not run controllers") }),
    );
    assert_eq!(
        wait_for_status(addr_b, 200).await,
        "leader: ok (another replica leads)\n"
    );

    sync_tx.send(()).unwrap();
    assert_eq!(
        wait_for_status(addr_a, 200).await,
        "leader: ok (this replica leads)\ncaches: ok (synced)\n"
    );

    shutdown_b.trigger();
    standby.await.unwrap().unwrap();
    shutdown_a.trigger();
    leader.await.unwrap().unwrap();
}

#[tokio::test]
async fn webhooks_make_the_replica_ready_once_their_certificate_appears() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let cert_dir = fresh_dir(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "manager-webhook",
    );
    let port = free_port();
    let shutdown = Shutdown::new();
    let (addr_tx, addr_rx) = oneshot::channel();
    let flags = [
        "--health-addr=127.0.0.1:0".to_string(),
        format!("--webhook-port={port}"),
        format!("--webhook-cert-dir={}", cert_dir.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let routes = WebhookRoutes::new().route("/allow", |req| AdmissionResponse::from(&req));
    let task = tokio::spawn(
        manager(&flags, &client, &shutdown)
            .webhooks(routes)
            .webhook_reload_interval(Duration::from_millis(100))
            .run(move |ctx| async move {
                ctx.readiness.set_synced();
                let _ = addr_tx.send(ctx.health_addr);
                ctx.shutdown.wait().await;
            }),
    );
    let addr = addr_rx.await.unwrap().unwrap();
    assert_eq!(
        wait_for_status(addr, 503).await,
        "caches: ok (synced)\nwebhook: failed (waiting for the serving certificate)\n"
    );

    let cert = SelfSignedCert::generate();
    cert.write_to(&cert_dir);
    assert_eq!(
        wait_for_status(addr, 200).await,
        "caches: ok (synced)\nwebhook: ok (serving)\n"
    );
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": "x",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        }
    });
    let answer: serde_json::Value = https_client_trusting(&cert.cert_pem)
        .post(format!("https://localhost:{port}/allow"))
        .body(review.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], true);

    shutdown.trigger();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_taken_probe_port_fails_startup() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let flag = format!("--health-addr={}", taken.local_addr().unwrap());
    let result = manager(&[flag.as_str(), "--webhook-port=0"], &client, &Shutdown::new())
        .run(|_ctx| async { panic!("controllers must not start") })
        .await;
    assert!(
        matches!(
            result,
            Err(ManagerError::Server {
                what: "health probes",
                ..
            })
        ),
        "{result:?}"
    );
}
