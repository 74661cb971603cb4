#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `kubectl kustomize config/namespaced`, the namespaced install: config/default with the
//! managers' roles bound in the watched namespace only and the managers watching only it; and
//! `hack/release.sh`, which publishes both installs with the image pinned by digest.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use etcdadm_manifest_tests::{clusterctl, find_tool, read_repo_file, repo_root};
use serde_json::Value;

const KUBECTL_HINT: &str = "install kubectl (it has kustomize built in), or set KUBECTL to its path";
const WATCHED: &str = "${ETCDADM_WATCH_NAMESPACE}";
const TENANT_ROLES: [&str; 2] = [
    "etcdadm-bootstrap-manager-role",
    "etcdadm-controller-manager-role",
];
const IMAGE: &str = "ghcr.io/etcdadm-rs/etcdadm-providers:v0.1.0";

fn kustomize(dir: &str) -> String {
    let kubectl = find_tool("kubectl", "KUBECTL", KUBECTL_HINT).unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(&kubectl)
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {KUBECTL_HINT}", kubectl.display()));
    assert!(
        output.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).unwrap()
}

fn id(doc: &Value) -> (String, String, String) {
    let text = |pointer: &str| {
        doc.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (text("/kind"), text("/metadata/namespace"), text("/metadata/name"))
}

fn by_id(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter().map(|d| (id(d), d.clone())).collect()
}

fn watch_namespace(deployment: &Value) -> Option<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .and_then(|e| e["value"].as_str())
        .map(str::to_string)
}

#[test]
fn the_namespaced_install_grants_the_managers_roles_in_the_watched_namespace_only() {
    let default = by_id(&documents(&kustomize("config/default")));
    let namespaced = by_id(&documents(&kustomize("config/namespaced")));

    // Nothing binds the tenant roles cluster-wide; the only ClusterRoleBinding left lets the
    // managers ask for the reviews that guard /metrics.
    let cluster_bindings: Vec<&Value> = namespaced
        .values()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(cluster_bindings.len(), 1, "{cluster_bindings:#?}");
    let review_role = &cluster_bindings[0]["roleRef"]["name"];
    assert_eq!(review_role, "etcdadm-metrics-auth-role");
    let rules = &namespaced[&(
        "ClusterRole".into(),
        String::new(),
        "etcdadm-metrics-auth-role".into(),
    )]["rules"];
    let granted: BTreeSet<(String, String)> = rules
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let resources: Vec<String> = r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.to_string())
                .collect();
            let verbs: Vec<String> = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.to_string())
                .collect();
            resources
                .into_iter()
                .flat_map(move |res| verbs.clone().into_iter().map(move |v| (res.clone(), v)))
        })
        .collect();
    assert_eq!(
        granted,
        BTreeSet::from([
            ("\"tokenreviews\"".into(), "\"create\"".into()),
            ("\"subjectaccessreviews\"".into(), "\"create\"".into())
        ]),
        "cluster-wide, the managers may only ask for reviews"
    );

    // Each tenant role is bound in the watched namespace, to its manager alone.
    for role in TENANT_ROLES {
        let bindings: Vec<&Value> = namespaced
            .values()
            .filter(|d| d["roleRef"]["name"] == role)
            .collect();
        assert_eq!(bindings.len(), 1, "{role}: {bindings:#?}");
        let binding = bindings[0];
        assert_eq!(binding["kind"], "RoleBinding", "{role}");
        assert_eq!(binding["metadata"]["namespace"], WATCHED, "{role}");
        let subjects = binding["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{role}");
        assert_eq!(
            format!("{}-role", subjects[0]["name"].as_str().unwrap()),
            role,
            "{role} is bound to its own manager"
        );
    }

    // Both managers watch only the watched namespace; the cluster-wide install sets nothing.
    let deployments: Vec<&Value> = namespaced
        .values()
        .filter(|d| d["kind"] == "Deployment")
        .collect();
    assert_eq!(deployments.len(), 2);
    for deployment in deployments {
        assert_eq!(
            watch_namespace(deployment).as_deref(),
            Some(WATCHED),
            "{}",
            id(deployment).2
        );
        let in_default = &default[&id(deployment)];
        assert_eq!(
            watch_namespace(in_default),
            None,
            "config/default watches everything"
        );
    }

    // Everything else is config/default's, unchanged.
    let changed = |d: &Value| {
        d["kind"] == "Deployment" || d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding"
    };
    for (key, doc) in default.iter().filter(|(_, d)| !changed(d)) {
        assert_eq!(namespaced.get(key), Some(doc), "{key:?} differs or is missing");
    }
    for (key, doc) in namespaced.iter().filter(|(_, d)| !changed(d)) {
        assert!(default.contains_key(key), "{key:?} is new: {doc}");
    }
}

