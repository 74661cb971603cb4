#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `kubectl kustomize config/default`, the provider's components: what clusterctl installs.
//! Checks the shape clusterctl and CAPI expect (one namespace, the provider label everywhere),
//! the two hardened Deployments, least-privilege RBAC, webhook wiring and the release script.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::OnceLock;

use etcdadm_manifest_tests::{clusterctl, find_tool, read_repo_file, repo_root};
use serde_json::Value;

const NAMESPACE: &str = "etcdadm-system";
const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
const PROVIDER: &str = "bootstrap-etcdadm";
const KUBECTL_HINT: &str = "install kubectl (it has kustomize built in), e.g. from \
    https://kubernetes.io/docs/tasks/tools/ or `apt-get install kubectl` from the Kubernetes apt \
    repository, or set KUBECTL to its path; CI machines have it at /usr/bin/kubectl";
const CLUSTER_SCOPED: [&str; 6] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// The built components: raw text and parsed documents.
fn components() -> &'static (String, Vec<Value>) {
    static BUILT: OnceLock<(String, Vec<Value>)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let text = kustomize_build();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("kustomize output is not YAML: {e}"));
        (text, docs)
    })
}

fn kustomize_build() -> String {
    let kubectl = find_tool("kubectl", "KUBECTL", KUBECTL_HINT).unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(&kubectl)
        .arg("kustomize")
        .arg(repo_root().join("config/default"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {KUBECTL_HINT}", kubectl.display()));
    assert!(
        output.status.success(),
        "kubectl kustomize config/default failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("kustomize output is UTF-8")
}

fn docs() -> &'static [Value] {
    &components().1
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn of_kind(kind_name: &str) -> Vec<&'static Value> {
    docs().iter().filter(|d| kind(d) == kind_name).collect()
}

fn find(kind_name: &str, object: &str) -> &'static Value {
    docs()
        .iter()
        .find(|d| kind(d) == kind_name && name(d) == object)
        .unwrap_or_else(|| panic!("no {kind_name} {object} in the components"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn one_namespace_and_every_object_labelled_and_in_it() {
    let namespaces = of_kind("Namespace");
    assert_eq!(namespaces.len(), 1, "exactly one Namespace");
    assert_eq!(name(namespaces[0]), NAMESPACE);
    assert!(docs().len() > 15, "suspiciously few objects: {}", docs().len());
    for doc in docs() {
        let id = format!("{} {}", kind(doc), name(doc));
        assert!(
            !kind(doc).is_empty() && !name(doc).is_empty(),
            "object without kind/name: {doc}"
        );
        assert_eq!(
            doc["metadata"]["labels"][PROVIDER_LABEL].as_str(),
            Some(PROVIDER),
            "{id} lacks {PROVIDER_LABEL}={PROVIDER}"
        );
        let namespace = doc["metadata"]["namespace"].as_str();
        if CLUSTER_SCOPED.contains(&kind(doc)) {
            assert_eq!(namespace, None, "{id} is cluster-scoped but has a namespace");
        } else {
            assert_eq!(namespace, Some(NAMESPACE), "{id} is not in {NAMESPACE}");
        }
    }
    let mut ids = BTreeSet::new();
    for doc in docs() {
        assert!(
            ids.insert((kind(doc), name(doc))),
            "duplicate {} {}",
            kind(doc),
            name(doc)
        );
    }
}

#[test]
fn crds_are_the_four_generated_ones_with_contract_labels() {
    let crds: BTreeSet<&str> = of_kind("CustomResourceDefinition")
        .into_iter()
        .map(name)
        .collect();
    assert_eq!(
        crds,
        BTreeSet::from([
            "etcdadmconfigs.bootstrap.cluster.x-k8s.io",
            "etcdadmconfigtemplates.bootstrap.cluster.x-k8s.io",
            "etcdadmclusters.etcdcluster.cluster.x-k8s.io",
            "etcdadmsnapshots.etcdcluster.cluster.x-k8s.io",
        ])
    );
    for crd in of_kind("CustomResourceDefinition") {
        let labels = &crd["metadata"]["labels"];
        assert_eq!(labels["cluster.x-k8s.io/v1beta1"], "v1beta1", "{}", name(crd));
        assert_eq!(labels["cluster.x-k8s.io/v1beta2"], "v1beta1", "{}", name(crd));
    }
}

#[test]
fn two_hardened_deployments_named_manager() {
    let deployments = of_kind("Deployment");
    let names: BTreeSet<&str> = deployments.iter().map(|d| name(d)).collect();
    assert_eq!(
        names,
        BTreeSet::from(["etcdadm-bootstrap-manager", "etcdadm-controller-manager"])
    );
    let cert_secret = find("Certificate", "etcdadm-serving-cert")["spec"]["secretName"]
        .as_str()
        .unwrap();
    for deployment in deployments {
        let id = name(deployment);
        let pod = &deployment["spec"]["template"];
        assert_eq!(
            pod["metadata"]["labels"][PROVIDER_LABEL], PROVIDER,
            "{id}: pods carry the provider label"
        );
        let selector = deployment["spec"]["selector"]["matchLabels"].as_object().unwrap();
        for (key, value) in selector {
            assert_eq!(
                &pod["metadata"]["labels"][key], value,
                "{id}: selector matches the pods"
            );
        }
        let spec = &pod["spec"];
        let account = spec["serviceAccountName"].as_str().unwrap();
        find("ServiceAccount", account);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{id}");
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{id}"
        );

        let containers = spec["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{id}: one container");
        let c = &containers[0];
        assert_eq!(c["name"], "manager", "{id}: container name");
        assert!(
            c["image"].as_str().unwrap().starts_with("${ETCDADM_IMAGE:="),
            "{id}: image is the ETCDADM_IMAGE variable"
        );
        let binary = c["command"][0].as_str().unwrap();
        assert!(
            binary.ends_with(id.trim_end_matches("-manager")),
            "{id}: runs its own binary, not {binary}"
        );
        let args = strings(&c["args"]);
        for wanted in [
            "run",
            "--leader-elect",
            "--diagnostics-address=:8443",
            "--health-addr=:9440",
            "--webhook-port=9443",
            "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs",
        ] {
            assert!(args.contains(&wanted), "{id}: args lack {wanted}: {args:?}");
        }
        assert_eq!(args[0], "run", "{id}: the subcommand comes first");

        let ports: BTreeMap<&str, i64> = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_i64().unwrap()))
            .collect();
        assert_eq!(ports.get("healthz"), Some(&9440), "{id}");
        assert_eq!(ports.get("webhook-server"), Some(&9443), "{id}");
        assert_eq!(ports.get("metrics"), Some(&8443), "{id}");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            assert_eq!(c[probe]["httpGet"]["path"], path, "{id}: {probe}");
            assert_eq!(
                c[probe]["httpGet"]["port"], "healthz",
                "{id}: {probe} on the health port"
            );
        }
        for kind in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    !c["resources"][kind][resource].is_null(),
                    "{id}: resources.{kind}.{resource}"
                );
            }
        }
        let security = &c["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{id}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{id}");
        assert_eq!(security["runAsNonRoot"], true, "{id}");
        assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{id}");

        // The serving certificate is mounted where --webhook-cert-dir points, from the Secret
        // cert-manager writes, and /tmp is writable for everything else.
        let mounts: BTreeMap<&str, &str> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["mountPath"].as_str().unwrap(), m["name"].as_str().unwrap()))
            .collect();
        let volumes: BTreeMap<&str, &Value> = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["name"].as_str().unwrap(), v))
            .collect();
        let cert_volume = volumes[mounts["/tmp/k8s-webhook-server/serving-certs"]];
        assert_eq!(cert_volume["secret"]["secretName"], cert_secret, "{id}");
        assert!(
            volumes[mounts["/tmp"]]["emptyDir"].is_object(),
            "{id}: /tmp is an emptyDir"
        );
    }
}

