#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The committed CRDs on a real kube-apiserver: accepted (schema, CEL cost budgets), Established,
//! and deciding admission as documented: every bound and rule refuses its negative case with its
//! message and field path, and the reference's manifests are accepted unchanged. The sim's API
//! server evaluates none of this, so only these tests can catch a refusal.

use std::path::{Path, PathBuf};

use etcdadm_envtest::{KubeApiServer, read_crds};
use etcdadm_shared::validation::GO_TLS12_CIPHER_SUITES;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases")
}

async fn server_with_crds() -> KubeApiServer {
    let server = KubeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let crds = read_crds(&crd_dir()).unwrap();
    assert_eq!(crds.len(), 4, "config/crd/bases should hold our four CRDs");
    if let Err(problems) = server.install_crds(&crds).await {
        panic!("a real kube-apiserver refused our CRDs:\n{problems}");
    }
    server
}

#[tokio::test]
async fn every_committed_crd_is_accepted_and_established() {
    server_with_crds().await;
}

/// Server-side dry-run create of `object` in `default`: `Ok` or the server's message.
async fn admit(client: &Client, object: &Value) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let object: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(e) => panic!("dry-run create failed without an answer from the server: {e}"),
    }
}

/// A config spec that sets every field the schema bounds, each within its bound.
fn full_config_spec() -> Value {
    json!({
        "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA ops@example"], "sudo": "ALL=(ALL) NOPASSWD:ALL"},
                  {"name": "audit", "passwdFrom": {"secret": {"name": "pw", "key": "audit"}}}],
        "etcdadmInstallCommands": ["curl -sSL https://example.com/etcdadm -o /usr/local/bin/etcdadm"],
        "preEtcdadmCommands": ["echo pre"],
        "postEtcdadmCommands": ["echo post"],
        "format": "cloud-config",
        "cloudInitConfig": {"version": "3.5.9", "etcdReleaseURL": "https://example.com/etcd", "installDir": "/usr/local/bin"},
        "files": [{"path": "/etc/a", "content": "a"},
                  {"path": "/etc/b", "contentFrom": {"secret": {"name": "s", "key": "b"}}, "encoding": "base64"}],
        "proxy": {"httpProxy": "http://proxy:3128", "noProxy": ["10.0.0.0/8", "localhost"]},
        "registryMirror": {"endpoint": "mirror.example:5000"},
        "cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ntp": {"enabled": true, "servers": ["0.pool.ntp.org"]},
        "certBundles": [{"name": "corp-ca.crt", "data": "-----BEGIN CERTIFICATE-----"}],
        "etcdadmFlavor": "upstream"
    })
}

fn bottlerocket_config() -> Value {
    json!({
        "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9",
        "bootstrapImage": "public.ecr.aws/bottlerocket/bottlerocket-bootstrap:v1",
        "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:3.9",
        "customHostContainers": [{"name": "h", "image": "i", "superpowered": false}],
        "customBootstrapContainers": [{"name": "b", "image": "i", "mode": "once"}]
    })
}

fn config(spec: Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfig",
           "metadata": {"name": "c"}, "spec": spec})
}

fn template(spec: Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmConfigTemplate",
           "metadata": {"name": "t"}, "spec": {"template": {"spec": spec}}})
}

fn s3_store() -> Value {
    json!({"s3": {"endpoint": "https://s3.eu-west-1.amazonaws.com", "bucket": "etcd-backups",
                  "prefix": "prod/", "region": "eu-west-1", "forcePathStyle": false,
                  "credentialsSecretRef": {"name": "s3-credentials"}, "caSecretRef": {"name": "s3-ca"}}})
}

fn backup() -> Value {
    json!({"store": s3_store(), "schedule": "0 */6 * * *", "retention": {"keep": 7, "hourly": 24, "daily": 7, "weekly": 4},
           "beforeChange": {"maxAge": "15m", "keep": 5}, "verify": {"schedule": "0 4 * * *", "sampleKeys": 100}})
}

fn snapshot(spec: Value) -> Value {
    json!({"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmSnapshot",
           "metadata": {"name": "s"}, "spec": spec})
}

fn cluster(spec: Value) -> Value {
    let mut full = json!({
        "replicas": 3,
        "infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevMachineTemplate", "name": "m"},
        "etcdadmConfigSpec": full_config_spec(),
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
        "provisioning": {"parallelMachines": 2},
        "rolloutBefore": {"certificatesExpiryDays": 30},
        "healthCheck": {"interval": "10s", "timeout": "5s", "unhealthyAfter": "5m", "remediation": "Enabled"},
        "failureDomains": ["zone-a", "zone-b", "zone-c"]
    });
    merge(&mut full, spec);
    json!({"apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
           "metadata": {"name": "e"}, "spec": full})
}

/// JSON merge patch semantics: objects merge, anything else replaces.
fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, patch) => *base = patch,
    }
}

/// `config(full spec + patch)`.
fn config_with(patch: Value) -> Value {
    let mut spec = full_config_spec();
    merge(&mut spec, patch);
    config(spec)
}

/// A cipher suite list of exactly 2048 characters, every entry a name Go knows (the last one
/// padded with spaces, which admission trims).
fn longest_cipher_suites() -> String {
    let mut list = String::new();
    for name in GO_TLS12_CIPHER_SUITES.iter().cycle() {
        if list.len() + name.len() + 1 > 2048 {
            break;
        }
        if !list.is_empty() {
            list.push(',');
        }
        list.push_str(name);
    }
    format!("{list:<2048}")
}

fn strings(n: usize, prefix: &str) -> Value {
    (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>().into()
}

fn objects(n: usize, make: impl Fn(usize) -> Value) -> Value {
    (0..n).map(make).collect::<Vec<_>>().into()
}

fn reference_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .filter(|doc| {
            let api_version = doc["apiVersion"].as_str().unwrap_or_default();
            api_version.starts_with("bootstrap.cluster.x-k8s.io/")
                || api_version.starts_with("etcdcluster.cluster.x-k8s.io/")
        })
        .map(|mut doc| {
            doc["metadata"]["namespace"] = "default".into();
            doc
        })
        .collect()
}

