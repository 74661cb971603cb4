//! Leader election against the sim API server: one leader among replicas, controllers only on
//! the leader, takeover after a silent leader's lease expires, immediate takeover after a clean
//! release, and a leader that loses its lease gives up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use clap::Parser;
use etcdadm_shared::manager::{
    LeaderElectionError, LeaderElector, Leadership, LeaseConfig, Manager, ManagerArgs, ManagerError, Shutdown,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::mpsc;

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(300);

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

fn args() -> ManagerArgs {
    Cli::parse_from([
        "test",
        "--leader-elect",
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=300ms",
        "--leader-election-namespace=default",
        "--health-addr=0",
        "--diagnostics-address=0",
        "--webhook-port=0",
    ])
    .args
}

fn lease_config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: "election".into(),
        namespace: "default".into(),
        identity: identity.into(),
        lease_duration: LEASE,
        renew_deadline: RENEW,
        retry_period: RETRY,
    }
}

async fn holder(client: &kube::Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// A replica whose controllers report `identity` when they start and run until shutdown.
fn replica(
    client: &kube::Client,
    identity: &'static str,
    started: mpsc::UnboundedSender<&'static str>,
) -> (Shutdown, tokio::task::JoinHandle<Result<(), ManagerError>>) {
    let shutdown = Shutdown::new();
    let manager = Manager::new(args(), "test-manager", "test-manager-election")
        .client(client.clone())
        .shutdown(shutdown.clone())
        .identity(identity);
    let task = tokio::spawn(manager.run(move |ctx| async move {
        let _ = started.send(identity);
        ctx.shutdown.wait().await;
    }));
    (shutdown, task)
}

#[tokio::test]
async fn controllers_run_only_on_the_leader_and_a_standby_takes_over_a_silent_leader() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (_shutdown_a, a) = replica(&client, "replica-a", started_tx.clone());
    let (shutdown_b, b) = replica(&client, "replica-b", started_tx);

    let first = tokio::time::timeout(Duration::from_secs(5), started.recv())
        .await
        .expect("a leader within 5 s")
        .unwrap();
    assert_eq!(
        holder(&client, "test-manager-election").await.as_deref(),
        Some(first)
    );
    // The other replica stays a standby while the leader renews.
    tokio::time::sleep(LEASE + RETRY).await;
    assert!(
        started.try_recv().is_err(),
        "only one replica may run controllers"
    );

    // The leader dies without releasing the lease (its whole task tree is dropped).
    let (leader, standby, standby_name, standby_shutdown) = if first == "replica-a" {
        (a, b, "replica-b", shutdown_b.clone())
    } else {
        (b, a, "replica-a", _shutdown_a.clone())
    };
    leader.abort();
    let died = Instant::now();
    let second = tokio::time::timeout(LEASE + Duration::from_secs(3), started.recv())
        .await
        .expect("the standby takes over")
        .unwrap();
    let waited = died.elapsed();
    assert_eq!(second, standby_name);
    assert!(
        waited >= LEASE - 4 * RETRY,
        "took over after {waited:?}, before the silent leader's lease could have expired"
    );
    assert!(waited <= LEASE + 4 * RETRY, "took over only after {waited:?}");
    assert_eq!(
        holder(&client, "test-manager-election").await.as_deref(),
        Some(standby_name)
    );

    // A clean shutdown releases the lease.
    standby_shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), standby)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(holder(&client, "test-manager-election").await, None);
}

#[tokio::test]
async fn a_released_lease_is_taken_over_at_once() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let a = LeaderElector::new(client.clone(), lease_config("a")).unwrap();
    let mut a_state = a.subscribe();
    let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
    let a_task = tokio::spawn(a.run(async move {
        let _ = stopped_a.await;
    }));
    tokio::time::timeout(
        Duration::from_secs(3),
        a_state.wait_for(|s| *s == Leadership::Leader),
    )
    .await
    .unwrap()
    .unwrap();

    let b = LeaderElector::new(client.clone(), lease_config("b")).unwrap();
    let mut b_state = b.subscribe();
    let _b_task = tokio::spawn(b.run(std::future::pending::<()>()));
    tokio::time::timeout(
        Duration::from_secs(3),
        b_state.wait_for(|s| *s == Leadership::Follower { leader: "a".into() }),
    )
    .await
    .unwrap()
    .unwrap();

    stop_a.send(()).unwrap();
    a_task.await.unwrap().unwrap();
    let released = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(2),
        b_state.wait_for(|s| *s == Leadership::Leader),
    )
    .await
    .expect("b leads soon after a released the lease")
    .unwrap();
    assert!(released.elapsed() < LEASE, "{:?}", released.elapsed());
    assert_eq!(holder(&client, "election").await.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_gives_up() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let a = LeaderElector::new(client.clone(), lease_config("a")).unwrap();
    let mut state = a.subscribe();
    let task = tokio::spawn(a.run(std::future::pending::<()>()));
    tokio::time::timeout(
        Duration::from_secs(3),
        state.wait_for(|s| *s == Leadership::Leader),
    )
    .await
    .unwrap()
    .unwrap();

    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let mut lease = leases.get("election").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    leases
        .replace("election", &PostParams::default(), &lease)
        .await
        .unwrap();

    let result = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the leader notices within a retry period")
        .unwrap();
    match result {
        Err(LeaderElectionError::Lost { reason, .. }) => assert!(reason.contains("intruder"), "{reason}"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(*state.borrow(), Leadership::Unknown);
}

#[tokio::test]
async fn a_leader_that_cannot_renew_gives_up_at_the_renew_deadline() {
    let server = etcdadm_sim_apiserver::ApiServer::new();
    let served = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let config = kube::Config::new(served.url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let a = LeaderElector::new(client, lease_config("a")).unwrap();
    let mut state = a.subscribe();
    let task = tokio::spawn(a.run(std::future::pending::<()>()));
    tokio::time::timeout(
        Duration::from_secs(3),
        state.wait_for(|s| *s == Leadership::Leader),
    )
    .await
    .unwrap()
    .unwrap();

    // The API server becomes unreachable.
    served.shutdown().await;
    let unreachable = Instant::now();
    let result = tokio::time::timeout(RENEW + Duration::from_secs(3), task)
        .await
        .expect("the leader gives up")
        .unwrap();
    let waited = unreachable.elapsed();
    match result {
        Err(LeaderElectionError::Lost { reason, .. }) => {
            assert!(reason.contains("renew deadline"), "{reason}")
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(waited >= RENEW - 2 * RETRY, "gave up after {waited:?}");
    assert!(
        waited < LEASE,
        "gave up after {waited:?}, after the lease may have expired"
    );
}

#[tokio::test]
async fn a_manager_that_loses_leadership_returns_an_error() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (_shutdown, task) = replica(&client, "replica-a", started_tx);
    tokio::time::timeout(Duration::from_secs(5), started.recv())
        .await
        .unwrap()
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let mut lease = leases.get("test-manager-election").await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
    leases
        .replace("test-manager-election", &PostParams::default(), &lease)
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            result,
            Err(ManagerError::LeaderElection(LeaderElectionError::Lost { .. }))
        ),
        "{result:?}"
    );
}

#[test]
fn timings_are_checked() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
        let mut config = lease_config("a");
        config.renew_deadline = LEASE;
        assert!(matches!(
            LeaderElector::new(client.clone(), config),
            Err(LeaderElectionError::Config(_))
        ));
        let mut config = lease_config("a");
        config.retry_period = RENEW;
        assert!(LeaderElector::new(client, config).is_err());
    });
}
