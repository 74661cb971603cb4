//! Control plane coordination (docs/safety.md, "The control plane"): the KubeadmControlPlane
//! stays paused until this etcd is first ready, then gets the voting endpoints and the two
//! certificate Secrets and is un-paused; later endpoint changes come from the rollout rules.
//! The KCP type here is partial, so every apply configuration is JSON holding only the fields
//! this controller owns.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::capi::KubeadmControlPlane;
use etcdadm_shared::api::cluster::condition::CONTROL_PLANE_ENDPOINTS_UPDATED;
use etcdadm_shared::api::conditions::{NewCondition, Severity};
use etcdadm_shared::contract::ca::Ca;
use etcdadm_shared::contract::{ClusterRef, bytes, create_cluster_secret};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::pki::LeafRequest;
use etcdadm_shared::ssa;

use super::machines::reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT;
use crate::controller::decision::reason::PROVISIONING;
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Outputs, StatusPart,
};
use crate::controller::observation::{ClusterView, KcpView, Observation, is_ready, voting_endpoints};

/// Condition reasons of the control plane hand-over.
pub mod reason {
    pub const UPDATING_CONTROL_PLANE: &str = "UpdatingControlPlane";
}

/// Server-side apply sites on the KCP.
const PAUSE_MANAGER: &str = "etcdadm-controller/control-plane-pause";
const ENDPOINTS_MANAGER: &str = "etcdadm-controller/control-plane-endpoints";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum ControlPlaneStep {
    /// Keep KubeadmControlPlane `kcp` from rolling its Machines until etcd is ready.
    PauseKcp {
        kcp: String,
    },
    /// Write the voting members' client URLs into `kcp`'s external etcd endpoints.
    WriteKcpEndpoints {
        kcp: String,
        endpoints: Vec<String>,
    },
    /// Create `<cluster>-etcd` (the CA certificate) and `<cluster>-apiserver-etcd-client`.
    CreateKcpSecrets {
        cluster: ClusterRef,
        ca: Ca,
    },
    UnpauseKcp {
        kcp: String,
    },
}

impl ConcernStep for ControlPlaneStep {
    type View = ();
    type Metrics = ();

    /// `ControlPlaneEndpointsUpdated`.
    fn status(part: &mut StatusPart<'_>, _: Option<&Self>) {
        part.set_condition(condition(part.o, is_ready(part.o)));
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            ControlPlaneStep::PauseKcp { .. } => (
                PROVISIONING,
                "preparing the EtcdadmCluster, its CA and the control plane gate".into(),
            ),
            ControlPlaneStep::WriteKcpEndpoints { .. }
            | ControlPlaneStep::CreateKcpSecrets { .. }
            | ControlPlaneStep::UnpauseKcp { .. } => (
                reason::UPDATING_CONTROL_PLANE,
                "handing the etcd endpoints and certificates to the KubeadmControlPlane".into(),
            ),
        }
    }

    /// The Event this step leaves once applied.
    fn event(&self, _: &Observation) -> Option<EventNote> {
        let (reason, note) = match self {
            ControlPlaneStep::PauseKcp { kcp } => (
                "ControlPlanePaused",
                format!("paused KubeadmControlPlane {kcp} until etcd is ready"),
            ),
            ControlPlaneStep::WriteKcpEndpoints { kcp, endpoints } => (
                "ControlPlaneEndpointsUpdated",
                format!(
                    "wrote etcd endpoints {} into KubeadmControlPlane {kcp}",
                    endpoints.join(",")
                ),
            ),
            ControlPlaneStep::CreateKcpSecrets { cluster, .. } => (
                "ControlPlaneSecretsCreated",
                format!(
                    "created the Secrets the control plane needs, {} and {} (one that existed already is kept as it was)",
                    names::kcp_etcd_ca_secret_name(&cluster.name),
                    names::apiserver_client_secret_name(&cluster.name)
                ),
            ),
            ControlPlaneStep::UnpauseKcp { kcp } => (
                "ControlPlaneUnpaused",
                format!("etcd is ready: un-paused KubeadmControlPlane {kcp}"),
            ),
        };
        Some(EventNote::normal(reason, note))
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            // Not forced: a pause someone else set stays theirs.
            ControlPlaneStep::PauseKcp { kcp } => {
                let metadata = json!({ "annotations": { names::PAUSED_ANNOTATION: "" } });
                apply(out, o, kcp, PAUSE_MANAGER, false, metadata, json!({})).await
            }
            ControlPlaneStep::UnpauseKcp { kcp } => unpause(out, o, kcp).await,
            // The endpoints are this controller's to decide, so forced.
            ControlPlaneStep::WriteKcpEndpoints { kcp, endpoints } => {
                let spec = json!({ "spec": { "kubeadmConfigSpec": { "clusterConfiguration": {
                    "etcd": { "external": { "endpoints": endpoints } }
                } } } });
                apply(out, o, kcp, ENDPOINTS_MANAGER, true, json!({}), spec).await
            }
            ControlPlaneStep::CreateKcpSecrets { cluster, ca } => create_kcp_secrets(out, cluster, ca).await,
        }
    }

    /// What comes after: the next step may follow at once.
    fn after(&self, _: &Observation) -> After {
        match self {
            ControlPlaneStep::PauseKcp { .. }
            | ControlPlaneStep::WriteKcpEndpoints { .. }
            | ControlPlaneStep::CreateKcpSecrets { .. }
            | ControlPlaneStep::UnpauseKcp { .. } => After::Again,
        }
    }
}

