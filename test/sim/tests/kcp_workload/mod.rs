#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]
//! The real KubeadmControlPlane on our etcd (real-CAPI tier): its control plane hosts run a real
//! kube-apiserver storing in the EtcdadmCluster's members, so KCP initializes, and every change
//! of the etcd endpoint list rolls its Machines out as it would in a real cluster. The etcd
//! changes: scale 3 → 5 → 3, an etcd Machine deleted by hand, a dead member remediated, a
//! rolling replacement (`day_two`). What the scenario measures: how many KCP rollouts each
//! causes, how long each takes, and the longest pause of a client writing through the control
//! plane's load balancer; the membership history follows the safety rules throughout.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::etcd::MemberClient;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim::plane::{Plane, PlaneOptions};
use etcdadm_sim::real_capi::RealCapi;

use super::{KeepLogs, TIMEOUT, lifecycle_support, wait_for};

mod day_two;

const CLUSTER: &str = "c1";
const KCP: &str = "c1-control-plane";
/// One KCP rollout here: a host boots a kube-apiserver, registers, the old one drains and goes.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const WRITE_EVERY: Duration = Duration::from_millis(200);

fn kcp_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
    ))
}

fn control_plane(machine: &Machine) -> bool {
    machine.labels().contains_key("cluster.x-k8s.io/control-plane")
}

fn status_of(machine: &Machine) -> Value {
    serde_json::to_value(machine.status.clone().unwrap_or_default()).unwrap()
}

