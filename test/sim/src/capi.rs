//! The CAPI stand-in: the parts of CAPI's Cluster and Machine controllers that etcd flows need,
//! v1beta2 contract, in front of the sim's infrastructure provider ([`crate::infra`]). What it
//! does is what real Cluster API v1.13 was seen to do (docs/capi.md, "Where the stand-ins
//! differed"): a Machine without a Node stays `Provisioned`, the infrastructure machine is
//! deleted (and gone) before the bootstrap config, pre-terminate hooks hold the deletion, and a
//! Cluster is deleted only once its worker Machines (etcd Machines among them) are gone.
//!
//! It makes a pass over everything instead of reconciling one object: it is test infrastructure,
//! and a pass restarts cleanly. Watches start a pass as soon as something changes, as CAPI's own
//! watches would react ([`crate::wake`]).

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::warn;

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::names;

use crate::infra::is_subset;
pub use crate::infra::{sim_cluster_resource, sim_machine_resource, sim_machine_template_resource};
use crate::wake::Wake;

/// CAPI's Machine finalizer.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// CAPI's Cluster finalizer.
pub const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
const MANAGER: &str = "capi-standin";
const TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// CAPI's Cluster and Machine controllers, as far as etcd Machines meet them.
pub struct CapiStandIn {
    pub client: Client,
    pub namespace: String,
}

impl CapiStandIn {
    /// Reconcile every Cluster and Machine until cancelled: a pass as soon as one of them, their
    /// bootstrap configs or infrastructure objects changes (as CAPI's watches react), else every
    /// tick.
    pub async fn run(self) {
        let resources = vec![
            ApiResource::erase::<Cluster>(&()),
            ApiResource::erase::<Machine>(&()),
            ApiResource::erase::<EtcdadmConfig>(&()),
            sim_cluster_resource(),
            sim_machine_resource(),
        ];
        let pass = || async {
            if let Err(e) = self.tick().await {
                warn!(error = %e, "CAPI stand-in pass failed");
            }
        };
        Wake::drive(
            self.client.clone(),
            self.namespace.clone(),
            resources,
            pass,
            || TICK,
        )
        .await;
    }

