//! The KubeadmControlPlane stand-in: what the etcd controller's gating and rollout rules talk to.
//! Like the real KCP (docs/capi.md), it waits for the Cluster's owner reference, honours the
//! paused annotation, will not "create machines" before the etcd certificate Secrets exist and
//! makes itself their controller, reports v1beta2 status and conditions, records every endpoint
//! list it is given, and rolls its (imaginary) machines
//! one step at a time when the endpoints change or `spec.rollout.after` moves (each move is
//! recorded as a rollout request), as a real KCP rollout would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use etcdadm_shared::api::capi::{ControlPlaneEtcd, KubeadmControlPlane};
use etcdadm_shared::names;

const MANAGER: &str = "kcp-standin";
const TICK: Duration = Duration::from_millis(250);

/// One endpoint list a KCP was given, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointChange {
    pub kcp: String,
    pub at: Duration,
    pub endpoints: Vec<String>,
}

/// A rollout asked for through `spec.rollout.after`, and when it was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRequest {
    pub kcp: String,
    pub at: Duration,
    /// The new `spec.rollout.after`.
    pub after: String,
}

/// What the stand-in saw, for scenarios to assert on.
#[derive(Clone, Debug, Default)]
pub struct KcpRecord {
    pub endpoint_changes: Vec<EndpointChange>,
    /// Rollouts started because the endpoints changed.
    pub rollouts: usize,
    /// Every value `spec.rollout.after` took, in order, whenever it was seen (paused or not).
    pub rollout_requests: Vec<RolloutRequest>,
}

/// Per-KCP progress of the imaginary machines.
#[derive(Clone, Debug)]
struct Machines {
    /// Endpoints the running machines use.
    endpoints: Vec<String>,
    /// The `spec.rollout.after` they were last rolled for.
    rollout_after: Option<String>,
    /// Machines already on `endpoints` while a rollout runs.
    up_to_date: i32,
    last_step: Instant,
}

pub struct KcpStandIn {
    pub client: Client,
    pub namespace: String,
    /// Time one machine takes to be replaced during a rollout.
    pub rollout_step: Duration,
    pub record: Arc<Mutex<KcpRecord>>,
    started: Instant,
    machines: Mutex<BTreeMap<String, Machines>>,
    /// The `spec.rollout.after` last seen per KCP.
    rollout_after_seen: Mutex<BTreeMap<String, String>>,
}

impl KcpStandIn {
    pub fn new(client: Client, namespace: &str, rollout_step: Duration) -> KcpStandIn {
        KcpStandIn {
            client,
            namespace: namespace.into(),
            rollout_step,
            record: Arc::default(),
            started: Instant::now(),
            machines: Mutex::default(),
            rollout_after_seen: Mutex::default(),
        }
    }

    pub async fn run(self) {
        loop {
            if let Err(e) = self.tick().await {
                warn!(error = %e, "KCP stand-in pass failed");
            }
            tokio::time::sleep(TICK).await;
        }
    }

    pub async fn tick(&self) -> Result<(), kube::Error> {
        let api: Api<KubeadmControlPlane> = Api::namespaced(self.client.clone(), &self.namespace);
        for kcp in api.list(&Default::default()).await?.items {
            if let Err(e) = self.reconcile(&api, &kcp).await {
                warn!(kcp = %kcp.name_any(), error = %e, "KCP pass failed");
            }
        }
        Ok(())
    }

    async fn reconcile(
        &self,
        api: &Api<KubeadmControlPlane>,
        kcp: &KubeadmControlPlane,
    ) -> Result<(), kube::Error> {
        let name = kcp.name_any();
        let rollout_after = kcp.rollout_after().map(|t| t.to_string());
        self.note_rollout_request(&name, rollout_after.as_deref());
        // Like the real KCP: nothing before the Cluster controller has made the Cluster its owner.
        let owned_by_cluster = kcp
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"));
        if !owned_by_cluster || kcp.annotations().contains_key(names::PAUSED_ANNOTATION) {
            return Ok(());
        }
        let ControlPlaneEtcd::External(endpoints) = kcp.etcd() else {
            return Ok(());
        };
        let cluster = kcp
            .labels()
            .get(names::CLUSTER_NAME_LABEL)
            .cloned()
            .unwrap_or_default();
        let replicas = kcp.spec.replicas.unwrap_or(1);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut missing = vec![];
        for secret in [
            names::kcp_etcd_ca_secret_name(&cluster),
            names::apiserver_client_secret_name(&cluster),
        ] {
            match secrets.get_opt(&secret).await? {
                Some(found) => self.control(&secrets, &found, kcp).await?,
                None => missing.push(secret),
            }
        }
        let previous = kcp.status.as_ref().map(|s| &s.rest);
        let status = if !missing.is_empty() {
            let message = format!("external certificate not found: Secret {}", missing.join(", "));
            json!({"replicas": 0, "upToDateReplicas": 0, "deprecated": {"v1beta1": {"updatedReplicas": 0}},
                   "conditions": [condition(previous, "CertificatesAvailable", "False", "InternalError", &message)]})
        } else {
            let up_to_date = self.step_machines(&name, &endpoints, rollout_after, replicas);
            json!({"replicas": replicas, "readyReplicas": replicas, "upToDateReplicas": up_to_date,
                   "deprecated": {"v1beta1": {"updatedReplicas": up_to_date}},
                   "initialization": {"controlPlaneInitialized": true},
                   "conditions": [condition(previous, "CertificatesAvailable", "True", "Available", "")]})
        };
        let mut status = status;
        status["observedGeneration"] = json!(kcp.metadata.generation);
        let current = serde_json::to_value(&kcp.status).unwrap_or_default();
        let changed = status
            .as_object()
            .into_iter()
            .flatten()
            .any(|(k, v)| current.get(k) != Some(v));
        if changed {
            let params = PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            api.patch_status(&name, &params, &Patch::Merge(&json!({"status": status})))
                .await?;
        }
        Ok(())
    }

