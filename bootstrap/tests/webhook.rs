//! The EtcdadmConfig(Template) admission webhooks, as the API server calls them: AdmissionReview
//! fixtures POSTed over TLS to the real webhook server, answers checked for allowed/denied, the
//! message with its field paths, and the defaulting patch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use etcdadm_bootstrap::webhook::{
    MUTATE_CONFIG_PATH, MUTATE_CONFIG_TEMPLATE_PATH, VALIDATE_CONFIG_PATH, VALIDATE_CONFIG_TEMPLATE_PATH,
    routes,
};
use etcdadm_shared::manager::testing::{SelfSignedCert, fresh_dir, https_client_trusting};
use etcdadm_shared::manager::{Metrics, Shutdown, WebhookServer};
use serde_json::{Value, json};

/// A running webhook server and a client that trusts its certificate.
struct Webhooks {
    base: String,
    client: reqwest::Client,
    _shutdown: ShutdownOnDrop,
}

struct ShutdownOnDrop(Shutdown);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.trigger();
    }
}

impl Webhooks {
    async fn start() -> Self {
        let dir = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "bootstrap-webhooks");
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
            _shutdown: ShutdownOnDrop(shutdown),
        }
    }

    /// POST `review` to `path`; the AdmissionReview's `response`.
    async fn call(&self, path: &str, review: &Value) -> Value {
        let answer: Value = tokio::time::timeout(
            Duration::from_secs(10),
            self.client
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(review.to_string())
                .send(),
        )
        .await
        .unwrap()
        .unwrap()
        .json()
        .await
        .unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
        answer["response"].clone()
    }
}

fn review(kind: &str, resource: &str, operation: &str, object: Option<Value>) -> Value {
    let name = object
        .as_ref()
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or("gone")
        .to_string();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "bootstrap.cluster.x-k8s.io", "version": "v1beta1", "kind": kind},
            "resource": {"group": "bootstrap.cluster.x-k8s.io", "version": "v1beta1", "resource": resource},
            "requestKind": {"group": "bootstrap.cluster.x-k8s.io", "version": "v1beta1", "kind": kind},
            "name": name,
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

/// The field of every cause in a denial.
fn cause_fields(response: &Value) -> Vec<&str> {
    response["status"]["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect()
}

fn config(spec: Value) -> Value {
    review(
        "EtcdadmConfig",
        "etcdadmconfigs",
        "CREATE",
        Some(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1",
            "kind": "EtcdadmConfig",
            "metadata": {"name": "etcd-0", "namespace": "default"},
            "spec": spec,
        })),
    )
}

fn template(spec: Value) -> Value {
    review(
        "EtcdadmConfigTemplate",
        "etcdadmconfigtemplates",
        "CREATE",
        Some(json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1",
            "kind": "EtcdadmConfigTemplate",
            "metadata": {"name": "etcd-template", "namespace": "default"},
            "spec": {"template": {"spec": spec}},
        })),
    )
}

/// The decoded JSON patch of a defaulting response (base64 on the wire, as Kubernetes wants).
fn patch_of(response: &Value) -> Value {
    use base64::Engine as _;
    assert_eq!(response["patchType"], "JSONPatch");
    let encoded = response["patch"].as_str().expect("a base64 patch string");
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn defaulting_sets_the_cloud_config_format_only_when_unset() {
    let webhooks = Webhooks::start().await;

    let response = webhooks.call(MUTATE_CONFIG_PATH, &config(json!({}))).await;
    assert_eq!(response["allowed"], true);
    let patch = patch_of(&response);
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/format", "value": "cloud-config"}])
    );
    // Applying it gives the defaulted object.
    let mut object = config(json!({}))["request"]["object"].clone();
    let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(object["spec"]["format"], "cloud-config");

    let response = webhooks
        .call(MUTATE_CONFIG_PATH, &config(json!({"format": "bottlerocket"})))
        .await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");

    let response = webhooks
        .call(
            MUTATE_CONFIG_TEMPLATE_PATH,
            &template(json!({"users": [{"name": "etcd"}]})),
        )
        .await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        patch_of(&response),
        json!([{"op": "add", "path": "/spec/template/spec/format", "value": "cloud-config"}])
    );
}