#[tokio::test]
async fn admission_accepts_valid_objects_and_refuses_each_bound_and_rule_with_its_message() {
    let server = server_with_crds().await;
    let client = server.client().await.unwrap();

    let mut accepted = vec![
        ("full config", config(full_config_spec())),
        ("empty config", config(json!({}))),
        (
            "bottlerocket config",
            config(json!({"format": "bottlerocket", "bottlerocketConfig": bottlerocket_config()})),
        ),
        ("full template", template(full_config_spec())),
        ("full cluster", cluster(json!({}))),
        ("cluster with backups", cluster(json!({"backup": backup()}))),
        (
            "cluster restored from a snapshot by name",
            cluster(json!({"restore": {"snapshot": {"name": "c1-snap"}}})),
        ),
        (
            "cluster restored to the latest write of continuous backup",
            cluster(json!({"restore": {"snapshot": {"name": "c1-snap"}, "to": {"latest": true}}})),
        ),
        (
            "cluster restored to a revision",
            cluster(json!({"restore": {"snapshot": {"name": "c1-snap"}, "to": {"revision": 48211}}})),
        ),
        (
            "cluster restored to a time",
            cluster(
                json!({"restore": {"snapshot": {"name": "c1-snap"}, "to": {"time": "2026-11-28T14:09:00Z"}}}),
            ),
        ),
        (
            "cluster restored from a store and key",
            cluster(json!({"restore": {"snapshot": {"store": s3_store(), "key": "prod/default/c1/s.db"}}})),
        ),
        (
            "cluster restored from a store and key with its SHA-256",
            cluster(
                json!({"restore": {"snapshot": {"store": s3_store(), "key": "k", "sha256": "aB".repeat(32)}}}),
            ),
        ),
        (
            "a plain http store allowed by insecure",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "http://minio:9000", "insecure": true}}}))}),
            ),
        ),
        (
            "a store encrypting with a KMS key",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"sse": "aws:kms", "sseKMSKeyID": "alias/etcd"}}}))}),
            ),
        ),
        (
            "a store encrypting with AES256",
            cluster(json!({"backup": merged(backup(), json!({"store": {"s3": {"sse": "AES256"}}}))})),
        ),
        ("snapshot", snapshot(json!({"clusterName": "c1-etcd"}))),
        (
            "health checks at their bounds",
            cluster(json!({"healthCheck": {"interval": "10m", "timeout": "30s", "unhealthyAfter": "10m"}})),
        ),
        (
            "health checks at their lower bounds",
            cluster(json!({"healthCheck": {"interval": "1s", "timeout": "1ms", "unhealthyAfter": "1s"}})),
        ),
        (
            "certificatesExpiryDays at its minimum",
            cluster(json!({"rolloutBefore": {"certificatesExpiryDays": 7}})),
        ),
        (
            "certificatesExpiryDays at its maximum",
            cluster(json!({"rolloutBefore": {"certificatesExpiryDays": 180}})),
        ),
        (
            "one member",
            cluster(json!({"replicas": 1, "failureDomains": ["only"]})),
        ),
        // The quota as a number or a quantity (int-or-string), alarm repair by hand.
        (
            "quota in bytes",
            config_with(json!({"quotaBackendBytes": 8_589_934_592_u64})),
        ),
        (
            "quota as a quantity",
            config_with(json!({"quotaBackendBytes": "8Gi"})),
        ),
        (
            "alarms repaired by hand",
            cluster(json!({"maintenance": {"alarms": "Manual"}})),
        ),
        // etcd settings as numbers or strings; corruption checks off; a full defragmentation policy.
        (
            "etcd settings",
            config_with(json!({"corruptionChecks": "Disabled", "etcdSettings": {
                "snapshot-count": 20000, "auto-compaction-retention": "30m", "max-request-bytes": "2Mi"}})),
        ),
        (
            "a defragmentation policy",
            cluster(json!({"maintenance": {"defragmentation": {
                "mode": "Automatic", "fragmentedPercent": 99, "minimumSize": "200Mi", "quotaPercent": 100,
                "minimumReclaimable": 1048576, "interval": "30m",
                "window": {"start": "0 2 * * *", "duration": "4h"}}}})),
        ),
        // The latest time the server accepts: the controller must read it too.
        (
            "rolloutAfter at the end of year 9999",
            cluster(json!({"rolloutAfter": "9999-12-31T23:59:59Z"})),
        ),
        (
            "every bound at its limit",
            config_with(json!({
                "users": objects(32, |i| json!({"name": format!("u{i}"), "sshAuthorizedKeys": strings(64, "k")})),
                "preEtcdadmCommands": strings(64, "c"),
                "files": objects(128, |i| json!({"path": format!("/f/{i}{}", "x".repeat(if i == 0 { 4096 - 4 } else { 0 }))})),
                "certBundles": objects(64, |i| json!({"name": format!("b{i}{}", "n".repeat(if i == 0 { 253 - 2 } else { 0 })), "data": "d"})),
                "cipherSuites": longest_cipher_suites(),
                "ntp": {"servers": strings(32, "s")},
                "proxy": {"noProxy": strings(256, "h")},
            })),
        ),
    ];
    for dir in [
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference-etcdadmconfig.yaml"),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference-external-etcd.yaml"),
    ] {
        for doc in reference_documents(&dir) {
            accepted.push(("reference manifest", doc));
        }
    }
    let mut failures = vec![];
    for (what, object) in &accepted {
        if let Err(message) = admit(&client, object).await {
            failures.push(format!("{what} ({}) was refused: {message}", object["kind"]));
        }
    }

    // (what, object, words the refusal must contain: the field path first)
    let refused: Vec<(&str, Value, &[&str])> = vec![
        // EtcdadmConfig: lists bounded, unique keys by list type, enums, CEL rules, string bounds.
        (
            "33 users",
            config_with(json!({"users": objects(33, |i| json!({"name": format!("u{i}")}))})),
            &["spec.users", "must have at most 32 items"],
        ),
        (
            "two users of one name",
            config_with(json!({"users": [{"name": "a"}, {"name": "a"}]})),
            &["spec.users[1]", "Duplicate value"],
        ),
        (
            "65 ssh keys",
            config_with(json!({"users": [{"name": "a", "sshAuthorizedKeys": strings(65, "k")}]})),
            &["spec.users[0].sshAuthorizedKeys", "must have at most 64 items"],
        ),
        (
            "65 install commands",
            config_with(json!({"etcdadmInstallCommands": strings(65, "c")})),
            &["spec.etcdadmInstallCommands", "must have at most 64 items"],
        ),
        (
            "65 pre commands",
            config_with(json!({"preEtcdadmCommands": strings(65, "c")})),
            &["spec.preEtcdadmCommands", "must have at most 64 items"],
        ),
        (
            "65 post commands",
            config_with(json!({"postEtcdadmCommands": strings(65, "c")})),
            &["spec.postEtcdadmCommands", "must have at most 64 items"],
        ),
        (
            "129 files",
            config_with(json!({"files": objects(129, |i| json!({"path": format!("/f{i}")}))})),
            &["spec.files", "must have at most 128 items"],
        ),
        (
            "two files of one path",
            config_with(json!({"files": [{"path": "/etc/a"}, {"path": "/etc/a"}]})),
            &["spec.files[1]", "Duplicate value"],
        ),
        (
            "a relative file path",
            config_with(json!({"files": [{"path": "etc/a"}]})),
            &["spec.files[0].path", "path must be absolute"],
        ),
        (
            "a file path over PATH_MAX",
            config_with(json!({"files": [{"path": format!("/{}", "p".repeat(4096))}]})),
            &["spec.files[0].path", "Too long", "4096"],
        ),
        (
            "content and contentFrom",
            config_with(
                json!({"files": [{"path": "/a", "content": "x", "contentFrom": {"secret": {"name": "s", "key": "k"}}}]}),
            ),
            &["spec.files[0]", "content and contentFrom are mutually exclusive"],
        ),
        (
            "an unknown file encoding",
            config_with(json!({"files": [{"path": "/a", "encoding": "zip"}]})),
            &["spec.files[0].encoding", "Unsupported value"],
        ),
        (
            "an unknown alarm repair",
            cluster(json!({"maintenance": {"alarms": "Sometimes"}})),
            &["spec.maintenance.alarms", "Unsupported value"],
        ),
        (
            "17 etcd settings",
            config_with(
                json!({"etcdSettings": (0..17).map(|i| (format!("s{i}"), json!(i))).collect::<serde_json::Map<_, _>>()}),
            ),
            &["spec.etcdSettings", "must have at most 16 items"],
        ),
        (
            "an unknown corruption check setting",
            config_with(json!({"corruptionChecks": "Sometimes"})),
            &["spec.corruptionChecks", "Unsupported value"],
        ),
        (
            "an unknown defragmentation mode",
            cluster(json!({"maintenance": {"defragmentation": {"mode": "Sometimes"}}})),
            &["spec.maintenance.defragmentation.mode", "Unsupported value"],
        ),
        (
            "fragmentation of 100%",
            cluster(json!({"maintenance": {"defragmentation": {"fragmentedPercent": 100}}})),
            &[
                "spec.maintenance.defragmentation.fragmentedPercent",
                "less than or equal to 99",
            ],
        ),
        (
            "a long cipher suite list",
            config_with(json!({"cipherSuites": "x".repeat(2049)})),
            &["spec.cipherSuites", "Too long", "2048"],
        ),
        (
            "65 cert bundles",
            config_with(
                json!({"certBundles": objects(65, |i| json!({"name": format!("b{i}"), "data": "d"}))}),
            ),
            &["spec.certBundles", "must have at most 64 items"],
        ),
        (
            "two cert bundles of one name",
            config_with(json!({"certBundles": [{"name": "a", "data": "d"}, {"name": "a", "data": "e"}]})),
            &["spec.certBundles[1]", "Duplicate value"],
        ),
        (
            "a cert bundle name with a slash",
            config_with(json!({"certBundles": [{"name": "../etc/passwd", "data": "d"}]})),
            &["spec.certBundles[0].name", "name must be a plain file name"],
        ),
        (
            "a long cert bundle name",
            config_with(json!({"certBundles": [{"name": "n".repeat(254), "data": "d"}]})),
            &["spec.certBundles[0].name", "Too long", "253"],
        ),
        (
            "a version with a v",
            config_with(json!({"cloudInitConfig": {"version": "v3.5.9"}})),
            &["spec.cloudInitConfig.version", "should match"],
        ),
        (
            "a 1 MiB version",
            config_with(json!({"cloudInitConfig": {"version": format!("3.5.{}", "9".repeat(1 << 20))}})),
            &["spec.cloudInitConfig.version", "Too long", "64"],
        ),
        (
            "a long release URL",
            config_with(json!({"cloudInitConfig": {"etcdReleaseURL": "u".repeat(2049)}})),
            &["spec.cloudInitConfig.etcdReleaseURL", "Too long", "2048"],
        ),
        (
            "a long install dir",
            config_with(json!({"cloudInitConfig": {"installDir": "d".repeat(4097)}})),
            &["spec.cloudInitConfig.installDir", "Too long", "4096"],
        ),
        (
            "257 no-proxy entries",
            config_with(json!({"proxy": {"noProxy": strings(257, "h")}})),
            &["spec.proxy.noProxy", "must have at most 256 items"],
        ),
        (
            "33 NTP servers",
            config_with(json!({"ntp": {"servers": strings(33, "s")}})),
            &["spec.ntp.servers", "must have at most 32 items"],
        ),
        (
            "an unknown format",
            config_with(json!({"format": "ignition"})),
            &["spec.format", "Unsupported value"],
        ),
        (
            "an unknown flavor",
            config_with(json!({"etcdadmFlavor": "eksa"})),
            &["spec.etcdadmFlavor", "Unsupported value"],
        ),
        (
            "an unknown bootstrap container mode",
            config(json!({"format": "bottlerocket", "bottlerocketConfig":
                merged(bottlerocket_config(), json!({"customBootstrapContainers": [{"name": "b", "image": "i", "mode": "sometimes"}]}))})),
            &[
                "spec.bottlerocketConfig.customBootstrapContainers[0].mode",
                "Unsupported value",
                "always",
            ],
        ),
        (
            "two bootstrap containers of one name",
            config(json!({"format": "bottlerocket", "bottlerocketConfig":
                merged(bottlerocket_config(), json!({"customBootstrapContainers": [{"name": "b", "image": "i", "mode": "once"}, {"name": "b", "image": "j", "mode": "once"}]}))})),
            &[
                "spec.bottlerocketConfig.customBootstrapContainers[1]",
                "Duplicate value",
            ],
        ),
        (
            "33 bootstrap containers",
            config(json!({"format": "bottlerocket", "bottlerocketConfig":
                merged(bottlerocket_config(), json!({"customBootstrapContainers": objects(33, |i| json!({"name": format!("b{i}"), "image": "i", "mode": "once"}))}))})),
            &[
                "spec.bottlerocketConfig.customBootstrapContainers",
                "must have at most 32 items",
            ],
        ),
        (
            "two host containers of one name",
            config(json!({"format": "bottlerocket", "bottlerocketConfig":
                merged(bottlerocket_config(), json!({"customHostContainers": [{"name": "h", "image": "i", "superpowered": false}, {"name": "h", "image": "j", "superpowered": true}]}))})),
            &[
                "spec.bottlerocketConfig.customHostContainers[1]",
                "Duplicate value",
            ],
        ),
        (
            "33 host containers",
            config(json!({"format": "bottlerocket", "bottlerocketConfig":
                merged(bottlerocket_config(), json!({"customHostContainers": objects(33, |i| json!({"name": format!("h{i}"), "image": "i", "superpowered": false}))}))})),
            &[
                "spec.bottlerocketConfig.customHostContainers",
                "must have at most 32 items",
            ],
        ),
        // The template embeds the same schema one level down.
        (
            "a template with two files of one path",
            template(merged(
                full_config_spec(),
                json!({"files": [{"path": "/a"}, {"path": "/a"}]}),
            )),
            &["spec.template.spec.files[1]", "Duplicate value"],
        ),
        (
            "a template with a relative path",
            template(json!({"files": [{"path": "a"}]})),
            &["spec.template.spec.files[0].path", "path must be absolute"],
        ),
        // EtcdadmCluster: its own rules, and the embedded config spec.
        (
            "an even replica count",
            cluster(json!({"replicas": 2})),
            &["spec.replicas", "replicas must be odd and at least 1"],
        ),
        (
            "zero replicas",
            cluster(json!({"replicas": 0})),
            &["spec.replicas", "replicas must be odd and at least 1"],
        ),
        (
            "replicas beyond int32",
            cluster(json!({"replicas": 1_099_511_627_777_i64})),
            &["spec.replicas", "should be less than or equal to 2147483647"],
        ),
        (
            "a repeated failure domain",
            cluster(json!({"failureDomains": ["a", "b", "a"]})),
            &["spec.failureDomains[2]", "Duplicate value"],
        ),
        (
            "an empty failure domain",
            cluster(json!({"failureDomains": ["a", ""]})),
            &["spec.failureDomains[1]", "at least 1 chars long"],
        ),
        (
            "a long failure domain",
            cluster(json!({"failureDomains": ["f".repeat(254)]})),
            &["spec.failureDomains[0]", "Too long", "253"],
        ),
        (
            "65 failure domains",
            cluster(json!({"failureDomains": strings(65, "z")})),
            &["spec.failureDomains", "must have at most 64 items"],
        ),
        (
            "a rollout type other than RollingUpdate",
            cluster(json!({"rolloutStrategy": {"type": "Recreate"}})),
            &["spec.rolloutStrategy.type", "Unsupported value", "RollingUpdate"],
        ),
        (
            "maxSurge 2",
            cluster(json!({"rolloutStrategy": {"rollingUpdate": {"maxSurge": 2}}})),
            &[
                "spec.rolloutStrategy.rollingUpdate.maxSurge",
                "maxSurge must be 0 or 1",
            ],
        ),
        (
            "parallelMachines 0",
            cluster(json!({"provisioning": {"parallelMachines": 0}})),
            &[
                "spec.provisioning.parallelMachines",
                "parallelMachines must be at least 1",
            ],
        ),
        (
            "certificatesExpiryDays below 7",
            cluster(json!({"rolloutBefore": {"certificatesExpiryDays": 6}})),
            &[
                "spec.rolloutBefore.certificatesExpiryDays",
                "should be greater than or equal to 7",
            ],
        ),
        (
            "certificatesExpiryDays over 180",
            cluster(json!({"rolloutBefore": {"certificatesExpiryDays": 181}})),
            &[
                "spec.rolloutBefore.certificatesExpiryDays",
                "should be less than or equal to 180",
            ],
        ),
        (
            "certificatesExpiryDays that is not an integer",
            cluster(json!({"rolloutBefore": {"certificatesExpiryDays": "30"}})),
            &[
                "spec.rolloutBefore.certificatesExpiryDays",
                "must be of type integer",
            ],
        ),
        (
            "a health interval that is not a duration",
            cluster(json!({"healthCheck": {"interval": "often"}})),
            &["spec.healthCheck.interval", "should match"],
        ),
        // Health checks: a check holds a reconcile turn for its timeout (issue 44).
        (
            "a health interval over 10m",
            cluster(json!({"healthCheck": {"interval": "11m", "timeout": "5s", "unhealthyAfter": "1h"}})),
            &["spec.healthCheck.interval", "interval must be 1s to 10m"],
        ),
        (
            "a health interval under 1s",
            cluster(json!({"healthCheck": {"interval": "500ms", "timeout": "100ms"}})),
            &["spec.healthCheck.interval", "interval must be 1s to 10m"],
        ),
        (
            "a health timeout over 30s",
            cluster(json!({"healthCheck": {"interval": "5m", "timeout": "31s"}})),
            &[
                "spec.healthCheck.timeout",
                "timeout must be above zero and at most 30s",
            ],
        ),
        (
            "a health timeout of zero",
            cluster(json!({"healthCheck": {"timeout": "0s"}})),
            &[
                "spec.healthCheck.timeout",
                "timeout must be above zero and at most 30s",
            ],
        ),
        (
            "a health timeout over the interval",
            cluster(json!({"healthCheck": {"interval": "5s", "timeout": "6s"}})),
            &["spec.healthCheck.timeout", "timeout must not exceed the interval"],
        ),
        (
            "a health timeout over the default interval",
            cluster(json!({"healthCheck": {"interval": null, "timeout": "11s"}})),
            &[
                "spec.healthCheck.timeout",
                "timeout must not exceed the interval (default 10s)",
            ],
        ),
        (
            "unhealthyAfter under the interval",
            cluster(json!({"healthCheck": {"interval": "1m", "unhealthyAfter": "30s"}})),
            &["spec.healthCheck.unhealthyAfter", "must be at least the interval"],
        ),
        (
            "a health duration of 33 characters",
            cluster(json!({"healthCheck": {"interval": format!("{}s", "0".repeat(31) + "9")}})),
            &["spec.healthCheck.interval", "Too long", "32"],
        ),
        (
            "an unknown remediation",
            cluster(json!({"healthCheck": {"remediation": "Sometimes"}})),
            &["spec.healthCheck.remediation", "Unsupported value"],
        ),
        (
            "a backup store without a bucket",
            cluster(
                json!({"backup": {"store": {"s3": {"endpoint": "https://s3.example.com", "credentialsSecretRef": {"name": "c"}}}}}),
            ),
            &["spec.backup.store.s3.bucket", "Required value"],
        ),
        (
            "a backup store without credentials",
            cluster(
                json!({"backup": {"store": {"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd-backups"}}}}),
            ),
            &["spec.backup.store.s3.credentialsSecretRef", "Required value"],
        ),
        (
            "a bucket name of two characters",
            cluster(json!({"backup": merged(backup(), json!({"store": {"s3": {"bucket": "ab"}}}))})),
            &["spec.backup.store.s3.bucket", "at least 3 chars long"],
        ),
        (
            "a bucket name of 64 characters",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"bucket": "b".repeat(64)}}}))}),
            ),
            &["spec.backup.store.s3.bucket", "Too long", "63"],
        ),
        (
            "an endpoint that is not http",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "s3.example.com"}}}))}),
            ),
            &[
                "spec.backup.store.s3.endpoint",
                "endpoint must be an http:// or https:// URL",
            ],
        ),
        (
            "a long endpoint",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": format!("https://{}", "e".repeat(2048))}}}))}),
            ),
            &["spec.backup.store.s3.endpoint", "Too long", "2048"],
        ),
        (
            "a long prefix",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"prefix": "p".repeat(513)}}}))}),
            ),
            &["spec.backup.store.s3.prefix", "Too long", "512"],
        ),
        (
            "a long schedule",
            cluster(json!({"backup": merged(backup(), json!({"schedule": "*".repeat(129)}))})),
            &["spec.backup.schedule", "Too long", "128"],
        ),
        (
            "retention keeping none",
            cluster(json!({"backup": merged(backup(), json!({"retention": {"keep": 0}}))})),
            &[
                "spec.backup.retention.keep",
                "should be greater than or equal to 1",
            ],
        ),
        (
            "retention keeping too many",
            cluster(json!({"backup": merged(backup(), json!({"retention": {"keep": 10001}}))})),
            &[
                "spec.backup.retention.keep",
                "should be less than or equal to 10000",
            ],
        ),
        (
            "retention with neither keep nor a tier",
            cluster(
                json!({"backup": merged(backup(), json!({"retention": {"keep": null, "hourly": null, "daily": null, "weekly": null}}))}),
            ),
            &["spec.backup.retention", "set keep or a tier"],
        ),
        (
            "an hourly tier of none",
            cluster(json!({"backup": merged(backup(), json!({"retention": {"hourly": 0}}))})),
            &[
                "spec.backup.retention.hourly",
                "should be greater than or equal to 1",
            ],
        ),
        (
            "a weekly tier too long",
            cluster(json!({"backup": merged(backup(), json!({"retention": {"weekly": 1001}}))})),
            &[
                "spec.backup.retention.weekly",
                "should be less than or equal to 1000",
            ],
        ),
        (
            "a before-change maxAge that is no duration",
            cluster(json!({"backup": merged(backup(), json!({"beforeChange": {"maxAge": "ten minutes"}}))})),
            &["spec.backup.beforeChange.maxAge", "should match"],
        ),
        (
            "keeping no before-change snapshot",
            cluster(json!({"backup": merged(backup(), json!({"beforeChange": {"keep": 0}}))})),
            &[
                "spec.backup.beforeChange.keep",
                "should be greater than or equal to 1",
            ],
        ),
        (
            "a continuous backup every second",
            cluster(json!({"backup": merged(backup(), json!({"continuous": {"interval": "1s"}}))})),
            &[
                "spec.backup.continuous.interval",
                "must be a duration from 5s to 10m",
            ],
        ),
        (
            "a continuous backup every hour",
            cluster(json!({"backup": merged(backup(), json!({"continuous": {"interval": "1h"}}))})),
            &[
                "spec.backup.continuous.interval",
                "must be a duration from 5s to 10m",
            ],
        ),
        (
            "a restore drill without a schedule",
            cluster(json!({"backup": merged(backup(), json!({"verify": {"schedule": null}}))})),
            &["spec.backup.verify.schedule", "Required value"],
        ),
        (
            "a restore drill sampling too many keys",
            cluster(
                json!({"backup": merged(backup(), json!({"verify": {"schedule": "@daily", "sampleKeys": 1001}}))}),
            ),
            &[
                "spec.backup.verify.sampleKeys",
                "should be less than or equal to 1000",
            ],
        ),
        (
            "a restore naming nothing",
            cluster(json!({"restore": {"snapshot": {}}})),
            &["spec.restore.snapshot", "set either name, or store and key"],
        ),
        (
            "a restore naming a snapshot and a key",
            cluster(json!({"restore": {"snapshot": {"name": "s", "store": s3_store(), "key": "k"}}})),
            &["spec.restore.snapshot", "set either name, or store and key"],
        ),
        (
            "a restore to two points",
            cluster(json!({"restore": {"snapshot": {"name": "s"}, "to": {"latest": true, "revision": 7}}})),
            &["spec.restore.to", "set exactly one of latest, revision and time"],
        ),
        (
            "a restore to latest: false",
            cluster(json!({"restore": {"snapshot": {"name": "s"}, "to": {"latest": false}}})),
            &["spec.restore.to.latest", "latest: true, or leave it unset"],
        ),
        (
            "a restore to a point of a store object",
            cluster(
                json!({"restore": {"snapshot": {"store": s3_store(), "key": "k"}, "to": {"latest": true}}}),
            ),
            &["spec.restore.to", "to needs snapshot.name"],
        ),
        (
            "a restore key without its store",
            cluster(json!({"restore": {"snapshot": {"key": "k"}}})),
            &["spec.restore.snapshot", "store and key go together"],
        ),
        (
            "a plain http store without insecure",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "http://minio:9000"}}}))}),
            ),
            &[
                "spec.backup.store.s3.endpoint",
                "endpoint must be an https:// URL; a plain http:// store needs insecure: true",
            ],
        ),
        (
            "a plain http restore store without insecure",
            cluster(json!({"restore": {"snapshot": {"key": "k",
                "store": merged(s3_store(), json!({"s3": {"endpoint": "http://minio:9000"}}))}}})),
            &["spec.restore.snapshot.store.s3.endpoint", "needs insecure: true"],
        ),
        (
            "a KMS key without aws:kms",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"sse": "AES256", "sseKMSKeyID": "k"}}}))}),
            ),
            &[
                "spec.backup.store.s3.sseKMSKeyID",
                "sseKMSKeyID needs sse: aws:kms",
            ],
        ),
        (
            "an encryption the store does not know",
            cluster(json!({"backup": merged(backup(), json!({"store": {"s3": {"sse": "ROT13"}}}))})),
            &["spec.backup.store.s3.sse", "Unsupported value"],
        ),
        (
            "a restore SHA-256 that is not 64 hex digits",
            cluster(
                json!({"restore": {"snapshot": {"store": s3_store(), "key": "k", "sha256": "g".repeat(64)}}}),
            ),
            &["spec.restore.snapshot.sha256", "should match"],
        ),
        (
            "a restore SHA-256 for a named snapshot",
            cluster(json!({"restore": {"snapshot": {"name": "s", "sha256": "a".repeat(64)}}})),
            &["spec.restore.snapshot.sha256", "sha256 goes with store and key"],
        ),
        (
            "a snapshot of no cluster",
            snapshot(json!({"clusterName": ""})),
            &["spec.clusterName", "at least 1 chars long"],
        ),
        (
            "a snapshot without a cluster",
            snapshot(json!({})),
            &["spec.clusterName", "Required value"],
        ),
        (
            "a cluster config spec with two users of one name",
            cluster(json!({"etcdadmConfigSpec": {"users": [{"name": "a"}, {"name": "a"}]}})),
            &["spec.etcdadmConfigSpec.users[1]", "Duplicate value"],
        ),
        (
            "a cluster config spec with a bad bundle name",
            cluster(json!({"etcdadmConfigSpec": {"certBundles": [{"name": "a b", "data": "d"}]}})),
            &[
                "spec.etcdadmConfigSpec.certBundles[0].name",
                "name must be a plain file name",
            ],
        ),
    ];
    for (what, object, words) in &refused {
        match admit(&client, object).await {
            Ok(()) => failures.push(format!("{what}: accepted, should be refused with {words:?}")),
            Err(message) => {
                let missing: Vec<&&str> = words.iter().filter(|w| !message.contains(**w)).collect();
                if !missing.is_empty() {
                    failures.push(format!(
                        "{what}: refused, but the message lacks {missing:?}: {message}"
                    ));
                }
            }
        }
    }
    println!("{} admission cases", accepted.len() + refused.len());
    assert!(
        failures.is_empty(),
        "{} of {} admission cases went wrong:\n{}",
        failures.len(),
        accepted.len() + refused.len(),
        failures.join("\n")
    );
}

