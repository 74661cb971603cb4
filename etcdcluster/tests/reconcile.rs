#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The EtcdadmCluster controller against the in-memory API server (FakeApi), playing CAPI and
//! the infrastructure by hand; the tests that need a healthy etcd run real etcd processes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcdadm_etcdcluster::controller::{Context, reconcile};
use etcdadm_shared::api::capi::{Cluster, KubeadmControlPlane, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::testing::{TlsEtcd, TlsEtcdCluster, etcd_binary};
use etcdadm_sim_apiserver::{ApiServer, fake_client};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "default";
const ETCD: &str = "c1-etcd";
const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";

fn require_etcd() {
    if let Err(hint) = etcd_binary() {
        panic!("install etcd: apt-get install etcd-server ({hint})");
    }
}

/// One CA for the whole test binary: RSA generation is the slow part.
fn test_ca() -> &'static CertificateAuthority {
    static CA: std::sync::OnceLock<CertificateAuthority> = std::sync::OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate("etcd-ca").unwrap())
}

fn sim_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(INFRA_GROUP, "v1beta2", kind))
}

struct Env {
    server: ApiServer,
    client: Client,
    ctx: Arc<Context>,
}

impl Env {
    fn new() -> Env {
        let (server, client) = fake_client().unwrap();
        let ctx = Arc::new(Context::new(client.clone()));
        Env { server, client, ctx }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    fn sim_api(&self, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &sim_resource(kind))
    }

    async fn create<K>(&self, value: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let object: K = serde_json::from_value(value).unwrap();
        self.api::<K>()
            .create(&PostParams::default(), &object)
            .await
            .unwrap()
    }

    async fn patch_status<K>(&self, name: &str, status: Value)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        self.api::<K>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    /// Cluster `c1` with its infrastructure provisioned, offering `domains`, whose control plane
    /// is the KCP `c1-cp` when `with_kcp`.
    async fn cluster(&self, domains: &[&str], with_kcp: bool) -> Cluster {
        let mut spec = json!({});
        if with_kcp {
            spec["controlPlaneRef"] = json!({"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "c1-cp"});
        }
        let cluster: Cluster = self
            .create(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1"}, "spec": spec,
            }))
            .await;
        let domains: Vec<Value> = domains.iter().map(|d| json!({"name": d})).collect();
        self.patch_status::<Cluster>(
            "c1",
            json!({"initialization": {"infrastructureProvisioned": true}, "failureDomains": domains}),
        )
        .await;
        cluster
    }

    /// KCP `c1-cp` using external etcd with a placeholder endpoint.
    async fn kcp(&self, etcd: Value) -> KubeadmControlPlane {
        self.create(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
            "metadata": {"name": "c1-cp"},
            "spec": {
                "replicas": 1, "version": "v1.33.1",
                "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": etcd}, "files": [{"path": "/x", "content": "kept"}]},
            },
        }))
        .await
    }

    async fn template(&self) {
        let template = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate",
            "metadata": {"name": "etcd-template"},
            "spec": {"template": {
                "metadata": {"labels": {"from-template": "yes"}},
                "spec": {"image": "etcd-node:1", "cpus": 2},
            }},
        });
        let object: DynamicObject = serde_json::from_value(template).unwrap();
        self.sim_api("SimMachineTemplate")
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }

    async fn etcd_cluster(&self, replicas: i32, labelled: bool, extra_spec: Value) -> EtcdadmCluster {
        let labels = if labelled {
            json!({names::CLUSTER_NAME_LABEL: "c1"})
        } else {
            json!({})
        };
        let mut spec = json!({
            "replicas": replicas,
            "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate", "name": "etcd-template"},
            "etcdadmConfigSpec": {"cloudInitConfig": {"version": "3.5.9"}},
            "healthCheck": {"timeout": "2s"},
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            spec.extend(extra.clone());
        }
        self.create(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": ETCD, "labels": labels},
            "spec": spec,
        }))
        .await
    }

    async fn ca_secret(&self, cert: &str, key: &str) -> Secret {
        let data = json!({
            names::TLS_CERT_KEY: ByteString(cert.as_bytes().to_vec()),
            names::TLS_KEY_KEY: ByteString(key.as_bytes().to_vec()),
        });
        self.create::<Secret>(json!({"metadata": {"name": names::ca_secret_name("c1")}, "data": data}))
            .await
    }

    /// One reconcile after the tests' changes to Machines, Clusters and KCPs, each of which the
    /// controller's watches would report, ending the reuse of the kept observation.
    async fn reconcile(&self) -> EtcdadmCluster {
        self.ctx.observations.invalidate(&format!("{NS}/{ETCD}"));
        self.reconcile_reusing().await.0
    }

    /// One reconcile with whatever observation is kept, and the API requests it made.
    async fn reconcile_reusing(&self) -> (EtcdadmCluster, u64) {
        let etcd = self.api::<EtcdadmCluster>().get(ETCD).await.unwrap();
        let before = self.server.request_count();
        // A task of its own: polled by the runtime, not inside the test's (large, unoptimised)
        // future, so the test thread's stack holds one of them at a time.
        tokio::spawn(reconcile(Arc::new(etcd), self.ctx.clone()))
            .await
            .unwrap()
            .unwrap();
        let requests = self.server.request_count() - before;
        (self.api::<EtcdadmCluster>().get(ETCD).await.unwrap(), requests)
    }

    async fn machines(&self) -> Vec<Machine> {
        let mut list = self
            .api::<Machine>()
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        list.retain(|m| m.labels().contains_key(names::ETCD_CLUSTER_LABEL));
        list
    }

    async fn secret(&self, name: &str) -> Option<Secret> {
        self.api::<Secret>().get_opt(name).await.unwrap()
    }

    async fn set_address(&self, machine: &str, address: &str) {
        self.patch_status::<Machine>(
            machine,
            json!({"addresses": [{"type": "InternalIP", "address": address}]}),
        )
        .await;
    }

    async fn event_reasons(&self) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> = self.api();
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }

    /// A Machine of this EtcdadmCluster as CAPI would hold it, with an address.
    async fn member_machine(&self, etcd: &EtcdadmCluster, name: &str, address: &str) {
        self.create::<Machine>(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": name,
                "labels": {names::CLUSTER_NAME_LABEL: "c1", names::ETCD_CLUSTER_LABEL: ETCD},
                "annotations": {names::PRE_TERMINATE_HOOK_ANNOTATION: ""},
                "ownerReferences": [{
                    "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                    "name": ETCD, "uid": etcd.uid().unwrap(), "controller": true,
                }],
            },
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": name}},
                "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "SimMachine", "name": name},
            },
        }))
        .await;
        self.set_address(name, address).await;
    }
}