#[tokio::test]
async fn a_valid_config_and_template_are_allowed() {
    let webhooks = Webhooks::start().await;
    let spec = json!({
        "format": "cloud-config",
        "cloudInitConfig": {"version": "3.5.9"},
        "cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "files": [{"path": "/etc/motd", "content": "etcd"}],
        "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]}],
        "registryMirror": {"endpoint": "mirror.local:5000"},
    });
    let response = webhooks.call(VALIDATE_CONFIG_PATH, &config(spec.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");
    let response = webhooks
        .call(VALIDATE_CONFIG_TEMPLATE_PATH, &template(spec))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn an_invalid_config_is_denied_with_every_field_path() {
    let webhooks = Webhooks::start().await;
    let spec = json!({
        "files": [
            {"path": "/etc/a", "content": "a"},
            {"path": "/etc/b"},
            {"path": "/etc/c", "content": "c", "contentFrom": {"secret": {"name": "s", "key": "k"}}},
        ],
        "cloudInitConfig": {"version": "v3.5.9"},
    });
    let response = webhooks.call(VALIDATE_CONFIG_PATH, &config(spec)).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    assert_eq!(
        response["status"]["message"],
        "EtcdadmConfig default/etcd-0 is invalid: \
         spec.cloudInitConfig.version: \"v3.5.9\" is not an etcd version like 3.5.9 (drop the leading v); \
         spec.files[2].contentFrom: content and contentFrom are mutually exclusive: keep one"
    );
    let fields = cause_fields(&response);
    assert_eq!(
        fields,
        ["spec.cloudInitConfig.version", "spec.files[2].contentFrom"]
    );
}

#[tokio::test]
async fn etcd_settings_outside_the_list_or_of_the_wrong_shape_are_denied_with_their_paths() {
    let webhooks = Webhooks::start().await;
    let allowed = json!({
        "corruptionChecks": "Enabled",
        "etcdSettings": {"snapshot-count": 20000, "auto-compaction-retention": "30m", "max-request-bytes": "2Mi"},
    });
    let response = webhooks.call(VALIDATE_CONFIG_PATH, &config(allowed)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let refused = json!({
        "etcdSettings": {"quota-backend-bytes": "8Gi", "initial-cluster-token": "x", "heartbeat-interval": "fast"},
    });
    let response = webhooks.call(VALIDATE_CONFIG_PATH, &config(refused)).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(
        cause_fields(&response),
        [
            "spec.etcdSettings[\"heartbeat-interval\"]",
            "spec.etcdSettings[\"initial-cluster-token\"]",
            "spec.etcdSettings[\"quota-backend-bytes\"]",
        ]
    );
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("it is the field quotaBackendBytes"), "{message}");
    assert!(
        message.contains("\"fast\" is not a whole number of milliseconds"),
        "{message}"
    );
}

#[tokio::test]
async fn an_invalid_template_is_denied_with_template_paths() {
    let webhooks = Webhooks::start().await;
    let response = webhooks
        .call(
            VALIDATE_CONFIG_TEMPLATE_PATH,
            &template(json!({"format": "bottlerocket", "cipherSuites": "TLS_AES_128_GCM_SHA256"})),
        )
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("EtcdadmConfigTemplate default/etcd-template is invalid: "),
        "{message}"
    );
    assert!(
        message.contains("spec.template.spec.bottlerocketConfig: is required with format bottlerocket"),
        "{message}"
    );
    assert!(
        message.contains("spec.template.spec.cipherSuites: TLS_AES_128_GCM_SHA256 is a TLS 1.3 suite"),
        "{message}"
    );
}

#[tokio::test]
async fn bottlerocket_configs_are_allowed_unless_a_field_would_be_ignored() {
    let webhooks = Webhooks::start().await;
    let spec = json!({
        "format": "bottlerocket",
        "etcdadmBuiltin": true,
        "bottlerocketConfig": {
            "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9",
            "bootstrapImage": "public.ecr.aws/l0g8r8j6/bottlerocket-bootstrap:v1-28-9-eks-a-60",
            "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:v1.28.9-eks-1-28-9",
        },
        "users": [{"name": "ec2-user", "sshAuthorizedKeys": ["ssh-rsa AAAA"], "sudo": "ALL=(ALL) NOPASSWD:ALL"}],
    });
    let response = webhooks.call(VALIDATE_CONFIG_PATH, &config(spec.clone())).await;
    assert_eq!(response["allowed"], true, "{response}");

    let mut ignored = spec;
    ignored["preEtcdadmCommands"] = json!(["hostname x"]);
    ignored["users"][0]["shell"] = json!("/bin/zsh");
    let response = webhooks
        .call(VALIDATE_CONFIG_TEMPLATE_PATH, &template(ignored))
        .await;
    assert_eq!(response["allowed"], false);
    let fields = cause_fields(&response);
    assert_eq!(
        fields,
        [
            "spec.template.spec.preEtcdadmCommands",
            "spec.template.spec.users[0].shell"
        ]
    );
}

#[tokio::test]
async fn an_unreadable_spec_is_denied_and_deletes_are_allowed() {
    let webhooks = Webhooks::start().await;
    let response = webhooks
        .call(VALIDATE_CONFIG_PATH, &config(json!({"format": "windows"})))
        .await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("EtcdadmConfig default/etcd-0 cannot be read: unknown variant `windows`"),
        "{message}"
    );

    let delete = review("EtcdadmConfig", "etcdadmconfigs", "DELETE", None);
    for path in [VALIDATE_CONFIG_PATH, MUTATE_CONFIG_PATH] {
        let response = webhooks.call(path, &delete).await;
        assert_eq!(response["allowed"], true, "{path}: {response}");
        assert!(response.get("patch").is_none());
    }
}
