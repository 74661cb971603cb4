#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The EtcdadmConfig controller against the in-memory API server (FakeApi): each step of
//! docs/bootstrap.md, observed through the objects and status it leaves behind.

use std::collections::BTreeMap;
use std::sync::Arc;

use etcdadm_bootstrap::controller::{Context, reconcile};
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmConfig};
use etcdadm_shared::names;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_sim_apiserver::{ApiServer, fake_client};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "default";

struct Env {
    _server: ApiServer,
    client: Client,
    ctx: Arc<Context>,
}

impl Env {
    fn new() -> Env {
        let (server, client) = fake_client().unwrap();
        let ctx = Arc::new(Context::new(client.clone()));
        Env {
            _server: server,
            client,
            ctx,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), NS)
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

    async fn cluster(&self, name: &str, spec: Value) -> Cluster {
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name}, "spec": spec,
        }))
        .await
    }

    /// A Machine of cluster `c1` whose bootstrap config is the EtcdadmConfig of the same name.
    async fn machine(&self, name: &str, owner: Option<&EtcdadmCluster>) -> Machine {
        let owners: Vec<Value> = owner
            .map(|e| {
                vec![json!({
                    "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
                    "name": e.name_any(), "uid": e.uid().unwrap(), "controller": true,
                })]
            })
            .unwrap_or_default();
        self.create(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "labels": {names::CLUSTER_NAME_LABEL: "c1"}, "ownerReferences": owners},
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "EtcdadmConfig", "name": name}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SimMachine", "name": name},
            },
        }))
        .await
    }

    /// An EtcdadmConfig owned by `machine` (none: not yet adopted by a Machine).
    async fn config(&self, name: &str, machine: Option<&Machine>, spec: Value) -> EtcdadmConfig {
        let owners: Vec<Value> = machine
            .map(|m| {
                vec![json!({
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": m.name_any(), "uid": m.uid().unwrap(), "controller": true,
                })]
            })
            .unwrap_or_default();
        self.create(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": spec,
        }))
        .await
    }

    async fn ca_secret(&self, cert: &str, key: &str) {
        let data = json!({
            names::TLS_CERT_KEY: ByteString(cert.as_bytes().to_vec()),
            names::TLS_KEY_KEY: ByteString(key.as_bytes().to_vec()),
        });
        self.create::<Secret>(json!({"metadata": {"name": names::ca_secret_name("c1")}, "data": data}))
            .await;
    }

    async fn reconcile(&self, name: &str) -> EtcdadmConfig {
        let config = self.api::<EtcdadmConfig>().get(name).await.unwrap();
        reconcile(Arc::new(config), self.ctx.clone()).await.unwrap();
        self.api::<EtcdadmConfig>().get(name).await.unwrap()
    }

    async fn secret(&self, name: &str) -> Option<Secret> {
        self.api::<Secret>().get_opt(name).await.unwrap()
    }

    async fn set_address(&self, machine: &str, address: &str) {
        let patch = json!({"status": {"addresses": [{"type": "InternalIP", "address": address}]}});
        self.api::<Machine>()
            .patch_status(machine, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

fn secret_value(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// `(status, reason, message)` of condition `type_`.
fn condition(config: &EtcdadmConfig, type_: &str) -> (String, String, String) {
    let status = serde_json::to_value(config.status.as_ref().expect("status written")).unwrap();
    let found = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
    let text = |k: &str| found[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"), text("message"))
}

fn ready(config: &EtcdadmConfig) -> bool {
    config.status.as_ref().is_some_and(|s| s.ready)
}

#[tokio::test]
async fn without_an_owner_machine_it_waits_and_says_so() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    env.config("m1", None, json!({})).await;
    let config = env.reconcile("m1").await;
    assert!(!ready(&config));
    let (status, reason, _) = condition(&config, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WaitingForMachineOwner")
    );
    assert!(env.secret("m1").await.is_none());
    assert!(
        env.api::<ConfigMap>()
            .get_opt(&names::init_lock_name("c1"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_paused_cluster_or_config_is_left_alone() {
    let env = Env::new();
    env.cluster("c1", json!({"paused": true})).await;
    let machine = env.machine("m1", None).await;
    env.config("m1", Some(&machine), json!({})).await;
    let config = env.reconcile("m1").await;
    assert_eq!(condition(&config, "Paused").0, "True");
    assert!(env.secret("m1").await.is_none());
    assert!(env.secret(&names::ca_secret_name("c1")).await.is_none());

    // Unpausing the Cluster but annotating the config keeps it paused.
    let patch = json!({"spec": {"paused": false}});
    env.api::<Cluster>()
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let patch = json!({"metadata": {"annotations": {names::PAUSED_ANNOTATION: ""}}});
    env.api::<EtcdadmConfig>()
        .patch("m1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let config = env.reconcile("m1").await;
    assert_eq!(condition(&config, "Paused").0, "True");
    assert!(env.secret("m1").await.is_none());
}

#[tokio::test]
async fn the_first_config_takes_the_lock_creates_the_ca_and_renders_init() {
    let env = Env::new();
    let cluster = env.cluster("c1", json!({})).await;
    let machine = env.machine("m1", None).await;
    let created = env.config("m1", Some(&machine), json!({})).await;
    let config = env.reconcile("m1").await;

    let lock = env
        .api::<ConfigMap>()
        .get(&names::init_lock_name("c1"))
        .await
        .unwrap();
    let info: Value = serde_json::from_str(&lock.data.unwrap()[names::LOCK_INFORMATION_KEY]).unwrap();
    assert_eq!(info["machineName"], "m1");

    let ca = env
        .secret(&names::ca_secret_name("c1"))
        .await
        .expect("CA Secret created");
    assert_eq!(ca.owner_references()[0].uid, cluster.uid().unwrap());
    CertificateAuthority::from_pem(
        &secret_value(&ca, names::TLS_CERT_KEY),
        &secret_value(&ca, names::TLS_KEY_KEY),
    )
    .expect("the generated CA loads");

    let data = env.secret("m1").await.expect("data Secret created");
    assert_eq!(data.type_.as_deref(), Some(names::CLUSTER_SECRET_TYPE));
    assert_eq!(data.labels()[names::CLUSTER_NAME_LABEL], "c1");
    let owner = &data.owner_references()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        (created.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(secret_value(&data, names::DATA_SECRET_FORMAT_KEY), "cloud-config");
    let user_data = secret_value(&data, names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("etcdadm init"), "{user_data}");
    assert!(user_data.contains("--name m1"), "{user_data}");
    assert!(
        user_data.contains(
            &secret_value(&ca, names::TLS_CERT_KEY)
                .lines()
                .nth(1)
                .unwrap()
                .to_string()
        )
    );

    let status = config.status.clone().unwrap();
    assert!(status.ready);
    assert_eq!(status.data_secret_name.as_deref(), Some("m1"));
    assert_eq!(status.initialization.unwrap().data_secret_created, Some(true));
    assert_eq!(condition(&config, "Ready").0, "True");
    assert_eq!(condition(&config, "DataSecretAvailable").0, "True");

    // Idempotent: another pass writes nothing.
    let before = (
        data.resource_version(),
        ca.resource_version(),
        config.resource_version(),
    );
    let again = env.reconcile("m1").await;
    let data = env.secret("m1").await.unwrap();
    let ca = env.secret(&names::ca_secret_name("c1")).await.unwrap();
    assert_eq!(
        before,
        (
            data.resource_version(),
            ca.resource_version(),
            again.resource_version()
        )
    );

    // Step 8: once the lock holder has an address, `<cluster>-etcd-init` is published.
    assert!(env.secret(&names::init_secret_name("c1")).await.is_none());
    env.set_address("m1", "10.0.0.7").await;
    env.reconcile("m1").await;
    let init = env
        .secret(&names::init_secret_name("c1"))
        .await
        .expect("init Secret published");
    assert_eq!(secret_value(&init, names::INIT_ADDRESS_KEY), "10.0.0.7");
    assert_eq!(
        secret_value(&init, names::INIT_CLIENT_URLS_KEY),
        "https://10.0.0.7:2379"
    );
}

#[tokio::test]
async fn a_second_config_loses_the_lock_then_joins_through_the_init_secret() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({})).await;
    let m2 = env.machine("m2", None).await;
    env.config("m2", Some(&m2), json!({})).await;
    env.reconcile("m1").await;

    let second = env.reconcile("m2").await;
    let (status, reason, message) = condition(&second, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WaitingForInitLock")
    );
    assert!(message.contains("m1"), "{message}");
    assert!(env.secret("m2").await.is_none());

    env.set_address("m1", "10.0.0.7").await;
    env.reconcile("m1").await;
    let second = env.reconcile("m2").await;
    assert!(ready(&second));
    let user_data = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(
        user_data.contains("etcdadm join https://10.0.0.7:2379"),
        "{user_data}"
    );
    assert!(user_data.contains("--name m2"), "{user_data}");
    assert!(!user_data.contains("etcdadm init"), "{user_data}");
}

#[tokio::test]
async fn a_lock_whose_holder_is_gone_is_released_and_retaken() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let lock = json!({names::LOCK_INFORMATION_KEY: json!({"machineName": "deleted-machine"}).to_string()});
    env.create::<ConfigMap>(json!({"metadata": {"name": names::init_lock_name("c1")}, "data": lock}))
        .await;
    let m2 = env.machine("m2", None).await;
    env.config("m2", Some(&m2), json!({})).await;

    let config = env.reconcile("m2").await;
    assert!(ready(&config), "{:?}", config.status);
    let lock = env
        .api::<ConfigMap>()
        .get(&names::init_lock_name("c1"))
        .await
        .unwrap();
    assert!(lock.data.unwrap()[names::LOCK_INFORMATION_KEY].contains("\"m2\""));
    let user_data = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("etcdadm init"), "{user_data}");
}

/// An EtcdadmCluster-owned member: `status` must be patched after create (create drops it).
async fn etcdadm_cluster(env: &Env, status: Value) -> EtcdadmCluster {
    let created: EtcdadmCluster = env
        .create(json!({
            "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
            "metadata": {"name": "c1-etcd", "labels": {names::CLUSTER_NAME_LABEL: "c1"}},
            "spec": {
                "replicas": 3,
                "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate", "name": "t"},
                "etcdadmConfigSpec": {},
            },
        }))
        .await;
    env.api::<EtcdadmCluster>()
        .patch_status(
            "c1-etcd",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap();
    created
}

#[tokio::test]
async fn a_managed_join_waits_for_the_init_secret_then_uses_a_healthy_member() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    let etcd = etcdadm_cluster(&env, json!({"initialized": true})).await;
    let m2 = env.machine("m2", Some(&etcd)).await;
    env.config("m2", Some(&m2), json!({})).await;

    let config = env.reconcile("m2").await;
    let (status, reason, message) = condition(&config, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WaitingForEtcdInitSecret")
    );
    assert!(message.contains("c1-etcd-init"), "{message}");
    assert!(env.secret("m2").await.is_none());

    // Members reported, the first unhealthy: the join goes through the healthy one.
    let members = json!({"members": [
        {"name": "m0", "clientURL": "https://10.0.0.1:2379", "healthy": false},
        {"name": "m1", "clientURL": "https://10.0.0.2:2379", "healthy": true},
    ]});
    let status = json!({"initialized": true, "members": members["members"]});
    env.api::<EtcdadmCluster>()
        .patch_status(
            "c1-etcd",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap();
    let config = env.reconcile("m2").await;
    assert!(ready(&config), "{:?}", config.status);
    let user_data = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(
        user_data.contains("etcdadm join https://10.0.0.2:2379"),
        "{user_data}"
    );
    assert!(!user_data.contains("10.0.0.1"), "{user_data}");
    // A managed member never publishes the init Secret itself.
    env.set_address("m2", "10.0.0.9").await;
    env.reconcile("m2").await;
    assert!(env.secret(&names::init_secret_name("c1")).await.is_none());
}

#[tokio::test]
async fn a_join_marked_by_the_etcdadm_cluster_controller_waits_for_its_learner() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    env.ca_secret(ca.cert_pem(), ca.key_pem()).await;
    let members = json!([{"name": "m1", "clientURL": "https://10.0.0.2:2379", "healthy": true}]);
    let etcd = etcdadm_cluster(&env, json!({"initialized": true, "members": members})).await;
    for (name, flavor) in [("m2", "upstream"), ("m3", "eks-anywhere")] {
        let machine = env.machine(name, Some(&etcd)).await;
        env.config(name, Some(&machine), json!({"etcdadmFlavor": flavor}))
            .await;
        // The controller also writes how long the join may wait for its turn.
        let marked = json!({"metadata": {"annotations": {
            names::LEARNER_JOIN_ANNOTATION: "true",
            names::LEARNER_LISTED_WAIT_ANNOTATION: "2100",
        }}});
        env.api::<EtcdadmConfig>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&marked))
            .await
            .unwrap();
        let config = env.reconcile(name).await;
        assert!(ready(&config), "{:?}", config.status);
    }
    let learner = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(
        learner.contains(
            "sh /run/cluster-api/etcd-learner-join.sh wait-listed 2100 https://10.0.0.2:2379 && { etcdadm join \
             https://10.0.0.2:2379 --init-system systemd --name m2 \
             --bind-address \\\"$(cat /run/cluster-api/etcd-member-address)\\\" \
             --server-cert-extra-sans \\\"$(cat /run/cluster-api/etcd-member-address)\\\" || "
        ),
        "{learner}"
    );
    // The eks-anywhere build keeps its voter join; the controller does not pre-add for it
    // (EtcdadmConfig::joins_as_learner says so to both).
    let voter = secret_value(&env.secret("m3").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(!voter.contains("etcd-learner-join"), "{voter}");
    assert!(voter.contains("\"etcdadm join https://10.0.0.2:2379 --init-system systemd --name m3 && "));
}

#[tokio::test]
async fn a_corrupt_ca_is_reported_and_never_replaced() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    env.ca_secret("not a certificate", "not a key").await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({})).await;
    let config = env.reconcile("m1").await;
    let (status, reason, message) = condition(&config, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "EtcdCACorrupt"));
    assert!(message.contains(&names::ca_secret_name("c1")), "{message}");
    let ca = env.secret(&names::ca_secret_name("c1")).await.unwrap();
    assert_eq!(secret_value(&ca, names::TLS_CERT_KEY), "not a certificate");
    assert!(env.secret("m1").await.is_none());
}

