//! The smallest stand-in for cert-manager and the cluster's service network that lets
//! `clusterctl init` install real providers and their webhooks answer (docs/capi.md, "What the
//! real-CAPI tier stands in"). cert-manager is a container image and there is no pod network
//! here, so:
//!
//! - its API is four CRDs (`Certificate`, `Issuer`, `ClusterIssuer`, `CertificateRequest`,
//!   `cert-manager.io/v1`, schemas kept open): installed before `clusterctl init`, which then
//!   finds cert-manager's API answering and skips installing it;
//! - each `Certificate` gets its Secret (`tls.crt`, `tls.key`, `ca.crt`), issued by a CA of its
//!   own for the names it asks for plus 127.0.0.1, where its Service is reached here;
//! - the CA injector's work: every CRD and webhook configuration annotated
//!   `cert-manager.io/inject-ca-from` gets that Certificate's CA as its `caBundle`;
//! - the service network's: each webhook `clientConfig.service` becomes a `url` on 127.0.0.1 at
//!   the port of the process serving that Service (see `kubelet`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::pki::{CertificateAuthority, KeyType, LeafRequest, Usage};

use crate::error::SimError;

const MANAGER: &str = "cert-manager-standin";

/// cert-manager's API, as far as clusterctl and the providers' components use it.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        ("Certificate", "certificates", "Namespaced"),
        ("Issuer", "issuers", "Namespaced"),
        ("ClusterIssuer", "clusterissuers", "Cluster"),
        ("CertificateRequest", "certificaterequests", "Namespaced"),
    ]
    .iter()
    .filter_map(|(kind, plural, scope)| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {"group": "cert-manager.io", "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
        }))
        .ok()
    })
    .collect()
}

fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"))
}

/// What was issued for one Certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    pub secret_namespace: String,
    pub secret_name: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

/// Issue every Certificate whose Secret does not exist yet (and read back those that do), keyed
/// by `<namespace>/<name>` of the Certificate, as `inject-ca-from` names it.
pub async fn issue_all(client: &Client) -> Result<BTreeMap<String, Issued>, SimError> {
    let certificates: Api<DynamicObject> = Api::all_with(client.clone(), &certificate_resource());
    let mut issued = BTreeMap::new();
    for certificate in certificates.list(&Default::default()).await?.items {
        let namespace = certificate.namespace().unwrap_or_default();
        let name = certificate.name_any();
        let spec = &certificate.data["spec"];
        let secret_name = spec["secretName"].as_str().unwrap_or_default().to_string();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let existing = secrets.get_opt(&secret_name).await?;
        let text = |secret: &Secret, key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        let found = existing.as_ref().and_then(|s| {
            Some(Issued {
                secret_namespace: namespace.clone(),
                secret_name: secret_name.clone(),
                cert_pem: text(s, "tls.crt")?,
                key_pem: text(s, "tls.key")?,
                ca_pem: text(s, "ca.crt")?,
            })
        });
        let one = match found {
            Some(one) => one,
            None => {
                let dns_names: Vec<String> = spec["dnsNames"]
                    .as_array()
                    .map(|names| names.iter().filter_map(Value::as_str).map(String::from).collect())
                    .unwrap_or_default();
                let one = issue(&namespace, &name, &secret_name, dns_names)?;
                let secret: Secret = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": secret_name, "namespace": namespace},
                }))?;
                let secret = Secret {
                    data: Some(BTreeMap::from([
                        (
                            "tls.crt".to_string(),
                            ByteString(one.cert_pem.clone().into_bytes()),
                        ),
                        (
                            "tls.key".to_string(),
                            ByteString(one.key_pem.clone().into_bytes()),
                        ),
                        ("ca.crt".to_string(), ByteString(one.ca_pem.clone().into_bytes())),
                    ])),
                    ..secret
                };
                secrets.create(&Default::default(), &secret).await?;
                let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Issued",
                    "message": "issued by the cert-manager stand-in"}]}});
                Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &certificate_resource())
                    .patch_status(&name, &params(), &Patch::Merge(&ready))
                    .await?;
                one
            }
        };
        issued.insert(format!("{namespace}/{name}"), one);
    }
    Ok(issued)
}

