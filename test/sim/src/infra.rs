//! The sim's infrastructure provider: `SimCluster`, `SimMachine` and `SimMachineTemplate` under
//! Cluster API's v1beta2 infrastructure contract, booting process machines from the bootstrap
//! data Secret their Machine names. It is the same provider under both the CAPI stand-in and the
//! real Cluster API controllers, so the two tiers differ only in who plays CAPI.
//!
//! Contract, as it does it (docs/capi.md, "The sim's infrastructure provider"):
//! - it acts on an object only once CAPI has made it an owner reference (the Cluster for a
//!   SimCluster, the Machine for a SimMachine), and never while the Cluster or the object is
//!   paused;
//! - a SimCluster reports `status.initialization.provisioned` and its `spec.failureDomains` as
//!   `status.failureDomains` (every one usable by control plane Machines), and has a
//!   `spec.controlPlaneEndpoint` (`<prefix>.1:6443` unless given), which CAPI copies to the
//!   Cluster;
//! - a SimMachine boots once its Machine has `spec.bootstrap.dataSecretName`, then reports
//!   `spec.providerID`, `status.addresses` and `status.initialization.provisioned`, and, as
//!   CAPD does, whether its user data ran (condition `BootstrapExecSucceeded`); a machine that
//!   could not boot is reported as a terminal failure (`status.failureReason`/`failureMessage`);
//! - each object carries the provider's finalizer; a SimMachine being deleted is powered off
//!   before the finalizer goes, unless `clusterctl move` deletes it (`delete-for-move`): its
//!   machine keeps running, and the provider of the target finds it again by its provider ID.
//!
//! Machines whose bootstrap config is not an EtcdadmConfig (a KubeadmControlPlane's) are
//! control plane hosts: they get an address and are reported provisioned. Under real CAPI a
//! KubeadmConfig's host boots into a real API server on the cluster's etcd, behind the
//! SimCluster's load balancer ([`crate::control_plane_host`]); elsewhere its user data is not run.
//!
//! It makes a pass over everything instead of reconciling one object: it is test infrastructure,
//! and a pass restarts cleanly. Watches start a pass as soon as something changes, as a
//! provider's own watches would react, and a pass runs when a boot is due ([`crate::wake`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use etcdadm_shared::api::capi::{Cluster, Machine};
use etcdadm_shared::names;
use etcdadm_sim_machines::{MachineRuntime, MachineSpec, MachineState};

use crate::boot_delay::{BootDelay, Draws};
use crate::control_plane_host::{ControlPlaneHosts, HostSpec};
use crate::infra_kinds::params;
pub use crate::infra_kinds::{
    BOOTSTRAP_EXEC_SUCCEEDED, FINALIZER, GROUP, VERSION, bootstrap_not_done, bootstrap_succeeded, is_subset,
    provider_id, sim_cluster_resource, sim_machine_resource, sim_machine_template_resource,
};
use crate::wake::Wake;

/// What `clusterctl move` annotates the source's objects with before it deletes them.
const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
const TICK: Duration = Duration::from_millis(250);

/// What can be changed about the machines booted from now on, while the provider runs.
#[derive(Clone, Default)]
pub struct BootSettings {
    /// Validity of the member certificates of machines booted from now on (`None`: etcdadm's
    /// 365 days); see [`crate::plane::Plane::set_member_certificate_validity`].
    pub member_certificate_validity: Arc<Mutex<Option<Duration>>>,
    /// Whether machines booted from now on route through a second interface while reporting
    /// the first one's address; see [`crate::plane::Plane::set_default_route_on_second_interface`].
    pub default_route_on_second_interface: Arc<AtomicBool>,
}

/// The provider: one per namespace it serves.
pub struct SimInfra {
    pub client: Client,
    pub namespace: String,
    pub runtime: Arc<dyn MachineRuntime>,
    /// Machine root directories are created under here.
    pub work_dir: PathBuf,
    /// Machine IPs are `<ip_prefix>.N` for N in 2..=254.
    pub ip_prefix: [u8; 3],
    pub settings: BootSettings,
    /// How long a Machine takes to boot once its bootstrap data exists.
    pub boot_delay: BootDelay,
    /// When each machine waiting to boot is due, and the delays still to draw.
    pub booting: Mutex<Booting>,
    /// Where KubeadmConfig-bootstrapped Machines boot into control plane hosts (real CAPI only).
    pub control_plane: Option<Arc<ControlPlaneHosts>>,
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