#[tokio::test]
async fn a_data_secret_left_by_a_crash_is_adopted_not_rewritten() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    let config = env.config("m1", Some(&m1), json!({})).await;
    // A previous run wrote the Secret and crashed before status.
    let owner = config.controller_owner_ref(&()).unwrap();
    let data = BTreeMap::from([
        (
            names::DATA_SECRET_VALUE_KEY.to_string(),
            ByteString(b"#cloud-config\n".to_vec()),
        ),
        (
            names::DATA_SECRET_FORMAT_KEY.to_string(),
            ByteString(b"cloud-config".to_vec()),
        ),
    ]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("m1".into()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let written = env
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let config = env.reconcile("m1").await;
    assert!(ready(&config));
    assert_eq!(config.status.unwrap().data_secret_name.as_deref(), Some("m1"));
    assert_eq!(
        env.secret("m1").await.unwrap().resource_version(),
        written.resource_version()
    );
}

#[tokio::test]
async fn a_data_secret_owned_by_someone_else_is_a_conflict() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({})).await;
    env.create::<Secret>(json!({"metadata": {"name": "m1"}, "data": {"value": "aGk="}}))
        .await;
    let config = env.reconcile("m1").await;
    let (status, reason, _) = condition(&config, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "DataSecretConflict")
    );
    assert_eq!(secret_value(&env.secret("m1").await.unwrap(), "value"), "hi");
}