pub fn issue(
    namespace: &str,
    name: &str,
    secret_name: &str,
    dns_names: Vec<String>,
) -> Result<Issued, SimError> {
    let failed = |e: &dyn std::fmt::Display| SimError::Setup(format!("issuing {namespace}/{name}: {e}"));
    let ca = CertificateAuthority::generate(&format!("{name}-ca")).map_err(|e| failed(&e))?;
    let leaf = ca
        .issue(&LeafRequest {
            common_name: name.to_string(),
            organizations: vec![],
            dns_names,
            ips: vec![IpAddr::from([127, 0, 0, 1])],
            usage: Usage {
                client: false,
                server: true,
            },
            validity: Duration::from_secs(24 * 3600),
            key_type: KeyType::EcdsaP256,
        })
        .map_err(|e| failed(&e))?;
    Ok(Issued {
        secret_namespace: namespace.to_string(),
        secret_name: secret_name.to_string(),
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
        ca_pem: ca.cert_pem().to_string(),
    })
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// `clientConfig` with the injected CA and, for a Service, its URL here: the port serving
/// `<namespace>/<service>` in `ports`.
pub fn client_config(config: &Value, ca_pem: &str, ports: &BTreeMap<String, u16>) -> Result<Value, SimError> {
    use base64::Engine;
    let mut config = config.clone();
    if let Some(service) = config.get("service").cloned() {
        let key = format!(
            "{}/{}",
            service["namespace"].as_str().unwrap_or_default(),
            service["name"].as_str().unwrap_or_default()
        );
        let port = ports
            .get(&key)
            .ok_or_else(|| SimError::Setup(format!("no process serves Service {key}")))?;
        let path = service["path"].as_str().unwrap_or_default();
        config["url"] = json!(format!("https://127.0.0.1:{port}{path}"));
        if let Some(object) = config.as_object_mut() {
            object.remove("service");
        }
    }
    config["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    Ok(config)
}

/// The CA injector and the service network: every CRD and webhook configuration that asks for a
/// Certificate's CA gets it, and its Services' URLs here.
pub async fn inject_and_route(
    client: &Client,
    issued: &BTreeMap<String, Issued>,
    ports: &BTreeMap<String, u16>,
) -> Result<(), SimError> {
    let source = |object: &DynamicObject| -> Option<&Issued> {
        let from = object.annotations().get("cert-manager.io/inject-ca-from")?;
        issued.get(from)
    };
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let resource =
            ApiResource::from_gvk(&GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        for configuration in api.list(&Default::default()).await?.items {
            let Some(issued) = source(&configuration) else {
                continue;
            };
            let mut webhooks = configuration.data["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for webhook in &mut webhooks {
                webhook["clientConfig"] = client_config(&webhook["clientConfig"], &issued.ca_pem, ports)?;
            }
            api.patch(
                &configuration.name_any(),
                &params(),
                &Patch::Merge(&json!({ "webhooks": webhooks })),
            )
            .await?;
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds.list(&Default::default()).await?.items {
        let as_dynamic: DynamicObject = serde_json::from_value(serde_json::to_value(&crd)?)?;
        let Some(issued) = source(&as_dynamic) else {
            continue;
        };
        let conversion = as_dynamic.data["spec"]["conversion"].clone();
        if conversion["strategy"] != "Webhook" {
            continue;
        }
        let mut config = client_config(&conversion["webhook"]["clientConfig"], &issued.ca_pem, ports)?;
        // A merge patch keeps what it does not name: the Service is removed by name.
        config["service"] = Value::Null;
        let patch = json!({"spec": {"conversion": {"webhook": {"clientConfig": config}}}});
        crds.patch(&crd.name_any(), &params(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}
