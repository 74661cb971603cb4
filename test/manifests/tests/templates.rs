#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The cluster templates (`templates/cluster-template*.yaml`), the CAPD kit's YAML, the
//! clusterctl metadata and settings: they render with the documented variables, parse, refer to
//! each other consistently, and the EtcdadmClusters in them are what our API accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use etcdadm_manifest_tests::clusterctl::{self, VariableUse};
use etcdadm_manifest_tests::docs::{DocumentedVariable, variables_table};
use etcdadm_manifest_tests::{read_repo_file, repo_root};
use etcdadm_shared::api::EtcdadmCluster;
use serde_json::{Value, json};

const FLAVORS: [(&str, &str); 3] = [
    ("default", "templates/cluster-template.yaml"),
    ("ha", "templates/cluster-template-ha.yaml"),
    ("backup", "templates/cluster-template-backup.yaml"),
];
const E2E_TEMPLATE: &str = "test/capd/cluster-template-e2e.yaml";

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn parse(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{what} is not valid YAML: {e}"))
}

fn documented(readme: &str) -> BTreeMap<String, DocumentedVariable> {
    variables_table(&read_repo_file(readme).unwrap()).unwrap_or_else(|e| panic!("{readme}: {e}"))
}

fn examples(table: &BTreeMap<String, DocumentedVariable>) -> BTreeMap<String, String> {
    table
        .iter()
        .map(|(k, v)| (k.clone(), v.example.clone()))
        .collect()
}

fn required_only(table: &BTreeMap<String, DocumentedVariable>) -> BTreeMap<String, String> {
    table
        .iter()
        .filter(|(_, v)| v.default.is_none())
        .map(|(k, v)| (k.clone(), v.example.clone()))
        .collect()
}

/// The template rendered with `values` and parsed.
fn render(path: &str, values: &BTreeMap<String, String>) -> Vec<Value> {
    let text = read_repo_file(path).unwrap();
    let rendered = clusterctl::substitute(&text, values).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse(&rendered, path)
}

fn find<'a>(docs: &'a [Value], kind_name: &str, object: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == kind_name && name(d) == object)
        .unwrap_or_else(|| panic!("no {kind_name} {object}"))
}

fn only<'a>(docs: &'a [Value], kind_name: &str) -> &'a Value {
    let found: Vec<_> = docs.iter().filter(|d| kind(d) == kind_name).collect();
    assert_eq!(found.len(), 1, "exactly one {kind_name}");
    found[0]
}

/// A v1beta2 reference (`apiGroup`, `kind`, `name`) resolves to a document of this template.
fn assert_ref(docs: &[Value], reference: &Value, what: &str) {
    let target = find(
        docs,
        reference["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no kind")),
        reference["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no name")),
    );
    let group = reference["apiGroup"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no apiGroup"));
    assert!(
        target["apiVersion"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{group}/")),
        "{what}: apiGroup {group} vs {}",
        target["apiVersion"]
    );
}

/// Every key path of `original` is present in `round_trip`: nothing was dropped as unknown.
fn assert_no_unknown_fields(original: &Value, round_trip: &Value, path: &str) {
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let child = format!("{path}.{key}");
                let other = b
                    .get(key)
                    .unwrap_or_else(|| panic!("{child} is not a field of our API"));
                assert_no_unknown_fields(value, other, &child);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_no_unknown_fields(x, y, &format!("{path}[{i}]"));
            }
        }
        (a, b) => assert_eq!(a, b, "{path} changed in a round trip through our API"),
    }
}

/// The EtcdadmCluster deserializes into our type without losing anything, and is consistent
/// with the rest of the template.
fn check_etcdadm_cluster(docs: &[Value], what: &str) -> EtcdadmCluster {
    let doc = only(docs, "EtcdadmCluster");
    assert_eq!(
        doc["apiVersion"], "etcdcluster.cluster.x-k8s.io/v1beta1",
        "{what}"
    );
    let typed: EtcdadmCluster =
        serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: EtcdadmCluster: {e}"));
    let round_trip = serde_json::to_value(&typed).unwrap();
    assert_no_unknown_fields(&doc["spec"], &round_trip["spec"], &format!("{what}: spec"));

    let cluster = only(docs, "Cluster");
    assert_eq!(
        doc["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"], cluster["metadata"]["name"],
        "{what}: the cluster-name label links the EtcdadmCluster to its Cluster"
    );
    let replicas = typed.spec.replicas();
    assert!(replicas >= 1 && replicas % 2 == 1, "{what}: replicas {replicas}");
    let template = &typed.spec.infrastructure_template;
    let target = find(
        docs,
        template.kind.as_deref().unwrap(),
        template.name.as_deref().unwrap(),
    );
    assert_eq!(
        target["apiVersion"].as_str(),
        template.api_version.as_deref(),
        "{what}"
    );
    assert!(
        kind(target).ends_with("MachineTemplate"),
        "{what}: {}",
        kind(target)
    );
    let kcp = only(docs, "KubeadmControlPlane");
    assert_eq!(
        typed.spec.machine_version(),
        kcp["spec"]["version"].as_str(),
        "{what}: etcd Machines get a version (CAPD picks the node image from it)"
    );
    typed
}