/// `(what, object)` rows the API server must accept, and `(what, object, words)` rows it must
/// refuse with every one of `words` (the field path first) in its message; the failures.
async fn judge(
    client: &Client,
    accepted: &[(&str, Value)],
    refused: &[(&str, Value, &[&str])],
) -> Vec<String> {
    let mut failures = vec![];
    for (what, object) in accepted {
        if let Err(message) = admit(client, object).await {
            failures.push(format!("{what}: refused, should be accepted: {message}"));
        }
    }
    for (what, object, words) in refused {
        match admit(client, object).await {
            Ok(()) => failures.push(format!("{what}: accepted, should be refused with {words:?}")),
            Err(message) => {
                let missing: Vec<&&str> = words.iter().filter(|w| !message.contains(**w)).collect();
                if !missing.is_empty() {
                    failures.push(format!(
                        "{what}: refused, but the message lacks {missing:?}: {message}"
                    ));
                }
            }
        }
    }
    failures
}

fn window(start: &str, duration: &str) -> Value {
    json!({"maintenance": {"defragmentation": {"window": {"start": start, "duration": duration}}}})
}

fn defragmentation(policy: Value) -> Value {
    json!({"maintenance": {"defragmentation": policy}})
}

/// What admission refuses and the schema can say is refused by the API server itself, so a
/// cluster without the webhooks refuses it too (docs/operating.md, "Bad input"): sizes as
/// quantities within bounds, durations with a minimum, the infrastructure template's kind,
/// name and group, and the rules across fields. What only the webhook can judge (a cron
/// expression's field ranges) is accepted here and left to it and to the controller.
#[tokio::test]
async fn the_schema_refuses_what_admission_refuses_where_cel_can_say_it() {
    let server = server_with_crds().await;
    let client = server.client().await.unwrap();
    let bottlerocket = json!({"format": "bottlerocket", "bottlerocketConfig": bottlerocket_config()});
    let accepted = [
        (
            "quota at its minimum, as a quantity",
            config_with(json!({"quotaBackendBytes": "16Mi"})),
        ),
        (
            "quota at its maximum, in bytes",
            config_with(json!({"quotaBackendBytes": 34_359_738_368_u64})),
        ),
        (
            "quota as a decimal quantity",
            config_with(json!({"quotaBackendBytes": "1.5Gi"})),
        ),
        (
            "quota on a cluster",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "8Gi"}})),
        ),
        (
            "defragmentation sizes of zero",
            cluster(defragmentation(
                json!({"minimumSize": 0, "minimumReclaimable": "0"}),
            )),
        ),
        (
            "a defragmentation interval and window of 1m",
            cluster(merged(
                window("0 2 * * *", "1m"),
                defragmentation(json!({"interval": "1m"})),
            )),
        ),
        (
            "an automatic recovery after 10m with a store",
            cluster(json!({"backup": backup(), "recovery": {"automatic": true, "after": "10m"}})),
        ),
        (
            "a template of another infrastructure version",
            cluster(
                json!({"infrastructureTemplate": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2"}}),
            ),
        ),
        (
            "a user name with a trailing $ and a mirror with a port and path",
            config_with(
                json!({"users": [{"name": "_svc-1$"}], "registryMirror": {"endpoint": "[::1]:5000/v2/mirror"}}),
            ),
        ),
        (
            "cipher suites spaced and blank",
            config(
                json!({"cipherSuites": " TLS_RSA_WITH_AES_128_CBC_SHA , TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 "}),
            ),
        ),
        ("no cipher suites", config(json!({"cipherSuites": "  "}))),
        (
            "a store on a plain host and port with a path",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "https://10.0.0.5:9000/s3", "bucket": "a.b-c"}}}))}),
            ),
        ),
        // Only the webhook and the controller read a cron expression's field ranges.
        (
            "a window whose cron only admission reads",
            cluster(window("61 25 * * *", "2h")),
        ),
    ];
    let quota = "must be a whole number of bytes from 16.0 MiB to 32.0 GiB";
    let cluster_quota = "spec.etcdadmConfigSpec.quotaBackendBytes";
    let refused: [(&str, Value, &[&str]); 38] = [
        (
            "the issue's 1Ki quota on a cluster",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "1Ki"}})),
            &[cluster_quota, quota],
        ),
        (
            "a 1Ki quota on a config",
            config_with(json!({"quotaBackendBytes": "1Ki"})),
            &["spec.quotaBackendBytes", quota],
        ),
        (
            "a 1Ki quota on a template",
            template(merged(full_config_spec(), json!({"quotaBackendBytes": "1Ki"}))),
            &["spec.template.spec.quotaBackendBytes", quota],
        ),
        (
            "a quota of 1024 bytes",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": 1024}})),
            &[cluster_quota, quota],
        ),
        (
            "a quota above 32Gi",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "33Gi"}})),
            &[cluster_quota, quota],
        ),
        (
            "a quota of half a byte",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "16777216.5"}})),
            &[cluster_quota, quota],
        ),
        (
            "a quota with an exponent",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "1e9"}})),
            &[cluster_quota, quota],
        ),
        (
            "a quota that is no size",
            cluster(json!({"etcdadmConfigSpec": {"quotaBackendBytes": "lots"}})),
            &[cluster_quota, quota],
        ),
        (
            "a negative minimumSize",
            cluster(defragmentation(json!({"minimumSize": -1}))),
            &[
                "spec.maintenance.defragmentation.minimumSize",
                "must be a whole number of bytes",
            ],
        ),
        (
            "a minimumReclaimable in millibytes",
            cluster(defragmentation(json!({"minimumReclaimable": "1500m"}))),
            &[
                "spec.maintenance.defragmentation.minimumReclaimable",
                "must be a whole number of bytes",
            ],
        ),
        (
            "a defragmentation interval of 30s",
            cluster(defragmentation(json!({"interval": "30s"}))),
            &[
                "spec.maintenance.defragmentation.interval",
                "interval must be a duration of at least 1m",
            ],
        ),
        (
            "a defragmentation interval in words",
            cluster(defragmentation(json!({"interval": "ten minutes"}))),
            &["spec.maintenance.defragmentation.interval", "should match"],
        ),
        (
            "a window open for 59s",
            cluster(window("0 2 * * *", "59s")),
            &[
                "spec.maintenance.defragmentation.window.duration",
                "duration must be a duration of at least 1m",
            ],
        ),
        (
            "a window open for ever",
            cluster(window("0 2 * * *", "forever")),
            &["spec.maintenance.defragmentation.window.duration", "should match"],
        ),
        (
            "an automatic recovery after 5m",
            cluster(json!({"backup": backup(), "recovery": {"automatic": true, "after": "5m"}})),
            &["spec.recovery.after", "after must be a duration of at least 10m"],
        ),
        (
            "an automatic recovery without a store",
            cluster(json!({"recovery": {"automatic": true}})),
            &["spec.recovery.automatic", "needs spec.backup.store"],
        ),
        (
            "a template without a kind",
            cluster(json!({"infrastructureTemplate": {"kind": ""}})),
            &["spec.infrastructureTemplate.kind", "kind is required"],
        ),
        (
            "a template without a name",
            cluster(json!({"infrastructureTemplate": {"name": null}})),
            &["spec.infrastructureTemplate.name", "name is required"],
        ),
        (
            "a template of another group",
            cluster(json!({"infrastructureTemplate": {"apiVersion": "cluster.x-k8s.io/v1beta1"}})),
            &[
                "spec.infrastructureTemplate.apiVersion",
                "infrastructure.cluster.x-k8s.io/<version>",
            ],
        ),
        (
            "bottlerocketConfig with cloud-config",
            config(json!({"bottlerocketConfig": bottlerocket_config()})),
            &["spec.bottlerocketConfig", "only used with format bottlerocket"],
        ),
        (
            "bottlerocket without its config",
            config(json!({"format": "bottlerocket"})),
            &["spec.bottlerocketConfig", "required with format bottlerocket"],
        ),
        (
            "bottlerocket with a quota",
            config(merged(bottlerocket.clone(), json!({"quotaBackendBytes": "8Gi"}))),
            &["spec.quotaBackendBytes", "cloud-config only"],
        ),
        (
            "a cluster's bottlerocket with a quota",
            cluster(
                json!({"etcdadmConfigSpec": merged(bottlerocket.clone(), json!({"quotaBackendBytes": "8Gi"}))}),
            ),
            &[cluster_quota, "cloud-config only"],
        ),
        (
            "a store prefix from the root",
            cluster(json!({"backup": merged(backup(), json!({"store": {"s3": {"prefix": "/prod"}}}))})),
            &["spec.backup.store.s3.prefix", "must not start with '/'"],
        ),
        (
            "a store bucket in capitals",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"bucket": "Etcd-Backups"}}}))}),
            ),
            &["spec.backup.store.s3.bucket", "should match"],
        ),
        (
            "a store bucket ending in a dot",
            cluster(json!({"backup": merged(backup(), json!({"store": {"s3": {"bucket": "etcd."}}}))})),
            &["spec.backup.store.s3.bucket", "should match"],
        ),
        (
            "a store endpoint with credentials",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "https://key:secret@s3.example.com"}}}))}),
            ),
            &[
                "spec.backup.store.s3.endpoint",
                "without credentials, query or fragment",
            ],
        ),
        (
            "a store endpoint with a query",
            cluster(
                json!({"backup": merged(backup(), json!({"store": {"s3": {"endpoint": "https://s3.example.com/?x=1"}}}))}),
            ),
            &[
                "spec.backup.store.s3.endpoint",
                "without credentials, query or fragment",
            ],
        ),
        (
            "a restore into Bottlerocket members",
            cluster(
                json!({"restore": {"snapshot": {"name": "s"}}, "etcdadmConfigSpec": {"format": "bottlerocket", "bottlerocketConfig": bottlerocket_config()}}),
            ),
            &["spec.restore", "needs etcdadmConfigSpec.format cloud-config"],
        ),
        (
            "a user name in capitals",
            config_with(json!({"users": [{"name": "Admin"}]})),
            &["spec.users[0].name", "should match"],
        ),
        (
            "a user name of 33 characters",
            config_with(json!({"users": [{"name": "u".repeat(33)}]})),
            &["spec.users[0].name", "Too long"],
        ),
        (
            "a registry mirror without an endpoint",
            config(json!({"registryMirror": {"caCert": "pem"}})),
            &["spec.registryMirror.endpoint", "endpoint is required"],
        ),
        (
            "a registry mirror with a scheme",
            config_with(json!({"registryMirror": {"endpoint": "https://mirror.example"}})),
            &["spec.registryMirror.endpoint", "no scheme"],
        ),
        (
            "a registry mirror trusting a CA and skipping the check",
            config_with(
                json!({"registryMirror": {"endpoint": "mirror.example", "caCert": "pem", "insecureSkipVerify": true}}),
            ),
            &["spec.registryMirror.insecureSkipVerify", "remove one of them"],
        ),
        (
            "a TLS 1.3 cipher suite",
            config_with(json!({"cipherSuites": "TLS_AES_128_GCM_SHA256"})),
            &["spec.cipherSuites", "Go's TLS 1.2 cipher suite names"],
        ),
        (
            "an empty cipher suite entry",
            cluster(
                json!({"etcdadmConfigSpec": {"cipherSuites": "TLS_RSA_WITH_AES_128_CBC_SHA,,TLS_RSA_WITH_AES_256_CBC_SHA"}}),
            ),
            &[
                "spec.etcdadmConfigSpec.cipherSuites",
                "Go's TLS 1.2 cipher suite names",
            ],
        ),
        (
            "a cipher suite Go does not know",
            template(merged(
                full_config_spec(),
                json!({"cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, NOT_A_SUITE"}),
            )),
            &[
                "spec.template.spec.cipherSuites",
                "Go's TLS 1.2 cipher suite names",
            ],
        ),
        (
            "an etcd setting outside the list",
            config_with(json!({"etcdSettings": {"data-dir": "/tmp"}})),
            &["spec.etcdSettings", "allowed are auto-compaction-mode"],
        ),
    ];
    let failures = judge(&client, &accepted, &refused).await;
    assert!(
        failures.is_empty(),
        "{} of {} cases went wrong:\n{}",
        failures.len(),
        accepted.len() + refused.len(),
        failures.join("\n")
    );
}