// Decisions.

/// Until etcd is first ready, the KCP is kept paused (unless it carries the skip annotation or
/// declares local etcd, which is never touched).
pub fn keep_paused(o: &Observation) -> Option<Decision<ControlPlaneStep>> {
    let KcpView::Found {
        name,
        local_etcd: false,
        paused: false,
        skip_pause: false,
        ..
    } = &o.kcp
    else {
        return None;
    };
    (!is_ready(o) && !o.creation_complete)
        .then(|| Decision::Do(ControlPlaneStep::PauseKcp { kcp: name.clone() }))
}

/// Ready: hand the KCP its endpoints and certificates, then un-pause it.
pub fn hand_over(o: &Observation) -> Option<Decision<ControlPlaneStep>> {
    let KcpView::Found {
        name,
        local_etcd: false,
        endpoints,
        paused,
        skip_pause,
        secrets_present,
        ..
    } = &o.kcp
    else {
        return None;
    };
    if !is_ready(o) {
        return None;
    }
    let desired = voting_endpoints(o);
    let mut current = endpoints.clone();
    current.sort();
    if current != desired {
        return Some(switch(name, desired));
    }
    if !secrets_present {
        // Ready implies the Cluster and a usable CA: both were needed to check the members.
        let (ClusterView::Found { reference, .. }, Some(ca)) = (&o.cluster, o.ca.ca()) else {
            return None;
        };
        return Some(Decision::Do(ControlPlaneStep::CreateKcpSecrets {
            cluster: reference.clone(),
            ca: ca.clone(),
        }));
    }
    (*paused && !skip_pause).then(|| Decision::Do(ControlPlaneStep::UnpauseKcp { kcp: name.clone() }))
}

/// Point KubeadmControlPlane `kcp` at `endpoints` (a rollout's switch, or the hand-over).
pub fn switch(kcp: &str, endpoints: Vec<String>) -> Decision<ControlPlaneStep> {
    Decision::Do(ControlPlaneStep::WriteKcpEndpoints {
        kcp: kcp.to_string(),
        endpoints,
    })
}

// Status.