#[tokio::test]
async fn an_unresolved_secret_reference_names_the_field() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    let spec =
        json!({"users": [{"name": "ops", "passwdFrom": {"secret": {"name": "missing", "key": "hash"}}}]});
    env.config("m1", Some(&m1), spec).await;
    let config = env.reconcile("m1").await;
    let (status, reason, message) = condition(&config, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(message.contains("spec.users[0].passwdFrom"), "{message}");
    assert!(message.contains("missing"), "{message}");
    assert!(env.secret("m1").await.is_none());

    // Once the Secret exists the password is rendered.
    let hash = ByteString(b"$6$salt$hash".to_vec());
    env.create::<Secret>(json!({"metadata": {"name": "missing"}, "data": {"hash": hash}}))
        .await;
    let config = env.reconcile("m1").await;
    assert!(ready(&config), "{:?}", config.status);
    let user_data = secret_value(&env.secret("m1").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("$6$salt$hash"), "{user_data}");
}

#[tokio::test]
async fn deleting_the_lock_holder_lets_the_next_machine_initialize() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({})).await;
    let m2 = env.machine("m2", None).await;
    env.config("m2", Some(&m2), json!({})).await;
    env.reconcile("m1").await;
    assert!(!ready(&env.reconcile("m2").await));

    env.api::<Machine>()
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    let config = env.reconcile("m2").await;
    assert!(ready(&config), "{:?}", config.status);
    let user_data = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("etcdadm init"), "{user_data}");
}