fn secret_value(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// `(status, reason, message)` of condition `type_`.
fn condition(etcd: &EtcdadmCluster, type_: &str) -> (String, String, String) {
    let status = serde_json::to_value(etcd.status.as_ref().expect("status written")).unwrap();
    let found = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
    let text = |k: &str| found[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

fn is_member_name(name: &str) -> bool {
    let Some(suffix) = name.strip_prefix("c1-etcd-") else {
        return false;
    };
    suffix.len() == 5
        && suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// A loopback address on which nothing listens: probes fail fast with "connection refused".
const DEAD_ADDRESS: &str = "127.77.0.1";

#[tokio::test]
async fn links_to_the_cluster_with_owner_ref_finalizer_and_a_new_ca() {
    let env = Env::new();
    let cluster = env.cluster(&[], false).await;
    env.template().await;
    env.etcd_cluster(3, true, json!({})).await;
    let etcd = env.reconcile().await;

    let owner = etcd
        .owner_references()
        .iter()
        .find(|r| r.kind == "Cluster")
        .expect("Cluster ownerRef");
    assert_eq!(owner.uid, cluster.uid().unwrap());
    assert_ne!(owner.controller, Some(true));
    assert!(
        etcd.finalizers()
            .contains(&names::ETCDADM_CLUSTER_FINALIZER.to_string())
    );

    let ca = env
        .secret(&names::ca_secret_name("c1"))
        .await
        .expect("CA created");
    assert_eq!(ca.owner_references()[0].uid, cluster.uid().unwrap());
    assert_eq!(ca.type_.as_deref(), Some(names::CLUSTER_SECRET_TYPE));
    CertificateAuthority::from_pem(
        &secret_value(&ca, names::TLS_CERT_KEY),
        &secret_value(&ca, names::TLS_KEY_KEY),
    )
    .expect("the generated CA loads");
    assert_eq!(condition(&etcd, "CertificatesAvailable").0, "True");
    assert!(env.event_reasons().await.contains(&"CACreated".to_string()));

    // Another pass never rewrites the CA.
    env.reconcile().await;
    let again = env.secret(&names::ca_secret_name("c1")).await.unwrap();
    assert_eq!(again.resource_version(), ca.resource_version());
}

#[tokio::test]
async fn finds_the_cluster_through_the_forks_managed_external_etcd_ref() {
    let env = Env::new();
    env.create::<Cluster>(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1"},
        "spec": {"managedExternalEtcdRef": {"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster", "name": ETCD}},
    }))
    .await;
    env.patch_status::<Cluster>(
        "c1",
        json!({"initialization": {"infrastructureProvisioned": true}}),
    )
    .await;
    env.template().await;
    env.etcd_cluster(1, false, json!({})).await;
    let etcd = env.reconcile().await;
    assert!(etcd.owner_references().iter().any(|r| r.name == "c1"));
    assert_eq!(env.machines().await.len(), 1);
}

#[tokio::test]
async fn an_existing_ca_is_used_and_a_corrupt_one_is_reported_never_replaced() {
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    let ca = test_ca();
    let written = env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    env.etcd_cluster(1, true, json!({})).await;
    env.reconcile().await;
    let kept = env.secret(&names::ca_secret_name("c1")).await.unwrap();
    assert_eq!(kept.resource_version(), written.resource_version());
    assert_eq!(secret_value(&kept, names::TLS_CERT_KEY), ca.cert_pem());

    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.ca_secret("not a certificate", "not a key").await;
    env.etcd_cluster(1, true, json!({})).await;
    let etcd = env.reconcile().await;
    let (status, reason, message) = condition(&etcd, "CertificatesAvailable");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "EtcdCACorrupt"));
    assert!(message.contains("c1-managed-etcd"), "{message}");
    assert_eq!(condition(&etcd, "Ready").1, "EtcdCACorrupt");
    let ca = env.secret(&names::ca_secret_name("c1")).await.unwrap();
    assert_eq!(secret_value(&ca, names::TLS_CERT_KEY), "not a certificate");
    assert!(env.machines().await.is_empty());
    assert!(env.event_reasons().await.contains(&"EtcdCACorrupt".to_string()));
}

