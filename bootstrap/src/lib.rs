//! The etcdadm bootstrap provider: EtcdadmConfig in, cloud-init user data for etcdadm out.

pub mod controller;
pub mod metrics;
pub mod render;
pub mod webhook;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use etcdadm_shared::api::{EtcdadmConfig, EtcdadmConfigTemplate};

/// The CRDs this provider serves.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![EtcdadmConfig::crd(), EtcdadmConfigTemplate::crd()]
}
