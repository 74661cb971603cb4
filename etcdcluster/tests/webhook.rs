//! The EtcdadmCluster admission webhooks as the API server calls them: AdmissionReviews POSTed
//! over TLS to the real webhook server; answers checked for allowed/denied, the field paths in
//! the message, and the defaulting patch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use etcdadm_etcdcluster::webhook::{MUTATE_PATH, VALIDATE_PATH, routes};
use etcdadm_shared::manager::testing::{SelfSignedCert, fresh_dir, https_client_trusting};
use etcdadm_shared::manager::{Metrics, Shutdown, WebhookServer};
use serde_json::{Value, json};

struct Webhooks {
    base: String,
    client: reqwest::Client,
    shutdown: Shutdown,
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

impl Webhooks {
    async fn start() -> Self {
        let dir = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "etcdcluster-webhooks");
        let cert = SelfSignedCert::generate();
        cert.write_to(&dir);
        let server = WebhookServer::new("127.0.0.1:0".parse().unwrap(), &dir, &routes(), &Metrics::new())
            .bind()
            .await
            .unwrap();
        let base = format!("https://localhost:{}", server.local_addr().port());
        let shutdown = Shutdown::new();
        tokio::spawn(server.serve(shutdown.signal()));
        Webhooks {
            base,
            client: https_client_trusting(&cert.cert_pem),
            shutdown,
        }
    }

    async fn call(&self, path: &str, review: &Value) -> Value {
        let send = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(review.to_string())
            .send();
        let answer: Value = tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .unwrap()
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
        answer["response"].clone()
    }
}

fn cluster(spec: Value) -> Value {
    json!({
        "apiVersion": "etcdcluster.cluster.x-k8s.io/v1beta1", "kind": "EtcdadmCluster",
        "metadata": {"name": "c1-etcd", "namespace": "default"},
        "spec": spec,
    })
}

fn review(operation: &str, object: Value, old: Option<Value>) -> Value {
    let gvk =
        json!({"group": "etcdcluster.cluster.x-k8s.io", "version": "v1beta1", "kind": "EtcdadmCluster"});
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0f1c5a7e-1d6b-4f0e-9c55-6c2f3f1f0a11",
            "kind": gvk, "requestKind": gvk,
            "resource": {"group": "etcdcluster.cluster.x-k8s.io", "version": "v1beta1", "resource": "etcdadmclusters"},
            "name": "c1-etcd", "namespace": "default", "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object, "oldObject": old, "dryRun": false,
        }
    })
}

fn template() -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "SimMachineTemplate", "name": "t"})
}