    /// How long until the next Machine waiting to boot is due, when one is due later than `now`:
    /// it boots then, not at the next tick. (Those due already booted, or are retried every
    /// tick.)
    pub fn until_next(&self, now: Instant) -> Option<Duration> {
        self.due
            .values()
            .filter(|at| **at > now)
            .min()
            .map(|at| *at - now)
    }
}

/// The owner reference of `kind` on `object`, by name.
fn owner_named(object: &DynamicObject, kind: &str) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|r| r.kind == kind && r.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|r| r.name.clone())
}

impl SimInfra {
    /// Reconcile every SimCluster and SimMachine until cancelled: a pass as soon as one of them,
    /// a Cluster or a Machine changes (as a provider's watches react) or a Machine's boot is due,
    /// else every tick.
    pub async fn run(self) {
        let resources = vec![
            ApiResource::erase::<Cluster>(&()),
            ApiResource::erase::<Machine>(&()),
            sim_cluster_resource(),
            sim_machine_resource(),
        ];
        let pass = || async {
            if let Err(e) = self.tick().await {
                warn!(error = %e, "sim infrastructure pass failed");
            }
        };
        let longest = || {
            let next_boot = self
                .booting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .until_next(Instant::now());
            next_boot.map_or(TICK, |due| due.min(TICK))
        };
        Wake::drive(
            self.client.clone(),
            self.namespace.clone(),
            resources,
            pass,
            longest,
        )
        .await;
    }