#[tokio::test]
async fn file_content_from_a_secret_is_fetched_and_rendered() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    let spec =
        json!({"files": [{"path": "/etc/motd", "contentFrom": {"secret": {"name": "motd", "key": "text"}}}]});
    env.config("m1", Some(&m1), spec).await;
    let config = env.reconcile("m1").await;
    let (_, reason, message) = condition(&config, "Ready");
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("spec.files[0].contentFrom"), "{message}");

    let text = ByteString(b"welcome to etcd\n".to_vec());
    env.create::<Secret>(json!({"metadata": {"name": "motd"}, "data": {"text": text}}))
        .await;
    assert!(ready(&env.reconcile("m1").await));
    let user_data = secret_value(&env.secret("m1").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("welcome to etcd"), "{user_data}");
}

#[tokio::test]
async fn bottlerocket_without_its_settings_is_an_invalid_spec() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({"format": "bottlerocket"}))
        .await;
    let config = env.reconcile("m1").await;
    let (status, reason, message) = condition(&config, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(
        message.starts_with("spec.bottlerocketConfig: is required with format bottlerocket"),
        "{message}"
    );
    assert!(env.secret("m1").await.is_none());
}

fn bottlerocket_spec() -> Value {
    json!({
        "format": "bottlerocket",
        "bottlerocketConfig": {
            "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9",
            "bootstrapImage": "public.ecr.aws/l0g8r8j6/bottlerocket-bootstrap:v1-28-9-eks-a-60",
            "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:v1.28.9-eks-1-28-9",
        },
        "registryMirror": {"endpoint": "mirror.example:5000"},
    })
}