fn check_cluster_wiring(docs: &[Value], what: &str) {
    for doc in docs {
        assert!(!kind(doc).is_empty() && !name(doc).is_empty(), "{what}: {doc}");
        assert!(
            doc["metadata"]["namespace"].is_string(),
            "{what}: {} has no namespace",
            name(doc)
        );
    }
    let expected_versions = [
        ("Cluster", "cluster.x-k8s.io/v1beta2"),
        ("MachineDeployment", "cluster.x-k8s.io/v1beta2"),
        ("KubeadmControlPlane", "controlplane.cluster.x-k8s.io/v1beta2"),
        ("KubeadmConfigTemplate", "bootstrap.cluster.x-k8s.io/v1beta2"),
        ("DevCluster", "infrastructure.cluster.x-k8s.io/v1beta2"),
        ("DevMachineTemplate", "infrastructure.cluster.x-k8s.io/v1beta2"),
        ("EtcdadmCluster", "etcdcluster.cluster.x-k8s.io/v1beta1"),
        ("Secret", "v1"),
    ];
    for doc in docs {
        let expected = expected_versions
            .iter()
            .find(|(k, _)| *k == kind(doc))
            .unwrap_or_else(|| panic!("{what}: unexpected kind {}", kind(doc)));
        assert_eq!(doc["apiVersion"], expected.1, "{what}: {}", kind(doc));
    }
    let cluster = only(docs, "Cluster");
    assert_ref(
        docs,
        &cluster["spec"]["infrastructureRef"],
        &format!("{what}: Cluster infrastructureRef"),
    );
    assert_ref(
        docs,
        &cluster["spec"]["controlPlaneRef"],
        &format!("{what}: Cluster controlPlaneRef"),
    );
    let kcp = only(docs, "KubeadmControlPlane");
    assert_ref(
        docs,
        &kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"],
        &format!("{what}: KCP machine template"),
    );
    let external = &kcp["spec"]["kubeadmConfigSpec"]["clusterConfiguration"]["etcd"]["external"];
    assert_eq!(
        external["endpoints"],
        json!(["https://placeholder.invalid:2379"]),
        "{what}"
    );
    assert_eq!(external["caFile"], "/etc/kubernetes/pki/etcd/ca.crt", "{what}");
    assert_eq!(
        external["certFile"], "/etc/kubernetes/pki/apiserver-etcd-client.crt",
        "{what}"
    );
    assert_eq!(
        external["keyFile"], "/etc/kubernetes/pki/apiserver-etcd-client.key",
        "{what}"
    );
    for md in docs.iter().filter(|d| kind(d) == "MachineDeployment") {
        let template = &md["spec"]["template"]["spec"];
        assert_ref(
            docs,
            &template["bootstrap"]["configRef"],
            &format!("{what}: MD bootstrap"),
        );
        assert_ref(
            docs,
            &template["infrastructureRef"],
            &format!("{what}: MD infrastructure"),
        );
        assert_eq!(md["spec"]["clusterName"], cluster["metadata"]["name"], "{what}");
    }
    let names: BTreeSet<(&str, &str)> = docs.iter().map(|d| (kind(d), name(d))).collect();
    assert_eq!(names.len(), docs.len(), "{what}: duplicate objects");
}

#[test]
fn templates_render_parse_and_wire_up_with_examples_and_with_defaults() {
    let table = documented("templates/README.md");
    for (flavor, path) in FLAVORS {
        for (mode, values) in [
            ("examples", examples(&table)),
            ("defaults", required_only(&table)),
        ] {
            let what = format!("{flavor} flavor with {mode}");
            let docs = render(path, &values);
            check_cluster_wiring(&docs, &what);
            check_etcdadm_cluster(&docs, &what);
        }
    }
}