fn patch_of(response: &Value) -> Value {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn defaults_fill_only_what_is_absent() {
    let webhooks = Webhooks::start().await;
    let response = webhooks
        .call(
            MUTATE_PATH,
            &review(
                "CREATE",
                cluster(json!({"infrastructureTemplate": template()})),
                None,
            ),
        )
        .await;
    assert_eq!(response["allowed"], true);
    let mut object = cluster(json!({"infrastructureTemplate": template()}));
    let patch: json_patch::Patch = serde_json::from_value(patch_of(&response)).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    let spec = &object["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["infrastructureTemplate"]["namespace"], "default");
    assert_eq!(
        spec["healthCheck"],
        json!({"interval": "10s", "timeout": "5s", "unhealthyAfter": "5m0s", "remediation": "Enabled"})
    );
    assert_eq!(spec["etcdadmConfigSpec"]["format"], "cloud-config");

    let set = json!({"replicas": 3, "infrastructureTemplate": {"kind": "K", "name": "n", "namespace": "default"},
        "healthCheck": {"interval": "2s", "timeout": "1s", "unhealthyAfter": "1m", "remediation": "Disabled"},
        "etcdadmConfigSpec": {"format": "cloud-config"}});
    let response = webhooks
        .call(MUTATE_PATH, &review("CREATE", cluster(set), None))
        .await;
    assert_eq!(response["allowed"], true);
    assert!(response["patch"].is_null(), "nothing to default: {response}");
}

#[tokio::test]
async fn invalid_clusters_are_denied_with_every_field_path() {
    let webhooks = Webhooks::start().await;
    let bad = json!({"replicas": 2, "infrastructureTemplate": {"apiVersion": "apps/v1", "kind": "K", "name": "n", "namespace": "other"},
        "failureDomains": ["a", "a"], "healthCheck": {"interval": "5s", "timeout": "30s"},
        "etcdadmConfigSpec": {"cipherSuites": "TLS_NOT_A_SUITE"}});
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", cluster(bad), None))
        .await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    let message = response["status"]["message"].as_str().unwrap();
    for path in [
        "spec.replicas",
        "spec.infrastructureTemplate.apiVersion",
        "spec.infrastructureTemplate.namespace",
        "spec.failureDomains[1]",
        "spec.healthCheck.timeout",
        "spec.etcdadmConfigSpec.cipherSuites",
    ] {
        assert!(message.contains(path), "{path} missing from {message}");
    }
    let good =
        json!({"replicas": 3, "infrastructureTemplate": template(), "failureDomains": ["a", "b", "c"]});
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", cluster(good), None))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn backup_settings_are_checked_and_a_restore_is_admitted_with_cloud_config_only() {
    let webhooks = Webhooks::start().await;
    let store = json!({"s3": {"endpoint": "minio:9000", "bucket": "etcd-backups",
                              "credentialsSecretRef": {"name": "s3"}}});
    let bad = json!({"infrastructureTemplate": template(),
        "backup": {"store": store, "schedule": "every day", "retention": {"keep": 0}}});
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", cluster(bad), None))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    for path in [
        "spec.backup.store.s3.endpoint",
        "spec.backup.schedule",
        "spec.backup.retention.keep",
    ] {
        assert!(message.contains(path), "{path} missing from {message}");
    }
    let good = json!({"infrastructureTemplate": template(),
        "backup": {"store": {"s3": {"endpoint": "https://minio:9000", "bucket": "etcd-backups",
                                    "credentialsSecretRef": {"name": "s3"}, "sse": "AES256"}},
                   "schedule": "0 */6 * * *", "retention": {"keep": 3}}});
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", cluster(good), None))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none_or(Value::is_null), "{response}");

    // Plain http: refused, unless the store says insecure: true, which is admitted with a
    // warning kubectl prints.
    let http = |insecure: Value| {
        let mut s3 = json!({"endpoint": "http://minio:9000", "bucket": "etcd-backups",
                            "credentialsSecretRef": {"name": "s3"}});
        if !insecure.is_null() {
            s3["insecure"] = insecure;
        }
        cluster(json!({"infrastructureTemplate": template(), "backup": {"store": {"s3": s3}}}))
    };
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", http(Value::Null), None))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.backup.store.s3.endpoint: \"http://minio:9000\" is plain http"),
        "{message}"
    );
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", http(json!(true)), None))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    let warnings = response["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{response}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("spec.backup.store.s3.endpoint is plain http (insecure: true)"),
        "{warnings:?}"
    );

    let restored = cluster(json!({"infrastructureTemplate": template(),
        "restore": {"snapshot": {"name": "c1-snap"}}}));
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", restored, None))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    let bottlerocket = cluster(json!({"infrastructureTemplate": template(),
        "etcdadmConfigSpec": {"format": "bottlerocket",
            "bottlerocketConfig": {"etcdImage": "r/etcd:v3.5.9", "bootstrapImage": "b", "adminImage": "a",
                                   "controlImage": "c", "pauseImage": "p"}},
        "restore": {"snapshot": {"name": "c1-snap"}}}));
    let response = webhooks
        .call(VALIDATE_PATH, &review("CREATE", bottlerocket, None))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.restore") && message.contains("format cloud-config"),
        "{message}"
    );
}

#[tokio::test]
async fn an_etcd_downgrade_or_minor_skip_is_denied_on_update() {
    let webhooks = Webhooks::start().await;
    let at = |v: &str| {
        cluster(json!({"replicas": 3, "infrastructureTemplate": template(),
        "etcdadmConfigSpec": {"cloudInitConfig": {"version": v}}}))
    };
    let response = webhooks
        .call(VALIDATE_PATH, &review("UPDATE", at("3.4.27"), Some(at("3.5.9"))))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.etcdadmConfigSpec.cloudInitConfig.version"),
        "{message}"
    );
    let response = webhooks
        .call(VALIDATE_PATH, &review("UPDATE", at("3.5.9"), Some(at("3.4.27"))))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    let response = webhooks
        .call(VALIDATE_PATH, &review("UPDATE", at("3.6.0"), Some(at("3.4.27"))))
        .await;
    assert_eq!(response["allowed"], false, "a skipped minor: {response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("skips a minor version"), "{message}");
}

/// A cluster annotated `rotate-ca: <request>` (None: not annotated), with `extra` annotations,
/// `spec` fields and `status`.
fn rotating(request: Option<&str>, extra: &[(&str, &str)], spec: Value, status: Value) -> Value {
    let mut object = cluster(spec);
    let mut annotations = serde_json::Map::new();
    if let Some(request) = request {
        annotations.insert("etcdcluster.cluster.x-k8s.io/rotate-ca".into(), json!(request));
    }
    for (k, v) in extra {
        annotations.insert(k.to_string(), json!(v));
    }
    object["metadata"]["annotations"] = Value::Object(annotations);
    object["status"] = status;
    object
}