    /// Make this KCP the controller of a Secret of CAPI's type it reads certificates from,
    /// replacing any other controller, as the real KCP does (other owners stay).
    async fn control(
        &self,
        secrets: &Api<Secret>,
        secret: &Secret,
        kcp: &KubeadmControlPlane,
    ) -> Result<(), kube::Error> {
        let uid = kcp.uid().unwrap_or_default();
        let is_capi_type = secret.type_.as_deref() == Some(names::CLUSTER_SECRET_TYPE);
        if !is_capi_type
            || secret
                .owner_references()
                .iter()
                .any(|o| o.uid == uid && o.controller == Some(true))
        {
            return Ok(());
        }
        let mut owners: Vec<serde_json::Value> = secret
            .owner_references()
            .iter()
            .filter(|o| o.controller != Some(true))
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect();
        owners.push(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
            "name": kcp.name_any(), "uid": uid, "controller": true, "blockOwnerDeletion": true,
        }));
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        secrets
            .patch(
                &secret.name_any(),
                &params,
                &Patch::Merge(&json!({"metadata": {"ownerReferences": owners}})),
            )
            .await?;
        Ok(())
    }

    /// Advance the imaginary machines towards `endpoints` and the latest `rollout_after`;
    /// returns how many are up to date.
    fn step_machines(
        &self,
        kcp: &str,
        endpoints: &[String],
        rollout_after: Option<String>,
        replicas: i32,
    ) -> i32 {
        let mut all = self.machines.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let machines = all.entry(kcp.to_string()).or_insert_with(|| {
            self.remember(kcp, endpoints, false);
            info!(kcp, ?endpoints, "control plane machines created");
            Machines {
                endpoints: endpoints.to_vec(),
                rollout_after: rollout_after.clone(),
                up_to_date: replicas,
                last_step: now,
            }
        });
        if machines.rollout_after != rollout_after {
            info!(
                kcp,
                ?rollout_after,
                "rollout requested: rolling the control plane"
            );
            machines.rollout_after = rollout_after;
            machines.up_to_date = 0;
            machines.last_step = now;
        }
        if machines.endpoints != endpoints {
            self.remember(kcp, endpoints, true);
            info!(
                kcp,
                ?endpoints,
                "etcd endpoints changed: rolling the control plane"
            );
            machines.endpoints = endpoints.to_vec();
            machines.up_to_date = 0;
            machines.last_step = now;
        }
        if machines.up_to_date < replicas && now.duration_since(machines.last_step) >= self.rollout_step {
            machines.up_to_date += 1;
            machines.last_step = now;
        }
        machines.up_to_date.min(replicas)
    }

    /// Record `spec.rollout.after` when it differs from what was last seen of `kcp`.
    fn note_rollout_request(&self, kcp: &str, after: Option<&str>) {
        let Some(after) = after else { return };
        let mut seen = self
            .rollout_after_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.get(kcp).map(String::as_str) == Some(after) {
            return;
        }
        seen.insert(kcp.into(), after.into());
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.rollout_requests.push(RolloutRequest {
            kcp: kcp.into(),
            at: self.started.elapsed(),
            after: after.into(),
        });
    }

    fn remember(&self, kcp: &str, endpoints: &[String], rollout: bool) {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.endpoint_changes.push(EndpointChange {
            kcp: kcp.into(),
            at: self.started.elapsed(),
            endpoints: endpoints.to_vec(),
        });
        if rollout {
            record.rollouts += 1;
        }
    }
}

/// A v1beta2 condition, keeping the transition time it had while its status stays.
fn condition(
    previous: Option<&etcdadm_shared::api::capi::Rest>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> serde_json::Value {
    let since = previous
        .and_then(|rest| rest.get("conditions"))
        .and_then(serde_json::Value::as_array)
        .and_then(|all| all.iter().find(|c| c["type"] == type_ && c["status"] == status))
        .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
        .unwrap_or_else(|| {
            k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        });
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
}
