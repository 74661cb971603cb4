//! The EtcdadmCluster's own life: a Cluster to serve and not paused, owned by its Cluster and
//! finalized, a spec that can be acted on, provisioned infrastructure; and its deletion
//! (docs/safety.md, "Deletion"): every etcd Machine with its hook released (the whole cluster
//! is going, so no member is removed one by one), then the finalizer. The control plane goes
//! first (the API servers need etcd until then) unless upstream Cluster API deletes it: its
//! Cluster controller and KubeadmControlPlane delete etcd Machines with the workers, before the
//! control plane. The Cluster owns the infrastructure template, as KubeadmControlPlane makes it
//! own its own (`view`).

mod spec_condition;
mod view;

pub use self::view::LifecycleView;

use etcdadm_shared::api::cluster::condition::PAUSED;
use etcdadm_shared::api::conditions::{NewCondition, Severity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::error::Error;
use etcdadm_shared::names;
use etcdadm_shared::ssa;

use super::machines::{self, reason::WAITING_FOR_MACHINE_DELETION};
use crate::controller::decision::reason::{INVALID_SPEC, PROVISIONING};
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, Hold, Outputs, StatusPart,
};
use crate::controller::observation::{ClusterView, Observation};

/// Condition reasons of the EtcdadmCluster's life.
pub mod reason {
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    pub const WAITING_FOR_INFRASTRUCTURE: &str = "WaitingForInfrastructure";
    pub const PAUSED: &str = "Paused";
    pub const DELETING: &str = "Deleting";
    pub const WAITING_FOR_CONTROL_PLANE_DELETION: &str = "WaitingForControlPlaneDeletion";
    pub const WAITING_FOR_CLUSTER_DELETION: &str = "WaitingForClusterDeletion";
}

/// Server-side apply sites on the EtcdadmCluster: each owns what it applies, and only that.
const OWNER_MANAGER: &str = "etcdadm-controller/cluster-owner";
/// The apply site of the Cluster's owner reference on the infrastructure template.
const TEMPLATE_OWNER_MANAGER: &str = "etcdadm-controller/template-owner";
const FINALIZER_MANAGER: &str = "etcdadm-controller/finalizer";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum LifecycleStep {
    /// Paused: no writes (status still reports).
    Paused,
    /// The Cluster as a (non-controller) owner: garbage collection and `clusterctl move`.
    AddClusterOwnerRef {
        owner: OwnerReference,
    },
    AddFinalizer,
    /// The Cluster as a (non-controller) owner of the infrastructure template: `clusterctl
    /// move` carries it and the garbage collector takes it with the Cluster.
    AddTemplateOwnerRef {
        owner: OwnerReference,
    },
    /// Deletion: release our pre-terminate hook on these Machines and delete them.
    ReleaseAndDeleteMachines {
        names: Vec<String>,
    },
    RemoveFinalizer,
}

impl ConcernStep for LifecycleStep {
    type View = LifecycleView;
    type Metrics = ();

    /// `Paused`: True while the plan pauses (the Cluster or this EtcdadmCluster is paused);
    /// `SpecValid`: the spec's problems, with a Warning Event when they appear or change.
    fn status(part: &mut StatusPart<'_>, step: Option<&Self>) {
        let problems = spec_condition::problems(part.o);
        let (valid, event) = spec_condition::condition(problems.as_deref(), part.old);
        part.set_condition(valid);
        if let Some(event) = event {
            part.event(event);
        }
        part.set_condition(if matches!(step, Some(LifecycleStep::Paused)) {
            NewCondition::true_(PAUSED, reason::PAUSED)
                .with_message("the Cluster or this EtcdadmCluster is paused: nothing is written but status")
        } else {
            NewCondition::false_(PAUSED, Severity::Info, "NotPaused", "")
        });
    }

