#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The HTTP front: a kubeconfig-configured kube client and kubectl against a served server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcdadm_shared::testing::TempDir;
use etcdadm_sim_apiserver::{ApiServer, repository_crd_dir};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

const KUBECTL: &str = "/usr/bin/kubectl";

async fn served() -> (ApiServer, etcdadm_sim_apiserver::Served, TempDir, PathBuf) {
    let server = ApiServer::new();
    server.load_crds_dir(&repository_crd_dir()).unwrap();
    let served = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = TempDir::new("apiserver-http");
    let kubeconfig = dir.path().join("kubeconfig");
    ApiServer::write_kubeconfig(&served.url, &kubeconfig).unwrap();
    (server, served, dir, kubeconfig)
}

async fn client_from(kubeconfig: &Path) -> Client {
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_client_through_the_written_kubeconfig() {
    let (server, served, _dir, kubeconfig) = served().await;
    let client = client_from(&kubeconfig).await;
    assert_eq!(client.default_namespace(), "default");
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "over-http"}, "data": {"k": "v"}})).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.next().await.unwrap().unwrap() {
                WatchEvent::Added(o) => return o,
                WatchEvent::Bookmark(_) => continue,
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(event.name_any(), "over-http");
    // A second watch without bookmarks: nothing is written to it while idle.
    let quiet = api
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.open_watch_count() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "second watch never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(quiet);
    // A client that goes away over HTTP ends its watch on the server.
    drop(stream);
    drop(api);
    drop(client);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.open_watch_count() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch outlived its HTTP client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_watches() {
    let (server, served, _dir, kubeconfig) = served().await;
    let client = client_from(&kubeconfig).await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let _stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    tokio::time::timeout(Duration::from_secs(10), served.shutdown())
        .await
        .expect("shutdown waited on a watch");
    assert_eq!(server.open_watch_count(), 0);
}

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// Runs kubectl; returns stdout, failing with stderr when it fails.
    async fn run(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.try_run(args).await;
        assert!(ok, "kubectl {args:?} failed: {err}");
        out
    }

    async fn try_run(&self, args: &[&str]) -> (bool, String, String) {
        assert!(
            Path::new(KUBECTL).exists(),
            "{KUBECTL} is missing: install kubectl (https://kubernetes.io/docs/tasks/tools/) to run this test"
        );
        let output = tokio::process::Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .output()
            .await
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

const ETCDADM_CLUSTER: &str = "apiVersion: etcdcluster.cluster.x-k8s.io/v1beta1
kind: EtcdadmCluster
metadata:
  name: e1
spec:
  replicas: REPLICAS
  infrastructureTemplate:
    apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
    kind: SimMachineTemplate
    name: t
  etcdadmConfigSpec: {}
";

const CONFIG_MAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  key: VALUE
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_apply_scale_delete() {
    let (_server, served, dir, kubeconfig) = served().await;
    let kubectl = Kubectl {
        kubeconfig,
        cache: dir.path().join("cache"),
    };

    let namespaces = kubectl.run(&["get", "namespaces"]).await;
    assert!(namespaces.contains("kube-system"), "{namespaces}");

    // The server has no OpenAPI documents (404 on /openapi/v2 and /openapi/v3), so kubectl's
    // client-side validation must be turned off; kubectl says so itself when it is not.
    let manifest = dir.path().join("etcdc.yaml");
    std::fs::write(&manifest, ETCDADM_CLUSTER.replace("REPLICAS", "3")).unwrap();
    let (ok, _, err) = kubectl
        .try_run(&["apply", "-f", manifest.to_str().unwrap()])
        .await;
    assert!(!ok && err.contains("--validate=false"), "{err}");
    std::fs::write(&manifest, ETCDADM_CLUSTER.replace("REPLICAS", "3")).unwrap();
    let out = kubectl
        .run(&["apply", "--validate=false", "-f", manifest.to_str().unwrap()])
        .await;
    assert!(out.contains("created"), "{out}");
    std::fs::write(&manifest, ETCDADM_CLUSTER.replace("REPLICAS", "5")).unwrap();
    let out = kubectl
        .run(&["apply", "--validate=false", "-f", manifest.to_str().unwrap()])
        .await;
    assert!(out.contains("configured"), "{out}");
    let replicas = kubectl
        .run(&["get", "etcdc", "e1", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(replicas, "5");

    let out = kubectl
        .run(&["scale", "etcdadmcluster", "e1", "--replicas=3"])
        .await;
    assert!(out.contains("scaled"), "{out}");
    let replicas = kubectl
        .run(&[
            "get",
            "etcdadmclusters.etcdcluster.cluster.x-k8s.io/e1",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await;
    assert_eq!(replicas, "3");
    let listed = kubectl.run(&["get", "cluster-api"]).await;
    assert!(listed.contains("e1"), "{listed}");

    // Built-in kinds: client-side apply uses strategic merge patch the second time.
    let cm = dir.path().join("cm.yaml");
    std::fs::write(&cm, CONFIG_MAP.replace("VALUE", "one")).unwrap();
    kubectl
        .run(&["apply", "--validate=false", "-f", cm.to_str().unwrap()])
        .await;
    std::fs::write(&cm, CONFIG_MAP.replace("VALUE", "two")).unwrap();
    kubectl
        .run(&["apply", "--validate=false", "-f", cm.to_str().unwrap()])
        .await;
    assert_eq!(
        kubectl
            .run(&["get", "cm", "settings", "-o", "jsonpath={.data.key}"])
            .await,
        "two"
    );
    // Server-side apply.
    std::fs::write(&cm, CONFIG_MAP.replace("VALUE", "three")).unwrap();
    let out = kubectl
        .run(&[
            "apply",
            "--validate=false",
            "--server-side",
            "--force-conflicts",
            "-f",
            cm.to_str().unwrap(),
        ])
        .await;
    assert!(out.contains("serverside-applied"), "{out}");
    assert_eq!(
        kubectl
            .run(&["get", "cm", "settings", "-o", "jsonpath={.data.key}"])
            .await,
        "three"
    );

    let out = kubectl.run(&["delete", "etcdadmcluster", "e1"]).await;
    assert!(out.contains("deleted"), "{out}");
    let (ok, _, err) = kubectl.try_run(&["get", "etcdc", "e1"]).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    served.shutdown().await;
}