/// `ControlPlaneEndpointsUpdated`: the KubeadmControlPlane has this etcd's voting endpoints, its
/// certificates and no pause of ours, or what it waits for.
pub fn condition(o: &Observation, ready: bool) -> NewCondition {
    match &o.kcp {
        KcpView::None => NewCondition::true_(CONTROL_PLANE_ENDPOINTS_UPDATED, "NoControlPlane")
            .with_message("the Cluster references no KubeadmControlPlane"),
        KcpView::Missing { name } => NewCondition::false_(
            CONTROL_PLANE_ENDPOINTS_UPDATED,
            Severity::Info,
            "ControlPlaneNotFound",
            format!("KubeadmControlPlane {name} not found"),
        ),
        KcpView::Found {
            name,
            local_etcd: true,
            ..
        } => NewCondition::false_(
            CONTROL_PLANE_ENDPOINTS_UPDATED,
            Severity::Warning,
            "ControlPlaneUsesLocalEtcd",
            format!("KubeadmControlPlane {name} declares local etcd, not etcd.external; it is not touched"),
        ),
        KcpView::Found {
            name,
            endpoints,
            paused,
            skip_pause,
            secrets_present,
            rollout_complete,
            ..
        } => {
            let mut current = endpoints.clone();
            current.sort();
            let voting = voting_endpoints(o);
            let done = ready && current == voting && *secrets_present && (!paused || *skip_pause);
            if done {
                NewCondition::true_(CONTROL_PLANE_ENDPOINTS_UPDATED, "EndpointsUpdated")
            } else if !o.creation_complete {
                let message = if *skip_pause {
                    format!("KubeadmControlPlane {name} gets the endpoints once etcd is ready")
                } else {
                    format!("KubeadmControlPlane {name} is kept paused until etcd is ready")
                };
                NewCondition::false_(
                    CONTROL_PLANE_ENDPOINTS_UPDATED,
                    Severity::Info,
                    "WaitingForEtcdReady",
                    message,
                )
            } else if current != voting {
                NewCondition::false_(
                    CONTROL_PLANE_ENDPOINTS_UPDATED,
                    Severity::Info,
                    reason::UPDATING_CONTROL_PLANE,
                    format!(
                        "KubeadmControlPlane {name} lists {}; the voting members are {}; the list is updated once per resize or rollout, when membership settles",
                        current.join(","),
                        voting.join(",")
                    ),
                )
            } else if !rollout_complete {
                NewCondition::false_(
                    CONTROL_PLANE_ENDPOINTS_UPDATED,
                    Severity::Info,
                    WAITING_FOR_CONTROL_PLANE_ROLLOUT,
                    format!(
                        "KubeadmControlPlane {name} is rolling its Machines onto the endpoints it was given"
                    ),
                )
            } else {
                NewCondition::false_(
                    CONTROL_PLANE_ENDPOINTS_UPDATED,
                    Severity::Info,
                    reason::UPDATING_CONTROL_PLANE,
                    format!("writing endpoints and certificates for KubeadmControlPlane {name}"),
                )
            }
        }
    }
}

// Effects.

fn api(out: &Outputs<'_>, o: &Observation) -> Api<KubeadmControlPlane> {
    Api::namespaced(out.client.clone(), &o.namespace)
}

/// Server-side apply `metadata` and `rest` (beside the KCP's identity) as `manager`.
async fn apply(
    out: &Outputs<'_>,
    o: &Observation,
    kcp: &str,
    manager: &str,
    force: bool,
    metadata: Value,
    rest: Value,
) -> Result<Applied, Error> {
    let body = ssa::configuration::<KubeadmControlPlane>(kcp, metadata, rest);
    api(out, o)
        .patch(kcp, &ssa::params(manager, force), &Patch::Apply(body))
        .await?;
    Ok(Applied::Done)
}

/// Ask KubeadmControlPlane `kcp` to replace its Machines created before `after` (v1beta2
/// `spec.rollout.after`, the version this controller reads the KCP at), applied as `manager`.
/// Forced: a later request by anyone else would have made the step unnecessary, so whatever is
/// there is earlier.
pub async fn request_rollout(
    out: &Outputs<'_>,
    o: &Observation,
    kcp: &str,
    after: &k8s_openapi::jiff::Timestamp,
    manager: &str,
) -> Result<Applied, Error> {
    let spec = json!({ "spec": { "rollout": { "after": after.to_string() } } });
    apply(out, o, kcp, manager, true, json!({}), spec).await
}

/// Remove the pause once etcd is ready.
async fn unpause(out: &Outputs<'_>, o: &Observation, kcp: &str) -> Result<Applied, Error> {
    // A merge patch: an apply removes only what its manager alone owns, and an earlier version
    // paused the KCP by merge patch.
    let patch = json!({ "metadata": { "annotations": { names::PAUSED_ANNOTATION: null } } });
    let params = PatchParams {
        field_manager: Some(PAUSE_MANAGER.into()),
        ..Default::default()
    };
    api(out, o).patch(kcp, &params, &Patch::Merge(&patch)).await?;
    Ok(Applied::Done)
}