/// A client of the workload cluster from the `<cluster>-kubeconfig` Secret KCP wrote (its
/// server is the control plane endpoint: the load balancer).
async fn workload_client(client: &Client) -> Result<Client, String> {
    let secret = Api::<Secret>::default_namespaced(client.clone())
        .get(&format!("{CLUSTER}-kubeconfig"))
        .await
        .map_err(|e| e.to_string())?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .ok_or("the kubeconfig Secret has no value")?;
    let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    config.connect_timeout = Some(Duration::from_secs(3));
    config.read_timeout = Some(Duration::from_secs(5));
    config.write_timeout = Some(Duration::from_secs(5));
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Write ConfigMap `default/<name>` with `data` through `workload` (server-side apply).
async fn write_config_map(workload: &Client, name: &str, data: Value) -> Result<(), String> {
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"}, "data": data});
    Api::<ConfigMap>::namespaced(workload.clone(), "default")
        .patch(
            name,
            &PatchParams::apply("etcdadm-sim").force(),
            &Patch::Apply(&config_map),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The value of `key` as our etcd stores it, read from the first member over our CA.
async fn etcd_value(client: &Client, etcd: &EtcdadmCluster, key: &str) -> Result<Option<Vec<u8>>, String> {
    let tls = demo::etcd_tls(client, client.default_namespace(), CLUSTER)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no etcd CA yet")?;
    let url = etcd
        .status
        .as_ref()
        .and_then(|s| s.members.first())
        .and_then(|m| m.client_url.clone())
        .ok_or("no member with a client URL")?;
    let member = MemberClient::new(&url, &tls, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let mut kv = member.workload_client().await.map_err(|e| e.to_string())?;
    let answer = kv.get(key, None).await.map_err(|e| e.to_string())?;
    Ok(answer.kvs().first().map(|kv| kv.value().to_vec()))
}

/// What a writer through the load balancer saw.
#[derive(Debug, Default)]
struct Writes {
    succeeded: u64,
    failed: u64,
    /// Longest time between two successful writes (or from the start to the first).
    longest_gap: Duration,
    /// When the longest gap ended, from the writer's start.
    longest_gap_ended: Duration,
}

/// Update `default/writer` every [`WRITE_EVERY`] through `workload` until `stop` (at most an
/// hour: the loop is bounded whatever happens to the test).
fn start_writer(workload: Client, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Writes> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut writes = Writes::default();
        let mut last = started;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(3600) {
            n += 1;
            let attempt = Instant::now();
            let written = tokio::time::timeout(
                Duration::from_secs(10),
                write_config_map(&workload, "writer", json!({"n": n.to_string()})),
            )
            .await;
            if matches!(written, Ok(Ok(()))) {
                writes.succeeded += 1;
                let now = Instant::now();
                if now - last > writes.longest_gap {
                    writes.longest_gap = now - last;
                    writes.longest_gap_ended = now - started;
                }
                last = now;
            } else {
                writes.failed += 1;
            }
            tokio::time::sleep(WRITE_EVERY.saturating_sub(attempt.elapsed())).await;
        }
        writes
    })
}

/// The control plane Machines, by name.
async fn control_plane_machines(client: &Client) -> Vec<Machine> {
    Api::<Machine>::default_namespaced(client.clone())
        .list(&Default::default())
        .await
        .map(|l| l.items.into_iter().filter(control_plane).collect())
        .unwrap_or_default()
}

/// When each thing was first seen, from `start`.
struct Milestones {
    start: Instant,
    seen: Vec<(String, Duration)>,
}

impl Milestones {
    fn new(start: Instant) -> Milestones {
        Milestones { start, seen: vec![] }
    }

    fn mark(&mut self, what: &str) {
        if !self.seen.iter().any(|(w, _)| w == what) {
            self.seen.push((what.to_string(), self.start.elapsed()));
        }
    }

    fn print(&self) {
        for (what, at) in &self.seen {
            println!("{at:>10.1?}  {what}");
        }
    }
}

/// What one etcd change did to the real KCP.
struct Change {
    what: String,
    events: Milestones,
    endpoint_lists: usize,
    generations: i64,
    new_machines: Vec<String>,
}

/// Patch the EtcdadmCluster to `replicas`, wait until it settles with KCP rolled out, and count
/// what KCP did on the way: endpoint lists it was given, generations, Machines created; with
/// when each step was first seen.
async fn change_replicas(client: &Client, from: usize, replicas: usize, real: &RealCapi) -> Change {
    let what = format!("etcd {from} → {replicas}");
    let patch = json!({"replicas": replicas});
    follow_change(client, &what, replicas, real, || {
        lifecycle_support::patch_spec(client, CLUSTER, patch.clone())
    })
    .await
}

/// Make an etcd change with `act`, wait until the cluster settles at `replicas` with KCP rolled
/// out, and count what KCP did on the way (see [`change_replicas`]).
async fn follow_change<F, Fut>(
    client: &Client,
    what: &str,
    replicas: usize,
    real: &RealCapi,
    act: F,
) -> Change
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let machines: Vec<Machine> = control_plane_machines(client).await;
    let before: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
    let kcp_before = lifecycle_support::kcp(client, CLUSTER).await.unwrap();
    let generation_before = kcp_before.metadata.generation.unwrap_or_default();
    let sorted = |kcp: &KubeadmControlPlane| match kcp.etcd() {
        ControlPlaneEtcd::External(mut endpoints) => {
            endpoints.sort();
            endpoints
        }
        ControlPlaneEtcd::Local => vec![],
    };
    let mut lists = vec![sorted(&kcp_before)];
    let mut events = Milestones::new(Instant::now());
    act().await;
    let mut seen = before.clone();
    let deadline = Instant::now() + CHANGE_TIMEOUT;
    loop {
        let etcd = lifecycle_support::etcd_api(client).get("c1-etcd").await.ok();
        let members = etcd.and_then(|e| e.status).map_or(0, |s| s.members.len());
        events.mark(&format!("{members} etcd members"));
        if let Some(kcp) = lifecycle_support::kcp(client, CLUSTER).await
            && !lists.contains(&sorted(&kcp))
        {
            lists.push(sorted(&kcp));
            events.mark(&format!(
                "KCP given endpoint list {}: {:?}",
                lists.len() - 1,
                sorted(&kcp)
            ));
        }
        let now: Vec<Machine> = control_plane_machines(client).await;
        for machine in &now {
            let name = machine.name_any();
            seen.insert(name.clone());
            if before.contains(&name) {
                if machine.is_deleting() {
                    events.mark(&format!("old control plane Machine {name} deleting"));
                }
                continue;
            }
            events.mark(&format!("new control plane Machine {name} created"));
            if status_of(machine)["nodeRef"]["name"].is_string() {
                events.mark(&format!("new control plane Machine {name} has a nodeRef"));
            }
        }
        for gone in before.iter().filter(|b| !now.iter().any(|m| m.name_any() == **b)) {
            events.mark(&format!("old control plane Machine {gone} gone"));
        }
        match lifecycle_support::settled(client, CLUSTER, replicas).await {
            Ok(_) => break,
            Err(state) if Instant::now() > deadline => panic!(
                "not settled at {replicas} within {CHANGE_TIMEOUT:?}: {state}\n{}",
                real.logs()
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    events.mark("settled: etcd Ready, KCP on the current endpoints, rollout complete");
    let generation = lifecycle_support::kcp(client, CLUSTER)
        .await
        .and_then(|k| k.metadata.generation)
        .unwrap_or_default();
    Change {
        what: what.to_string(),
        events,
        endpoint_lists: lists.len() - 1,
        generations: generation - generation_before,
        new_machines: seen.difference(&before).cloned().collect(),
    }
}

/// Whether KCP recorded the API server certificate expiry of `machine` on its KubeadmConfig,
/// which it reads through a port-forward to the host's `kube-apiserver` pod.
async fn certificate_expiry(client: &Client, machine: &Machine) -> Option<String> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "bootstrap.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmConfig",
    ));
    let name = &machine.spec.bootstrap.config_ref.as_ref()?.name;
    Api::<DynamicObject>::namespaced_with(client.clone(), client.default_namespace(), &resource)
        .get(name)
        .await
        .ok()?
        .annotations()
        .get("machine.cluster.x-k8s.io/certificates-expiry")
        .cloned()
}

pub async fn scenario() {
    let work = TempDir::new("sim-real-capi-kcp-workload");
    let _keep = KeepLogs(&work, "kcp-workload");
    let real = RealCapi::start(&work.path().join("capi"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let plane = Plane::start(real.plane_options(PlaneOptions {
        namespace: "real-capi".into(),
        ip_prefix: [127, 0, 42],
        ..Default::default()
    }))
    .await
    .unwrap();
    let client = plane.client.clone();
    let spec = ManagedCluster {
        name: CLUSTER,
        replicas: 3,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        // A dead member is replaced 10 s after it went bad (day_two).
        health_check: json!({"interval": "1s", "timeout": "1s", "unhealthyAfter": "10s"}),
        with_kcp: true,
        extra_spec: json!({}),
    };
    let created = Instant::now();
    create_managed_cluster(&client, client.default_namespace(), &spec)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    // One control plane host at a time keeps the load down (each is a kube-apiserver).
    Api::<KubeadmControlPlane>::default_namespaced(client.clone())
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let mut timings = Milestones::new(created);
    let kcps: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), client.default_namespace(), &kcp_resource());
    let deadline = Instant::now() + Duration::from_secs(900);
    let first = loop {
        let etcd = lifecycle_support::etcd_api(&client).get("c1-etcd").await.ok();
        if etcd.and_then(|e| e.status).is_some_and(|s| s.ready) {
            timings.mark("etcd Ready");
        }
        let machines = control_plane_machines(&client).await;
        let machine = machines.first();
        if let Some(machine) = machine {
            timings.mark("control plane Machine created");
            let status = status_of(machine);
            if status["nodeRef"]["name"].is_string() {
                timings.mark("control plane Machine has a nodeRef");
            }
            if status["phase"] == "Running" {
                timings.mark("control plane Machine Running");
            }
        }
        let kcp = kcps.get(KCP).await.ok();
        let initialized = kcp
            .as_ref()
            .and_then(|k| k.data.pointer("/status/initialization/controlPlaneInitialized"));
        if initialized == Some(&json!(true)) {
            timings.mark("KCP initialized");
        }
        let settled = lifecycle_support::settled(&client, CLUSTER, 3).await;
        if settled.is_ok() {
            timings.mark("etcd Ready and KCP rollout complete on its endpoints");
        }
        if let Some(machine) = machine
            && timings.seen.len() == 6
        {
            break machine.clone();
        }
        if Instant::now() > deadline {
            panic!(
                "the control plane did not come up: seen {:?}; {settled:?}; KCP status {}\n{}",
                timings.seen,
                kcp.map(|k| k.data["status"].clone()).unwrap_or_default(),
                real.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "control plane Machine {}: {}",
        first.name_any(),
        status_of(&first)["nodeRef"]
    );

    // A ConfigMap written through the load balancer lands in our etcd.
    let workload = wait_for(
        "a client of the workload cluster",
        Duration::from_secs(60),
        || workload_client(&client),
    )
    .await
    .unwrap();
    wait_for(
        "a write through the load balancer",
        Duration::from_secs(120),
        || {
            write_config_map(
                &workload,
                "etcdadm-sim-probe",
                json!({"written": "through the load balancer"}),
            )
        },
    )
    .await
    .unwrap();
    let etcd = lifecycle_support::etcd_api(&client).get("c1-etcd").await.unwrap();
    let stored = etcd_value(&client, &etcd, "/registry/configmaps/default/etcdadm-sim-probe")
        .await
        .unwrap()
        .expect("the ConfigMap is a key in our etcd");
    assert!(
        String::from_utf8_lossy(&stored).contains("through the load balancer"),
        "the stored ConfigMap holds what was written"
    );
    timings.mark("a ConfigMap written through the load balancer found in our etcd");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(workload, stop.clone());
    let watchers = lifecycle_support::Watchers::start(&client, CLUSTER).await;
    let mut changes = vec![];
    for (from, to) in [(3, 5), (5, 3)] {
        changes.push(change_replicas(&client, from, to, &real).await);
    }
    changes.push(day_two::delete_a_machine(&client, &real).await);
    changes.push(day_two::remediate_a_dead_member(&client, &plane, &real).await);
    changes.push(day_two::roll(&client, &real).await);
    for change in &changes {
        println!(
            "{}: KCP given {} new endpoint list(s), spec generation +{}, {} new control plane Machine(s) {:?}",
            change.what,
            change.endpoint_lists,
            change.generations,
            change.new_machines.len(),
            change.new_machines
        );
        change.events.print();
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.unwrap();
    let (history, machine_log) = watchers.finish();
    lifecycle_support::assert_safe(&history, &machine_log);

    println!("from the cluster's creation:");
    timings.print();
    println!(
        "writer through the load balancer: {} writes, {} failed, longest gap {:.1?} (ended {:.1?} after it started)",
        writes.succeeded, writes.failed, writes.longest_gap, writes.longest_gap_ended
    );
    let settled = lifecycle_support::settled(&client, CLUSTER, 3).await;
    assert!(
        settled.is_ok(),
        "ends Ready with KCP on the current endpoints: {settled:?}"
    );
    assert!(writes.succeeded > 0, "the writer wrote through the load balancer");
    let current = control_plane_machines(&client).await;
    assert_eq!(current.len(), 1, "one control plane Machine");
    // KCP reads each new host's API server certificate through a port-forward to its
    // kube-apiserver pod (the kubelet's SPDY endpoint), and records when it expires.
    let expiry = wait_for("the certificate expiry on the KubeadmConfig", TIMEOUT, || async {
        certificate_expiry(&client, &current[0])
            .await
            .ok_or(format!("none on {}'s KubeadmConfig yet", current[0].name_any()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    println!("API server certificate expiry KCP read through the kubelet's port-forward: {expiry}");
    drop(plane);
    drop(real);
}