#[test]
fn template_variables_are_documented_exactly() {
    let table = documented("templates/README.md");
    let mut used: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (flavor, path) in FLAVORS {
        let text = read_repo_file(path).unwrap();
        for VariableUse { name, default, line } in clusterctl::variable_uses(&text).unwrap() {
            let doc = table
                .get(&name)
                .unwrap_or_else(|| panic!("{path}:{line}: ${{{name}}} is not in templates/README.md"));
            assert_eq!(
                default, doc.default,
                "{path}:{line}: default of {name} differs from templates/README.md"
            );
            used.entry(name).or_default().insert(flavor);
        }
    }
    for (name, doc) in &table {
        let flavors = used
            .get(name)
            .unwrap_or_else(|| panic!("templates/README.md documents {name}, which no template uses"));
        let documented: BTreeSet<&str> = match doc.templates.as_deref() {
            Some("all") => FLAVORS.iter().map(|(f, _)| *f).collect(),
            Some(list) => list.split(',').map(str::trim).collect(),
            None => panic!("templates/README.md: {name} has no Templates cell"),
        };
        assert_eq!(
            flavors, &documented,
            "templates using {name} vs templates/README.md"
        );
    }
}

#[test]
fn templates_pass_clusterctl_unchanged_and_cloud_init_jinja_untouched() {
    let mut paths: Vec<&str> = FLAVORS.iter().map(|(_, p)| *p).collect();
    paths.push(E2E_TEMPLATE);
    for path in paths {
        let text = read_repo_file(path).unwrap();
        let rewritten = clusterctl::rewritten_sequences(&text);
        assert!(
            rewritten.is_empty(),
            "{path}: clusterctl would rewrite {rewritten:#?}"
        );
        // etcdadmConfigSpec content ends up in cloud-config user data with `## template: jinja`.
        for delimiter in ["{{", "{%", "{#"] {
            assert!(
                !text.contains(delimiter),
                "{path} contains the jinja delimiter {delimiter}"
            );
        }
    }
}

#[test]
fn flavors_share_the_default_objects() {
    let values = examples(&documented("templates/README.md"));
    let base = render(FLAVORS[0].1, &values);
    for (flavor, path) in &FLAVORS[1..] {
        let docs = render(path, &values);
        for doc in &base {
            let same = find(&docs, kind(doc), name(doc));
            match (*flavor, kind(doc)) {
                (_, "EtcdadmCluster") | ("ha", "DevCluster") => {}
                _ => assert_eq!(
                    same,
                    doc,
                    "{flavor}: {} {} differs from the default",
                    kind(doc),
                    name(doc)
                ),
            }
        }
    }
}

#[test]
fn ha_flavor_spreads_over_three_failure_domains() {
    let table = documented("templates/README.md");
    for count in ["3", "5"] {
        let mut values = examples(&table);
        values.insert("ETCD_MACHINE_COUNT".into(), count.into());
        values.insert("CONTROL_PLANE_MACHINE_COUNT".into(), "3".into());
        let docs = render("templates/cluster-template-ha.yaml", &values);
        let domains = &only(&docs, "DevCluster")["spec"]["backend"]["docker"]["failureDomains"];
        let names: BTreeSet<&str> = domains
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["controlPlane"] == true)
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 3, "three control plane failure domains");
        let etcd = check_etcdadm_cluster(&docs, "ha");
        assert_eq!(etcd.spec.replicas().to_string(), count);
        assert!(
            etcd.spec.failure_domains.is_empty()
                || etcd
                    .spec
                    .failure_domains
                    .iter()
                    .all(|d| names.contains(d.as_str())),
            "etcd failure domains are the Cluster's"
        );
        assert_eq!(only(&docs, "KubeadmControlPlane")["spec"]["replicas"], 3);
    }
}

