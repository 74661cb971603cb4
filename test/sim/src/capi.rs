//! The CAPI stand-in: the parts of CAPI's Machine and Cluster controllers and of an
//! infrastructure provider (`SimCluster`, `SimMachine`) that etcd flows need, v1beta2 contract.
//!
//! It polls instead of watching: it is test infrastructure, and a poll loop restarts cleanly.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::names;
use etcdadm_sim_machines::{MachineRuntime, MachineSpec, MachineState};

use crate::boot_delay::{BootDelay, Draws};

/// CAPI's Machine finalizer.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
const MANAGER: &str = "capi-standin";
const TICK: Duration = Duration::from_millis(250);

/// The infrastructure kinds of the sim.
pub fn sim_machine_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "SimMachine",
    ))
}

pub fn sim_machine_template_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "SimMachineTemplate",
    ))
}

pub fn sim_cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "SimCluster",
    ))
}

/// Where machines live and how they boot.
pub struct CapiStandIn {
    pub client: Client,
    pub namespace: String,
    pub runtime: Arc<dyn MachineRuntime>,
    /// Machine root directories are created under here.
    pub work_dir: PathBuf,
    /// Machine IPs are `<ip_prefix>.N` for N in 2..=254.
    pub ip_prefix: [u8; 3],
    /// Validity of the member certificates of machines booted from now on (`None`: etcdadm's
    /// 365 days); see [`crate::plane::Plane::set_member_certificate_validity`].
    pub member_certificate_validity: Arc<Mutex<Option<Duration>>>,
    /// Whether machines booted from now on route through a second interface while reporting
    /// the first one's address; see [`crate::plane::Plane::set_default_route_on_second_interface`].
    pub default_route_on_second_interface: Arc<AtomicBool>,
    /// How long a Machine takes to boot once its bootstrap data exists.
    pub boot_delay: BootDelay,
    /// When each Machine waiting to boot is due, and the delays still to draw.
    pub booting: Mutex<Booting>,
}

/// Machines whose bootstrap data exists and that have not booted yet.
#[derive(Debug)]
pub struct Booting {
    due: BTreeMap<String, Instant>,
    draws: Draws,
}

impl Booting {
    pub fn new(delay: BootDelay) -> Booting {
        Booting {
            due: BTreeMap::new(),
            draws: delay.draws(),
        }
    }
}