/// Whether any rule grants `verb` on `resource` in `group`.
fn allows(rules: &Value, group: &str, resource: &str, verb: &str) -> bool {
    rules.as_array().unwrap().iter().any(|rule| {
        let has = |key: &str, wanted: &str| strings(&rule[key]).iter().any(|v| *v == wanted || *v == "*");
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

fn rules_of(kind_name: &str, role: &str) -> &'static Value {
    &find(kind_name, role)["rules"]
}

#[test]
fn rbac_is_least_privilege() {
    for binding in of_kind("ClusterRoleBinding")
        .into_iter()
        .chain(of_kind("RoleBinding"))
    {
        let role = binding["roleRef"]["name"].as_str().unwrap();
        assert!(
            !["cluster-admin", "admin", "edit"].contains(&role),
            "{} binds {role}",
            name(binding)
        );
        find(binding["roleRef"]["kind"].as_str().unwrap(), role);
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["kind"], "ServiceAccount", "{}", name(binding));
            assert_eq!(subject["namespace"], NAMESPACE, "{}", name(binding));
            find("ServiceAccount", subject["name"].as_str().unwrap());
        }
    }

    // No wildcard verbs or groups anywhere; a wildcard resource only where the kind cannot be
    // known at install time: infrastructure machines and templates, without watch or update.
    for role in of_kind("ClusterRole").into_iter().chain(of_kind("Role")) {
        for rule in role["rules"].as_array().unwrap() {
            let id = format!("{} rule {rule}", name(role));
            if rule.get("nonResourceURLs").is_some() {
                // Only the metrics reader, only `get /metrics`.
                assert_eq!(name(role), "etcdadm-metrics-reader", "{id}: non-resource URLs");
                assert_eq!(strings(&rule["nonResourceURLs"]), ["/metrics"], "{id}");
                assert_eq!(strings(&rule["verbs"]), ["get"], "{id}");
                continue;
            }
            assert!(!strings(&rule["verbs"]).contains(&"*"), "{id}: wildcard verb");
            assert!(
                !strings(&rule["apiGroups"]).contains(&"*"),
                "{id}: wildcard group"
            );
            if strings(&rule["resources"]).contains(&"*") {
                assert_eq!(name(role), "etcdadm-controller-manager-role", "{id}");
                assert_eq!(
                    strings(&rule["apiGroups"]),
                    ["infrastructure.cluster.x-k8s.io"],
                    "{id}"
                );
                let verbs: BTreeSet<&str> = strings(&rule["verbs"]).into_iter().collect();
                assert!(
                    verbs.is_subset(&BTreeSet::from(["get", "list", "create", "patch", "delete"])),
                    "{id}"
                );
            }
        }
    }

    // Each controller gets what its code does, and not what the other one does.
    let bootstrap = rules_of("ClusterRole", "etcdadm-bootstrap-manager-role");
    let controller = rules_of("ClusterRole", "etcdadm-controller-manager-role");
    const B: &str = "bootstrap.cluster.x-k8s.io";
    const E: &str = "etcdcluster.cluster.x-k8s.io";
    const C: &str = "cluster.x-k8s.io";
    for (group, resource, verb) in [
        (B, "etcdadmconfigs", "watch"),
        (B, "etcdadmconfigs/status", "patch"),
        (C, "machines", "watch"),
        (C, "clusters", "get"),
        (E, "etcdadmclusters", "watch"),
        ("", "configmaps", "create"),
        ("", "configmaps", "delete"),
        ("", "secrets", "create"),
        ("", "secrets", "patch"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(
            allows(bootstrap, group, resource, verb),
            "bootstrap needs {verb} {group}/{resource}"
        );
    }
    for (group, resource, verb) in [
        (C, "machines", "create"),
        (C, "machines", "delete"),
        ("infrastructure.cluster.x-k8s.io", "devmachines", "create"),
        ("", "secrets", "delete"),
        ("", "secrets", "list"),
        (B, "etcdadmconfigs", "update"),
        (E, "etcdadmsnapshots", "get"),
        ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes", "patch"),
    ] {
        assert!(
            !allows(bootstrap, group, resource, verb),
            "bootstrap must not {verb} {group}/{resource}"
        );
    }
    for (group, resource, verb) in [
        (E, "etcdadmclusters", "watch"),
        (E, "etcdadmclusters", "patch"),
        (E, "etcdadmclusters/status", "patch"),
        (E, "etcdadmclusters/finalizers", "update"),
        (E, "etcdadmsnapshots", "watch"),
        (E, "etcdadmsnapshots", "create"),
        (E, "etcdadmsnapshots", "delete"),
        (E, "etcdadmsnapshots/status", "patch"),
        (C, "clusters", "watch"),
        (C, "machines", "create"),
        (C, "machines", "delete"),
        (C, "machines", "patch"),
        (B, "etcdadmconfigs", "create"),
        (B, "etcdadmconfigs", "delete"),
        ("infrastructure.cluster.x-k8s.io", "devmachinetemplates", "get"),
        ("infrastructure.cluster.x-k8s.io", "awsmachines", "create"),
        ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes", "patch"),
        ("", "secrets", "create"),
        // A restored cluster's download URL, once the first member is healthy.
        ("", "secrets", "delete"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(
            allows(controller, group, resource, verb),
            "controller needs {verb} {group}/{resource}"
        );
    }
    for (group, resource, verb) in [
        ("", "configmaps", "create"),
        (B, "etcdadmconfigs/status", "patch"),
        ("infrastructure.cluster.x-k8s.io", "devmachines", "watch"),
        ("infrastructure.cluster.x-k8s.io", "devmachines", "update"),
        ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes", "delete"),
    ] {
        assert!(
            !allows(controller, group, resource, verb),
            "controller must not {verb} {group}/{resource}"
        );
    }
    for role in [bootstrap, controller] {
        assert!(
            !allows(role, "coordination.k8s.io", "leases", "get"),
            "leases only in the namespace"
        );
        // The reviews that guard `/metrics` are a role of their own (both installs bind it
        // cluster-wide; the namespaced one binds these roles in the watched namespace only).
        assert!(!allows(role, "authentication.k8s.io", "tokenreviews", "create"));
    }
    // `/metrics` is guarded by the API server's reviews, which each manager asks for.
    let reviews = rules_of("ClusterRole", "etcdadm-metrics-auth-role");
    assert_eq!(reviews.as_array().unwrap().len(), 2, "reviews only: {reviews}");
    assert!(allows(reviews, "authentication.k8s.io", "tokenreviews", "create"));
    assert!(allows(
        reviews,
        "authorization.k8s.io",
        "subjectaccessreviews",
        "create"
    ));
    let subjects: BTreeSet<&str> = find("ClusterRoleBinding", "etcdadm-metrics-auth-rolebinding")["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        subjects,
        BTreeSet::from(["etcdadm-bootstrap-manager", "etcdadm-controller-manager"])
    );
    // What a scraper's ServiceAccount is bound to: get /metrics, nothing else, bound to nobody
    // by the provider itself.
    let reader = find("ClusterRole", "etcdadm-metrics-reader");
    assert_eq!(reader["rules"].as_array().unwrap().len(), 1);
    assert!(
        of_kind("ClusterRoleBinding")
            .iter()
            .all(|b| b["roleRef"]["name"] != "etcdadm-metrics-reader"),
        "the provider binds the metrics reader to no one"
    );

    // Leader election: a namespaced Role, bound to both service accounts.
    let election = find("Role", "etcdadm-leader-election-role");
    for verb in ["get", "create", "update"] {
        assert!(allows(&election["rules"], "coordination.k8s.io", "leases", verb));
    }
    let bound: BTreeSet<&str> = of_kind("RoleBinding")
        .into_iter()
        .filter(|b| b["roleRef"]["name"] == "etcdadm-leader-election-role")
        .flat_map(|b| b["subjects"].as_array().unwrap().iter())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        bound,
        BTreeSet::from(["etcdadm-bootstrap-manager", "etcdadm-controller-manager"])
    );
}

#[test]
fn capi_core_manager_gets_our_kinds_through_aggregation() {
    let aggregated: Vec<_> = of_kind("ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"] == "true")
        .collect();
    assert_eq!(aggregated.len(), 1, "one aggregated ClusterRole");
    let rules = &aggregated[0]["rules"];
    for (group, resource) in [
        ("bootstrap.cluster.x-k8s.io", "etcdadmconfigs"),
        ("bootstrap.cluster.x-k8s.io", "etcdadmconfigs/status"),
        ("bootstrap.cluster.x-k8s.io", "etcdadmconfigtemplates"),
        ("etcdcluster.cluster.x-k8s.io", "etcdadmclusters"),
        ("etcdcluster.cluster.x-k8s.io", "etcdadmclusters/status"),
        ("etcdcluster.cluster.x-k8s.io", "etcdadmsnapshots"),
        ("etcdcluster.cluster.x-k8s.io", "etcdadmsnapshots/status"),
    ] {
        for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
            assert!(
                allows(rules, group, resource, verb),
                "aggregated role lacks {verb} {group}/{resource}"
            );
        }
    }
    assert!(
        !allows(rules, "", "secrets", "get"),
        "the aggregated role covers our kinds only"
    );
}