/// The transition rules: `spec.restore` only at creation and never changed afterwards, and a
/// snapshot's cluster fixed. Checked with real objects (a dry-run create has no old object).
#[tokio::test]
async fn restore_and_a_snapshots_cluster_are_fixed_at_creation() {
    let server = server_with_crds().await;
    let client = server.client().await.unwrap();
    let resource = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "etcdcluster.cluster.x-k8s.io",
            "v1beta1",
            kind,
        ))
    };
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &resource("EtcdadmCluster"));
    let snapshots: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource("EtcdadmSnapshot"));
    let create = |object: Value| -> DynamicObject { serde_json::from_value(object).unwrap() };
    let mut plain = cluster(json!({}));
    plain["metadata"]["name"] = "plain".into();
    clusters
        .create(&PostParams::default(), &create(plain))
        .await
        .unwrap();
    let mut restored = cluster(json!({"restore": {"snapshot": {"name": "s1"}}}));
    restored["metadata"]["name"] = "restored".into();
    clusters
        .create(&PostParams::default(), &create(restored))
        .await
        .unwrap();
    snapshots
        .create(
            &PostParams::default(),
            &create(snapshot(json!({"clusterName": "plain"}))),
        )
        .await
        .unwrap();

    let message = refused_update(
        &clusters,
        "plain",
        json!({"spec": {"restore": {"snapshot": {"name": "s1"}}}}),
    )
    .await;
    assert!(
        message.contains("spec.restore")
            && message.contains("restore can only be set when the EtcdadmCluster is created"),
        "{message}"
    );
    let message = refused_update(
        &clusters,
        "restored",
        json!({"spec": {"restore": {"snapshot": {"name": "s2"}}}}),
    )
    .await;
    assert!(
        message.contains("spec.restore") && message.contains("restore is immutable"),
        "{message}"
    );
    let message = refused_update(&clusters, "restored", json!({"spec": {"restore": null}})).await;
    assert!(
        message.contains("restore can only be set when the EtcdadmCluster is created"),
        "{message}"
    );
    let message = refused_update(&snapshots, "s", json!({"spec": {"clusterName": "restored"}})).await;
    assert!(
        message.contains("spec.clusterName") && message.contains("clusterName is immutable"),
        "{message}"
    );
    // Everything else in the spec still changes.
    clusters
        .patch(
            "restored",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": backup()}})),
        )
        .await
        .unwrap();
}

/// The server's message refusing a merge patch of `name`.
async fn refused_update(api: &Api<DynamicObject>, name: &str, patch: Value) -> String {
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("the update of {name} was not refused: {other:?}"),
    }
}

fn merged(mut base: Value, patch: Value) -> Value {
    merge(&mut base, patch);
    base
}
