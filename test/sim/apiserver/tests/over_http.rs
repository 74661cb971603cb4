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

    // The server has no OpenAPI v2 document (kubectl's client-side validation reads it), so that
    // validation must be turned off; kubectl says so itself when it is not.
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

/// The row of `table` (kubectl's aligned columns) whose first cell is `name`, by column header.
fn row_of(table: &str, name: &str) -> std::collections::BTreeMap<String, String> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let starts: Vec<(usize, String)> = header
        .match_indices(|c: char| c != ' ')
        .filter(|(i, _)| *i == 0 || header[..*i].ends_with("  "))
        .map(|(i, _)| {
            let rest = &header[i..];
            let end = rest.find("  ").unwrap_or(rest.len());
            (i, rest[..end].to_string())
        })
        .collect();
    let line = lines
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    starts
        .iter()
        .enumerate()
        .map(|(n, (start, title))| {
            let end = starts
                .get(n + 1)
                .map_or(line.len(), |(next, _)| *next)
                .min(line.len());
            (
                title.clone(),
                line.get(*start..end).unwrap_or_default().trim().to_string(),
            )
        })
        .collect()
}

/// A GET with an `Accept` header of our choosing: the status code.
async fn status_of_get(addr: std::net::SocketAddr, path: &str, accept: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_prints_columns_events_and_explanations_as_on_a_real_server() {
    use etcdadm_shared::api::EtcdadmCluster;
    use etcdadm_shared::manager::events::Recorder;
    use kube::Resource;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::events::{Event, EventType, Reporter};

    let (_server, served, dir, kubeconfig) = served().await;
    let client = client_from(&kubeconfig).await;
    let kubectl = Kubectl {
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    let clusters: Api<EtcdadmCluster> = Api::default_namespaced(client.clone());
    let cluster: EtcdadmCluster = serde_json::from_value(json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "e1", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {"replicas": 3, "infrastructureTemplate": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate", "name": "t"}},
    }))
    .unwrap();
    let created = clusters.create(&PostParams::default(), &cluster).await.unwrap();
    let status = json!({"status": {"ready": true, "readyReplicas": 3, "endpoints": "https://10.0.0.1:2379",
                                   "certificates": {"nextExpiry": "2030-01-01T00:00:00Z"}}});
    clusters
        .patch_status("e1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // The controllers publish events.k8s.io/v1 Events; kubectl reads core v1 ones.
    let recorder = Recorder::new(client.clone(), Reporter::from("etcdadm-controller"));
    let joined = Event {
        type_: EventType::Normal,
        reason: "MemberJoined".into(),
        note: Some("Machine m1 is etcd member 8e9e05c52164694d".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder.publish(&joined, &created.object_ref(&())).await.unwrap();
    recorder.publish(&joined, &created.object_ref(&())).await.unwrap();

    let wide = kubectl.run(&["get", "etcdadmclusters", "-o", "wide"]).await;
    let row = row_of(&wide, "e1");
    assert_eq!(row["CLUSTER"], "c1", "{wide}");
    assert_eq!(row["READY"], "true", "{wide}");
    assert_eq!(row["REPLICAS"], "3", "{wide}");
    assert_eq!(row["READY REPLICAS"], "3", "{wide}");
    assert_eq!(row["ENDPOINTS"], "https://10.0.0.1:2379", "{wide}");
    assert_eq!(row["CERTIFICATES EXPIRE"], "2030-01-01T00:00:00Z", "{wide}");
    assert!(row["AGE"].ends_with('s'), "{wide}");
    let narrow = kubectl.run(&["get", "etcdc"]).await;
    assert!(
        !narrow.contains("CERTIFICATES EXPIRE") && narrow.contains("READY REPLICAS"),
        "{narrow}"
    );

    for resource in ["events", "events.v1.events.k8s.io"] {
        let events = kubectl.run(&["get", resource]).await;
        assert!(events.contains("MemberJoined"), "{events}");
    }
    let events = kubectl.run(&["get", "events", "-o", "wide"]).await;
    let line = events.lines().find(|l| l.contains("MemberJoined")).unwrap();
    for expected in [
        "Normal",
        "etcdadmcluster/e1",
        "etcdadm-controller",
        "Machine m1 is etcd member",
    ] {
        assert!(line.contains(expected), "{expected} in {line}");
    }
    assert!(
        line.split_whitespace().any(|w| w == "2"),
        "a count of 2 in {line}"
    );
    let described = kubectl.run(&["describe", "etcdadmcluster", "e1"]).await;
    let events_section = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events_section.contains("MemberJoined") && events_section.contains("(x2 over"),
        "{described}"
    );

    let explained = kubectl.run(&["explain", "etcdadmcluster.spec.replicas"]).await;
    assert!(explained.contains("FIELD: replicas <integer>"), "{explained}");
    assert!(
        explained.contains("Number of members: odd and at least 1"),
        "{explained}"
    );
    let top = kubectl.run(&["explain", "etcdadmcluster"]).await;
    assert!(
        top.contains("metadata\t<ObjectMeta>") && top.contains("spec\t<Object> -required-"),
        "{top}"
    );

    // `get -w` prints a row per change, from watch events that carry one-row Tables.
    let mut watching = tokio::process::Command::new(KUBECTL)
        .arg("--kubeconfig")
        .arg(&kubectl.kubeconfig)
        .arg("--cache-dir")
        .arg(&kubectl.cache)
        .args(["get", "etcdc", "e1", "-w"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watching.stdout.take().unwrap()));
    let first = lines.next_line().await.unwrap().unwrap();
    assert!(first.starts_with("NAME"), "{first}");
    kubectl.run(&["scale", "etcdc", "e1", "--replicas=5"]).await;
    let changed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.split_whitespace().nth(3) == Some("5") {
                return line;
            }
        }
        panic!("kubectl get -w ended");
    })
    .await
    .unwrap();
    assert!(changed.starts_with("e1 "), "{changed}");
    watching.kill().await.unwrap();

    // What is not served is refused, never answered in another form.
    let path = "/apis/etcdcluster.cluster.x-k8s.io/v1beta1/namespaces/default/etcdadmclusters";
    assert_eq!(
        status_of_get(served.addr, path, "application/vnd.kubernetes.protobuf").await,
        406
    );
    assert_eq!(status_of_get(served.addr, path, "application/yaml").await, 406);
    assert_eq!(
        status_of_get(served.addr, path, "application/json;as=Table;v=v1;g=meta.k8s.io").await,
        200
    );
    served.shutdown().await;
}