#[test]
fn webhooks_reach_existing_services_with_ca_injection() {
    let certificate = find("Certificate", "etcdadm-serving-cert");
    let issuer = certificate["spec"]["issuerRef"]["name"].as_str().unwrap();
    find(certificate["spec"]["issuerRef"]["kind"].as_str().unwrap(), issuer);
    let dns_names = strings(&certificate["spec"]["dnsNames"]);
    let inject = format!("{NAMESPACE}/{}", name(certificate));

    let mut paths = BTreeMap::new();
    for configuration in of_kind("MutatingWebhookConfiguration")
        .into_iter()
        .chain(of_kind("ValidatingWebhookConfiguration"))
    {
        assert_eq!(
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            inject,
            "{}: cert-manager CA injection",
            name(configuration)
        );
        for webhook in configuration["webhooks"].as_array().unwrap() {
            let id = webhook["name"].as_str().unwrap();
            let timeout = webhook["timeoutSeconds"].as_i64();
            assert!(
                timeout.is_some_and(|t| (1..=10).contains(&t)),
                "{id}: timeoutSeconds {timeout:?} must be set, 1 to 10"
            );
            let service_ref = &webhook["clientConfig"]["service"];
            assert_eq!(service_ref["namespace"], NAMESPACE, "{id}");
            let service_name = service_ref["name"].as_str().unwrap();
            let service = find("Service", service_name);
            let port = service_ref["port"].as_i64().unwrap_or(443);
            let service_port = service["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["port"].as_i64() == Some(port))
                .unwrap_or_else(|| panic!("{id}: Service {service_name} has no port {port}"));
            assert_eq!(service_port["targetPort"], "webhook-server", "{id}");
            assert!(
                dns_names.contains(&format!("{service_name}.{NAMESPACE}.svc").as_str()),
                "{id}: the serving certificate does not name {service_name}"
            );
            // The Service selects exactly one of the Deployments.
            let selector = service["spec"]["selector"].as_object().unwrap();
            let backends: Vec<&str> = of_kind("Deployment")
                .into_iter()
                .filter(|d| {
                    selector
                        .iter()
                        .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k] == v)
                })
                .map(name)
                .collect();
            assert_eq!(
                backends.len(),
                1,
                "{id}: Service {service_name} selects {backends:?}"
            );
            assert_eq!(webhook["sideEffects"], "None", "{id}");
            assert_eq!(webhook["failurePolicy"], "Fail", "{id}");
            assert!(
                strings(&webhook["admissionReviewVersions"]).contains(&"v1"),
                "{id}"
            );
            let path = service_ref["path"].as_str().unwrap();
            paths.insert(path.to_string(), backends[0].to_string());
        }
    }
    let expected = [
        (
            "/mutate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster",
            "etcdadm-controller-manager",
        ),
        (
            "/validate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster",
            "etcdadm-controller-manager",
        ),
        (
            "/mutate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfig",
            "etcdadm-bootstrap-manager",
        ),
        (
            "/validate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfig",
            "etcdadm-bootstrap-manager",
        ),
        (
            "/mutate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfigtemplate",
            "etcdadm-bootstrap-manager",
        ),
        (
            "/validate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfigtemplate",
            "etcdadm-bootstrap-manager",
        ),
    ]
    .map(|(p, d)| (p.to_string(), d.to_string()));
    assert_eq!(
        paths,
        BTreeMap::from(expected),
        "webhook paths and who serves them"
    );
    assert_eq!(of_kind("Service").len(), 2, "one webhook Service per Deployment");
}