    /// Whether this step writes anything (pausing writes nothing but status).
    fn writes(&self) -> bool {
        !matches!(self, LifecycleStep::Paused)
    }

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            LifecycleStep::Paused => (reason::PAUSED, "reconciliation is paused".into()),
            LifecycleStep::AddClusterOwnerRef { .. }
            | LifecycleStep::AddFinalizer
            | LifecycleStep::AddTemplateOwnerRef { .. } => (
                PROVISIONING,
                "preparing the EtcdadmCluster, its CA and the control plane gate".into(),
            ),
            LifecycleStep::ReleaseAndDeleteMachines { names } => (
                reason::DELETING,
                format!("deleting etcd Machines {}", names.join(", ")),
            ),
            LifecycleStep::RemoveFinalizer => (reason::DELETING, "every etcd Machine is gone".into()),
        }
    }

    /// The Event this step leaves once applied: only the deletion of the Machines says one;
    /// ownership and the finalizer only tidy up.
    fn event(&self, _: &Observation) -> Option<EventNote> {
        match self {
            LifecycleStep::ReleaseAndDeleteMachines { names } => Some(EventNote::normal(
                "MachinesDeleted",
                format!(
                    "deleting etcd Machines {} (their pre-terminate hooks released)",
                    names.join(", ")
                ),
            )),
            LifecycleStep::Paused
            | LifecycleStep::AddClusterOwnerRef { .. }
            | LifecycleStep::AddFinalizer
            | LifecycleStep::AddTemplateOwnerRef { .. }
            | LifecycleStep::RemoveFinalizer => None,
        }
    }

    /// Perform the step.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        let etcd = &o.etcd_cluster;
        match self {
            LifecycleStep::Paused => Ok(Applied::AlreadyDone),
            LifecycleStep::AddClusterOwnerRef { owner } => {
                // The owner list merges by uid, so the entry is applied alone.
                apply_metadata(out, etcd, OWNER_MANAGER, json!({ "ownerReferences": [owner] })).await
            }
            LifecycleStep::AddFinalizer => {
                let metadata = json!({ "finalizers": [names::ETCDADM_CLUSTER_FINALIZER] });
                apply_metadata(out, etcd, FINALIZER_MANAGER, metadata).await
            }
            LifecycleStep::AddTemplateOwnerRef { owner } => own_template(out, o, owner).await,
            LifecycleStep::ReleaseAndDeleteMachines { names } => {
                machines::release_and_delete(out, &o.namespace, names).await
            }
            LifecycleStep::RemoveFinalizer => remove_finalizer(out, o).await,
        }
    }

    /// What comes after: Machines being deleted are looked at again; a finalized object is gone.
    fn after(&self, o: &Observation) -> After {
        match self {
            LifecycleStep::Paused => After::Requeue(o.health_interval()),
            LifecycleStep::AddClusterOwnerRef { .. }
            | LifecycleStep::AddFinalizer
            | LifecycleStep::AddTemplateOwnerRef { .. } => After::Again,
            LifecycleStep::ReleaseAndDeleteMachines { .. } => {
                After::Requeue(o.health_interval().min(crate::controller::decision::WAIT_REQUEUE))
            }
            LifecycleStep::RemoveFinalizer => After::AwaitChange,
        }
    }
}

// Decisions.

/// No Cluster yet (and not being deleted), or paused: nothing else is looked at.
pub fn cluster(o: &Observation) -> Option<Decision<LifecycleStep>> {
    match &o.cluster {
        ClusterView::Missing if o.deleting => None,
        ClusterView::Missing => Some(Decision::Hold(Hold::wait(
            reason::WAITING_FOR_CLUSTER,
            "no Cluster found: label the EtcdadmCluster with cluster.x-k8s.io/cluster-name \
             or reference it from Cluster.spec.managedExternalEtcdRef",
        ))),
        ClusterView::Found { paused, .. } => {
            (*paused || o.paused_annotation).then_some(Decision::Do(LifecycleStep::Paused))
        }
    }
}

/// The Cluster as an owner (garbage collection, `clusterctl move`) and our finalizer.
pub fn ownership(o: &Observation) -> Option<Decision<LifecycleStep>> {
    if !o.has_cluster_owner_ref
        && let ClusterView::Found { reference, .. } = &o.cluster
    {
        return Some(Decision::Do(LifecycleStep::AddClusterOwnerRef {
            owner: reference.owner.clone(),
        }));
    }
    if !o.has_finalizer {
        return Some(Decision::Do(LifecycleStep::AddFinalizer));
    }
    let ClusterView::Found { reference, .. } = &o.cluster else {
        return None;
    };
    let owners = o.view::<LifecycleView>().template_owners.clone()?;
    (!owners.iter().any(|r| r.uid == reference.owner.uid)).then(|| {
        Decision::Do(LifecycleStep::AddTemplateOwnerRef {
            owner: reference.owner.clone(),
        })
    })
}

