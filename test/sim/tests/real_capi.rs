#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The providers beside the real Cluster API v1.13 (docs/capi.md): installed with `clusterctl
//! init` on a real kube-apiserver with the real core, kubeadm bootstrap and KubeadmControlPlane
//! managers, the sim's infrastructure provider booting the machines. Each scenario runs in a
//! network namespace of its own (CAPI's managers listen on every interface).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::{ControlPlaneEtcd, KubeadmControlPlane, Machine};
use etcdadm_shared::names;
use etcdadm_shared::testing::TempDir;
use etcdadm_sim::manifests::{ManagedCluster, create_managed_cluster};
use etcdadm_sim::netns;
use etcdadm_sim::plane::{Plane, PlaneOptions};
use etcdadm_sim::real_capi::RealCapi;
use etcdadm_sim_machines::MachineRuntime;

mod lifecycle_support;

const TIMEOUT: Duration = Duration::from_secs(240);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Run `name`'s body in a network namespace of its own.
macro_rules! isolated {
    ($name:literal, $body:expr) => {
        if let Some(result) = netns::run_isolated($name) {
            result.unwrap();
            return;
        }
        // The plane's own warnings (infrastructure provider, stand-ins) on stderr.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(std::env::var("SIM_LOG").unwrap_or_else(|_| "warn".into()))
            .with_writer(std::io::stderr)
            .try_init();
        runtime().block_on($body);
    };
}

/// On a failure, every log of the scenario's work directory (the managers', clusterctl's, the
/// API server's, the machines') is copied under `$SIM_LOG_DIR/<scenario>/`, when set.
struct KeepLogs<'a>(&'a TempDir, &'static str);

impl Drop for KeepLogs<'_> {
    fn drop(&mut self) {
        let Some(dir) = std::env::var_os("SIM_LOG_DIR").filter(|_| std::thread::panicking()) else {
            return;
        };
        let target = std::path::PathBuf::from(dir).join(self.1);
        let _ = std::fs::create_dir_all(&target);
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg("cd \"$0\" && find . -name '*.log' -exec cp --parents {} \"$1\" \\;")
            .arg(self.0.path())
            .arg(&target)
            .status();
    }
}

/// Poll `get` every 250 ms until it answers `Ok`, for at most `timeout`; the last answer is the
/// error.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut get: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match get().await {
            Ok(value) => return Ok(value),
            Err(last) if std::time::Instant::now() > deadline => {
                return Err(format!("{what}: not within {timeout:?}: {last}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn kubeadm_config(client: &Client, name: &str) -> DynamicObject {
    let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "bootstrap.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmConfig",
    ));
    Api::<DynamicObject>::namespaced_with(client.clone(), client.default_namespace(), &resource)
        .get(name)
        .await
        .unwrap()
}

fn secret_text(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default()
}

#[test]
fn the_real_kcp_waits_for_etcd_then_takes_its_endpoints_and_certificates() {
    isolated!(
        "the_real_kcp_waits_for_etcd_then_takes_its_endpoints_and_certificates",
        create_gates_the_real_kcp()
    );
}