#[test]
fn clusterctl_variables_are_safe_and_documented() {
    let text = &components().0;
    let rewritten = clusterctl::rewritten_sequences(text);
    assert!(rewritten.is_empty(), "clusterctl would rewrite: {rewritten:#?}");
    let uses = clusterctl::variable_uses(text).unwrap();
    let names: BTreeSet<&str> = uses.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["ETCDADM_IMAGE"]),
        "variables of the components"
    );
    assert!(
        uses.iter().all(|u| u.default.is_some()),
        "every components variable has a default, so `clusterctl init` needs none: {uses:?}"
    );
    let readme = read_repo_file("docs/install.md").unwrap();
    for name in names {
        assert!(readme.contains(name), "docs/install.md does not document {name}");
    }
}

#[test]
fn release_script_writes_the_clusterctl_assets() {
    let out = etcdadm_shared::testing::TempDir::new("etcdadm-release");
    let target = out.path().join("assets");
    let status = Command::new("bash")
        .arg(repo_root().join("hack/release.sh"))
        // The digest pinning: tests/namespaced.rs.
        .arg("--unpinned")
        .arg(&target)
        .status()
        .expect("run hack/release.sh");
    assert!(status.success(), "hack/release.sh failed");
    let written = std::fs::read_to_string(target.join("bootstrap-components.yaml")).unwrap();
    assert_eq!(
        written,
        components().0,
        "bootstrap-components.yaml is the kustomize build"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("metadata.yaml")).unwrap(),
        read_repo_file("metadata.yaml").unwrap()
    );
    let mut templates: Vec<String> = std::fs::read_dir(repo_root().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cluster-template") && n.ends_with(".yaml"))
        .collect();
    templates.sort();
    assert!(templates.len() >= 3, "templates: {templates:?}");
    for template in templates {
        assert_eq!(
            std::fs::read_to_string(target.join(&template)).unwrap(),
            read_repo_file(&format!("templates/{template}")).unwrap(),
            "{template} copied as is"
        );
    }
}

