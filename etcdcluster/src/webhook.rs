//! Admission for EtcdadmCluster: fill the defaults a user would otherwise have to know, and
//! reject, with the field path, every spec the controller could not act on safely (the checks
//! are the API's own, beside each section's types in `etcdadm_shared::api::cluster`; the
//! controller runs the same ones).

use serde_json::{Value, json};

use etcdadm_shared::api::cluster::{
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT, DEFAULT_REPLICAS, DEFAULT_UNHEALTHY_AFTER,
    restore_needs_cloud_config, rotation_problems, validate_spec, validate_update,
};
use etcdadm_shared::api::{EtcdadmCluster, Format};
use etcdadm_shared::duration;
use etcdadm_shared::manager::WebhookRoutes;
use etcdadm_shared::manager::admission::{self, AdmissionRequest, AdmissionResponse, DynamicObject};
use etcdadm_shared::validation::backup_warnings;

/// Defaulting webhook path (controller-runtime's naming).
pub const MUTATE_PATH: &str = "/mutate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster";
/// Validating webhook path.
pub const VALIDATE_PATH: &str = "/validate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster";

pub fn routes() -> WebhookRoutes {
    WebhookRoutes::new()
        .route(MUTATE_PATH, default_cluster)
        .route(VALIDATE_PATH, validate_cluster)
}

/// Defaults: replicas 1, the template in our namespace, health-check settings, cloud-config.
pub fn default_cluster(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let mut defaults: Vec<(&[&str], Value)> = vec![
        (&["spec", "replicas"], json!(DEFAULT_REPLICAS)),
        (
            &["spec", "healthCheck", "interval"],
            json!(duration::format(DEFAULT_HEALTH_INTERVAL)),
        ),
        (
            &["spec", "healthCheck", "timeout"],
            json!(duration::format(DEFAULT_HEALTH_TIMEOUT)),
        ),
        (
            &["spec", "healthCheck", "unhealthyAfter"],
            json!(duration::format(DEFAULT_UNHEALTHY_AFTER)),
        ),
        (&["spec", "healthCheck", "remediation"], json!("Enabled")),
        (
            &["spec", "etcdadmConfigSpec", "format"],
            json!(Format::CloudConfig.as_str()),
        ),
    ];
    if let Some(namespace) = &req.namespace {
        defaults.push((&["spec", "infrastructureTemplate", "namespace"], json!(namespace)));
    }
    admission::with_defaults(&req, &defaults)
}

pub fn validate_cluster(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let new = match admission::object::<EtcdadmCluster>(&req) {
        Ok(Some(new)) => new,
        Ok(None) => return AdmissionResponse::from(&req),
        Err(message) => return admission::rejected(&req, message),
    };
    let old: Option<EtcdadmCluster> = req
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
        .and_then(|v| serde_json::from_value(v).ok());
    let namespace = req.namespace.clone().or_else(|| new.metadata.namespace.clone());
    let mut errors = validate_spec(&new.spec, namespace.as_deref());
    errors.extend(rotation_problems(
        old.as_ref().map(EtcdadmCluster::rotation_facts).as_ref(),
        &new.rotation_facts(),
    ));
    match old {
        Some(old) => errors.extend(validate_update(&old.spec, &new.spec)),
        None => errors.extend(restore_needs_cloud_config(&new.spec)),
    }
    let warnings = backup_warnings(new.spec.backup.as_ref(), new.spec.restore.as_ref());
    admission::with_warnings(admission::validated(&req, &errors), warnings)
}