async fn create_gates_the_real_kcp() {
    let work = TempDir::new("sim-real-capi-create");
    let _keep = KeepLogs(&work, "create");
    let real = match RealCapi::start(&work.path().join("capi")).await {
        Ok(real) => real,
        Err(e) => panic!("{e}"),
    };
    let plane = Plane::start(real.plane_options(PlaneOptions {
        namespace: "real-capi".into(),
        ip_prefix: [127, 0, 40],
        ..Default::default()
    }))
    .await
    .unwrap();
    let client = plane.client.clone();
    let spec = ManagedCluster {
        name: "c1",
        replicas: 3,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        health_check: json!({"interval": "1s", "timeout": "1s"}),
        with_kcp: true,
        extra_spec: json!({}),
    };
    create_managed_cluster(&client, client.default_namespace(), &spec)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    // What the control plane trusts etcd's servers by is a bundle of two CAs, as during a CA
    // rotation (docs/security.md, "Rotating the etcd CA"): written before etcd is Ready, so the
    // controller keeps it and the real KCP hands it to its Machines as it is.
    let second_ca = write_two_ca_bundle(&client, "c1").await;

    // Until etcd is Ready, the real KCP is paused and has created no Machine.
    let kcps: Api<KubeadmControlPlane> = Api::default_namespaced(client.clone());
    let etcds: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    let kcp_owned = |m: &Machine| m.labels().contains_key("cluster.x-k8s.io/control-plane");
    let ready = wait_for("etcd Ready", TIMEOUT, || async {
        let etcd = etcds.get("c1-etcd").await.map_err(|e| e.to_string())?;
        let kcp = kcps.get("c1-control-plane").await.map_err(|e| e.to_string())?;
        let control_plane = machines
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(kcp_owned)
            .count();
        let status = etcd.status.clone().unwrap_or_default();
        if !status.ready {
            assert!(
                kcp.annotations().contains_key(names::PAUSED_ANNOTATION) || control_plane == 0,
                "KCP unpaused before etcd was ready"
            );
            assert_eq!(control_plane, 0, "KCP created a Machine before etcd was ready");
            return Err(format!("not ready: {:?}", status.conditions));
        }
        Ok(etcd)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    let endpoints = ready.status.clone().unwrap_or_default().endpoints;

    // Then KCP gets the endpoints, is unpaused, and its first Machine's KubeadmConfig and bootstrap
    // data (rendered by the real kubeadm bootstrap provider) name them and carry our certificates.
    let first = wait_for(
        "the first control plane Machine's bootstrap data",
        TIMEOUT,
        || async {
            let kcp = kcps.get("c1-control-plane").await.map_err(|e| e.to_string())?;
            let ControlPlaneEtcd::External(mut listed) = kcp.etcd() else {
                return Err("KCP lost etcd.external".to_string());
            };
            listed.sort();
            if listed.join(",") != endpoints || kcp.annotations().contains_key(names::PAUSED_ANNOTATION) {
                return Err(format!(
                    "KCP endpoints {listed:?}, annotations {:?}",
                    kcp.annotations()
                ));
            }
            let machine = machines
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .find(|m| kcp_owned(m) && m.spec.bootstrap.data_secret_name.is_some())
                .ok_or("no control plane Machine with bootstrap data yet")?;
            Ok(machine)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    let config_name = &first.spec.bootstrap.config_ref.as_ref().unwrap().name;
    let config = kubeadm_config(&client, config_name).await;
    let external = &config.data["spec"]["clusterConfiguration"]["etcd"]["external"];
    let mut rendered: Vec<String> = serde_json::from_value(external["endpoints"].clone()).unwrap();
    rendered.sort();
    assert_eq!(
        rendered.join(","),
        endpoints,
        "the KubeadmConfig names our endpoints"
    );
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let user_data = secret_text(
        &secrets
            .get(first.spec.bootstrap.data_secret_name.as_ref().unwrap())
            .await
            .unwrap(),
        "value",
    );
    let etcd_ca = secret_text(&secrets.get("c1-etcd").await.unwrap(), "tls.crt");
    let client_cert = secret_text(&secrets.get("c1-apiserver-etcd-client").await.unwrap(), "tls.crt");
    let indented = |pem: &str| {
        pem.lines()
            .find(|l| !l.starts_with("-----"))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        user_data.contains(&indented(&etcd_ca)),
        "the bootstrap data writes our etcd CA"
    );
    assert_eq!(
        etcdadm_shared::pki::certificates_der(&etcd_ca).unwrap().len(),
        2,
        "c1-etcd holds the two-CA bundle written before etcd was Ready"
    );
    assert!(
        user_data.contains(&indented(&second_ca)),
        "the bootstrap data writes the second CA of the bundle too, to the --etcd-cafile the kubeadm config names"
    );
    assert_eq!(
        external["caFile"], "/etc/kubernetes/pki/etcd/ca.crt",
        "the file kube-apiserver's --etcd-cafile reads"
    );
    assert!(
        user_data.contains(&indented(&client_cert)),
        "the bootstrap data writes our API server client certificate"
    );

    // The real KCP makes itself the controller of our two Secrets (it does so with every Secret
    // of CAPI's type it reads certificates from); the Cluster stays an owner, so the garbage
    // collector keeps them as long as the Cluster exists, KCP or not.
    for name in ["c1-etcd", "c1-apiserver-etcd-client"] {
        let owners: Vec<String> = secrets
            .get(name)
            .await
            .unwrap()
            .owner_references()
            .iter()
            .map(|o| {
                format!(
                    "{} {} controller={}",
                    o.kind,
                    o.name,
                    o.controller.unwrap_or(false)
                )
            })
            .collect();
        println!("Secret {name} owners: {owners:?}");
        assert!(
            owners.contains(&"Cluster c1 controller=false".to_string()),
            "Secret {name} lost its Cluster owner: {owners:?}"
        );
    }

    // What a user reads in `clusterctl describe cluster`.
    let describe = real
        .clusterctl()
        .unwrap()
        .args([
            "describe",
            "cluster",
            "c1",
            "--namespace",
            "real-capi",
            "--show-conditions",
            "all",
        ])
        .output()
        .await
        .unwrap();
    println!(
        "clusterctl describe cluster:\n{}{}",
        String::from_utf8_lossy(&describe.stdout),
        String::from_utf8_lossy(&describe.stderr)
    );

    // The etcd Machines as the real Machine controller sees them: Provisioned for good (no
    // Node), and UpToDate as we, their owner, report it; the Cluster then counts them up to date.
    let selector = format!("{}=c1-etcd", names::ETCD_CLUSTER_LABEL);
    wait_for(
        "every etcd Machine UpToDate and the Cluster's workers up to date",
        TIMEOUT,
        || async {
            let etcd_machines = machines
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?
                .items;
            for machine in &etcd_machines {
                let status = serde_json::to_value(machine.status.as_ref().unwrap()).unwrap();
                assert_eq!(status["phase"], "Provisioned", "{}", machine.name_any());
                let up_to_date = status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "UpToDate")
                    .map(|c| c["status"].clone());
                if up_to_date != Some(json!("True")) {
                    return Err(format!("{} UpToDate {up_to_date:?}", machine.name_any()));
                }
            }
            let cluster = Api::<DynamicObject>::namespaced_with(
                client.clone(),
                client.default_namespace(),
                &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                    "cluster.x-k8s.io",
                    "v1beta2",
                    "Cluster",
                )),
            )
            .get("c1")
            .await
            .map_err(|e| e.to_string())?;
            let workers = cluster.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "WorkerMachinesUpToDate")
                .cloned()
                .unwrap_or_default();
            (workers["status"] == "True")
                .then_some(())
                .ok_or(format!("the Cluster's WorkerMachinesUpToDate: {workers}"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    // Every manager ran as its ServiceAccount, as clusterctl installed it: none was refused by
    // RBAC (ours under config/rbac, CAPI's through the roles our components aggregate into it).
    for pod in &real.pods {
        let log = std::fs::read_to_string(&pod.log).unwrap_or_default();
        let refused = etcdadm_sim::real_apiserver::forbidden_lines(&log);
        assert!(
            refused.is_empty(),
            "{} was refused by RBAC:\n{refused}",
            pod.deployment
        );
    }
    drop(plane);
    drop(real);
}

#[test]
fn deleting_the_cluster_removes_everything_in_capis_order() {
    isolated!(
        "deleting_the_cluster_removes_everything_in_capis_order",
        delete_the_cluster()
    );
}

/// What is left of cluster `c1` in the namespace, by kind, and which processes still run.
async fn leftovers(client: &Client, plane: &Plane) -> Vec<String> {
    let mut left = vec![];
    let kinds = [
        ("cluster.x-k8s.io", "v1beta2", "Cluster"),
        ("cluster.x-k8s.io", "v1beta2", "Machine"),
        ("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
        ("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig"),
        ("bootstrap.cluster.x-k8s.io", "v1beta1", "EtcdadmConfig"),
        ("etcdcluster.cluster.x-k8s.io", "v1beta1", "EtcdadmCluster"),
        ("infrastructure.cluster.x-k8s.io", "v1beta2", "SimMachine"),
        ("infrastructure.cluster.x-k8s.io", "v1beta2", "SimCluster"),
        ("infrastructure.cluster.x-k8s.io", "v1beta2", "SimMachineTemplate"),
    ];
    for (group, version, kind) in kinds {
        let resource =
            kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), client.default_namespace(), &resource);
        for object in api.list(&Default::default()).await.unwrap().items {
            left.push(format!("{kind} {}", object.name_any()));
        }
    }
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    for secret in secrets.list(&Default::default()).await.unwrap().items {
        let owners: Vec<String> = secret
            .owner_references()
            .iter()
            .map(|o| format!("{} {}", o.kind, o.name))
            .collect();
        left.push(format!("Secret {} (owners {owners:?})", secret.name_any()));
    }
    let built_in = plane.built_in.as_ref().unwrap();
    for name in built_in.machine_names() {
        if built_in.state(&name) != etcdadm_sim_machines::MachineState::Off {
            left.push(format!("machine process {name}"));
        }
    }
    left.sort();
    left
}

async fn delete_the_cluster() {
    let work = TempDir::new("sim-real-capi-delete");
    let _keep = KeepLogs(&work, "delete");
    let real = RealCapi::start(&work.path().join("capi"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let plane = Plane::start(real.plane_options(PlaneOptions {
        namespace: "real-capi".into(),
        ip_prefix: [127, 0, 41],
        ..Default::default()
    }))
    .await
    .unwrap();
    let client = plane.client.clone();
    let spec = ManagedCluster {
        name: "c1",
        replicas: 3,
        zones: &["zone-a", "zone-b", "zone-c"],
        config_spec: json!({}),
        health_check: json!({"interval": "1s", "timeout": "1s"}),
        with_kcp: true,
        extra_spec: json!({}),
    };
    create_managed_cluster(&client, client.default_namespace(), &spec)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    let machines: Api<Machine> = Api::default_namespaced(client.clone());
    wait_for("etcd Ready and a control plane Machine", TIMEOUT, || async {
        let all = machines
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let control_plane = all
            .iter()
            .filter(|m| m.labels().contains_key("cluster.x-k8s.io/control-plane"))
            .count();
        (control_plane > 0 && all.len() == 4).then_some(()).ok_or(format!(
            "{} Machines, {control_plane} of the control plane",
            all.len()
        ))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", real.logs()));
    let watchers = lifecycle_support::Watchers::start(&client, "c1").await;

    let clusters: Api<etcdadm_shared::api::capi::Cluster> = Api::default_namespaced(client.clone());
    clusters.delete("c1", &Default::default()).await.unwrap();
    // The order real CAPI deletes in, as it happens: when each object got its deletionTimestamp.
    let order = std::sync::Mutex::new(Vec::<String>::new());
    let deleted = wait_for("everything of the Cluster gone", Duration::from_secs(90), || {
        let order = &order;
        let machines = &machines;
        let client = &client;
        let plane = &plane;
        async move {
            for machine in machines
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
            {
                let kind = if machine.labels().contains_key("cluster.x-k8s.io/control-plane") {
                    "control plane"
                } else {
                    "etcd"
                };
                let entry = format!("{kind} Machine {}", machine.name_any());
                let mut order = order.lock().unwrap();
                if machine.is_deleting() && !order.contains(&entry) {
                    order.push(entry);
                }
            }
            let left = leftovers(client, plane).await;
            left.is_empty().then_some(()).ok_or(format!("left: {left:?}"))
        }
    })
    .await;
    println!("deletion order: {:#?}", order.lock().unwrap());
    if let Err(e) = deleted {
        panic!("{e}\n{}", real.logs());
    }
    let (history, machine_log) = watchers.finish();
    lifecycle_support::assert_safe(&history, &machine_log);
    drop(plane);
    drop(real);
}

mod kcp_workload;

#[test]
fn the_real_kcp_initializes_and_rolls_out_on_our_etcd() {
    isolated!(
        "the_real_kcp_initializes_and_rolls_out_on_our_etcd",
        kcp_workload::scenario()
    );
}

mod capi_move;

#[test]
fn clusterctl_move_carries_a_ready_cluster_to_a_second_management_cluster() {
    isolated!(
        "clusterctl_move_carries_a_ready_cluster_to_a_second_management_cluster",
        capi_move::scenario()
    );
}

/// Write `<cluster>-etcd` as the etcd CA followed by a second CA (the bundle a CA rotation
/// hands the control plane), owned by the Cluster as the controller's own would be, once the CA
/// exists and before the controller writes it (it keeps one that exists); the second CA's
/// certificate.
async fn write_two_ca_bundle(client: &Client, cluster: &str) -> String {
    use etcdadm_shared::contract::{ClusterRef, bytes, cluster_secret, secret_text};
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let ca_pem = wait_for("the etcd CA", TIMEOUT, || async {
        let secret = secrets
            .get_opt(&names::ca_secret_name(cluster))
            .await
            .map_err(|e| e.to_string())?;
        secret
            .and_then(|s| secret_text(&s, names::TLS_CERT_KEY))
            .ok_or_else(|| "no etcd CA yet".to_string())
    })
    .await
    .unwrap();
    let owner = Api::<etcdadm_shared::api::capi::Cluster>::default_namespaced(client.clone())
        .get(cluster)
        .await
        .unwrap();
    let reference = ClusterRef::of(&owner).unwrap();
    let second = etcdadm_shared::pki::CertificateAuthority::generate("etcd-ca-next").unwrap();
    let bundle = format!("{ca_pem}{}", second.cert_pem());
    let secret = cluster_secret(
        names::kcp_etcd_ca_secret_name(cluster),
        &reference.namespace,
        cluster,
        reference.owner.clone(),
        [(names::TLS_CERT_KEY.to_string(), bytes(&bundle))]
            .into_iter()
            .collect(),
    );
    secrets
        .create(&Default::default(), &secret)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{} was written before the scenario's bundle: {e}",
                names::kcp_etcd_ca_secret_name(cluster)
            )
        });
    second.cert_pem().to_string()
}