#[tokio::test]
async fn a_paused_cluster_or_etcd_cluster_gets_no_writes() {
    let env = Env::new();
    env.cluster(&[], false).await;
    env.api::<Cluster>()
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    env.template().await;
    env.etcd_cluster(1, true, json!({})).await;
    let etcd = env.reconcile().await;
    assert_eq!(condition(&etcd, "Paused").0, "True");
    assert!(etcd.finalizers().is_empty());
    assert!(etcd.owner_references().is_empty());
    assert!(env.secret(&names::ca_secret_name("c1")).await.is_none());
    assert!(env.machines().await.is_empty());

    env.api::<Cluster>()
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    let annotate = json!({"metadata": {"annotations": {names::PAUSED_ANNOTATION: ""}}});
    env.api::<EtcdadmCluster>()
        .patch(ETCD, &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let etcd = env.reconcile().await;
    assert_eq!(condition(&etcd, "Paused").0, "True");
    assert!(env.machines().await.is_empty());
}

#[tokio::test]
async fn the_first_member_is_created_whole_and_alone() {
    let env = Env::new();
    env.cluster(&["fd-b", "fd-a", "fd-c"], true).await;
    env.kcp(json!({"external": {"endpoints": []}})).await;
    env.template().await;
    let created = env
        .etcd_cluster(
            3,
            true,
            json!({"machineTemplate": {"metadata": {"labels": {"team": "etcd"}, "annotations": {"note": "x"}}}}),
        )
        .await;
    let etcd = env.reconcile().await;

    let machines = env.machines().await;
    assert_eq!(machines.len(), 1, "exactly one Machine at a time");
    let machine = &machines[0];
    let name = machine.name_any();
    assert!(is_member_name(&name), "{name}");
    assert_eq!(machine.labels()[names::CLUSTER_NAME_LABEL], "c1");
    assert_eq!(machine.labels()[names::ETCD_CLUSTER_LABEL], ETCD);
    assert_eq!(machine.labels()["team"], "etcd");
    assert_eq!(machine.annotations()["note"], "x");
    assert!(
        machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
    );
    let owner = &machine.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("EtcdadmCluster", created.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(machine.spec.cluster_name, "c1");
    let config_ref = machine.spec.bootstrap.config_ref.as_ref().unwrap();
    assert!(config_ref.points_to("bootstrap.cluster.x-k8s.io", "EtcdadmConfig", &name));
    assert!(
        machine
            .spec
            .infrastructure_ref
            .points_to(INFRA_GROUP, "SimMachine", &name)
    );
    assert_eq!(machine.spec.failure_domain.as_deref(), Some("fd-a"));
    assert_eq!(machine.spec.version.as_deref(), Some("v1.33.1"), "KCP's version");

    let config = env.api::<EtcdadmConfig>().get(&name).await.unwrap();
    // The cluster's config spec, with etcd's corruption checks on for the new member.
    let mut expected = created.spec.etcdadm_config_spec.clone();
    expected.corruption_checks = Some(etcdadm_shared::api::config::CorruptionChecks::Enabled);
    assert_eq!(config.spec, expected);
    assert_eq!(config.labels()[names::ETCD_CLUSTER_LABEL], ETCD);
    // Created asking for a learner join (the first member renders `init` regardless).
    assert_eq!(config.annotations()[names::LEARNER_JOIN_ANNOTATION], "true");
    assert!(config.joins_as_learner());
    // How long a join may wait for its turn: 20 minutes, plus a join deadline (5 minutes by
    // default) for each of the two other members of three.
    assert_eq!(
        config.annotations()[names::LEARNER_LISTED_WAIT_ANNOTATION],
        "1800"
    );
    assert_eq!(config.learner_listed_wait(), std::time::Duration::from_secs(1800));
    assert_eq!(config.owner_references()[0].uid, created.uid().unwrap());
    assert_ne!(config.owner_references()[0].controller, Some(true));

    let infra = env.sim_api("SimMachine").get(&name).await.unwrap();
    assert_eq!(infra.data["spec"], json!({"image": "etcd-node:1", "cpus": 2}));
    assert_eq!(infra.labels()["from-template"], "yes");
    assert_eq!(infra.labels()[names::ETCD_CLUSTER_LABEL], ETCD);
    assert_eq!(
        infra.annotations()[names::CLONED_FROM_NAME_ANNOTATION],
        "etcd-template"
    );
    assert_eq!(
        infra.annotations()[names::CLONED_FROM_GROUPKIND_ANNOTATION],
        "SimMachineTemplate.infrastructure.cluster.x-k8s.io"
    );
    assert_eq!(infra.owner_references()[0].uid, created.uid().unwrap());
    assert_ne!(infra.owner_references()[0].controller, Some(true));

    // The KCP is held until etcd is ready.
    let kcp = env.api::<KubeadmControlPlane>().get("c1-cp").await.unwrap();
    assert!(kcp.annotations().contains_key(names::PAUSED_ANNOTATION));
    assert!(env.event_reasons().await.contains(&"MachineCreated".to_string()));

    // No address yet: nothing more.
    let etcd_again = env.reconcile().await;
    assert_eq!(env.machines().await.len(), 1);
    assert_eq!(condition(&etcd_again, "Ready").1, "WaitingForMachineAddress");
    assert!(!etcd.status.as_ref().unwrap().initialized);

    // An address: the init Secret is published, but a member that does not answer gets no
    // company.
    env.set_address(&name, DEAD_ADDRESS).await;
    let etcd = env.reconcile().await;
    let init = env
        .secret(&names::init_secret_name("c1"))
        .await
        .expect("init Secret published");
    assert_eq!(secret_value(&init, names::INIT_ADDRESS_KEY), DEAD_ADDRESS);
    assert_eq!(
        secret_value(&init, names::INIT_CLIENT_URLS_KEY),
        format!("https://{DEAD_ADDRESS}:2379")
    );
    assert_eq!(init.type_.as_deref(), Some(names::CLUSTER_SECRET_TYPE));
    let status = etcd.status.clone().unwrap();
    assert_eq!(status.init_machine_address, "c1-etcd-init");
    assert!(!status.initialized);
    assert!(!status.ready);
    for _ in 0..2 {
        env.reconcile().await;
    }
    assert_eq!(env.machines().await.len(), 1);
    let etcd = env.reconcile().await;
    assert_eq!(condition(&etcd, "Ready").1, "WaitingForFirstMember");
    let member = &etcd.status.as_ref().unwrap().members[0];
    assert_eq!(member.name, name);
    assert!(!member.healthy);
    assert!(member.message.is_some());
    let kcp = env.api::<KubeadmControlPlane>().get("c1-cp").await.unwrap();
    assert!(kcp.annotations().contains_key(names::PAUSED_ANNOTATION));
}

#[tokio::test]
async fn an_interrupted_creation_is_finished_under_its_name() {
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    let etcd = env.etcd_cluster(1, true, json!({})).await;
    // A crash after the infra machine, before config and Machine.
    let leftover = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachine",
        "metadata": {
            "name": "c1-etcd-crash",
            "labels": {names::CLUSTER_NAME_LABEL: "c1", names::ETCD_CLUSTER_LABEL: ETCD},
            "ownerReferences": [{"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster", "name": ETCD, "uid": etcd.uid().unwrap()}],
        },
        "spec": {"image": "etcd-node:1"},
    });
    env.sim_api("SimMachine")
        .create(&PostParams::default(), &serde_json::from_value(leftover).unwrap())
        .await
        .unwrap();
    env.reconcile().await;
    let machines = env.machines().await;
    assert_eq!(machines.len(), 1);
    assert_eq!(machines[0].name_any(), "c1-etcd-crash");
    assert!(
        env.api::<EtcdadmConfig>()
            .get_opt("c1-etcd-crash")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        env.sim_api("SimMachine")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

#[tokio::test]
async fn status_selector_serves_the_scale_subresource() {
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.etcd_cluster(3, true, json!({})).await;
    let etcd = env.reconcile().await;
    let status = etcd.status.clone().unwrap();
    let selector = "cluster.x-k8s.io/cluster-name=c1,cluster.x-k8s.io/etcd-cluster=c1-etcd";
    assert_eq!(status.selector.as_deref(), Some(selector));
    assert_eq!(status.ready_replicas, Some(0));
    assert_eq!(status.observed_generation, etcd.metadata.generation);

    let api = env.api::<EtcdadmCluster>();
    let scale = api.get_scale(ETCD).await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(3));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some(selector));
    api.patch_scale(
        ETCD,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    assert_eq!(api.get(ETCD).await.unwrap().spec.replicas, Some(5));
    // The selector finds exactly the member Machines.
    let selected = env
        .api::<Machine>()
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
}

#[tokio::test]
async fn deletion_waits_for_the_control_plane_then_deletes_machines_then_the_finalizer() {
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.etcd_cluster(1, true, json!({})).await;
    env.reconcile().await;
    let machine = env.machines().await[0].name_any();
    env.create::<Machine>(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "cp-0", "labels": {names::CLUSTER_NAME_LABEL: "c1", "cluster.x-k8s.io/control-plane": ""}},
        "spec": {"clusterName": "c1"},
    }))
    .await;
    // CAPI's Machine finalizer keeps the etcd Machine visible while it is deleted.
    let finalizer = json!({"metadata": {"finalizers": ["machine.cluster.x-k8s.io"]}});
    env.api::<Machine>()
        .patch(&machine, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .unwrap();

    env.api::<EtcdadmCluster>()
        .delete(ETCD, &DeleteParams::default())
        .await
        .unwrap();
    let etcd = env.reconcile().await;
    assert_eq!(condition(&etcd, "Ready").1, "WaitingForControlPlaneDeletion");
    let still = env.api::<Machine>().get(&machine).await.unwrap();
    assert!(!still.is_deleting());
    assert!(
        still
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
    );

    env.api::<Machine>()
        .delete("cp-0", &DeleteParams::default())
        .await
        .unwrap();
    env.reconcile().await;
    let going = env.api::<Machine>().get(&machine).await.unwrap();
    assert!(going.is_deleting());
    assert!(
        !going
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
    );
    assert!(
        env.api::<EtcdadmCluster>()
            .get(ETCD)
            .await
            .unwrap()
            .finalizers()
            .contains(&names::ETCDADM_CLUSTER_FINALIZER.to_string())
    );

    // CAPI finishes the Machine; then the finalizer goes and the object with it.
    env.api::<Machine>()
        .patch(
            &machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let etcd = env.api::<EtcdadmCluster>().get(ETCD).await.unwrap();
    reconcile(Arc::new(etcd), env.ctx.clone()).await.unwrap();
    assert!(env.api::<EtcdadmCluster>().get_opt(ETCD).await.unwrap().is_none());
}

#[tokio::test]
async fn a_kcp_with_local_etcd_is_reported_and_left_alone() {
    let env = Env::new();
    env.cluster(&[], true).await;
    let kcp = env.kcp(json!({"local": {"dataDir": "/var/lib/etcd"}})).await;
    env.template().await;
    env.etcd_cluster(1, true, json!({})).await;
    let etcd = env.reconcile().await;
    let (status, reason, message) = condition(&etcd, "ControlPlaneEndpointsUpdated");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ControlPlaneUsesLocalEtcd")
    );
    assert!(message.contains("c1-cp"), "{message}");
    let after = env.api::<KubeadmControlPlane>().get("c1-cp").await.unwrap();
    assert_eq!(after.resource_version(), kcp.resource_version());
}

