#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `/metrics` guarded by the real kube-apiserver: each manager acting as its ServiceAccount,
//! with config/rbac applied (so it may ask for TokenReviews and
//! SubjectAccessReviews and nothing else is assumed), serves its metrics over HTTPS; a request
//! without a token gets 401, a ServiceAccount not bound to `etcdadm-metrics-reader` gets 403,
//! one bound to it gets the metrics, and plain HTTP is not served at all.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use etcdadm_envtest::{KubeApiServer, client_for};
use etcdadm_shared::manager::{Manager, ManagerArgs, Shutdown};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::oneshot;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

const MONITORING: &str = "monitoring";

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn kubectl(server: &KubeApiServer, args: &[&str]) {
    let output = server.kubectl().args(args).output().unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A token of the ServiceAccount `name` in [`MONITORING`], created first.
async fn token_of(admin: &Client, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), MONITORING);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts.create(&PostParams::default(), &account).await.unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

#[tokio::test]
async fn metrics_answer_only_a_service_account_bound_to_the_metrics_reader() {
    let server = KubeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let admin = server.client().await.unwrap();
    kubectl(&server, &["create", "namespace", "etcdadm-system"]);
    let rbac = repo("config/rbac").display().to_string();
    kubectl(&server, &["apply", "--server-side", "-k", &rbac]);
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": MONITORING}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let prometheus = token_of(&admin, "prometheus").await;
    let stranger = token_of(&admin, "stranger").await;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-etcdadm-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "etcdadm-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // Each manager as installed: its own ServiceAccount, guarded HTTPS metrics.
    for account in ["etcdadm-controller-manager", "etcdadm-bootstrap-manager"] {
        scrape_as(&server, account, &prometheus, &stranger).await;
    }
}

/// A manager acting as `account` (config/rbac's), and its `/metrics` scraped with no token, a
/// made-up one, `stranger`'s and `prometheus`'s.
async fn scrape_as(server: &KubeApiServer, account: &str, prometheus: &str, stranger: &str) {
    let identity = server
        .impersonating_kubeconfig(
            &format!("system:serviceaccount:etcdadm-system:{account}"),
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:etcdadm-system",
                "system:authenticated",
            ],
        )
        .unwrap();
    let args = Cli::parse_from([
        "test",
        "--health-addr=0",
        "--diagnostics-address=127.0.0.1:0",
        "--webhook-port=0",
    ])
    .args;
    let shutdown = Shutdown::new();
    let manager = Manager::new(args, "test-manager", "test-manager-election")
        .client(client_for(&identity).await.unwrap())
        .shutdown(shutdown.clone());
    let (addr_tx, addr_rx) = oneshot::channel();
    let task = tokio::spawn(manager.run(move |ctx| async move {
        ctx.metrics.reconcile_started("widget").succeeded();
        let _ = addr_tx.send(ctx.diagnostics_addr);
        ctx.shutdown.wait().await;
    }));
    let addr = tokio::time::timeout(Duration::from_secs(10), addr_rx)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The certificate is self-signed: scrapers authenticate by token, TLS only encrypts.
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("https://{addr}/metrics");
    let scrape = |token: Option<&str>| {
        let mut request = https.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let response = scrape(None).await.unwrap();
    assert_eq!(response.status(), 401, "{account}");
    let response = scrape(Some("not-a-token")).await.unwrap();
    assert_eq!(
        response.status(),
        401,
        "{account}: a token the API server does not know"
    );
    let response = scrape(Some(stranger)).await.unwrap();
    assert_eq!(response.status(), 403, "{account}");
    let body = response.text().await.unwrap();
    assert!(
        body.contains("system:serviceaccount:monitoring:stranger"),
        "{body}"
    );
    let response = scrape(Some(prometheus)).await.unwrap();
    assert_eq!(response.status(), 200, "{account}: {}", server.log());
    let body = response.text().await.unwrap();
    assert!(
        body.contains(r#"etcdadm_reconcile_total{controller="widget",result="success"} 1"#),
        "{body}"
    );

    // Plain HTTP gets no metrics from the HTTPS port.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(prometheus)
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "{account}: metrics over plain HTTP"
    );

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