    /// One pass over all Clusters and Machines.
    pub async fn tick(&self) -> Result<(), kube::Error> {
        let clusters: Api<Cluster> = Api::namespaced(self.client.clone(), &self.namespace);
        for cluster in clusters.list(&Default::default()).await?.items {
            self.reconcile_cluster(&cluster).await?;
        }
        let machines: Api<Machine> = Api::namespaced(self.client.clone(), &self.namespace);
        for machine in machines.list(&Default::default()).await?.items {
            if let Err(e) = self.reconcile_machine(&machine).await {
                warn!(machine = %machine.name_any(), error = %e, "machine pass failed");
            }
        }
        Ok(())
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        }
    }

    /// Take `finalizer` off `object`, if it carries it.
    async fn remove_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), kube::Error>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let finalizers: Vec<&String> = object.finalizers().iter().filter(|f| *f != finalizer).collect();
        if finalizers.len() != object.finalizers().len() {
            api.patch(
                &object.name_any(),
                &Self::params(),
                &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})),
            )
            .await?;
        }
        Ok(())
    }

    /// The Cluster controller: own the SimCluster and the control plane object, copy the
    /// infrastructure's provisioning, endpoint and failure domains; delete in CAPI's order.
    async fn reconcile_cluster(&self, cluster: &Cluster) -> Result<(), kube::Error> {
        if cluster.spec.paused.unwrap_or(false) {
            return Ok(());
        }
        let clusters: Api<Cluster> = Api::namespaced(self.client.clone(), &self.namespace);
        if cluster.metadata.deletion_timestamp.is_some() {
            return self.delete_cluster(cluster, &clusters).await;
        }
        if !cluster.finalizers().iter().any(|f| f == CLUSTER_FINALIZER) {
            let mut finalizers = cluster.finalizers().to_vec();
            finalizers.push(CLUSTER_FINALIZER.into());
            clusters
                .patch(
                    &cluster.name_any(),
                    &Self::params(),
                    &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})),
                )
                .await?;
        }
        let owner = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                           "name": cluster.name_any(), "uid": cluster.uid().unwrap_or_default()});
        if let Some(control_plane) = self.control_plane(cluster).await? {
            ensure_owner(&self.control_plane_api(), &control_plane, &owner).await?;
        }
        let mut failure_domains = vec![];
        let mut provisioned = cluster.spec.infrastructure_ref.is_none();
        if let Some(infra) = &cluster.spec.infrastructure_ref {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &sim_cluster_resource());
            let Some(sim) = api.get_opt(&infra.name).await? else {
                return Ok(());
            };
            if let Some(owner) = cluster.controller_owner_ref(&()) {
                let owner = serde_json::to_value(owner).unwrap_or_default();
                ensure_owner(&api, &sim, &owner).await?;
            }
            if let Some(domains) = sim
                .data
                .pointer("/status/failureDomains")
                .and_then(Value::as_array)
            {
                failure_domains = domains.clone();
            }
            provisioned = sim.data.pointer("/status/initialization/provisioned") == Some(&json!(true));
            if let Some(endpoint) = sim.data.pointer("/spec/controlPlaneEndpoint")
                && !cluster.spec.rest.contains_key("controlPlaneEndpoint")
            {
                let patch = json!({"spec": {"controlPlaneEndpoint": endpoint}});
                Api::<Cluster>::namespaced(self.client.clone(), &self.namespace)
                    .patch(&cluster.name_any(), &Self::params(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        if !provisioned
            || (cluster.infrastructure_ready()
                && cluster.status.as_ref().map(|s| s.failure_domains.len()) == Some(failure_domains.len()))
        {
            return Ok(());
        }
        let patch = json!({"status": {"initialization": {"infrastructureProvisioned": true}, "failureDomains": failure_domains}});
        Api::<Cluster>::namespaced(self.client.clone(), &self.namespace)
            .patch_status(&cluster.name_any(), &Self::params(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    fn control_plane_api(&self) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "controlplane.cluster.x-k8s.io",
            "v1beta2",
            "KubeadmControlPlane",
        ));
        Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
    }

    /// The KubeadmControlPlane the Cluster names, when it exists.
    async fn control_plane(&self, cluster: &Cluster) -> Result<Option<DynamicObject>, kube::Error> {
        match &cluster.spec.control_plane_ref {
            Some(reference) if reference.kind == "KubeadmControlPlane" => {
                self.control_plane_api().get_opt(&reference.name).await
            }
            _ => Ok(None),
        }
    }

    /// A Cluster's deletion as CAPI v1.13 does it: it waits until every worker Machine (etcd
    /// Machines count as workers) is gone, then deletes the control plane object, then the
    /// infrastructure cluster, then lets the Cluster go.
    async fn delete_cluster(&self, cluster: &Cluster, clusters: &Api<Cluster>) -> Result<(), kube::Error> {
        let name = cluster.name_any();
        let selector = format!("{}={name}", names::CLUSTER_NAME_LABEL);
        let machines: Api<Machine> = Api::namespaced(self.client.clone(), &self.namespace);
        let workers = machines
            .list(&kube::api::ListParams::default().labels(&selector))
            .await?
            .items
            .iter()
            .filter(|m| !m.labels().contains_key(names::CONTROL_PLANE_LABEL))
            .count();
        if workers > 0 {
            return Ok(());
        }
        if let Some(control_plane) = self.control_plane(cluster).await? {
            if control_plane.metadata.deletion_timestamp.is_none() {
                self.control_plane_api()
                    .delete(&control_plane.name_any(), &Default::default())
                    .await?;
            }
            return Ok(());
        }
        if let Some(infra) = &cluster.spec.infrastructure_ref {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &sim_cluster_resource());
            if let Some(sim) = api.get_opt(&infra.name).await? {
                if sim.metadata.deletion_timestamp.is_none() {
                    api.delete(&infra.name, &Default::default()).await?;
                }
                return Ok(());
            }
        }
        Self::remove_finalizer(clusters, cluster, CLUSTER_FINALIZER).await?;
        Ok(())
    }

    async fn reconcile_machine(&self, machine: &Machine) -> Result<(), kube::Error> {
        // One Machine's whole life as CAPI drives it (bootstrap, infrastructure, hooks, deletion), in order.
        let name = machine.name_any();
        let machines: Api<Machine> = Api::namespaced(self.client.clone(), &self.namespace);
        let sims: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &sim_machine_resource());
        if machine.is_deleting() {
            return self.delete_machine(machine, &machines, &sims).await;
        }
        if !machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER) {
            let mut finalizers = machine.finalizers().to_vec();
            finalizers.push(MACHINE_FINALIZER.into());
            let patch = json!({"metadata": {"finalizers": finalizers}});
            machines
                .patch(&name, &Self::params(), &Patch::Merge(&patch))
                .await?;
        }
        let owner = machine
            .controller_owner_ref(&())
            .map(|r| serde_json::to_value(r).unwrap_or_default());

        // Bootstrap: become the config's owner, copy dataSecretName once it is ready.
        let mut data_secret = machine.spec.bootstrap.data_secret_name.clone();
        if let Some(config_ref) = &machine.spec.bootstrap.config_ref {
            let configs: Api<EtcdadmConfig> = Api::namespaced(self.client.clone(), &self.namespace);
            if let Some(config) = configs.get_opt(&config_ref.name).await? {
                if let Some(owner) = &owner {
                    ensure_config_owner(&configs, &config, owner).await?;
                }
                if data_secret.is_none()
                    && let Some(secret) = config.status.as_ref().and_then(|s| s.data_secret_name.clone())
                {
                    let patch = json!({"spec": {"bootstrap": {"dataSecretName": secret}}});
                    machines
                        .patch(&name, &Self::params(), &Patch::Merge(&patch))
                        .await?;
                    data_secret = Some(secret);
                }
            }
        }

        // Infrastructure: the Machine controls its SimMachine; the provider boots it.
        let infra_name = machine.spec.infrastructure_ref.name.clone();
        let Some(sim) = sims.get_opt(&infra_name).await? else {
            return Ok(());
        };
        let machine_ref = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name,
            "uid": machine.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
        });
        ensure_owner(&sims, &sim, &machine_ref).await?;
        let provisioned = sim.data.pointer("/status/initialization/provisioned") == Some(&json!(true));
        let provider_id = sim.data.pointer("/spec/providerID").and_then(Value::as_str);
        if provisioned
            && let Some(id) = provider_id
            && machine.spec.rest.get("providerID").and_then(Value::as_str) != Some(id)
        {
            machines
                .patch(
                    &name,
                    &Self::params(),
                    &Patch::Merge(&json!({"spec": {"providerID": id}})),
                )
                .await?;
        }

        // Machine status, as CAPI's Machine controller reports it: without a Node a Machine
        // stays Provisioned; a terminal failure of its infrastructure makes it Failed.
        let failure = sim.data.pointer("/status/failureReason").and_then(Value::as_str);
        let phase = match (provisioned, failure) {
            (_, Some(_)) => "Failed",
            (false, _) if data_secret.is_none() => "Pending",
            (false, _) => "Provisioning",
            (true, None) => "Provisioned",
        };
        let mut status = json!({
            "phase": phase,
            "initialization": {
                "bootstrapDataSecretCreated": data_secret.is_some(),
                "infrastructureProvisioned": provisioned,
            },
        });
        if provisioned && let Some(addresses) = sim.data.pointer("/status/addresses") {
            status["addresses"] = addresses.clone();
        }
        let current = machine
            .status
            .as_ref()
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .unwrap_or_default();
        if !is_subset(&status, &current) {
            machines
                .patch_status(&name, &Self::params(), &Patch::Merge(&json!({"status": status})))
                .await?;
        }
        Ok(())
    }

    /// Deletion as CAPI does it: wait for pre-terminate hooks, delete the infrastructure
    /// machine and wait until it is gone (its provider powers it off), then the bootstrap
    /// config, then let the Machine go.
    async fn delete_machine(
        &self,
        machine: &Machine,
        machines: &Api<Machine>,
        sims: &Api<DynamicObject>,
    ) -> Result<(), kube::Error> {
        let hooks = machine
            .annotations()
            .keys()
            .any(|k| k.starts_with(names::PRE_TERMINATE_HOOK_PREFIX));
        if hooks {
            return Ok(());
        }
        let infra = &machine.spec.infrastructure_ref.name;
        if let Some(sim) = sims.get_opt(infra).await? {
            if sim.metadata.deletion_timestamp.is_none() {
                sims.delete(infra, &Default::default()).await?;
            }
            return Ok(());
        }
        if let Some(config_ref) = &machine.spec.bootstrap.config_ref {
            let configs: Api<EtcdadmConfig> = Api::namespaced(self.client.clone(), &self.namespace);
            if configs.get_opt(&config_ref.name).await?.is_some() {
                configs.delete(&config_ref.name, &Default::default()).await?;
            }
        }
        Self::remove_finalizer(machines, machine, MACHINE_FINALIZER).await?;
        Ok(())
    }
}

