//! `/metrics` on the diagnostics address, scraped over plain HTTP (`--insecure-diagnostics`)
//! from a running manager after a few reconciles: the exposition parses, and the generic and
//! registered series carry their labels. The guarded HTTPS default is tested on a real
//! kube-apiserver (real_apiserver_metrics.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use etcdadm_shared::manager::testing::http_client;
use etcdadm_shared::manager::{Manager, ManagerArgs, Shutdown};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::oneshot;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

/// `name{labels}` → value, for every sample line of an OpenMetrics text exposition.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let value: f64 = value.parse().unwrap_or(f64::NAN);
        assert!(!value.is_nan(), "a sample line without a numeric value: {line:?}");
        samples.insert(series.to_string(), value);
    }
    samples
}

#[tokio::test]
async fn metrics_are_scraped_over_http_after_reconciles() {
    let (_server, client) = etcdadm_sim_apiserver::fake_client().unwrap();
    let args = Cli::parse_from([
        "test",
        "--health-addr=0",
        "--diagnostics-address=127.0.0.1:0",
        "--insecure-diagnostics",
        "--webhook-port=0",
    ])
    .args;
    let shutdown = Shutdown::new();
    let manager = Manager::new(args, "test-manager", "test-manager-election")
        .client(client)
        .shutdown(shutdown.clone());
    let widgets: Family<Vec<(String, String)>, Counter> = Family::default();
    manager
        .metrics()
        .register("etcdadm_test_widgets", "Widgets made", widgets.clone());
    let (addr_tx, addr_rx) = oneshot::channel();
    let task = tokio::spawn(manager.run(move |ctx| async move {
        ctx.metrics.reconcile_started("widget").succeeded();
        ctx.metrics.reconcile_started("widget").succeeded();
        ctx.metrics.reconcile_started("widget").failed("kube");
        widgets
            .get_or_create(&vec![("color".to_string(), "blue".to_string())])
            .inc();
        let _ = addr_tx.send(ctx.diagnostics_addr);
        ctx.shutdown.wait().await;
    }));
    let addr = tokio::time::timeout(Duration::from_secs(5), addr_rx)
        .await
        .unwrap()
        .unwrap()
        .expect("the diagnostics server is enabled");

    let response = http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let samples = parse_exposition(&text);
    for (series, value) in [
        (
            r#"etcdadm_reconcile_total{controller="widget",result="success"}"#,
            2.0,
        ),
        (
            r#"etcdadm_reconcile_total{controller="widget",result="error"}"#,
            1.0,
        ),
        (
            r#"etcdadm_reconcile_errors_total{controller="widget",category="kube"}"#,
            1.0,
        ),
        (
            r#"etcdadm_reconcile_duration_seconds_count{controller="widget"}"#,
            3.0,
        ),
        (
            r#"etcdadm_reconcile_duration_seconds_bucket{le="+Inf",controller="widget"}"#,
            3.0,
        ),
        (r#"etcdadm_test_widgets_total{color="blue"}"#, 1.0),
        ("etcdadm_leader_election_is_leader", 0.0),
    ] {
        assert_eq!(samples.get(series), Some(&value), "{series} in\n{text}");
    }
    for family in [
        "# TYPE etcdadm_reconcile counter",
        "# TYPE etcdadm_reconcile_duration_seconds histogram",
        "# HELP etcdadm_reconcile_errors Reconciles that failed, by controller and error category.",
    ] {
        assert!(text.contains(family), "{family} in\n{text}");
    }

    let not_found = http_client()
        .get(format!("http://{addr}/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(not_found.status(), 404);

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