/// A spec problem admission should have caught refuses everything that follows.
pub fn spec(o: &Observation) -> Option<Hold> {
    if let Some(problem) = &o.spec_problem {
        return Some(Hold::refuse(INVALID_SPEC, problem.clone()));
    }
    (o.replicas < 1 || o.replicas % 2 == 0).then(|| {
        Hold::refuse(
            INVALID_SPEC,
            format!("spec.replicas is {}; it must be odd and at least 1", o.replicas),
        )
    })
}

/// Machines wait for the Cluster's infrastructure.
pub fn infrastructure(o: &Observation) -> Option<Hold> {
    let ClusterView::Found {
        reference,
        infrastructure_ready: false,
        ..
    } = &o.cluster
    else {
        return None;
    };
    Some(Hold::wait(
        reason::WAITING_FOR_INFRASTRUCTURE,
        format!(
            "waiting for Cluster {}'s infrastructure to be provisioned",
            reference.name
        ),
    ))
}

/// While the EtcdadmCluster or its Cluster is being deleted, the deletion's next step.
pub fn deletion(o: &Observation) -> Option<Decision<LifecycleStep>> {
    let cluster_deleting = matches!(o.cluster, ClusterView::Found { deleting: true, .. });
    (o.deleting || cluster_deleting).then(|| deletion_step(o))
}

/// Whether the control plane's Machines must be gone before etcd's: always, unless upstream
/// Cluster API deletes the whole Cluster or the control plane object. Its Cluster controller
/// counts etcd Machines as workers and deletes the control plane only once every worker is gone,
/// and KCP deletes its Machines only once every other Machine is gone, while CAPI skips draining
/// and Node deletion for them: waiting there would deadlock the deletion, going costs the API
/// servers nothing they still need.
fn control_plane_first(o: &Observation) -> bool {
    let ClusterView::Found {
        deleting,
        deletes_etcd_last,
        ..
    } = o.cluster
    else {
        return true;
    };
    // The control plane object deleted with us: upstream KCP deletes its Machines only once
    // every other Machine of the Cluster is gone, and CAPI neither drains nor deletes the Nodes
    // of a control plane being deleted.
    let upstream_deletes = deleting || o.view::<LifecycleView>().control_plane_deleting;
    deletes_etcd_last || !upstream_deletes
}

fn deletion_step(o: &Observation) -> Decision<LifecycleStep> {
    if o.control_plane_machines > 0 && control_plane_first(o) {
        return Decision::Hold(Hold::wait(
            reason::WAITING_FOR_CONTROL_PLANE_DELETION,
            format!(
                "{} control plane Machines still use etcd; deleting etcd Machines after they are gone",
                o.control_plane_machines
            ),
        ));
    }
    let to_release: Vec<String> = o
        .machines
        .iter()
        .filter(|m| m.has_hook || !m.deleting)
        .map(|m| m.name.clone())
        .collect();
    if !to_release.is_empty() {
        return Decision::Do(LifecycleStep::ReleaseAndDeleteMachines { names: to_release });
    }
    if !o.machines.is_empty() {
        let names: Vec<&str> = o.machines.iter().map(|m| m.name.as_str()).collect();
        return Decision::Hold(Hold::wait(
            WAITING_FOR_MACHINE_DELETION,
            format!("waiting for Machines {} to go", names.join(", ")),
        ));
    }
    if o.deleting && o.has_finalizer {
        return Decision::Do(LifecycleStep::RemoveFinalizer);
    }
    Decision::Hold(Hold::wait(
        reason::WAITING_FOR_CLUSTER_DELETION,
        "every etcd Machine is gone; waiting for the Cluster's deletion to remove this object",
    ))
}