    /// One pass over all SimClusters and SimMachines.
    pub async fn tick(&self) -> Result<(), kube::Error> {
        let clusters = self.api(&sim_cluster_resource());
        for sim in clusters.list(&Default::default()).await?.items {
            if let Err(e) = self.reconcile_cluster(&clusters, &sim).await {
                warn!(simcluster = %sim.name_any(), error = %e, "SimCluster pass failed");
            }
        }
        let machines = self.api(&sim_machine_resource());
        for sim in machines.list(&Default::default()).await?.items {
            if let Err(e) = self.reconcile_machine(&machines, &sim).await {
                warn!(simmachine = %sim.name_any(), error = %e, "SimMachine pass failed");
            }
        }
        Ok(())
    }

    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, resource)
    }

    /// Whether the Cluster `name` (when there is one) or the object itself is paused.
    async fn paused(&self, object: &DynamicObject, cluster: Option<&str>) -> Result<bool, kube::Error> {
        if object.annotations().contains_key(names::PAUSED_ANNOTATION) {
            return Ok(true);
        }
        let Some(cluster) = cluster else {
            return Ok(false);
        };
        let clusters: Api<Cluster> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(clusters.get_opt(cluster).await?.is_some_and(|c| c.is_paused()))
    }

    async fn remove_finalizer(
        &self,
        api: &Api<DynamicObject>,
        sim: &DynamicObject,
    ) -> Result<(), kube::Error> {
        let finalizers: Vec<&String> = sim.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        if finalizers.len() == sim.finalizers().len() {
            return Ok(());
        }
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": sim.resource_version()}});
        api.patch(&sim.name_any(), &params(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn add_finalizer(&self, api: &Api<DynamicObject>, sim: &DynamicObject) -> Result<(), kube::Error> {
        if sim.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let mut finalizers = sim.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": sim.resource_version()}});
        api.patch(&sim.name_any(), &params(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// A SimCluster: provisioned at once (there is nothing to create), its failure domains
    /// offered to control plane and etcd Machines alike.
    async fn reconcile_cluster(
        &self,
        api: &Api<DynamicObject>,
        sim: &DynamicObject,
    ) -> Result<(), kube::Error> {
        if sim.metadata.deletion_timestamp.is_some() {
            // A copy deleted by `clusterctl move`: the target's provider balances on.
            if let Some(hosts) = &self.control_plane
                && !sim.annotations().contains_key(DELETE_FOR_MOVE)
            {
                hosts.remove_balancer(&sim.name_any());
            }
            return self.remove_finalizer(api, sim).await;
        }
        let Some(cluster) = owner_named(sim, "Cluster") else {
            return Ok(());
        };
        if self.paused(sim, Some(&cluster)).await? {
            return Ok(());
        }
        self.add_finalizer(api, sim).await?;
        let [a, b, c] = self.ip_prefix;
        let endpoint = json!({"host": format!("{a}.{b}.{c}.1"), "port": 6443});
        if sim.data.pointer("/spec/controlPlaneEndpoint/host").is_none() {
            let patch = json!({"spec": {"controlPlaneEndpoint": endpoint}});
            api.patch(&sim.name_any(), &params(), &Patch::Merge(&patch))
                .await?;
        }
        if let Some(hosts) = &self.control_plane {
            let given = sim.data.pointer("/spec/controlPlaneEndpoint");
            hosts.balance(&sim.name_any(), given.unwrap_or(&endpoint)).await;
        }
        let domains: Vec<Value> = sim
            .data
            .pointer("/spec/failureDomains")
            .and_then(Value::as_array)
            .map(|domains| {
                domains
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|d| json!({"name": d, "controlPlane": true}))
                    .collect()
            })
            .unwrap_or_default();
        let status = json!({"initialization": {"provisioned": true}, "failureDomains": domains});
        if sim
            .data
            .get("status")
            .is_some_and(|current| is_subset(&status, current))
        {
            return Ok(());
        }
        api.patch_status(
            &sim.name_any(),
            &params(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await?;
        Ok(())
    }

    /// A SimMachine's whole life: wait for its Machine, boot from its bootstrap data, report,
    /// power off on deletion.
    async fn reconcile_machine(
        &self,
        api: &Api<DynamicObject>,
        sim: &DynamicObject,
    ) -> Result<(), kube::Error> {
        let name = sim.name_any();
        let cluster = sim.labels().get(names::CLUSTER_NAME_LABEL).cloned();
        if self.paused(sim, cluster.as_deref()).await? {
            return Ok(());
        }
        let Some(machine_name) = owner_named(sim, "Machine") else {
            if sim.metadata.deletion_timestamp.is_some() {
                self.power_off(&name);
                return self.remove_finalizer(api, sim).await;
            }
            return Ok(());
        };
        if sim.metadata.deletion_timestamp.is_some() {
            // A copy deleted by `clusterctl move` leaves its machine running for the target.
            if !sim.annotations().contains_key(DELETE_FOR_MOVE) {
                self.power_off(&machine_name);
            }
            return self.remove_finalizer(api, sim).await;
        }
        self.add_finalizer(api, sim).await?;
        let machines: Api<Machine> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(machine) = machines.get_opt(&machine_name).await? else {
            return Ok(());
        };
        let mut address = sim
            .data
            .pointer("/status/addresses/0/address")
            .and_then(Value::as_str)
            .map(String::from);
        let config_kind = machine
            .spec
            .bootstrap
            .config_ref
            .as_ref()
            .map(|r| r.kind.as_str());
        let etcd_member = config_kind == Some("EtcdadmConfig");
        let kubeadm_host = self.control_plane.is_some() && config_kind == Some("KubeadmConfig");
        // A machine booted before, whose object carries no status (a copy made by `clusterctl
        // move`): found again by its provider ID, as a cloud's API finds an instance.
        if address.is_none() && sim.data.pointer("/spec/providerID").is_some() {
            let host = self.control_plane.as_ref().and_then(|h| h.address(&machine_name));
            address = self
                .runtime
                .address(&machine_name)
                .or(host)
                .map(|ip| ip.to_string());
        }
        if address.is_none()
            && let Some(secret_name) = &machine.spec.bootstrap.data_secret_name
            && self.boot_due(&machine_name)
        {
            address = self
                .boot(&machine, secret_name, etcd_member, kubeadm_host)
                .await?;
        }
        let Some(address) = address else {
            return Ok(());
        };
        self.report(api, sim, &machine_name, &address, etcd_member || kubeadm_host)
            .await
    }

    fn power_off(&self, machine_name: &str) {
        self.booting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due
            .remove(machine_name);
        match &self.control_plane {
            Some(hosts) if hosts.state(machine_name) != MachineState::Off => hosts.stop(machine_name),
            _ => {
                if let Err(e) = self.runtime.stop(machine_name) {
                    warn!(machine = machine_name, error = %e, "stopping machine failed");
                }
            }
        }
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

    /// Allocate an address and, for an etcd member, hand its user data to the runtime (for a
    /// kubeadm control plane host, to [`ControlPlaneHosts`]).
    async fn boot(
        &self,
        owner: &Machine,
        secret_name: &str,
        etcd_member: bool,
        kubeadm_host: bool,
    ) -> Result<Option<String>, kube::Error> {
        let name = owner.name_any();
        let machine = name.as_str();
        let taken: Vec<String> = self
            .api(&sim_machine_resource())
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
        if !etcd_member && !kubeadm_host {
            info!(machine, %ip, "control plane host provisioned (its user data is not run here)");
            return Ok(Some(ip.to_string()));
        }
        let Some(user_data) = self.user_data(machine, secret_name).await? else {
            return Ok(None);
        };
        if let (false, Some(hosts)) = (etcd_member, &self.control_plane) {
            hosts.boot(HostSpec {
                machine: machine.to_string(),
                cluster: owner.spec.cluster_name.clone(),
                address: ip,
                user_data,
                version: owner.spec.version.clone().unwrap_or_default(),
                provider_id: provider_id(machine),
            });
            info!(machine, %ip, "control plane host booting");
            return Ok(Some(ip.to_string()));
        }
        let spec = MachineSpec {
            name: machine.to_string(),
            ip,
            root: self.work_dir.join("machines").join(machine),
            user_data,
            member_certificate_validity: *self
                .settings
                .member_certificate_validity
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            default_route_on_second_interface: self
                .settings
                .default_route_on_second_interface
                .load(Ordering::Relaxed),
        };
        if let Err(e) = self.runtime.boot(&spec) {
            warn!(machine, error = %e, "boot failed");
            return Ok(None);
        }
        info!(machine, %ip, "machine booted");
        Ok(Some(ip.to_string()))
    }

    /// The bootstrap data in Secret `secret_name`, once it exists (a Secret without a value is
    /// reported).
    async fn user_data(&self, machine: &str, secret_name: &str) -> Result<Option<String>, kube::Error> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(secret) = secrets.get_opt(secret_name).await? else {
            return Ok(None);
        };
        let value = secret
            .data
            .and_then(|mut d| d.remove(names::DATA_SECRET_VALUE_KEY));
        let user_data = value.and_then(|v| String::from_utf8(v.0).ok());
        if user_data.is_none() {
            warn!(
                machine,
                secret = secret_name,
                "bootstrap data Secret has no value"
            );
        }
        Ok(user_data)
    }

    fn free_ip(&self, taken: &[String]) -> Option<IpAddr> {
        let [a, b, c] = self.ip_prefix;
        (2..=254u8)
            .map(|n| IpAddr::V4(Ipv4Addr::new(a, b, c, n)))
            .find(|ip| !taken.contains(&ip.to_string()) && self.runtime.address_free(*ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_boot_is_the_earliest_still_to_come() {
        let now = Instant::now();
        let mut booting = Booting::new(BootDelay::Fixed(Duration::from_secs(30)));
        assert_eq!(booting.until_next(now), None, "nothing waits");
        booting.due.insert("booted".into(), now - Duration::from_secs(1));
        assert_eq!(
            booting.until_next(now),
            None,
            "one due already is no reason to hurry"
        );
        booting.due.insert("later".into(), now + Duration::from_secs(20));
        booting.due.insert("sooner".into(), now + Duration::from_secs(5));
        assert_eq!(booting.until_next(now), Some(Duration::from_secs(5)));
    }
}
