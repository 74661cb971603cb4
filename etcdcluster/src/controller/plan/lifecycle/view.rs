//! What the lifecycle concern reads and sees besides the core observation: who owns the
//! infrastructure template (the Cluster must, as KubeadmControlPlane makes it own its own
//! template, so `clusterctl move` carries it and the garbage collector takes it with the
//! Cluster), and, while this EtcdadmCluster is being deleted, whether the control plane object
//! is being deleted too (upstream KCP then waits for the etcd Machines to go first).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::error::Error;

use crate::controller::decision::ConcernView;
use crate::controller::observation::Reads;
use crate::controller::observation::clock::UnhealthyClock;
use crate::controller::observation::read::{find_cluster, infra_machine_kind};

/// The infrastructure template's owners and the control plane's deletion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LifecycleView {
    /// The owner references of `spec.infrastructureTemplate` (`None`: it does not exist, or its
    /// kind is unknown).
    pub template_owners: Option<Vec<OwnerReference>>,
    /// The Cluster's control plane object is being deleted (read only while this EtcdadmCluster
    /// is being deleted).
    pub control_plane_deleting: bool,
}

/// `Ok(None)` for a 404: the object, or its kind, is not there.
async fn get_opt(api: &Api<DynamicObject>, name: &str) -> Result<Option<DynamicObject>, Error> {
    match api.get_opt(name).await {
        Ok(found) => Ok(found),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn template_owners(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<Option<Vec<OwnerReference>>, Error> {
    let (_, Some(machine_kind)) = infra_machine_kind(etcd, namespace) else {
        return Ok(None);
    };
    let template = &etcd.spec.infrastructure_template;
    let kind = template.kind.clone().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        &machine_kind.group,
        &machine_kind.version,
        &kind,
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let name = template.name.clone().unwrap_or_default();
    Ok(get_opt(&api, &name).await?.map(|t| t.owner_references().to_vec()))
}

async fn control_plane_deleting(
    client: &Client,
    namespace: &str,
    etcd: &EtcdadmCluster,
) -> Result<bool, Error> {
    if etcd.metadata.deletion_timestamp.is_none() {
        return Ok(false);
    }
    let Some(cluster) = find_cluster(client, namespace, etcd).await? else {
        return Ok(false);
    };
    let Some(reference) = &cluster.spec.control_plane_ref else {
        return Ok(false);
    };
    // The contract reference names no version: the group's preferred one is looked up.
    let Some((resource, _)) = kube::discovery::group(client, reference.group())
        .await
        .ok()
        .and_then(|group| group.recommended_kind(&reference.kind))
    else {
        return Ok(false);
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    Ok(get_opt(&api, &reference.name)
        .await?
        .is_some_and(|cp| cp.metadata.deletion_timestamp.is_some()))
}

impl ConcernView for LifecycleView {
    type Read = LifecycleView;

    async fn read(client: &Client, namespace: &str, etcd: &EtcdadmCluster) -> Result<Self::Read, Error> {
        Ok(LifecycleView {
            template_owners: template_owners(client, namespace, etcd).await?,
            control_plane_deleting: control_plane_deleting(client, namespace, etcd).await?,
        })
    }

    fn view(read: &Self::Read, _: &Reads, _: &UnhealthyClock) -> Self {
        read.clone()
    }
}