#[tokio::test]
async fn a_ca_rotation_is_refused_beside_another_a_restore_or_a_recovery_and_on_bottlerocket() {
    let webhooks = Webhooks::start().await;
    let plain = json!({"replicas": 3, "infrastructureTemplate": template()});
    let bottlerocket = json!({"replicas": 3, "infrastructureTemplate": template(),
        "etcdadmConfigSpec": {"format": "bottlerocket", "bottlerocketConfig": {
            "etcdImage": "r/etcd:v3.5.9", "bootstrapImage": "b", "pauseImage": "p"}}});
    let restore = json!({"replicas": 3, "infrastructureTemplate": template(),
        "etcdadmConfigSpec": {"cloudInitConfig": {"version": "3.5.9"}},
        "restore": {"snapshot": {"name": "s1"}}});
    let rotating_status = json!({"caRotation": {"phase": "Signing", "request": "r1"}});
    let recovering = [("etcdcluster.cluster.x-k8s.io/recover", "m0")];
    let long = "x".repeat(64);
    // (what, new, old, allowed, what the message says)
    let rows: Vec<(&str, Value, Value, bool, &str)> = vec![
        (
            "a first request",
            rotating(Some("r1"), &[], plain.clone(), json!({})),
            rotating(None, &[], plain.clone(), json!({})),
            true,
            "",
        ),
        (
            "the same request again",
            rotating(Some("r1"), &[], plain.clone(), rotating_status.clone()),
            rotating(Some("r1"), &[], plain.clone(), rotating_status.clone()),
            true,
            "",
        ),
        (
            "a new request after one is done",
            rotating(Some("r2"), &[], plain.clone(), json!({})),
            rotating(Some("r1"), &[], plain.clone(), json!({})),
            true,
            "",
        ),
        (
            "another request mid-way",
            rotating(Some("r2"), &[], plain.clone(), rotating_status.clone()),
            rotating(Some("r1"), &[], plain.clone(), rotating_status.clone()),
            false,
            "a CA rotation for \"r1\" is under way (phase Signing)",
        ),
        (
            "the request removed mid-way",
            rotating(None, &[], plain.clone(), rotating_status.clone()),
            rotating(Some("r1"), &[], plain.clone(), rotating_status.clone()),
            false,
            "cannot be changed or stopped",
        ),
        (
            "during a recovery",
            rotating(Some("r1"), &recovering, plain.clone(), json!({})),
            rotating(None, &recovering, plain.clone(), json!({})),
            false,
            "a quorum-loss recovery is under way",
        ),
        (
            "during a recovery recorded in status",
            rotating(
                Some("r1"),
                &[],
                plain.clone(),
                json!({"recovery": {"requested": "m0", "source": "m0", "phase": "Snapshotting", "snapshot": "s"}}),
            ),
            rotating(
                None,
                &[],
                plain.clone(),
                json!({"recovery": {"requested": "m0", "source": "m0", "phase": "Snapshotting", "snapshot": "s"}}),
            ),
            false,
            "a quorum-loss recovery is under way",
        ),
        (
            "during a restore",
            rotating(Some("r1"), &[], restore.clone(), json!({})),
            rotating(None, &[], restore.clone(), json!({})),
            false,
            "a restore is under way",
        ),
        (
            "after a restore",
            rotating(Some("r1"), &[], restore.clone(), json!({"initialized": true})),
            rotating(None, &[], restore.clone(), json!({"initialized": true})),
            true,
            "",
        ),
        (
            "on Bottlerocket",
            rotating(Some("r1"), &[], bottlerocket.clone(), json!({})),
            rotating(None, &[], bottlerocket.clone(), json!({})),
            false,
            "not supported on Bottlerocket",
        ),
        (
            "an empty value",
            rotating(Some(" "), &[], plain.clone(), json!({})),
            rotating(None, &[], plain.clone(), json!({})),
            false,
            "must be 1 to 63 characters",
        ),
        (
            "a value too long",
            rotating(Some(&long), &[], plain.clone(), json!({})),
            rotating(None, &[], plain.clone(), json!({})),
            false,
            "must be 1 to 63 characters",
        ),
    ];
    for (what, new, old, allowed, says) in rows {
        let response = webhooks
            .call(VALIDATE_PATH, &review("UPDATE", new, Some(old)))
            .await;
        assert_eq!(response["allowed"], allowed, "{what}: {response}");
        if !allowed {
            let message = response["status"]["message"].as_str().unwrap();
            assert!(
                message.contains("metadata.annotations[etcdcluster.cluster.x-k8s.io/rotate-ca]")
                    && message.contains(says),
                "{what}: {message}"
            );
        }
    }
}