/// Make `owner` an owner of `object` (the controller when `owner` says so).
async fn ensure_owner(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    owner: &Value,
) -> Result<(), kube::Error> {
    let owner_uid = owner.get("uid").and_then(Value::as_str).unwrap_or_default();
    if object.owner_references().iter().any(|r| r.uid == owner_uid) {
        return Ok(());
    }
    let mut owners: Vec<Value> = object
        .owner_references()
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    owners.push(owner.clone());
    api.patch(
        &object.name_any(),
        &PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        },
        &Patch::Merge(&json!({"metadata": {"ownerReferences": owners}})),
    )
    .await?;
    Ok(())
}

/// The Machine as an owner of its bootstrap config: the controller unless another is.
async fn ensure_config_owner(
    configs: &Api<EtcdadmConfig>,
    config: &EtcdadmConfig,
    owner: &Value,
) -> Result<(), kube::Error> {
    let owner_uid = owner.get("uid").and_then(Value::as_str).unwrap_or_default();
    if config.owner_references().iter().any(|r| r.uid == owner_uid) {
        return Ok(());
    }
    let has_controller = config
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true));
    let mut new_owner = owner.clone();
    if has_controller {
        new_owner["controller"] = json!(false);
    }
    let mut owners: Vec<Value> = config
        .owner_references()
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    owners.push(new_owner);
    let patch = json!({"metadata": {"ownerReferences": owners}});
    configs
        .patch(
            &config.name_any(),
            &PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}
