//! The members: how many (`spec.replicas`), what their Machines are cloned from
//! (`spec.infrastructureTemplate`), where they go (`spec.failureDomains`) and their Machines'
//! metadata and version (`spec.machineTemplate`), with the defaults and checks of those fields.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::api::config::ObjectMetaTemplate;
use crate::names;
use crate::validation::field::{FieldError, quoted};

/// Default number of members.
pub const DEFAULT_REPLICAS: i32 = 1;

/// Metadata and version for member Machines.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    /// Labels and annotations added to each member Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// `Machine.spec.version` (default: the KubeadmControlPlane's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `spec.replicas`: odd and at least 1.
pub(super) fn replicas_problems(replicas: Option<i32>) -> Vec<FieldError> {
    let mut errors = vec![];
    if let Some(replicas) = replicas
        && (replicas < 1 || replicas % 2 == 0)
    {
        errors.push(FieldError::new(
            "spec.replicas",
            format!("{replicas}: must be odd and at least 1 (an even member count adds no fault tolerance)"),
        ));
    }
    errors
}

/// `spec.infrastructureTemplate`: named, an infrastructure provider's kind, in our namespace.
pub(super) fn template_problems(template: &ObjectReference, namespace: Option<&str>) -> Vec<FieldError> {
    let mut errors = vec![];
    if template.kind.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::new("spec.infrastructureTemplate.kind", "required"));
    }
    if template.name.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::new("spec.infrastructureTemplate.name", "required"));
    }
    if let Some(api_version) = template.api_version.as_deref()
        && let Some(problem) = infrastructure_group_problem(api_version)
    {
        errors.push(FieldError::new("spec.infrastructureTemplate.apiVersion", problem));
    }
    if let (Some(template_ns), Some(ns)) = (template.namespace.as_deref(), namespace)
        && template_ns != ns
    {
        errors.push(FieldError::new(
            "spec.infrastructureTemplate.namespace",
            format!(
                "{}: must be the EtcdadmCluster's own namespace {ns:?}",
                quoted(template_ns)
            ),
        ));
    }
    errors
}

/// Why `api_version` is not of the infrastructure providers' group, if it is not: the
/// controller clones only kinds of that group, and its RBAC reaches no other.
pub fn infrastructure_group_problem(api_version: &str) -> Option<String> {
    match api_version.split_once('/') {
        Some((group, version)) if group == names::INFRASTRUCTURE_GROUP && !version.is_empty() => None,
        _ => Some(format!(
            "{}: must be {}/<version> (the template of an infrastructure provider)",
            quoted(api_version),
            names::INFRASTRUCTURE_GROUP
        )),
    }
}

/// `spec.failureDomains`: unique, non-empty names.
pub(super) fn failure_domain_problems(domains: &[String]) -> Vec<FieldError> {
    let mut errors = vec![];
    for (i, domain) in domains.iter().enumerate() {
        if domain.is_empty() {
            errors.push(FieldError::new(
                format!("spec.failureDomains[{i}]"),
                "must not be empty",
            ));
        } else if domains[..i].contains(domain) {
            errors.push(FieldError::new(
                format!("spec.failureDomains[{i}]"),
                format!("{} is listed twice", quoted(domain)),
            ));
        }
    }
    errors
}

/// The template's namespace cannot move under running members.
pub(super) fn template_update_problems(old: &ObjectReference, new: &ObjectReference) -> Vec<FieldError> {
    let mut errors = vec![];
    if old.namespace.is_some() && old.namespace != new.namespace {
        errors.push(FieldError::new(
            "spec.infrastructureTemplate.namespace",
            "is immutable",
        ));
    }
    errors
}
