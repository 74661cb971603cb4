//! Deletion (SPEC-etcdcluster.md "Deletion"): the control plane goes first (the apiservers need
//! etcd until then), then every etcd Machine with its hook released (the whole cluster is going,
//! so no member is removed one by one), then the finalizer.

use super::observed::{ClusterView, Observed};
use super::step::{Step, reason};

/// While the EtcdadmCluster or its Cluster is being deleted, the deletion's next step.
pub(super) fn plan(o: &Observed) -> Option<Step> {
    let cluster_deleting = matches!(o.cluster, ClusterView::Found { deleting: true, .. });
    (o.deleting || cluster_deleting).then(|| next_step(o))
}

fn next_step(o: &Observed) -> Step {
    if o.control_plane_machines > 0 {
        return Step::Wait {
            reason: reason::WAITING_FOR_CONTROL_PLANE_DELETION,
            message: format!(
                "{} control plane Machines still use etcd; deleting etcd Machines after they are gone",
                o.control_plane_machines
            ),
        };
    }
    let to_release: Vec<String> = o
        .machines
        .iter()
        .filter(|m| m.has_hook || !m.deleting)
        .map(|m| m.name.clone())
        .collect();
    if !to_release.is_empty() {
        return Step::ReleaseAndDeleteMachines { names: to_release };
    }
    if !o.machines.is_empty() {
        let names: Vec<&str> = o.machines.iter().map(|m| m.name.as_str()).collect();
        return Step::Wait {
            reason: reason::WAITING_FOR_MACHINE_DELETION,
            message: format!("waiting for Machines {} to go", names.join(", ")),
        };
    }
    if o.deleting && o.has_finalizer {
        return Step::RemoveFinalizer;
    }
    Step::Wait {
        reason: reason::WAITING_FOR_CLUSTER_DELETION,
        message: "every etcd Machine is gone; waiting for the Cluster's deletion to remove this object"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
    #[test]
    fn deletion_waits_for_the_control_plane_then_deletes_machines_then_the_finalizer() {
        let mut o = running(3);
        o.deleting = true;
        o.control_plane_machines = 2;
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CONTROL_PLANE_DELETION);
        o.control_plane_machines = 0;
        let Step::ReleaseAndDeleteMachines { names } = plan(&o) else {
            panic!("expected Machine deletion");
        };
        assert_eq!(names.len(), 3);
        for m in &mut o.machines {
            m.deleting = true;
            m.has_hook = false;
        }
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_DELETION);
        o.machines.clear();
        assert_eq!(plan(&o), Step::RemoveFinalizer);
        // Quorum lost does not block deletion.
        let mut o = running(3);
        o.deleting = true;
        o.etcd = EtcdView::Unreachable {
            message: "gone".into(),
        };
        assert!(matches!(plan(&o), Step::ReleaseAndDeleteMachines { .. }));
        // The Cluster deleting alone deletes Machines but leaves our finalizer to our deletion.
        let mut o = base();
        o.cluster = ClusterView::Found {
            name: "c1".into(),
            paused: false,
            deleting: true,
            infrastructure_ready: true,
            failure_domains: vec![],
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_CLUSTER_DELETION);
    }
}