/// Poll reconciles until `done` holds for the EtcdadmCluster, or fail with its status.
async fn reconcile_until(env: &Env, what: &str, done: impl Fn(&EtcdadmCluster) -> bool) -> EtcdadmCluster {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let etcd = env.reconcile().await;
        if done(&etcd) {
            return etcd;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}; status: {}",
                serde_json::to_string_pretty(&etcd.status).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn a_ready_member_unpauses_kcp_after_endpoints_and_secrets() {
    require_etcd();
    let ca = test_ca();
    let etcd_process = TlsEtcd::start(ca);
    let env = Env::new();
    env.cluster(&[], true).await;
    let kcp = env
        .kcp(json!({"external": {"endpoints": ["https://placeholder:2379"], "caFile": "/etc/kubernetes/pki/etcd/ca.crt"}}))
        .await;
    env.template().await;
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    env.etcd_cluster(1, true, json!({})).await;
    env.reconcile().await;
    let kcp_now = env.api::<KubeadmControlPlane>().get("c1-cp").await.unwrap();
    assert!(kcp_now.annotations().contains_key(names::PAUSED_ANNOTATION));
    assert!(env.secret(&names::kcp_etcd_ca_secret_name("c1")).await.is_none());

    // The infrastructure "boots" the Machine onto the running etcd's address.
    let machine = env.machines().await[0].name_any();
    env.set_address(&machine, &etcd_process.ip.to_string()).await;
    let etcd = reconcile_until(&env, "ready", |e| e.status.as_ref().is_some_and(|s| s.ready)).await;
    let status = etcd.status.clone().unwrap();
    assert!(status.initialized && status.creation_complete);
    assert_eq!(status.endpoints, etcd_process.client_url);
    assert_eq!(status.ready_replicas, Some(1));
    assert_eq!(condition(&etcd, "Ready").0, "True");
    // status.clusterVersion says what etcd's own /version calls the cluster version.
    let client = ca
        .issue(&etcdadm_shared::pki::LeafRequest::in_memory_client(
            "test",
            Duration::from_secs(600),
        ))
        .unwrap();
    let version: Value = etcdadm_shared::testing::mtls_http_client(ca.cert_pem(), &client)
        .get(format!("{}/version", etcd_process.client_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status.cluster_version.as_deref(),
        version["etcdcluster"].as_str(),
        "{version}"
    );

    let kcp_now = env.api::<KubeadmControlPlane>().get("c1-cp").await.unwrap();
    assert!(!kcp_now.annotations().contains_key(names::PAUSED_ANNOTATION));
    let external = &kcp_now
        .spec
        .kubeadm_config_spec
        .cluster_configuration
        .as_ref()
        .unwrap()
        .etcd
        .as_ref()
        .unwrap()
        .external;
    assert_eq!(
        external.as_ref().unwrap().endpoints,
        vec![etcd_process.client_url.clone()]
    );
    // Only the endpoints changed: other KCP fields survive the patch.
    let raw = serde_json::to_value(&kcp_now).unwrap();
    assert_eq!(raw["spec"]["kubeadmConfigSpec"]["files"][0]["content"], "kept");
    assert_eq!(
        raw["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]["etcd"]["external"]["caFile"],
        "/etc/kubernetes/pki/etcd/ca.crt"
    );
    assert_ne!(kcp_now.resource_version(), kcp.resource_version());

    let ca_secret = env
        .secret(&names::kcp_etcd_ca_secret_name("c1"))
        .await
        .expect("<cluster>-etcd");
    assert_eq!(secret_value(&ca_secret, names::TLS_CERT_KEY), ca.cert_pem());
    assert_eq!(ca_secret.type_.as_deref(), Some(names::CLUSTER_SECRET_TYPE));
    let client_secret = env
        .secret(&names::apiserver_client_secret_name("c1"))
        .await
        .expect("<cluster>-apiserver-etcd-client");
    let cert = secret_value(&client_secret, names::TLS_CERT_KEY);
    let key = secret_value(&client_secret, names::TLS_KEY_KEY);
    assert!(etcdadm_shared::pki::cert_matches_key(&cert, &key).unwrap());
    assert_eq!(client_secret.owner_references()[0].kind, "Cluster");
    assert_eq!(condition(&etcd, "ControlPlaneEndpointsUpdated").0, "True");

    let reasons = env.event_reasons().await;
    for expected in [
        "ControlPlanePaused",
        "Initialized",
        "Ready",
        "ControlPlaneEndpointsUpdated",
        "ControlPlaneSecretsCreated",
        "ControlPlaneUnpaused",
    ] {
        assert!(
            reasons.contains(&expected.to_string()),
            "{expected} not in {reasons:?}"
        );
    }
    // Steady: nothing rewritten.
    let before = env
        .secret(&names::apiserver_client_secret_name("c1"))
        .await
        .unwrap();
    env.reconcile().await;
    let after = env
        .secret(&names::apiserver_client_secret_name("c1"))
        .await
        .unwrap();
    assert_eq!(before.resource_version(), after.resource_version());

    // The next health round of a steady cluster reuses what was read around it: at most the
    // EtcdadmCluster is read again and a status written; and once the cache (here: a live read
    // handed to reconcile, as the watch cache would) holds the version kept or written last,
    // a round asks the API server nothing.
    env.ctx.observations.invalidate(&format!("{NS}/{ETCD}"));
    let (_, fresh) = env.reconcile_reusing().await;
    let (_, reusing) = env.reconcile_reusing().await;
    let (etcd, cached) = env.reconcile_reusing().await;
    assert!(
        fresh >= 9,
        "a fresh observation with a KCP reads ten objects, saw {fresh} requests"
    );
    assert!(reusing <= 2, "a kept observation took {reusing} requests");
    assert_eq!(cached, 0, "a round over the cached version kept made requests");
    assert_eq!(condition(&etcd, "Ready").0, "True");

    // A new controller process (a leader change, an upgrade) taking over the established
    // cluster reads what it needs and writes nothing: no object, no status, no Event.
    let takeover = Arc::new(Context::new(env.client.clone()));
    let before = env.server.request_tally();
    reconcile(Arc::new(etcd), takeover).await.unwrap();
    let after = env.server.request_tally();
    assert_ne!(before, after, "the takeover's reads are counted");
    let writes = writes_since(&before, &after);
    assert!(writes.is_empty(), "the takeover wrote {writes:?}");
    drop(etcd_process);
}

/// The write requests (by kind, e.g. `PATCH machines`) served between two tallies.
fn writes_since(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<String> {
    after
        .iter()
        .filter(|(kind, _)| !kind.starts_with("GET") && !kind.starts_with("WATCH"))
        .filter(|(kind, count)| before.get(*kind) != Some(count))
        .map(|(kind, count)| format!("{kind} x{}", count - before.get(kind).unwrap_or(&0)))
        .collect()
}

#[tokio::test]
async fn health_checks_report_members_leader_and_dead_members_of_a_real_cluster() {
    require_etcd();
    let ca = test_ca();
    let mut cluster = TlsEtcdCluster::start(ca, 3);
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    let etcd = env.etcd_cluster(3, true, json!({})).await;
    // Machines named like the members (etcdadm's --name), on the members' addresses.
    let members: BTreeMap<String, String> = cluster
        .members
        .iter()
        .map(|m| (m.name.clone(), m.ip.to_string()))
        .collect();
    for (name, ip) in &members {
        env.member_machine(&etcd, name, ip).await;
    }

    let etcd = reconcile_until(&env, "three healthy members with a leader", |e| {
        e.status.as_ref().is_some_and(|s| {
            s.members.len() == 3
                && s.members.iter().all(|m| m.healthy)
                && s.members.iter().filter(|m| m.is_leader).count() == 1
        })
    })
    .await;
    let status = etcd.status.clone().unwrap();
    assert!(status.ready && status.initialized);
    for entry in &status.members {
        let ip = &members[&entry.name];
        assert_eq!(entry.machine_ref.as_ref().unwrap().name, entry.name);
        assert_eq!(entry.client_url.as_deref(), Some(names::client_url(ip).as_str()));
        assert_eq!(entry.peer_url.as_deref(), Some(names::peer_url(ip).as_str()));
        let id = entry.member_id.as_deref().unwrap();
        assert_eq!(id.len(), 16, "{id}");
        assert!(!entry.is_learner);
        assert!(entry.last_healthy_time.is_some());
        assert!(entry.etcd_version.is_some());
        assert!(entry.message.is_none(), "{:?}", entry.message);
    }
    let mut urls: Vec<String> = members.values().map(|ip| names::client_url(ip)).collect();
    urls.sort();
    assert_eq!(status.endpoints, urls.join(","));
    assert_eq!(condition(&etcd, "MembersHealthy").0, "True");
    assert_eq!(status.ready_replicas, Some(3));

    // One member dies: reported unhealthy with a reason, the others stay healthy.
    let dead = cluster.members[1].name.clone();
    cluster.kill(1);
    // (If it led, the others are briefly leaderless and unhealthy too, until they elect one.)
    let etcd = reconcile_until(&env, "the killed member reported, the others healthy", |e| {
        e.status.as_ref().is_some_and(|s| {
            s.members.iter().any(|m| m.name == dead && !m.healthy)
                && s.members.iter().filter(|m| m.healthy).count() == 2
        })
    })
    .await;
    let status = etcd.status.clone().unwrap();
    let entry = status.members.iter().find(|m| m.name == dead).unwrap();
    let message = entry.message.clone().unwrap_or_default();
    assert!(!message.is_empty());
    assert!(entry.last_healthy_time.is_some(), "it was healthy before");
    assert_eq!(status.members.iter().filter(|m| m.healthy).count(), 2);
    assert!(!status.ready);
    let (ms_status, ms_reason, ms_message) = condition(&etcd, "MembersHealthy");
    assert_eq!(
        (ms_status.as_str(), ms_reason.as_str()),
        ("False", "MembersUnhealthy")
    );
    assert!(ms_message.contains(&dead), "{ms_message}");
    assert!(env.event_reasons().await.contains(&"MemberUnhealthy".to_string()));

    // A second one dies: the survivor answers /health with 503 (no leader), which is unhealthy,
    // and quorum is lost: nothing is changed.
    cluster.kill(2);
    let survivor = cluster.members[0].name.clone();
    let etcd = reconcile_until(&env, "quorum lost", |e| {
        e.status
            .as_ref()
            .is_some_and(|s| s.members.iter().all(|m| !m.healthy))
    })
    .await;
    let status = etcd.status.clone().unwrap();
    let entry = status.members.iter().find(|m| m.name == survivor).unwrap();
    assert!(!entry.healthy, "a 503 from /health is unhealthy");
    let (_, reason, message) = condition(&etcd, "Ready");
    assert_eq!(reason, "QuorumLost", "{message}");
    assert_eq!(env.machines().await.len(), 3);
    assert!(env.event_reasons().await.contains(&"QuorumLost".to_string()));
}

#[tokio::test]
async fn deleting_the_leaders_machine_moves_leadership_removes_the_member_then_replaces_it() {
    require_etcd();
    let ca = test_ca();
    let cluster = TlsEtcdCluster::start(ca, 3);
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    let etcd = env.etcd_cluster(3, true, json!({})).await;
    for m in &cluster.members {
        env.member_machine(&etcd, &m.name, &m.ip.to_string()).await;
    }
    let etcd = reconcile_until(&env, "ready with a leader", |e| {
        e.status
            .as_ref()
            .is_some_and(|s| s.ready && s.members.iter().any(|m| m.is_leader))
    })
    .await;
    let status = etcd.status.unwrap();
    let leader = status.members.iter().find(|m| m.is_leader).unwrap();
    let leader_name = leader.name.clone();
    let leader_id = leader.member_id.clone().unwrap();

    // Someone deletes the leader's Machine; CAPI's finalizer and our hook keep it around.
    let finalizer = json!({"metadata": {"finalizers": ["machine.cluster.x-k8s.io"]}});
    env.api::<Machine>()
        .patch(&leader_name, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .unwrap();
    env.api::<Machine>()
        .delete(&leader_name, &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        env.reconcile().await;
        let machine = env.api::<Machine>().get(&leader_name).await.unwrap();
        if !machine
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            break;
        }
        assert!(Instant::now() < deadline, "hook never released");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let reasons = env.event_reasons().await;
    assert!(reasons.contains(&"LeadershipMoved".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"MemberRemoved".to_string()), "{reasons:?}");

    // etcd itself no longer lists the member.
    let tls = etcdadm_shared::etcd::EtcdTls::issued_by(ca, "test", Duration::from_secs(600)).unwrap();
    let survivor = cluster.members.iter().find(|m| m.name != leader_name).unwrap();
    let client =
        etcdadm_shared::etcd::MemberClient::new(&survivor.client_url, &tls, Duration::from_secs(5)).unwrap();
    let listed = client.member_list().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|m| etcdadm_shared::etcd::member_id_hex(m.id) != leader_id)
    );

    // CAPI lets the Machine go; the controller replaces it with a new one.
    env.api::<Machine>()
        .patch(
            &leader_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    reconcile_until(&env, "a replacement Machine", |_| true).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let machines = env.machines().await;
        if machines.iter().any(|m| is_member_name(&m.name_any())) {
            assert_eq!(machines.len(), 3);
            break;
        }
        assert!(Instant::now() < deadline, "no replacement Machine: {machines:?}");
        env.reconcile().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// CAPI's part of a Machine deletion: once no pre-terminate hook is left, drop the finalizer.
async fn let_unhooked_machines_go(env: &Env) {
    for machine in env.machines().await {
        if machine.is_deleting()
            && !machine
                .annotations()
                .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
        {
            env.api::<Machine>()
                .patch(
                    &machine.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn an_orphan_machine_is_adopted_and_scale_down_removes_members_before_machines() {
    require_etcd();
    let ca = test_ca();
    let cluster = TlsEtcdCluster::start(ca, 3);
    let env = Env::new();
    env.cluster(&[], false).await;
    env.template().await;
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    let etcd = env
        .etcd_cluster(
            3,
            true,
            json!({"healthCheck": {"interval": "1s", "timeout": "2s"}}),
        )
        .await;
    for m in &cluster.members {
        env.member_machine(&etcd, &m.name, &m.ip.to_string()).await;
        // CAPI's finalizer: a deleted Machine stays until its hooks are gone.
        env.api::<Machine>()
            .patch(
                &m.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["machine.cluster.x-k8s.io"]}})),
            )
            .await
            .unwrap();
    }
    // One Machine lost its controller and our hook (say, after a bad restore): adopted.
    let orphan = cluster.members[2].name.clone();
    env.api::<Machine>()
        .patch(
            &orphan,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null, "annotations": {names::PRE_TERMINATE_HOOK_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    let etcd = reconcile_until(&env, "ready", |e| e.status.as_ref().is_some_and(|s| s.ready)).await;
    let adopted = env.api::<Machine>().get(&orphan).await.unwrap();
    assert!(
        adopted
            .owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && Some(&r.uid) == etcd.uid().as_ref())
    );
    assert!(
        adopted
            .annotations()
            .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
    );
    assert!(env.event_reasons().await.contains(&"MachineAdopted".to_string()));
    assert_eq!(condition(&etcd, "MachinesSpecUpToDate").0, "True");
    assert_eq!(condition(&etcd, "ResizeCompleted").0, "True");
    assert_eq!(etcd.status.as_ref().unwrap().updated_replicas, Some(3));

    // 3 → 1: one Machine at a time, each member removed before CAPI may let the Machine go.
    env.api::<EtcdadmCluster>()
        .patch(
            ETCD,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let tls = etcdadm_shared::etcd::EtcdTls::issued_by(ca, "test", Duration::from_secs(600)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut saw_resizing = false;
    loop {
        let etcd = env.reconcile().await;
        let machines = env.machines().await;
        let deleting: Vec<String> = machines
            .iter()
            .filter(|m| m.is_deleting())
            .map(|m| m.name_any())
            .collect();
        assert!(deleting.len() <= 1, "two removals at once: {deleting:?}");
        if condition(&etcd, "ResizeCompleted").0 == "False" {
            saw_resizing = true;
        }
        // Any Machine whose hook is gone has no member left in etcd.
        for machine in machines.iter().filter(|m| m.is_deleting()) {
            if !machine
                .annotations()
                .contains_key(names::PRE_TERMINATE_HOOK_ANNOTATION)
            {
                let mut listed = None;
                for url in cluster.client_urls() {
                    let client =
                        etcdadm_shared::etcd::MemberClient::new(&url, &tls, Duration::from_secs(2)).unwrap();
                    if let Ok(members) = client.member_list().await {
                        listed = Some(members);
                        break;
                    }
                }
                let listed = listed.expect("a member answers");
                assert!(
                    listed.iter().all(|m| m.name != machine.name_any()),
                    "hook released while {} is still a member",
                    machine.name_any()
                );
            }
        }
        let_unhooked_machines_go(&env).await;
        if machines.len() == 1 && etcd.status.as_ref().is_some_and(|s| s.ready) {
            assert_eq!(condition(&etcd, "ResizeCompleted").0, "True");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no scale down: {machines:?}\n{}",
            serde_json::to_string_pretty(&etcd.status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(saw_resizing);
    let reasons = env.event_reasons().await;
    for expected in ["ScalingDown", "MemberRemoved", "PreTerminateHookReleased"] {
        assert!(reasons.contains(&expected.to_string()), "{expected}: {reasons:?}");
    }
}
