//! What comes before any membership rule: a Cluster to serve and not paused, the EtcdadmCluster
//! owned by its Cluster and finalized, a spec that can be acted on, provisioned infrastructure
//! and the etcd CA (created once, before any member exists, and never replaced).

use etcdadm_shared::names;

use super::observed::{CaView, ClusterView, Observed};
use super::step::{Step, reason};

/// No Cluster yet (and not being deleted), or paused: nothing else is looked at.
pub(super) fn cluster(o: &Observed) -> Option<Step> {
    match &o.cluster {
        ClusterView::Missing if o.deleting => None,
        ClusterView::Missing => Some(Step::Wait {
            reason: reason::WAITING_FOR_CLUSTER,
            message: "no Cluster found: label the EtcdadmCluster with cluster.x-k8s.io/cluster-name \
                      or reference it from Cluster.spec.managedExternalEtcdRef"
                .into(),
        }),
        ClusterView::Found { paused, .. } => (*paused || o.paused_annotation).then_some(Step::Paused),
    }
}

/// The Cluster as an owner (garbage collection, `clusterctl move`) and our finalizer.
pub(super) fn ownership(o: &Observed) -> Option<Step> {
    if !o.has_cluster_owner_ref {
        return Some(Step::AddClusterOwnerRef);
    }
    (!o.has_finalizer).then_some(Step::AddFinalizer)
}

/// A spec problem admission should have caught refuses everything that follows.
pub(super) fn spec(o: &Observed) -> Option<Step> {
    if let Some(problem) = &o.spec_problem {
        return Some(Step::Refuse {
            reason: reason::INVALID_SPEC,
            message: problem.clone(),
        });
    }
    (o.replicas < 1 || o.replicas % 2 == 0).then(|| Step::Refuse {
        reason: reason::INVALID_SPEC,
        message: format!("spec.replicas is {}; it must be odd and at least 1", o.replicas),
    })
}

/// Machines wait for the Cluster's infrastructure.
pub(super) fn infrastructure(o: &Observed) -> Option<Step> {
    let ClusterView::Found {
        name,
        infrastructure_ready: false,
        ..
    } = &o.cluster
    else {
        return None;
    };
    Some(Step::Wait {
        reason: reason::WAITING_FOR_INFRASTRUCTURE,
        message: format!("waiting for Cluster {name}'s infrastructure to be provisioned"),
    })
}

/// The CA: created when nothing exists yet; a corrupt one is reported, and a missing one under
/// existing members is asked for back (a new CA would cut every member off).
pub(super) fn ca(o: &Observed) -> Option<Step> {
    let ClusterView::Found { name, .. } = &o.cluster else {
        return None;
    };
    match &o.ca {
        CaView::Corrupt(problem) => Some(Step::Refuse {
            reason: reason::CA_CORRUPT,
            message: format!("{problem}; fix or restore the Secret, it is never replaced"),
        }),
        CaView::Missing if !o.machines.is_empty() || o.initialized => Some(Step::Refuse {
            reason: reason::CA_MISSING,
            message: format!(
                "Secret {} is missing while etcd members exist; restore it (a new CA would \
                 cut every member off)",
                names::ca_secret_name(name)
            ),
        }),
        CaView::Missing => Some(Step::CreateCa),
        CaView::Valid => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
    #[test]
    fn housekeeping_comes_first_in_order() {
        let mut o = base();
        o.cluster = ClusterView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER);
        let mut o = base();
        o.has_cluster_owner_ref = false;
        o.has_finalizer = false;
        assert_eq!(plan(&o), Step::AddClusterOwnerRef);
        o.has_cluster_owner_ref = true;
        assert_eq!(plan(&o), Step::AddFinalizer);
        o.has_finalizer = true;
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: false,
            infrastructure_ready: false,
            failure_domains: vec![],
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_INFRASTRUCTURE);
    }

    #[test]
    fn paused_cluster_or_annotation_writes_nothing() {
        let mut o = base();
        o.has_finalizer = false;
        o.paused_annotation = true;
        assert_eq!(plan(&o), Step::Paused);
        o.paused_annotation = false;
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: true,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: vec![],
        };
        assert_eq!(plan(&o), Step::Paused);
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
    fn ca_is_created_once_and_never_regenerated_under_members() {
        let mut o = base();
        o.ca = CaView::Missing;
        assert_eq!(plan(&o), Step::CreateCa);
        o.ca = CaView::Corrupt("Secret default/c1-managed-etcd has no tls.key".into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CA_CORRUPT);
        assert!(wait_message(&step).contains("no tls.key"));
        assert!(!step.writes());
        let mut o = running(1);
        o.ca = CaView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::CA_MISSING);
    }
}