// Effects.

fn api(out: &Outputs<'_>, etcd: &EtcdadmCluster) -> Api<EtcdadmCluster> {
    Api::namespaced(out.client.clone(), &etcd.namespace().unwrap_or_default())
}

/// Server-side apply `metadata` as `manager`, not forced: what it adds is shared with others.
async fn apply_metadata(
    out: &Outputs<'_>,
    etcd: &EtcdadmCluster,
    manager: &str,
    metadata: Value,
) -> Result<Applied, Error> {
    let body = ssa::configuration::<EtcdadmCluster>(&etcd.name_any(), metadata, json!({}));
    api(out, etcd)
        .patch(
            &etcd.name_any(),
            &ssa::params(manager, false),
            &Patch::Apply(body),
        )
        .await?;
    Ok(Applied::Done)
}

/// Server-side apply the Cluster's owner reference on the infrastructure template, not forced
/// (the list merges by uid; the template's other owners and fields stay).
async fn own_template(out: &Outputs<'_>, o: &Observation, owner: &OwnerReference) -> Result<Applied, Error> {
    let template = &o.etcd_cluster.spec.infrastructure_template;
    let (_, Some(machine_kind)) =
        crate::controller::observation::read::infra_machine_kind(&o.etcd_cluster, &o.namespace)
    else {
        return Ok(Applied::AlreadyDone);
    };
    let kind = template.kind.clone().unwrap_or_default();
    let name = template.name.clone().unwrap_or_default();
    let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        &machine_kind.group,
        &machine_kind.version,
        &kind,
    ));
    let body = json!({
        "apiVersion": resource.api_version, "kind": kind,
        "metadata": {"name": name, "ownerReferences": [owner]},
    });
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(out.client.clone(), &o.namespace, &resource);
    api.patch(
        &name,
        &ssa::params(TEMPLATE_OWNER_MANAGER, false),
        &Patch::Apply(body),
    )
    .await?;
    Ok(Applied::Done)
}