/// cert-manager's two kinds that the components use, as minimal CRDs (any fields accepted): the
/// real ones are cert-manager's to check; these let the rest of the stream be dry-run.
const CERT_MANAGER_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  names: {kind: Certificate, plural: certificates, singular: certificate, listKind: CertificateList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  names: {kind: Issuer, plural: issuers, singular: issuer, listKind: IssuerList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#;

/// `kubectl` with `args` and `stdin` against `server`; panics with its output on failure.
fn kubectl_on(server: &etcdadm_envtest::KubeApiServer, args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = server
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}; {KUBECTL_HINT}"));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "kubectl {args:?} failed:\n{text}");
    text
}

/// What clusterctl would install (variables at their defaults) passes a server-side dry run on a
/// real kube-apiserver: every object valid, every kind known, nothing refused by admission.
#[tokio::test]
async fn components_pass_a_server_side_dry_run_on_a_real_api_server() {
    let server = etcdadm_envtest::KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    kubectl_on(&server, &["apply", "--server-side", "-f", "-"], CERT_MANAGER_CRDS);
    kubectl_on(
        &server,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/certificates.cert-manager.io",
            "crd/issuers.cert-manager.io",
        ],
        "",
    );
    // A dry run creates nothing, so the objects in the provider's namespace need it for real.
    kubectl_on(&server, &["create", "namespace", "etcdadm-system"], "");
    let components = clusterctl::substitute(&components().0, &BTreeMap::new()).unwrap();
    let out = kubectl_on(
        &server,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=clusterctl",
            "-f",
            "-",
        ],
        &components,
    );
    let applied = out.lines().filter(|l| l.contains("(server dry run)")).count();
    assert_eq!(applied, docs().len(), "every document is dry-run applied:\n{out}");
}
