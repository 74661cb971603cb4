#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The README demo as a new user meets it, on each API server it can start: once it is Ready,
//! kubectl shows the EtcdadmCluster's printer columns (`get -o wide`), the controllers' Events
//! (`get events`, `describe`), and explains its fields from the CRD's schema (`explain`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use etcdadm_shared::testing::TempDir;
use etcdadm_sim::demo::{ApiServerChoice, Demo, DemoOptions, failure_logs};
use serde_json::Value;

const KUBECTL_HINT: &str = "install kubectl (https://kubernetes.io/docs/tasks/tools/, or \
    `apt-get install kubectl` from the Kubernetes apt repository), or set KUBECTL to its path; \
    this project's machines have it at /usr/bin/kubectl";

/// `$KUBECTL`, else `kubectl` on PATH, else `/usr/bin/kubectl`; a test without one fails.
fn kubectl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBECTL") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kubectl"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin/kubectl")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("kubectl not found: {KUBECTL_HINT}"))
}

/// kubectl against the demo's kubeconfig, with a discovery cache of the test's own.
struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> String {
        let output = Command::new(&self.binary)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {KUBECTL_HINT}", self.binary.display()));
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}

/// Each row of kubectl's aligned table, by column header.
fn rows(table: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    // A column starts where a header word follows two spaces (or the line's start).
    let starts: Vec<(usize, String)> = header
        .match_indices(|c: char| c != ' ')
        .filter(|(i, _)| *i == 0 || header[..*i].ends_with("  "))
        .map(|(i, _)| {
            let rest = &header[i..];
            (i, rest[..rest.find("  ").unwrap_or(rest.len())].to_string())
        })
        .collect();
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(n, (start, title))| {
                    let end = starts.get(n + 1).map_or(line.len(), |(next, _)| *next);
                    let cell = line.get(*start..end.min(line.len())).unwrap_or_default();
                    (title.clone(), cell.trim().to_string())
                })
                .collect()
        })
        .collect()
}

/// The CRD's description of `spec.replicas`, which `kubectl explain` must show.
fn replicas_description() -> String {
    let path = etcdadm_sim::crd_dir().join("etcdcluster.cluster.x-k8s.io_etcdadmclusters.yaml");
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/replicas/description")
        .and_then(Value::as_str)
        .unwrap()
        .to_string()
}

/// One demo at a time in this binary: both share the machine's two cores with real etcd.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_in_memory_api_server_kubectl_shows_columns_events_and_field_docs() {
    let _turn = ONE_AT_A_TIME.lock().await;
    kubectl_session(ApiServerChoice::Memory, 23).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_kube_apiserver_kubectl_shows_columns_events_and_field_docs() {
    let _turn = ONE_AT_A_TIME.lock().await;
    kubectl_session(ApiServerChoice::Real, 24).await;
}

async fn kubectl_session(api_server: ApiServerChoice, prefix: u8) {
    let work = TempDir::new("sim-demo");
    let options = DemoOptions {
        work_dir: work.path().to_path_buf(),
        api_server,
        ip_prefix: [127, 0, prefix],
        timeout: Duration::from_secs(120),
        ..DemoOptions::default()
    };
    let demo = Demo::start(&options)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    assert_eq!(demo.on_real_api_server(), api_server == ApiServerChoice::Real);
    demo.wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", failure_logs(work.path())));
    let kubectl = Kubectl {
        binary: kubectl_binary(),
        kubeconfig: demo.kubeconfig().to_path_buf(),
        cache: work.path().join("kubectl-cache"),
    };

    let wide = kubectl.run(&["get", "etcdadmclusters", "-o", "wide"]);
    let listed = rows(&wide);
    assert_eq!(listed.len(), 1, "{wide}");
    let row = &listed[0];
    assert_eq!(row["NAME"], "demo-etcd", "{wide}");
    assert_eq!(row["CLUSTER"], "demo", "{wide}");
    assert_eq!(row["READY"], "true", "{wide}");
    assert_eq!(row["REPLICAS"], "3", "{wide}");
    assert_eq!(row["READY REPLICAS"], "3", "{wide}");
    assert_eq!(row["ENDPOINTS"].matches("https://").count(), 3, "{wide}");
    assert!(
        row["CERTIFICATES EXPIRE"].ends_with('Z'),
        "-o wide shows the priority column: {wide}"
    );

    // The controllers publish events.k8s.io Events; kubectl reads them as core v1 ones. A
    // member's MemberJoined is in the status before its Event is published: wait a little.
    let deadline = Instant::now() + Duration::from_secs(10);
    let joined = loop {
        let events = kubectl.run(&["get", "events"]);
        let joined = rows(&events)
            .into_iter()
            .find(|e| e["REASON"] == "MemberJoined" && e["OBJECT"] == "etcdadmcluster/demo-etcd");
        match joined {
            Some(event) => break event,
            None if Instant::now() > deadline => panic!("no MemberJoined Event:\n{events}"),
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    assert_eq!(joined["TYPE"], "Normal");
    assert!(joined["MESSAGE"].contains("is etcd member"), "{joined:?}");
    let described = kubectl.run(&["describe", "etcdadmcluster", "demo-etcd"]);
    let (status, events) = described.split_once("\nEvents:").unwrap_or_default();
    assert!(
        status.contains("Conditions:") && status.contains("Members:"),
        "{described}"
    );
    assert!(events.contains("MemberJoined"), "{described}");

    let explained = kubectl.run(&["explain", "etcdadmcluster.spec.replicas"]);
    assert!(explained.contains("FIELD: replicas <integer>"), "{explained}");
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words(&explained).contains(&words(&replicas_description())),
        "{explained}"
    );
    drop(demo);
}