/// Create the two Secrets KCP needs: `<cluster>-etcd` (CA certificate) and
/// `<cluster>-apiserver-etcd-client` (client certificate and key). Existing ones are kept.
async fn create_kcp_secrets(out: &Outputs<'_>, cluster: &ClusterRef, ca: &Ca) -> Result<Applied, Error> {
    let api: Api<Secret> = Api::namespaced(out.client.clone(), &cluster.namespace);
    let mut created = false;
    let ca_name = names::kcp_etcd_ca_secret_name(&cluster.name);
    if api.get_opt(&ca_name).await?.is_none() {
        let data = BTreeMap::from([(names::TLS_CERT_KEY.to_string(), bytes(ca.cert_pem()))]);
        created |= create_cluster_secret(out.client, cluster, ca_name, data, FIELD_MANAGER).await?;
    }
    let client_name = names::apiserver_client_secret_name(&cluster.name);
    if api.get_opt(&client_name).await?.is_none() {
        // Issued only when the Secret is missing: an existing client certificate is kept.
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client(&cluster.name))?;
        let data = BTreeMap::from([
            (names::TLS_CERT_KEY.to_string(), bytes(&leaf.cert_pem)),
            (names::TLS_KEY_KEY.to_string(), bytes(&leaf.key_pem)),
        ]);
        created |= create_cluster_secret(out.client, cluster, client_name, data, FIELD_MANAGER).await?;
    }
    Ok(created.into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    #[test]
    fn kcp_is_paused_until_ready_then_gets_endpoints_secrets_and_unpause_in_order() {
        let mut o = base();
        o.kcp = kcp(&["https://placeholder:2379"], false, false);
        assert_eq!(
            plan(&o),
            Step::ControlPlane(ControlPlaneStep::PauseKcp { kcp: "c1-cp".into() })
        );
        // Skip annotation or local etcd: never paused.
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: false,
            endpoints: vec![],
            paused: false,
            skip_pause: true,
            secrets_present: false,
            rollout_complete: false,
            rollout_after: None,
        };
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine { .. })
        ));
        o.kcp = KcpView::Found {
            name: "c1-cp".into(),
            local_etcd: true,
            endpoints: vec![],
            paused: false,
            skip_pause: false,
            secrets_present: false,
            rollout_complete: false,
            rollout_after: None,
        };
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine { .. })
        ));

        let mut o = running(3);
        o.kcp = kcp(&["https://placeholder:2379"], true, false);
        let expected: Vec<String> = (1..=3).map(|i| format!("https://10.0.0.{i}:2379")).collect();
        assert_eq!(
            plan(&o),
            Step::ControlPlane(ControlPlaneStep::WriteKcpEndpoints {
                kcp: "c1-cp".into(),
                endpoints: expected.clone()
            })
        );
        let refs: Vec<&str> = expected.iter().map(String::as_str).collect();
        o.kcp = kcp(&refs, true, false);
        assert_eq!(
            plan(&o),
            Step::ControlPlane(ControlPlaneStep::CreateKcpSecrets {
                cluster: cluster_ref(),
                ca: test_ca()
            })
        );
        o.kcp = kcp(&refs, true, true);
        assert_eq!(
            plan(&o),
            Step::ControlPlane(ControlPlaneStep::UnpauseKcp { kcp: "c1-cp".into() })
        );
        o.kcp = kcp(&refs, false, true);
        assert_eq!(plan(&o), Step::Steady);
        // Not ready (one member missing): KCP is not touched, and after creation not re-paused.
        let mut o = running(2);
        o.kcp = kcp(&[], false, false);
        o.creation_complete = true;
        assert!(matches!(
            plan(&o),
            Step::Machines(MachineStep::CreateMachine { .. })
        ));
    }

    #[test]
    fn the_control_plane_keeps_a_working_endpoint_and_its_rollout_finishes_first() {
        // KCP lists only m0; removing m0 (Machine deleted by hand) waits for another endpoint.
        let mut o = zoned(3, false);
        o.kcp = kcp(&["https://10.0.0.1:2379"], false, true);
        o.machines[0].deleting = true;
        o.etcd = EtcdView::Members(
            members_mut(&mut o)
                .iter()
                .map(|m| MemberView {
                    is_leader: m.id == 2,
                    ..m.clone()
                })
                .collect(),
        );
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CONTROL_PLANE_NEEDS_MEMBER, "{step:?}");
        assert!(step.is_refusal());
        // A scale down waits while the KCP is rolling.
        let mut o = zoned(3, true);
        o.replicas = 1;
        if let KcpView::Found { rollout_complete, .. } = &mut o.kcp {
            *rollout_complete = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_ROLLOUT);
    }
}