#[test]
fn backup_flavor_embeds_the_script_and_unit_verbatim() {
    let values = examples(&documented("templates/README.md"));
    let docs = render("templates/cluster-template-backup.yaml", &values);
    let etcd = check_etcdadm_cluster(&docs, "backup");
    let spec = &etcd.spec.etcdadm_config_spec;
    let file = |path: &str| {
        spec.files
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("backup flavor writes no {path}"))
    };
    for (on_machine, source, permissions) in [
        (
            "/usr/local/sbin/etcd-backup.sh",
            "templates/backup/etcd-backup.sh",
            "0755",
        ),
        (
            "/etc/systemd/system/etcd-backup.service",
            "templates/backup/etcd-backup.service",
            "0644",
        ),
    ] {
        let embedded = file(on_machine);
        assert_eq!(
            embedded.content.as_deref(),
            Some(read_repo_file(source).unwrap().as_str()),
            "{on_machine} in the backup template differs from {source}: run hack/sync-backup-template.sh"
        );
        assert_eq!(embedded.permissions.as_deref(), Some(permissions), "{on_machine}");
    }
    let timer = file("/etc/systemd/system/etcd-backup.timer")
        .content
        .clone()
        .unwrap();
    assert!(
        timer.contains("OnCalendar=hourly")
            || timer.contains(&format!("OnCalendar={}", values["ETCD_BACKUP_SCHEDULE"]))
    );
    let service = file("/etc/systemd/system/etcd-backup.service")
        .content
        .clone()
        .unwrap();
    assert!(service.contains("ExecStart=/usr/local/sbin/etcd-backup.sh /etc/etcd-backup/backup.env"));
    let env = file("/etc/etcd-backup/backup.env").content.clone().unwrap();
    assert!(env.contains(&format!(
        "ETCD_BACKUP_DESTINATION='{}'",
        values["ETCD_BACKUP_DESTINATION"]
    )));
    assert!(
        spec.post_etcdadm_commands
            .iter()
            .any(|c| c.contains("enable --now etcd-backup.timer")),
        "the timer is enabled after etcdadm: {:?}",
        spec.post_etcdadm_commands
    );

    // Credentials come from a Secret of the template, never inline.
    let credentials = file("/etc/etcd-backup/credentials.env");
    assert!(credentials.content.is_none());
    let reference = &credentials.content_from.as_ref().unwrap().secret;
    let secret = find(&docs, "Secret", &reference.name);
    assert!(
        secret["stringData"][&reference.key]
            .as_str()
            .unwrap()
            .contains("AWS_SECRET_ACCESS_KEY=")
    );
    assert_eq!(
        secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"], values["CLUSTER_NAME"],
        "the Secret moves with the cluster (clusterctl move)"
    );
}

#[test]
fn sync_script_reproduces_the_committed_backup_template() {
    let dir = etcdadm_shared::testing::TempDir::new("etcdadm-sync-template");
    let copy = dir.path().join("cluster-template-backup.yaml");
    let committed = read_repo_file("templates/cluster-template-backup.yaml").unwrap();
    std::fs::write(&copy, &committed).unwrap();
    let status = Command::new("bash")
        .arg(repo_root().join("hack/sync-backup-template.sh"))
        .arg(&copy)
        .status()
        .expect("run hack/sync-backup-template.sh");
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), committed);

    // And it really replaces a stale copy.
    let stale = committed.replacen("set -eu", "set -eu # stale", 1);
    assert_ne!(stale, committed);
    std::fs::write(&copy, &stale).unwrap();
    let status = Command::new("bash")
        .arg(repo_root().join("hack/sync-backup-template.sh"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), committed);
}

#[test]
fn clusterctl_metadata_and_settings() {
    let settings: Value = serde_json::from_str(&read_repo_file("clusterctl-settings.json").unwrap()).unwrap();
    assert_eq!(
        settings,
        json!({"name": "bootstrap-etcdadm", "config": {
            "componentsFile": "bootstrap-components.yaml",
            "nextVersion": "v0.1.0",
            "configFolder": "config/default"}})
    );
    assert!(repo_root().join("config/default/kustomization.yaml").is_file());

    let metadata: Value = serde_saphyr::from_str(&read_repo_file("metadata.yaml").unwrap()).unwrap();
    assert_eq!(metadata["apiVersion"], "clusterctl.cluster.x-k8s.io/v1alpha3");
    assert_eq!(metadata["kind"], "Metadata");
    let version = settings["config"]["nextVersion"].as_str().unwrap();
    let mut parts = version
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u64>().unwrap());
    let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
    let series = metadata["releaseSeries"].as_array().unwrap();
    let current = series
        .iter()
        .find(|s| s["major"] == major && s["minor"] == minor)
        .unwrap_or_else(|| panic!("metadata.yaml has no release series for {version}"));
    assert_eq!(current["contract"], "v1beta2");
}