impl CapiStandIn {
    /// Reconcile every Cluster and Machine until cancelled.
    pub async fn run(self) {
        loop {
            if let Err(e) = self.tick().await {
                warn!(error = %e, "CAPI stand-in pass failed");
            }
            tokio::time::sleep(TICK).await;
        }
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

    /// Infrastructure ready and failure domains copied from the SimCluster (none: ready at once).
    async fn reconcile_cluster(&self, cluster: &Cluster) -> Result<(), kube::Error> {
        let mut failure_domains = vec![];
        if let Some(infra) = &cluster.spec.infrastructure_ref {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &sim_cluster_resource());
            let Some(sim) = api.get_opt(&infra.name).await? else {
                return Ok(());
            };
            if let Some(domains) = sim.data.pointer("/spec/failureDomains").and_then(Value::as_array) {
                failure_domains = domains
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|d| json!({"name": d, "controlPlane": true}))
                    .collect();
            }
            if sim.data.pointer("/status/initialization/provisioned") != Some(&json!(true)) {
                let patch = json!({"status": {"initialization": {"provisioned": true}}});
                api.patch_status(&infra.name, &Self::params(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        if cluster.infrastructure_ready()
            && cluster.status.as_ref().map(|s| s.failure_domains.len()) == Some(failure_domains.len())
        {
            return Ok(());
        }
        let patch = json!({"status": {"initialization": {"infrastructureProvisioned": true}, "failureDomains": failure_domains}});
        Api::<Cluster>::namespaced(self.client.clone(), &self.namespace)
            .patch_status(&cluster.name_any(), &Self::params(), &Patch::Merge(&patch))
            .await?;
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
                    self.ensure_owner(&configs, &config, owner).await?;
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

        // Infrastructure: own the SimMachine; boot it once bootstrap data exists.
        let infra_name = machine.spec.infrastructure_ref.name.clone();
        let Some(sim) = sims.get_opt(&infra_name).await? else {
            return Ok(());
        };
        if let Some(owner) = &owner
            && !sim
                .owner_references()
                .iter()
                .any(|r| r.kind == "Machine" && r.name == name)
        {
            let mut owners: Vec<Value> = sim
                .owner_references()
                .iter()
                .filter_map(|r| serde_json::to_value(r).ok())
                .collect();
            owners.push(owner.clone());
            sims.patch(
                &infra_name,
                &Self::params(),
                &Patch::Merge(&json!({"metadata": {"ownerReferences": owners}})),
            )
            .await?;
        }
        let mut address = sim
            .data
            .pointer("/status/addresses/0/address")
            .and_then(Value::as_str)
            .map(String::from);
        if address.is_none()
            && let Some(secret_name) = &data_secret
            && self.boot_due(&name)
        {
            address = self.boot(&name, &infra_name, secret_name, &sims).await?;
        }

        // Machine status, as CAPI's Machine controller reports it.
        let state = self.runtime.state(&name);
        let phase = match (&address, &state) {
            (None, _) if data_secret.is_none() => "Pending",
            (None, _) => "Provisioning",
            (
                Some(_),
                MachineState::Running {
                    bootstrap_succeeded: true,
                },
            ) => "Running",
            (Some(_), MachineState::Failed { .. }) => "Failed",
            (Some(_), _) => "Provisioned",
        };
        let mut status = json!({
            "phase": phase,
            "initialization": {
                "bootstrapDataSecretCreated": data_secret.is_some(),
                "infrastructureProvisioned": address.is_some(),
            },
        });
        if let Some(address) = &address {
            status["addresses"] = json!([{"type": "InternalIP", "address": address}]);
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

    async fn ensure_owner(
        &self,
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
            .patch(&config.name_any(), &Self::params(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Whether Machine `name`, whose bootstrap data exists, has finished booting: its delay is
    /// drawn when it is first asked about.
    fn boot_due(&self, name: &str) -> bool {
        if self.boot_delay == BootDelay::None {
            return true;
        }
        let mut booting = self.booting.lock().unwrap_or_else(PoisonError::into_inner);
        let Booting { due, draws } = &mut *booting;
        let at = *due.entry(name.to_string()).or_insert_with(|| {
            let delay = draws.next_delay();
            info!(machine = name, delay = ?delay, "machine booting");
            Instant::now() + delay
        });
        Instant::now() >= at
    }

    /// Allocate an address, hand the user data to the runtime, report the SimMachine provisioned.
    async fn boot(
        &self,
        machine: &str,
        infra: &str,
        secret_name: &str,
        sims: &Api<DynamicObject>,
    ) -> Result<Option<String>, kube::Error> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(secret) = secrets.get_opt(secret_name).await? else {
            return Ok(None);
        };
        let Some(user_data) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(names::DATA_SECRET_VALUE_KEY))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
        else {
            warn!(
                machine,
                secret = secret_name,
                "bootstrap data Secret has no value"
            );
            return Ok(None);
        };
        let taken: Vec<String> = sims
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter_map(|s| {
                s.data
                    .pointer("/status/addresses/0/address")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .collect();
        let Some(ip) = self.free_ip(&taken) else {
            warn!(machine, "no free machine address left");
            return Ok(None);
        };
        let spec = MachineSpec {
            name: machine.to_string(),
            ip,
            root: self.work_dir.join("machines").join(machine),
            user_data,
            member_certificate_validity: *self
                .member_certificate_validity
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            default_route_on_second_interface: self.default_route_on_second_interface.load(Ordering::Relaxed),
        };
        if let Err(e) = self.runtime.boot(&spec) {
            warn!(machine, error = %e, "boot failed");
            return Ok(None);
        }
        info!(machine, %ip, "machine booted");
        let patch = json!({"status": {"initialization": {"provisioned": true},
                                      "addresses": [{"type": "InternalIP", "address": ip.to_string()}]}});
        sims.patch_status(infra, &Self::params(), &Patch::Merge(&patch))
            .await?;
        Ok(Some(ip.to_string()))
    }

    fn free_ip(&self, taken: &[String]) -> Option<IpAddr> {
        let [a, b, c] = self.ip_prefix;
        (2..=254u8)
            .map(|n| IpAddr::V4(Ipv4Addr::new(a, b, c, n)))
            .find(|ip| !taken.contains(&ip.to_string()) && self.runtime.address_free(*ip))
    }

    /// Deletion as CAPI does it: wait for pre-terminate hooks, then power off and release.
    async fn delete_machine(
        &self,
        machine: &Machine,
        machines: &Api<Machine>,
        sims: &Api<DynamicObject>,
    ) -> Result<(), kube::Error> {
        let hooks: Vec<&String> = machine
            .annotations()
            .keys()
            .filter(|k| k.starts_with(names::PRE_TERMINATE_HOOK_PREFIX))
            .collect();
        if !hooks.is_empty() {
            return Ok(());
        }
        let name = machine.name_any();
        self.booting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due
            .remove(&name);
        if let Err(e) = self.runtime.stop(&name) {
            warn!(machine = %name, error = %e, "stopping machine failed");
        }
        // Like CAPI's Machine controller: the infrastructure machine and the bootstrap config
        // are deleted with the Machine (other owners may keep them from being collected).
        let infra = &machine.spec.infrastructure_ref.name;
        if sims.get_opt(infra).await?.is_some() {
            sims.delete(infra, &Default::default()).await?;
        }
        if let Some(config_ref) = &machine.spec.bootstrap.config_ref {
            let configs: Api<EtcdadmConfig> = Api::namespaced(self.client.clone(), &self.namespace);
            if configs.get_opt(&config_ref.name).await?.is_some() {
                configs.delete(&config_ref.name, &Default::default()).await?;
            }
        }
        let finalizers: Vec<&String> = machine
            .finalizers()
            .iter()
            .filter(|f| *f != MACHINE_FINALIZER)
            .collect();
        if finalizers.len() != machine.finalizers().len() {
            machines
                .patch(
                    &name,
                    &Self::params(),
                    &Patch::Merge(&json!({"metadata": {"finalizers": finalizers}})),
                )
                .await?;
        }
        Ok(())
    }
}

/// Whether every field of `wanted` is present with the same value in `current`.
fn is_subset(wanted: &Value, current: &Value) -> bool {
    match (wanted, current) {
        (Value::Object(w), Value::Object(c)) => {
            w.iter().all(|(k, v)| c.get(k).is_some_and(|cv| is_subset(v, cv)))
        }
        _ => wanted == current,
    }
}
