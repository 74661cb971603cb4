#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One EtcdadmCluster this version cannot read must not stop the others: the controller, run by
//! the manager runtime against the in-memory API server, reports it with a condition and keeps
//! reconciling the readable one.

use std::time::{Duration, Instant};

use clap::Parser;
use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::manager::{Manager, ManagerArgs, Shutdown};
use etcdadm_sim_apiserver::fake_client;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ManagerArgs,
}

fn etcd_cluster(name: &str, remediation: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": EtcdadmCluster::api_version(&()), "kind": "EtcdadmCluster",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "absent"}},
        "spec": {"replicas": 3, "healthCheck": {"remediation": remediation},
                 "infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"}},
    }))
    .unwrap()
}

#[tokio::test]
async fn an_unreadable_etcdadm_cluster_gets_a_condition_and_the_others_are_reconciled() {
    let (_server, client) = fake_client().unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::erase::<EtcdadmCluster>(&()),
    );
    api.create(&PostParams::default(), &etcd_cluster("bad", "Sometimes"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &etcd_cluster("good", "Enabled"))
        .await
        .unwrap();

    let shutdown = Shutdown::new();
    let args = Cli::parse_from([
        "test",
        "--health-addr=0",
        "--diagnostics-address=0",
        "--webhook-port=0",
    ])
    .args;
    let manager = Manager::new(args, "etcdadm-controller", "test-election")
        .client(client.clone())
        .shutdown(shutdown.clone());
    let pool = etcdadm_etcdcluster::snapshot::SnapshotPool::new(2);
    let task = tokio::spawn(manager.run(move |ctx| etcdadm_etcdcluster::controller::run(ctx, pool)));

    let reason = |o: &DynamicObject| {
        let conditions = o
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        conditions
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| (c["reason"].clone(), c["message"].clone()))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let (bad, good) = loop {
        let bad = reason(&api.get("bad").await.unwrap());
        let good = reason(&api.get("good").await.unwrap());
        if bad.is_some() && good.is_some() || Instant::now() > deadline {
            break (bad, good);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    shutdown.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let (reason, message) = bad.expect("the unreadable EtcdadmCluster got no Ready condition");
    assert_eq!(reason, "InvalidObject");
    assert!(message.as_str().unwrap().contains("default/bad"), "{message}");
    let (reason, _) = good.expect("the readable EtcdadmCluster was not reconciled");
    assert_eq!(reason, "WaitingForCluster");
}