#[test]
fn capd_kit_yaml_parses_and_matches_the_script() {
    let kind_config = parse(
        &read_repo_file("test/capd/kind-config.yaml").unwrap(),
        "kind-config.yaml",
    );
    assert_eq!(kind_config.len(), 1);
    assert_eq!(kind_config[0]["apiVersion"], "kind.x-k8s.io/v1alpha4");
    let mounts = &kind_config[0]["nodes"][0]["extraMounts"][0];
    assert_eq!(
        mounts["containerPath"], "/var/run/docker.sock",
        "CAPD needs the Docker socket"
    );

    let clusterctl_config = parse(
        &read_repo_file("test/capd/clusterctl.yaml").unwrap(),
        "clusterctl.yaml",
    );
    let provider = &clusterctl_config[0]["providers"][0];
    assert_eq!(provider["name"], "etcdadm");
    assert_eq!(provider["type"], "BootstrapProvider");
    let url = provider["url"].as_str().unwrap();
    let settings: Value = serde_json::from_str(&read_repo_file("clusterctl-settings.json").unwrap()).unwrap();
    assert_eq!(
        url,
        format!(
            "@LOCAL_REPOSITORY@/{}/{}/{}",
            settings["name"].as_str().unwrap(),
            settings["config"]["nextVersion"].as_str().unwrap(),
            settings["config"]["componentsFile"].as_str().unwrap()
        ),
        "the local repository layout clusterctl expects: <provider label>/<version>/<components>"
    );

    let table = documented("test/capd/README.md");
    let text = read_repo_file(E2E_TEMPLATE).unwrap();
    let uses = clusterctl::variable_uses(&text).unwrap();
    for u in &uses {
        let doc = table
            .get(&u.name)
            .unwrap_or_else(|| panic!("{E2E_TEMPLATE}:{}: {} not in test/capd/README.md", u.line, u.name));
        assert_eq!(u.default, doc.default, "{E2E_TEMPLATE}: default of {}", u.name);
    }
    let script = read_repo_file("test/capd/e2e.sh").unwrap();
    for (name, doc) in &table {
        assert!(
            uses.iter().any(|u| &u.name == name),
            "test/capd/README.md documents {name}, which {E2E_TEMPLATE} does not use"
        );
        if doc.default.is_none() {
            assert!(
                script.contains(&format!("\"${{{name}:=")),
                "e2e.sh does not set the required template variable {name}"
            );
        }
    }
    // Every setting of e2e.sh (`: "${NAME:=default}"`) is described in the README.
    let readme = read_repo_file("test/capd/README.md").unwrap();
    for line in script.lines().filter(|l| l.starts_with(": \"${")) {
        let setting = &line[5..line.find(":=").unwrap()];
        assert!(
            readme.contains(&format!("`{setting}`")),
            "test/capd/README.md does not describe {setting}"
        );
    }

    for (mode, values) in [
        ("examples", examples(&table)),
        ("defaults", required_only(&table)),
    ] {
        let what = format!("e2e template with {mode}");
        let docs = render(E2E_TEMPLATE, &values);
        check_cluster_wiring(&docs, &what);
        let etcd = check_etcdadm_cluster(&docs, &what);
        let spec = &etcd.spec.etcdadm_config_spec;
        assert_eq!(
            spec.etcdadm_builtin,
            Some(true),
            "{what}: etcdadm comes from preEtcdadmCommands"
        );
        assert_eq!(
            spec.files[0].path, "/etc/etcdadm-e2e/etcd-version",
            "{what}: e2e.sh's upgrade step patches files/0"
        );
        let version = spec.cloud_init_config.as_ref().unwrap().version.clone().unwrap();
        assert_eq!(
            spec.files[0].content.as_deref(),
            Some(format!("{version}\n").as_str()),
            "{what}"
        );
        let pre = spec.pre_etcdadm_commands.join("\n");
        assert!(pre.contains("/usr/local/bin/etcdadm"), "{what}: installs etcdadm");
        assert!(
            pre.contains("/var/cache/etcdadm/etcd/v$v"),
            "{what}: seeds etcdadm's etcd cache"
        );
        assert!(pre.contains("cat /etc/etcdadm-e2e/etcd-version"), "{what}");
        assert_eq!(etcd.spec.replicas(), 3, "{what}: three members");
        let domains = &only(&docs, "DevCluster")["spec"]["backend"]["docker"]["failureDomains"];
        assert_eq!(
            domains.as_array().unwrap().len(),
            3,
            "{what}: three failure domains"
        );
        assert!(
            docs.iter().all(|d| kind(d) != "MachineDeployment"),
            "{what}: no workers"
        );
    }
}
