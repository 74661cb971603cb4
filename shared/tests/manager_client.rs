//! `--kube-api-qps`/`--kube-api-burst` really limit the requests a manager's client sends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use etcdadm_shared::manager::client;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

async fn time_requests(qps: Option<f64>, burst: Option<u32>, requests: usize) -> Duration {
    let server = etcdadm_sim_apiserver::ApiServer::new();
    let served = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let config = kube::Config::new(served.url.parse().unwrap());
    let client = client::from_config(config, qps, burst).unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let started = Instant::now();
    for _ in 0..requests {
        namespaces.get("default").await.unwrap();
    }
    started.elapsed()
}

#[tokio::test]
async fn requests_beyond_the_burst_wait_for_the_rate() {
    // 2 back to back, then 2 per 200 ms: 6 requests need at least two more windows.
    let limited = time_requests(Some(10.0), Some(2), 6).await;
    assert!(limited >= Duration::from_millis(350), "took {limited:?}");
    let unlimited = time_requests(None, None, 6).await;
    assert!(unlimited < Duration::from_millis(350), "took {unlimited:?}");
}