/// The kubeadm-bootstrap container's runcmd in Bottlerocket user data.
fn bootstrap_runcmd(user_data: &str) -> String {
    use base64::Engine;
    let settings: Value = serde_json::to_value(toml::from_str::<toml::Table>(user_data).unwrap()).unwrap();
    let encoded = settings["settings"]["host-containers"]["kubeadm-bootstrap"]["user-data"]
        .as_str()
        .unwrap();
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    let container: Value = serde_saphyr::from_str(std::str::from_utf8(&decoded).unwrap()).unwrap();
    container["runcmd"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn bottlerocket_configs_get_bottlerocket_data_secrets_for_init_and_join() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    env.create::<Secret>(json!({"metadata": {"name": "registry-credentials"},
        "stringData": {"username": "robot", "password": "pw"}}))
        .await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), bottlerocket_spec()).await;
    let m2 = env.machine("m2", None).await;
    env.config("m2", Some(&m2), bottlerocket_spec()).await;

    assert!(ready(&env.reconcile("m1").await));
    let data = env.secret("m1").await.unwrap();
    assert_eq!(secret_value(&data, names::DATA_SECRET_FORMAT_KEY), "bottlerocket");
    let user_data = secret_value(&data, names::DATA_SECRET_VALUE_KEY);
    assert!(user_data.contains("hostname = \"m1\""), "{user_data}");
    assert!(
        user_data.contains("username = \"robot\""),
        "the mirror login: {user_data}"
    );
    assert!(
        bootstrap_runcmd(&user_data)
            .starts_with("EtcdadmInit public.ecr.aws/eks-distro/etcd-io/etcd 3.5.9-eks-1-28-9 "),
        "{user_data}"
    );

    env.set_address("m1", "10.0.0.7").await;
    env.reconcile("m1").await;
    assert!(ready(&env.reconcile("m2").await));
    let data = env.secret("m2").await.unwrap();
    assert_eq!(secret_value(&data, names::DATA_SECRET_FORMAT_KEY), "bottlerocket");
    let runcmd = bootstrap_runcmd(&secret_value(&data, names::DATA_SECRET_VALUE_KEY));
    assert!(runcmd.starts_with("EtcdadmJoin "), "{runcmd}");
    assert!(runcmd.ends_with(" https://10.0.0.7:2379"), "{runcmd}");
}

#[tokio::test]
async fn a_registry_login_secret_without_a_password_is_named() {
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    env.create::<Secret>(json!({"metadata": {"name": "registry-credentials"},
        "stringData": {"username": "robot"}}))
        .await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), bottlerocket_spec()).await;
    let config = env.reconcile("m1").await;
    let (_, reason, message) = condition(&config, "Ready");
    assert_eq!(reason, "InvalidSpec");
    assert_eq!(
        message,
        "spec.registryMirror: Secret default/registry-credentials has no UTF-8 key password"
    );
    assert!(env.secret("m1").await.is_none());
}