#[test]
fn clusterctl_requires_the_watched_namespace_and_docs_name_it() {
    let text = kustomize("config/namespaced");
    assert!(clusterctl::rewritten_sequences(&text).is_empty());
    let uses = clusterctl::variable_uses(&text).unwrap();
    let variables: BTreeMap<&str, Option<&str>> = uses
        .iter()
        .map(|u| (u.name.as_str(), u.default.as_deref()))
        .collect();
    assert_eq!(
        variables,
        BTreeMap::from([("ETCDADM_IMAGE", Some(IMAGE)), ("ETCDADM_WATCH_NAMESPACE", None)]),
        "the watched namespace has no default: clusterctl refuses to install without it"
    );
    let error = clusterctl::substitute(&text, &BTreeMap::new()).unwrap_err();
    assert!(error.contains("ETCDADM_WATCH_NAMESPACE"), "{error}");
    let values = BTreeMap::from([("ETCDADM_WATCH_NAMESPACE".to_string(), "team-a".to_string())]);
    let installed = documents(&clusterctl::substitute(&text, &values).unwrap());
    let bound: BTreeSet<String> = installed
        .iter()
        .filter(|d| {
            d["kind"] == "RoleBinding"
                && TENANT_ROLES.contains(&d["roleRef"]["name"].as_str().unwrap_or_default())
        })
        .map(|d| d["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(bound, BTreeSet::from(["team-a".to_string()]));
    for doc in ["docs/install.md", "docs/security.md"] {
        let text = read_repo_file(doc).unwrap();
        for wanted in [
            "ETCDADM_WATCH_NAMESPACE",
            "bootstrap-components-namespaced.yaml",
            "WATCH_NAMESPACE",
        ] {
            assert!(text.contains(wanted), "{doc} does not mention {wanted}");
        }
    }
}

fn release(args: &[&str], digest: Option<&str>, out: &std::path::Path) -> std::process::Output {
    let mut command = Command::new("bash");
    command
        .arg(repo_root().join("hack/release.sh"))
        .args(args)
        .arg(out);
    command.env_remove("ETCDADM_IMAGE_DIGEST");
    if let Some(digest) = digest {
        command.env("ETCDADM_IMAGE_DIGEST", digest);
    }
    command.output().expect("run hack/release.sh")
}

#[test]
fn the_release_publishes_both_installs_with_the_image_pinned_by_digest() {
    let out = etcdadm_shared::testing::TempDir::new("etcdadm-release-pinned");
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let target = out.path().join("assets");
    let output = release(&[], Some(&digest), &target);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (file, dir) in [
        ("bootstrap-components.yaml", "config/default"),
        ("bootstrap-components-namespaced.yaml", "config/namespaced"),
    ] {
        let written = std::fs::read_to_string(target.join(file)).unwrap();
        let pinned = format!("${{ETCDADM_IMAGE:={IMAGE}@{digest}}}");
        assert_eq!(
            written.matches(&pinned).count(),
            2,
            "{file}: both Deployments pinned"
        );
        assert_eq!(
            written.replace(&pinned, &format!("${{ETCDADM_IMAGE:={IMAGE}}}")),
            kustomize(dir),
            "{file} is the kustomize build of {dir} but for the digest"
        );
    }

    // No digest: refused, saying what to set; a malformed one too. --unpinned writes the tag.
    for digest in [None, Some("sha256:short"), Some("latest")] {
        let output = release(&[], digest, &out.path().join("refused"));
        assert!(!output.status.success(), "{digest:?} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("ETCDADM_IMAGE_DIGEST") && stderr.contains("--unpinned"),
            "{stderr}"
        );
        assert!(!out.path().join("refused/bootstrap-components.yaml").exists());
    }
    let unpinned = out.path().join("unpinned");
    let output = release(&["--unpinned"], None, &unpinned);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(unpinned.join("bootstrap-components-namespaced.yaml")).unwrap(),
        kustomize("config/namespaced")
    );
}
