//! The EtcdadmCluster controller: creates, health-checks, scales and rolls external etcd clusters;
//! and the snapshot controller beside it, which backs them up to an object store.

pub mod controller;
pub mod metrics;
pub mod snapshot;
pub mod webhook;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use etcdadm_shared::api::{EtcdadmCluster, EtcdadmSnapshot};

/// The CRDs this controller serves.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![EtcdadmCluster::crd(), EtcdadmSnapshot::crd()]
}
