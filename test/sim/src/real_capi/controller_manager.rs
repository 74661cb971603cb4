//! The two parts of kube-controller-manager a management cluster relies on, which the envtest
//! API server runs without (there is no kube-controller-manager binary here): ClusterRole
//! aggregation (Cluster API's manager role is an aggregate of every provider's role) and the
//! garbage collector (an EtcdadmCluster, Secrets and templates go with their owners). Both
//! follow what Kubernetes documents, reduced to what the plane exercises:
//!
//! - an aggregated ClusterRole's rules are the rules of every ClusterRole its selectors match;
//! - an object whose owners are all gone (by uid) is deleted in the background; references to
//!   owners that are gone are dropped while another owner stays; an owner deleted in the
//!   foreground loses its `foregroundDeletion` finalizer once no dependent blocks it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::warn;

const MANAGER: &str = "controller-manager-standin";
const FOREGROUND: &str = "foregroundDeletion";

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Run both until cancelled, every `every`.
pub async fn run(client: Client, every: Duration) {
    let mut resources = vec![];
    for pass in 0u64.. {
        if let Err(e) = aggregate_cluster_roles(&client).await {
            warn!(error = %e, "ClusterRole aggregation pass failed");
        }
        // Kinds come and go with CRDs (and are served a moment after they are created).
        if pass % 10 == 0 {
            match collectable(&client).await {
                Ok(found) => resources = found,
                Err(e) => warn!(error = %e, "discovery failed"),
            }
        }
        if let Err(e) = collect_garbage(&client, &resources).await {
            warn!(error = %e, "garbage collection pass failed");
        }
        tokio::time::sleep(every).await;
    }
}

/// One pass of ClusterRole aggregation.
pub async fn aggregate_cluster_roles(client: &Client) -> Result<(), kube::Error> {
    let api: Api<ClusterRole> = Api::all(client.clone());
    let roles = api.list(&Default::default()).await?.items;
    for role in roles.iter().filter(|r| r.aggregation_rule.is_some()) {
        let selectors = role
            .aggregation_rule
            .as_ref()
            .and_then(|a| a.cluster_role_selectors.clone())
            .unwrap_or_default();
        let mut rules = vec![];
        for other in roles.iter().filter(|r| r.name_any() != role.name_any()) {
            let labels = other.labels();
            let selected = selectors.iter().any(|selector| {
                selector.match_labels.as_ref().is_some_and(|wanted| {
                    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
                })
            });
            if selected {
                rules.extend(other.rules.clone().unwrap_or_default());
            }
        }
        if role.rules.clone().unwrap_or_default() != rules {
            api.patch(
                &role.name_any(),
                &params(),
                &Patch::Merge(&json!({ "rules": rules })),
            )
            .await?;
        }
    }
    Ok(())
}

/// The namespaced resources whose objects may have owners here: Cluster API's, ours, the sim's,
/// and Secrets and ConfigMaps.
async fn collectable(client: &Client) -> Result<Vec<ApiResource>, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut resources = vec![];
    for group in discovery.groups() {
        let ours = group.name().ends_with("x-k8s.io");
        // Every kind at its most stable version: a group's preferred version need not serve
        // them all (bootstrap.cluster.x-k8s.io: KubeadmConfig at v1beta2, ours at v1beta1).
        for (resource, capabilities) in group.resources_by_stability() {
            let core = group.name().is_empty() && matches!(resource.kind.as_str(), "Secret" | "ConfigMap");
            if (ours || core)
                && capabilities.scope == Scope::Namespaced
                && capabilities.supports_operation(verbs::LIST)
                && capabilities.supports_operation(verbs::DELETE)
            {
                resources.push(resource);
            }
        }
    }
    Ok(resources)
}

/// One pass of garbage collection over every namespace.
pub async fn collect_garbage(client: &Client, resources: &[ApiResource]) -> Result<(), kube::Error> {
    let mut objects: Vec<(ApiResource, DynamicObject)> = vec![];
    for resource in resources {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        for object in api.list(&ListParams::default()).await?.items {
            objects.push((resource.clone(), object));
        }
    }
    let alive: BTreeSet<String> = objects.iter().filter_map(|(_, o)| o.uid()).collect();
    for (resource, object) in &objects {
        let namespace = object.namespace().unwrap_or_default();
        let namespace = namespace.as_str();
        let owners = object.owner_references();
        // An owner of a kind not listed here is taken to exist: nothing is deleted on a guess.
        let mut gone = vec![];
        for owner in owners {
            let group = owner.api_version.rsplit_once('/').map_or("", |(group, _)| group);
            let Some(owner_resource) = resources
                .iter()
                .find(|r| r.kind == owner.kind && r.group == group)
            else {
                continue;
            };
            // A failed read is no evidence: the owner is taken to exist until the next pass.
            if !alive.contains(&owner.uid)
                && owner_gone(client, namespace, owner_resource, owner)
                    .await
                    .unwrap_or(false)
            {
                gone.push(owner.uid.clone());
            }
        }
        if gone.is_empty() {
            continue;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        if gone.len() == owners.len() {
            if object.metadata.deletion_timestamp.is_none()
                && let Err(e) = api.delete(&object.name_any(), &DeleteParams::background()).await
            {
                warn!(object = %object.name_any(), error = %e, "garbage collection: delete failed");
            }
        } else if !gone.is_empty() {
            let kept: Vec<_> = owners.iter().filter(|o| !gone.contains(&o.uid)).collect();
            let patch =
                json!({"metadata": {"ownerReferences": kept, "resourceVersion": object.resource_version()}});
            let _ = api
                .patch(&object.name_any(), &params(), &Patch::Merge(&patch))
                .await;
        }
    }
    // Foreground deletion: an owner waits until no dependent blocks it.
    for (resource, object) in &objects {
        if object.metadata.deletion_timestamp.is_none()
            || !object.finalizers().iter().any(|f| f == FOREGROUND)
        {
            continue;
        }
        let namespace = object.namespace().unwrap_or_default();
        let uid = object.uid().unwrap_or_default();
        let blocked = objects.iter().any(|(_, dependent)| {
            dependent
                .owner_references()
                .iter()
                .any(|o| o.uid == uid && o.block_owner_deletion == Some(true))
        });
        if !blocked {
            let finalizers: Vec<&String> = object.finalizers().iter().filter(|f| *f != FOREGROUND).collect();
            let patch =
                json!({"metadata": {"finalizers": finalizers, "resourceVersion": object.resource_version()}});
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
            let _ = api
                .patch(&object.name_any(), &params(), &Patch::Merge(&patch))
                .await;
        }
    }
    Ok(())
}

/// Whether `owner` is gone, asked afresh (it may have been created after its kind was listed).
async fn owner_gone(
    client: &Client,
    namespace: &str,
    resource: &ApiResource,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    Ok(api
        .get_opt(&owner.name)
        .await?
        .is_none_or(|found| found.uid().as_deref() != Some(owner.uid.as_str())))
}