/// The `(path, content)` of every `write_files` entry of cloud-config user data.
fn written_files(user_data: &str) -> Vec<(String, String)> {
    let body = user_data
        .lines()
        .filter(|l| !l.starts_with("## template"))
        .collect::<Vec<_>>()
        .join("\n");
    let parsed: Value = serde_saphyr::from_str(&body).unwrap();
    parsed["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A member of a CA rotation (docs/security.md, "Rotating the etcd CA"): its config's
/// `ca-bundle` annotation names the CAs its `ca.crt` holds, the signer first, and its `ca.key`
/// is the signer's; a CA neither CA Secret holds is reported and nothing is rendered.
#[tokio::test]
async fn a_rotating_member_gets_the_bundle_its_config_names_and_the_signers_key() {
    use etcdadm_shared::contract::ca::bundle_annotation;
    use etcdadm_shared::pki::{certificates_der, der_fingerprint};
    let env = Env::new();
    env.cluster("c1", json!({})).await;
    let old = CertificateAuthority::generate("etcd-ca").unwrap();
    let new = CertificateAuthority::generate("etcd-ca-rotated").unwrap();
    env.ca_secret(old.cert_pem(), old.key_pem()).await;
    let data = json!({
        names::TLS_CERT_KEY: ByteString(new.cert_pem().as_bytes().to_vec()),
        names::TLS_KEY_KEY: ByteString(new.key_pem().as_bytes().to_vec()),
    });
    env.create::<Secret>(json!({
        "metadata": {
            "name": names::next_ca_secret_name("c1"),
            "annotations": {names::CA_ROTATED_FOR_ANNOTATION: "r1"},
        },
        "data": data,
    }))
    .await;
    let m1 = env.machine("m1", None).await;
    env.config("m1", Some(&m1), json!({})).await;
    env.reconcile("m1").await;
    env.set_address("m1", "10.0.0.7").await;
    env.reconcile("m1").await;
    let annotate = |name: &str, value: String| {
        let api = env.api::<EtcdadmConfig>();
        let name = name.to_string();
        async move {
            let patch = json!({"metadata": {"annotations": {names::CA_BUNDLE_ANNOTATION: value}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    let fingerprints = |pem: &str| -> Vec<String> {
        certificates_der(pem)
            .unwrap()
            .iter()
            .map(|der| der_fingerprint(der))
            .collect()
    };
    let ca_files = |user_data: &str| {
        let files = written_files(user_data);
        let file = |name: &str| {
            files
                .iter()
                .find(|(path, _)| path == &format!("/etc/etcd/pki/{name}"))
                .map(|(_, content)| content.clone())
                .unwrap_or_else(|| panic!("no {name} in {files:?}"))
        };
        (file("ca.crt"), file("ca.key"))
    };

    // The first member, unannotated: the current CA alone.
    let first = secret_value(&env.secret("m1").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    let (crt, key) = ca_files(&first);
    assert_eq!(fingerprints(&crt), [old.fingerprint().unwrap()]);
    assert_eq!(key.trim(), old.key_pem().trim());

    // Signed by the next CA, trusting both.
    let m2 = env.machine("m2", None).await;
    env.config("m2", Some(&m2), json!({})).await;
    annotate("m2", bundle_annotation(&[&new, &old]).unwrap()).await;
    assert!(ready(&env.reconcile("m2").await));
    let joined = secret_value(&env.secret("m2").await.unwrap(), names::DATA_SECRET_VALUE_KEY);
    assert!(joined.contains("etcdadm join https://10.0.0.7:2379"), "{joined}");
    let (crt, key) = ca_files(&joined);
    assert_eq!(
        fingerprints(&crt),
        [new.fingerprint().unwrap(), old.fingerprint().unwrap()]
    );
    assert_eq!(key.trim(), new.key_pem().trim());

    // A CA neither Secret holds: reported, nothing rendered.
    let stranger = CertificateAuthority::generate("stranger").unwrap();
    let m3 = env.machine("m3", None).await;
    env.config("m3", Some(&m3), json!({})).await;
    annotate("m3", bundle_annotation(&[&old, &stranger]).unwrap()).await;
    let refused = env.reconcile("m3").await;
    let (status, reason, message) = condition(&refused, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "EtcdCACorrupt"));
    assert!(
        message.contains(&stranger.fingerprint().unwrap()) && message.contains("c1-managed-etcd-next"),
        "{message}"
    );
    assert!(env.secret("m3").await.is_none());
}