/// The last step of a deletion: nothing of this etcd cluster is kept after it.
async fn remove_finalizer(out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
    let etcd = &o.etcd_cluster;
    let finalizers: Vec<&String> = etcd
        .finalizers()
        .iter()
        .filter(|f| *f != names::ETCDADM_CLUSTER_FINALIZER)
        .collect();
    // A merge patch guarded by the resourceVersion observed (after this round's status write):
    // an apply removes only what its manager alone owns, and an earlier version added the
    // finalizer by merge patch.
    let metadata = json!({ "resourceVersion": etcd.resource_version(), "finalizers": finalizers });
    let params = PatchParams {
        field_manager: Some(FINALIZER_MANAGER.into()),
        ..Default::default()
    };
    api(out, etcd)
        .patch(
            &etcd.name_any(),
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    out.etcd_clients.forget(&o.cache_key());
    tracing::info!("every etcd Machine is gone; finalizer removed");
    Ok(Applied::Done)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    #[test]
    fn housekeeping_comes_first_in_order() {
        let mut o = base();
        o.cluster = ClusterView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER);
        let mut o = base();
        o.has_cluster_owner_ref = false;
        o.has_finalizer = false;
        assert_eq!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::AddClusterOwnerRef {
                owner: cluster_ref().owner
            })
        );
        o.has_cluster_owner_ref = true;
        assert_eq!(plan(&o), Step::Lifecycle(LifecycleStep::AddFinalizer));
        o.has_finalizer = true;
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: false,
            infrastructure_ready: false,
            failure_domains: vec![],
            deletes_etcd_last: false,
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_INFRASTRUCTURE);
    }

    #[test]
    fn paused_cluster_or_annotation_writes_nothing() {
        let mut o = base();
        o.has_finalizer = false;
        o.paused_annotation = true;
        assert_eq!(plan(&o), Step::Lifecycle(LifecycleStep::Paused));
        o.paused_annotation = false;
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: true,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: vec![],
            deletes_etcd_last: false,
        };
        assert_eq!(plan(&o), Step::Lifecycle(LifecycleStep::Paused));
        assert!(!plan(&o).writes());
    }

    #[test]
    fn invalid_replicas_and_spec_problems_are_refused() {
        for replicas in [0, 2, 4, -1] {
            let mut o = base();
            o.replicas = replicas;
            assert_eq!(wait_reason(&plan(&o)), reason::INVALID_SPEC, "{replicas}");
        }
        let mut o = base();
        o.spec_problem = Some("spec.infrastructureTemplate.namespace other".into());
        assert_eq!(wait_reason(&plan(&o)), reason::INVALID_SPEC);
    }

    #[test]
    fn deletion_waits_for_the_control_plane_then_deletes_machines_then_the_finalizer() {
        let mut o = running(3);
        o.deleting = true;
        o.control_plane_machines = 2;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
        o.control_plane_machines = 0;
        let Step::Lifecycle(LifecycleStep::ReleaseAndDeleteMachines { names }) = plan(&o) else {
            panic!("expected Machine deletion");
        };
        assert_eq!(names.len(), 3);
        for m in &mut o.machines {
            m.deleting = true;
            m.has_hook = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_DELETION);
        o.machines.clear();
        assert_eq!(plan(&o), Step::Lifecycle(LifecycleStep::RemoveFinalizer));
        // Quorum lost does not block deletion.
        let mut o = running(3);
        o.deleting = true;
        o.etcd = EtcdView::Unreachable {
            message: "gone".into(),
        };
        assert!(matches!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::ReleaseAndDeleteMachines { .. })
        ));
        // The Cluster deleting alone deletes Machines but leaves our finalizer to our deletion.
        let mut o = base();
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: true,
            infrastructure_ready: true,
            failure_domains: vec![],
            deletes_etcd_last: false,
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER_DELETION);
    }

    #[test]
    fn a_cluster_deleted_by_upstream_capi_takes_etcd_with_its_workers_the_forks_after_its_control_plane() {
        let deleting_cluster = |deletes_etcd_last| ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: true,
            infrastructure_ready: true,
            failure_domains: vec![],
            deletes_etcd_last,
        };
        // Upstream: CAPI waits for the etcd Machines before it deletes the control plane.
        let mut o = running(3);
        o.cluster = deleting_cluster(false);
        o.control_plane_machines = 3;
        let Step::Lifecycle(LifecycleStep::ReleaseAndDeleteMachines { names }) = plan(&o) else {
            panic!("expected Machine deletion, got {:?}", plan(&o));
        };
        assert_eq!(names.len(), 3);
        // EKS Anywhere's fork deletes the control plane first: wait for it.
        o.cluster = deleting_cluster(true);
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
        // Only the EtcdadmCluster deleted: the control plane still uses etcd.
        let mut o = running(3);
        o.deleting = true;
        o.control_plane_machines = 1;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
    }

    #[test]
    fn the_cluster_owns_the_infrastructure_template_as_kcp_makes_it_own_its_own() {
        let mut o = running(3);
        o.view_mut::<LifecycleView>().unwrap().template_owners = Some(vec![]);
        assert_eq!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::AddTemplateOwnerRef {
                owner: cluster_ref().owner
            })
        );
        o.view_mut::<LifecycleView>().unwrap().template_owners = Some(vec![cluster_ref().owner]);
        assert!(!matches!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::AddTemplateOwnerRef { .. })
        ));
        // A template that is not there (or of a kind not served) is the machines' concern.
        o.view_mut::<LifecycleView>().unwrap().template_owners = None;
        assert!(!matches!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::AddTemplateOwnerRef { .. })
        ));
    }

    #[test]
    fn deleted_with_its_control_plane_under_upstream_capi_etcd_goes_first() {
        // Upstream KCP deletes its Machines only once every other Machine of the Cluster is gone.
        let mut o = running(3);
        o.deleting = true;
        o.control_plane_machines = 1;
        o.view_mut::<LifecycleView>().unwrap().control_plane_deleting = true;
        assert!(matches!(
            plan(&o),
            Step::Lifecycle(LifecycleStep::ReleaseAndDeleteMachines { .. })
        ));
        // EKS Anywhere's fork deletes the control plane first.
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: vec![],
            deletes_etcd_last: true,
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
    }
}
