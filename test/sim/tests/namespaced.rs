#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The namespaced install (config/namespaced) on a real kube-apiserver: both controller binaries,
//! each as its own ServiceAccount holding only that install's RBAC, watching two namespaces. A
//! cluster in the first is built and Ready; the second's objects are reconciled too; a third
//! namespace's are never touched, and the controllers' identities are refused there.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::capi::sim_machine_template_resource;
use etcdadm_sim::demo;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim::plane::Plane;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use lifecycle_support::*;
use serde_json::json;

const PREFIX: u8 = 46;
const TIMEOUT: Duration = Duration::from_secs(180);
/// Both controller binaries, each with its ServiceAccount's identity.
const CONTROLLERS: [&str; 2] = ["etcdadm-bootstrap", CONTROLLER];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_install_on_a_real_api_server_reconciles_its_namespaces_and_cannot_reach_another() {
    let work = TempDir::new("sim-namespaced");
    // The plane's namespace, where the stand-ins play Cluster API and machines boot.
    let watched = scenario_namespace(PREFIX);
    // Watched too (an overlay's second namespace): reconciled, though no machine boots there.
    let also = format!("{watched}-also");
    // Neither watched nor granted: another tenant's.
    let outside = format!("{watched}-outside");
    let real = real_apiserver::RealApiServer::start_namespaced(&[watched.clone(), also.clone()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let admin = real.server.client().await.unwrap();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": outside}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();

    // The other namespaces' objects exist before the controllers start, so their first lists
    // would have them if they listed there.
    for namespace in [&also, &outside] {
        create_managed_cluster(&admin, namespace, &cluster("c1", false))
            .await
            .unwrap();
        Api::<EtcdadmConfig>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &lone_config())
            .await
            .unwrap();
    }
    let tenant_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "tenant-credentials", "labels": {names::CLUSTER_NAME_LABEL: "c1"}},
        "stringData": {"secret": "not for the controllers"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), &outside)
        .create(&PostParams::default(), &tenant_secret)
        .await
        .unwrap();

    let plane = Plane::start(real.plane_options(plane_options(PREFIX, &work, Duration::from_secs(1))))
        .await
        .unwrap();
    let client = plane.client.clone();
    let started = Instant::now();
    create(&client, "n1", 1, true, json!({}), json!({})).await;
    wait_settled(&client, "n1", 1, TIMEOUT, &work).await;
    println!(
        "namespaced install on a real kube-apiserver: a cluster of one with its control plane Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // The second watched namespace: the EtcdadmCluster taken in hand (finalizer, status) and the
    // lone EtcdadmConfig told what it waits for.
    let also_clusters = Api::<EtcdadmCluster>::namespaced(admin.clone(), &also);
    let also_configs = Api::<EtcdadmConfig>::namespaced(admin.clone(), &also);
    demo::eventually("the second namespace reconciled", TIMEOUT, || async {
        let etcd = also_clusters.get("c1-etcd").await?;
        let config = also_configs.get("lone").await?;
        let finalized = etcd
            .finalizers()
            .iter()
            .any(|f| f == names::ETCDADM_CLUSTER_FINALIZER);
        let status = etcd.status.as_ref().is_some_and(|s| !s.conditions.is_empty());
        let waiting = serde_json::to_string(&config.status)
            .unwrap()
            .contains("WaitingForMachineOwner");
        Ok(if finalized && status && waiting {
            Ok(())
        } else {
            Err(format!(
                "finalizer {finalized}, status {status}, config waiting for its Machine {waiting}\n{}",
                logs(&work)
            ))
        })
    })
    .await
    .unwrap();

    // The namespace outside: as created, nothing added, nothing written.
    let etcd = Api::<EtcdadmCluster>::namespaced(admin.clone(), &outside)
        .get("c1-etcd")
        .await
        .unwrap();
    assert!(etcd.finalizers().is_empty(), "{:?}", etcd.finalizers());
    assert!(
        etcd.owner_references().is_empty(),
        "{:?}",
        etcd.owner_references()
    );
    assert!(etcd.status.is_none(), "{:?}", etcd.status);
    let config = Api::<EtcdadmConfig>::namespaced(admin.clone(), &outside)
        .get("lone")
        .await
        .unwrap();
    assert!(config.status.is_none(), "{:?}", config.status);
    let machines = Api::<Machine>::namespaced(admin.clone(), &outside)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(machines.items.is_empty(), "Machines created outside");
    let configs = names_of(Api::<EtcdadmConfig>::namespaced(admin.clone(), &outside)).await;
    assert_eq!(configs, BTreeSet::from(["lone".to_string()]));
    let secrets = names_of(Api::<Secret>::namespaced(admin.clone(), &outside)).await;
    assert_eq!(secrets, BTreeSet::from(["tenant-credentials".to_string()]));
    let events = names_of(Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        admin.clone(),
        &outside,
    ))
    .await;
    assert!(events.is_empty(), "Events outside: {events:?}");

    // Not allowed either: each controller's identity is refused outside and cluster-wide, and
    // answered in the namespaces it watches.
    for binary in CONTROLLERS {
        let own = real.controller_client(binary).await.unwrap();
        refused(
            Api::<Secret>::namespaced(own.clone(), &outside)
                .get("tenant-credentials")
                .await,
            binary,
            "get a Secret outside",
        );
        refused(
            Api::<Secret>::all(own.clone()).list(&ListParams::default()).await,
            binary,
            "list Secrets everywhere",
        );
        refused(
            Api::<EtcdadmCluster>::all(own.clone())
                .list(&ListParams::default())
                .await,
            binary,
            "list EtcdadmClusters everywhere",
        );
        refused(
            Api::<EtcdadmCluster>::namespaced(own.clone(), &outside)
                .get("c1-etcd")
                .await,
            binary,
            "get the EtcdadmCluster outside",
        );
        for namespace in [&watched, &also] {
            let name = if *namespace == watched {
                "n1-etcd"
            } else {
                "c1-etcd"
            };
            Api::<EtcdadmCluster>::namespaced(own.clone(), namespace)
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("{binary} cannot get {namespace}/{name}: {e}"));
        }
    }
    let controller = real.controller_client(CONTROLLER).await.unwrap();
    refused(
        Api::<DynamicObject>::namespaced_with(controller.clone(), &outside, &sim_machine_template_resource())
            .delete("c1-etcd", &DeleteParams::default())
            .await,
        CONTROLLER,
        "delete an infrastructure template outside",
    );
    refused(
        Api::<Machine>::namespaced(controller, &outside)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "intruder"},
                    "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "x"},
                             "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                   "kind": "SimMachine", "name": "x"}},
                }))
                .unwrap(),
            )
            .await,
        CONTROLLER,
        "create a Machine outside",
    );

    // And the controllers never tried: the API server refused them nothing.
    for binary in CONTROLLERS {
        let log = std::fs::read_to_string(work.path().join(format!("{binary}.log"))).unwrap();
        let forbidden = real_apiserver::forbidden_lines(&log);
        assert!(forbidden.is_empty(), "{binary} was refused:\n{forbidden}");
    }
    drop(plane);
}

fn cluster(name: &str, with_kcp: bool) -> ManagedCluster<'_> {
    ManagedCluster {
        name,
        replicas: 1,
        zones: &["zone-a"],
        config_spec: json!({}),
        health_check: fast_health(),
        with_kcp,
        extra_spec: json!({}),
    }
}

/// An EtcdadmConfig no Machine owns (yet): the bootstrap controller says it waits for one.
fn lone_config() -> EtcdadmConfig {
    serde_json::from_value(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
        "metadata": {"name": "lone"},
        "spec": {},
    }))
    .unwrap()
}

async fn names_of<K>(api: Api<K>) -> BTreeSet<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect()
}

/// `result` is the API server's 403.
fn refused<T: Debug>(result: Result<T, kube::Error>, binary: &str, what: &str) {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{binary} may {what}: {other:?}"),
    }
}
