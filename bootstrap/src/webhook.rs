//! Admission for EtcdadmConfig and EtcdadmConfigTemplate: default the format, and reject at
//! admission, with the field path, every spec the renderer could not honour.

use serde_json::Value;

use etcdadm_shared::api::{EtcdadmConfig, EtcdadmConfigTemplate, Format};
use etcdadm_shared::manager::WebhookRoutes;
use etcdadm_shared::manager::admission::{self, AdmissionRequest, AdmissionResponse, DynamicObject};
use etcdadm_shared::validation::validate_config_spec;

/// Defaulting webhook path for EtcdadmConfig (controller-runtime's naming).
pub const MUTATE_CONFIG_PATH: &str = "/mutate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfig";
/// Validating webhook path for EtcdadmConfig.
pub const VALIDATE_CONFIG_PATH: &str = "/validate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfig";
/// Defaulting webhook path for EtcdadmConfigTemplate.
pub const MUTATE_CONFIG_TEMPLATE_PATH: &str =
    "/mutate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfigtemplate";
/// Validating webhook path for EtcdadmConfigTemplate.
pub const VALIDATE_CONFIG_TEMPLATE_PATH: &str =
    "/validate-bootstrap-cluster-x-k8s-io-v1beta1-etcdadmconfigtemplate";

/// The four webhooks this provider serves.
pub fn routes() -> WebhookRoutes {
    WebhookRoutes::new()
        .route(MUTATE_CONFIG_PATH, default_config)
        .route(VALIDATE_CONFIG_PATH, validate_config)
        .route(MUTATE_CONFIG_TEMPLATE_PATH, default_config_template)
        .route(VALIDATE_CONFIG_TEMPLATE_PATH, validate_config_template)
}

fn default_format() -> Value {
    Value::String(Format::CloudConfig.as_str().to_string())
}

/// EtcdadmConfig defaults: `spec.format: cloud-config` when unset.
pub fn default_config(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    admission::with_defaults(&req, &[(&["spec", "format"], default_format())])
}

/// EtcdadmConfigTemplate defaults: `spec.template.spec.format: cloud-config` when unset.
pub fn default_config_template(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    admission::with_defaults(
        &req,
        &[(&["spec", "template", "spec", "format"], default_format())],
    )
}

/// EtcdadmConfig: every rule of [`validate_config_spec`] on `spec`.
pub fn validate_config(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    match admission::object::<EtcdadmConfig>(&req) {
        Ok(Some(config)) => admission::validated(&req, &validate_config_spec(&config.spec, "spec")),
        Ok(None) => AdmissionResponse::from(&req),
        Err(message) => admission::rejected(&req, message),
    }
}

/// EtcdadmConfigTemplate: every rule of [`validate_config_spec`] on `spec.template.spec`.
pub fn validate_config_template(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    match admission::object::<EtcdadmConfigTemplate>(&req) {
        Ok(Some(template)) => admission::validated(
            &req,
            &validate_config_spec(&template.spec.template.spec, "spec.template.spec"),
        ),
        Ok(None) => AdmissionResponse::from(&req),
        Err(message) => admission::rejected(&req, message),
    }
}
