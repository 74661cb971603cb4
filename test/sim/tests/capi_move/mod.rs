#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]
//! `clusterctl move` of a Ready cluster (a KubeadmControlPlane on our etcd, a snapshot in a
//! store) from one real management cluster to a second, under the real Cluster API (docs/capi.md,
//! "clusterctl move"). Upstream clusterctl refuses to move a Machine without a Node, and etcd
//! Machines never get one: the mover's check is the one thing stood in (the scenario writes the
//! etcd Machines' `status.nodeRef` in the paused source before it runs the real `clusterctl
//! move`). Everything else is real: the move, the pause, the deletion of the source's copies, and
//! the target's controllers carrying on with the same CA, Machines and members while a client
//! writes to etcd throughout.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{KubeadmControlPlane, Machine};
use etcdadm_shared::api::snapshot::{EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::names;
use etcdadm_shared::testing::{SeaweedFs, TempDir};
use etcdadm_sim::infra::{BootSettings, Booting, SimInfra};
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim::plane::{Plane, PlaneOptions};
use etcdadm_sim::real_capi::RealCapi;

use super::{KeepLogs, lifecycle_support, wait_for};

const CLUSTER: &str = "c1";
const NAMESPACE: &str = "moving";
const BUCKET: &str = "moved-backups";
const SETTLE: Duration = Duration::from_secs(600);

/// An admin client of the API server of `kubeconfig`, `NAMESPACE` by default.
async fn client_of(kubeconfig: &std::path::Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.default_namespace = NAMESPACE.into();
    Client::try_from(config).unwrap()
}

/// The CA Secret's data, the etcd Machines' names and the members' IDs: what must not change.
async fn identity(client: &Client) -> (Vec<u8>, BTreeSet<String>, BTreeSet<String>) {
    let ca = Api::<Secret>::default_namespaced(client.clone())
        .get(&names::ca_secret_name(CLUSTER))
        .await
        .unwrap();
    let ca = serde_json::to_vec(&ca.data).unwrap();
    let machines = lifecycle_support::machine_names(client, CLUSTER).await;
    let members = lifecycle_support::etcd_api(client)
        .get("c1-etcd")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .members
        .iter()
        .filter_map(|m| m.member_id.clone())
        .collect();
    (ca, machines, members)
}

/// The KubeadmControlPlane reports its control plane initialized.
async fn kcp_initialized(client: &Client) -> Result<(), String> {
    let kcp: Api<KubeadmControlPlane> = Api::default_namespaced(client.clone());
    let kcp = kcp.get("c1-control-plane").await.map_err(|e| e.to_string())?;
    let status = serde_json::to_value(&kcp.status).unwrap_or_default();
    (status.pointer("/initialization/controlPlaneInitialized") == Some(&json!(true)))
        .then_some(())
        .ok_or("KCP not initialized".to_string())
}

/// What is left in the source's namespace of the objects the move carries.
async fn left_in_source(client: &Client) -> Vec<String> {
    let mut left = vec![];
    for (group, version, kind) in [
        ("cluster.x-k8s.io", "v1beta2", "Cluster"),
        ("cluster.x-k8s.io", "v1beta2", "Machine"),
        ("etcdcluster.cluster.x-k8s.io", "v1beta1", "EtcdadmCluster"),
        ("etcdcluster.cluster.x-k8s.io", "v1beta1", "EtcdadmSnapshot"),
        ("bootstrap.cluster.x-k8s.io", "v1beta1", "EtcdadmConfig"),
        ("infrastructure.cluster.x-k8s.io", "v1beta2", "SimMachine"),
    ] {
        let resource =
            kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
        left.extend(
            api.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(|o| format!("{kind} {}", o.name_any())),
        );
    }
    left
}

/// The mover's check, stood in: upstream clusterctl requires `status.nodeRef` on every Machine,
/// and etcd Machines never get a Node. Written just before the move (clusterctl refuses to
/// start on a paused Cluster, and pauses it itself once the check passed); the copies carry no
/// status.
async fn stand_in_for_the_node_check(client: &Client) {
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    for name in lifecycle_support::machine_names(client, CLUSTER).await {
        let patch = json!({"status": {"nodeRef": {"name": format!("stand-in-for-{name}")}}});
        machines
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
}

pub async fn scenario() {
    let work = TempDir::new("sim-real-capi-move");
    let _keep = KeepLogs(&work, "move");
    let source = RealCapi::start(&work.path().join("source"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let target = RealCapi::start(&work.path().join("target"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let plane = Plane::start(source.plane_options(PlaneOptions {
        namespace: NAMESPACE.into(),
        ip_prefix: [127, 0, 43],
        ..Default::default()
    }))
    .await
    .unwrap();
    let client = plane.client.clone();
    let logs = || format!("{}\n--- target\n{}", source.logs(), target.logs());

    // A Ready cluster with a KubeadmControlPlane on it and a snapshot in a store.
    let s3 = SeaweedFs::start_tls().await;
    s3.create_bucket(BUCKET).await;
    lifecycle_support::store_credentials(&client, &s3).await;
    let store = serde_json::to_value(s3.store(BUCKET)).unwrap();
    let spec = ManagedCluster {
        name: CLUSTER,
        replicas: 3,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        health_check: json!({"interval": "1s", "timeout": "1s"}),
        with_kcp: true,
        extra_spec: json!({"backup": {"store": {"s3": store}}}),
    };
    create_managed_cluster(&client, NAMESPACE, &spec)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    Api::<KubeadmControlPlane>::default_namespaced(client.clone())
        .patch(
            "c1-control-plane",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    wait_for("settled with the control plane initialized", SETTLE, || async {
        kcp_initialized(&client).await?;
        lifecycle_support::settled(&client, CLUSTER, 3).await.map(|_| ())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let snapshot = lifecycle_support::take_snapshot(&client, CLUSTER, "before-move", &work).await;
    let taken = snapshot.status.clone().unwrap();
    let before = identity(&client).await;

    // A client writing to etcd through the endpoints the control plane has, and the membership
    // as etcd reports it, throughout.
    let watchers = lifecycle_support::Watchers::start(&client, CLUSTER).await;
    let (endpoints, follower) = lifecycle_support::follow_kcp_endpoints(&client, CLUSTER);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let workload = lifecycle_support::Workload::start(&client, CLUSTER, endpoints, watchers.started).await;

    // The target's infrastructure provider: the same machines and control plane hosts (the
    // machines do not move; their objects do).
    let target_client = client_of(target.server.kubeconfig()).await;
    let target_infra = tokio::spawn(
        SimInfra {
            client: target_client.clone(),
            namespace: NAMESPACE.into(),
            runtime: plane.runtime.clone(),
            work_dir: work.path().join("target"),
            ip_prefix: [127, 0, 43],
            settings: BootSettings::default(),
            boot_delay: Default::default(),
            booting: Mutex::new(Booting::new(Default::default())),
            control_plane: plane.control_plane.clone(),
        }
        .run(),
    );

    stand_in_for_the_node_check(&client).await;
    let moved_at = Instant::now();
    let output = source
        .clusterctl()
        .unwrap()
        .args(["move", "--namespace", NAMESPACE, "-v", "3"])
        .arg(format!(
            "--to-kubeconfig={}",
            target.server.kubeconfig().display()
        ))
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "clusterctl move failed:\n{said}\n{}",
        logs()
    );
    let move_took = moved_at.elapsed();
    println!("clusterctl move ({move_took:.1?}):\n{said}");

    // Nothing of it is left in the source; in the target, our controllers carry on.
    let left = left_in_source(&client).await;
    assert!(left.is_empty(), "left in the source: {left:?}");
    let settled = wait_for("the target settled", SETTLE, || async {
        kcp_initialized(&target_client).await?;
        lifecycle_support::settled(&target_client, CLUSTER, 3)
            .await
            .map(|_| ())
    })
    .await;
    let settled_after = moved_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = workload.finish().await;
    follower.abort();
    let (history, machine_log) = watchers.finish();
    settled.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let after = identity(&target_client).await;
    assert!(before.0 == after.0, "the etcd CA changed in the move");
    assert_eq!(before.1, after.1, "etcd Machines were replaced");
    assert_eq!(before.2, after.2, "etcd members changed");
    assert!(
        history.names_with_several_ids().is_empty(),
        "a member was re-added: {history:#?}"
    );
    assert_eq!(
        history.max_size(),
        3,
        "the membership changed during the move: {history:#?}"
    );
    lifecycle_support::assert_safe(&history, &machine_log);
    assert!(
        report.lost.is_empty(),
        "acknowledged writes lost: {:?}",
        report.lost
    );

    // The snapshot moved with its record and its store's Secrets: its status is back, the same.
    let snapshots: Api<EtcdadmSnapshot> = Api::default_namespaced(target_client.clone());
    let moved = wait_for(
        "the snapshot's status back in the target",
        Duration::from_secs(120),
        || async {
            let moved = snapshots.get("before-move").await.map_err(|e| e.to_string())?;
            (moved.phase() == SnapshotPhase::Succeeded)
                .then_some(moved.clone())
                .ok_or(format!("{:?}", moved.status))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let moved_status = moved.status.unwrap();
    assert_eq!(
        (
            &moved_status.location,
            &moved_status.sha256,
            moved_status.revision
        ),
        (&taken.location, &taken.sha256, taken.revision),
        "the snapshot's record differs after the move"
    );
    for secret in [
        etcdadm_shared::testing::CREDENTIALS_SECRET,
        etcdadm_shared::testing::CA_SECRET,
    ] {
        assert!(
            Api::<Secret>::default_namespaced(target_client.clone())
                .get_opt(secret)
                .await
                .unwrap()
                .is_some(),
            "the store's Secret {secret} did not move"
        );
    }
    let etcd: EtcdadmCluster = lifecycle_support::etcd_api(&target_client)
        .get("c1-etcd")
        .await
        .unwrap();
    println!(
        "moved: clusterctl move {move_took:.1?}, the target settled {settled_after:.1?} after the move began; \
         client: {} writes, longest gap {:?}; CA, {} Machines and members unchanged; endpoints {}",
        report.acked,
        report.max_gap,
        after.1.len(),
        etcd.status.unwrap_or_default().endpoints
    );
    target_infra.abort();
    drop(plane);
    drop(target);
    drop(source);
}
