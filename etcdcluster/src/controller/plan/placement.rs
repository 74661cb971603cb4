//! Where members go and which one leaves (docs/safety.md, "Failure domains"): new Machines into
//! the allowed failure domain with the fewest, victims from the most crowded one, with the
//! delete-machine annotation, dead members and outdated ones first.

use crate::controller::decision::Hold;
use crate::controller::observation::{ClusterView, MachineView, Observation};

/// Condition reasons of placement.
pub mod reason {
    pub const NO_FAILURE_DOMAIN: &str = "NoAllowedFailureDomain";
}

/// The failure domains members may go to: `spec.failureDomains` ∩ the Cluster's (all of the
/// Cluster's by default). A Cluster that reports none leaves the spec's list as given. `Err`
/// when the spec names domains the Cluster does not offer at all.
pub fn allowed_failure_domains(spec: &[String], cluster: &[String]) -> Result<Vec<String>, String> {
    let mut allowed: Vec<String> = if spec.is_empty() {
        cluster.to_vec()
    } else if cluster.is_empty() {
        spec.to_vec()
    } else {
        spec.iter().filter(|d| cluster.contains(d)).cloned().collect()
    };
    allowed.sort();
    allowed.dedup();
    if allowed.is_empty() && !spec.is_empty() {
        return Err(format!(
            "spec.failureDomains [{}] names none of the Cluster's failure domains [{}]",
            spec.join(", "),
            cluster.join(", ")
        ));
    }
    Ok(allowed)
}

/// The allowed failure domain with the fewest current (not deleting) Machines; ties go to the
/// one with the fewest up-to-date Machines, then by name.
pub fn pick_failure_domain(allowed: &[String], machines: &[MachineView]) -> Option<String> {
    allowed
        .iter()
        .min_by_key(|domain| {
            let in_domain = || {
                machines
                    .iter()
                    .filter(|m| !m.deleting && m.failure_domain.as_deref() == Some(domain.as_str()))
            };
            let up_to_date = in_domain().filter(|m| m.outdated.is_none()).count();
            (in_domain().count(), up_to_date, domain.as_str())
        })
        .cloned()
}

/// The scale-down (or rollout) victim among `candidates`: a Machine annotated
/// `cluster.x-k8s.io/delete-machine` first, then one whose member is dead, then an outdated
/// one, then from the failure domain with the most Machines (Machines outside the allowed
/// domains first), oldest first.
pub fn pick_victim<'a>(
    o: &Observation,
    allowed_domains: &[String],
    candidates: &[&'a MachineView],
) -> Option<&'a MachineView> {
    let active: Vec<&MachineView> = o.active_machines().collect();
    candidates
        .iter()
        .enumerate()
        .min_by_key(|(age, m)| {
            let known = m
                .failure_domain
                .as_deref()
                .is_some_and(|d| allowed_domains.iter().any(|a| a == d));
            let crowd = active
                .iter()
                .filter(|other| other.failure_domain == m.failure_domain)
                .count();
            (
                !m.delete_requested,
                !o.is_dead(m),
                m.outdated.is_none(),
                known,
                std::cmp::Reverse(crowd),
                *age,
            )
        })
        .map(|(_, m)| *m)
}

/// The failure domains members may go to, or the refusal naming the spec's domains when the
/// Cluster offers none of them.
pub fn allowed_domains(o: &Observation) -> Result<Vec<String>, Hold> {
    let offered: &[String] = match &o.cluster {
        ClusterView::Found { failure_domains, .. } => failure_domains,
        ClusterView::Missing => &[],
    };
    allowed_failure_domains(&o.spec_failure_domains, offered)
        .map_err(|problem| Hold::refuse(reason::NO_FAILURE_DOMAIN, problem))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;
    #[test]
    fn zone_spread_puts_one_member_in_each_of_three_zones() {
        let zones = vec!["us-a".to_string(), "us-b".into(), "us-c".into()];
        let mut o = base();
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: zones.clone(),
            deletes_etcd_last: false,
        };
        let mut placed = Vec::new();
        for i in 0..3 {
            let Step::Machines(MachineStep::CreateMachine { failure_domain, .. }) = plan(&o) else {
                panic!("expected a Machine at step {i}: {:?}", plan(&o));
            };
            let domain = failure_domain.unwrap();
            let name = format!("c1-etcd-m{i}");
            let address = format!("10.0.0.{}", i + 1);
            o.machines.push(machine(&name, Some(&address), Some(&domain)));
            let mut members = match &o.etcd {
                EtcdView::Members(m) => m.clone(),
                _ => vec![],
            };
            members.push(member(i as u64 + 1, &name, &address));
            o.etcd = EtcdView::Members(members);
            o.initialized = true;
            o.init_secret = Some(InitSecret {
                address: Some("10.0.0.1".into()),
                client_urls: healthy_client_urls(&o),
            });
            placed.push(domain);
        }
        placed.sort();
        assert_eq!(placed, zones);
        assert!(is_ready(&o));
    }

    #[test]
    fn failure_domains_are_restricted_by_the_spec_and_ties_go_by_name() {
        let cluster = vec!["a".to_string(), "b".into(), "c".into()];
        assert_eq!(allowed_failure_domains(&[], &cluster).unwrap(), cluster);
        assert_eq!(
            allowed_failure_domains(&["c".into(), "x".into(), "b".into()], &cluster).unwrap(),
            vec!["b".to_string(), "c".into()]
        );
        assert!(allowed_failure_domains(&["x".into()], &cluster).is_err());
        assert_eq!(
            allowed_failure_domains(&["x".into()], &[]).unwrap(),
            vec!["x".to_string()]
        );
        let machines = vec![
            machine("m0", None, Some("a")),
            machine("m1", None, Some("b")),
            MachineView {
                deleting: true,
                ..machine("m2", None, Some("c"))
            },
        ];
        assert_eq!(pick_failure_domain(&cluster, &machines).as_deref(), Some("c"));
        assert_eq!(
            pick_failure_domain(&cluster, &machines[..1]).as_deref(),
            Some("b")
        );
        assert_eq!(pick_failure_domain(&[], &machines), None);
        let mut o = base();
        o.spec_failure_domains = vec!["x".into()];
        o.cluster = ClusterView::Found {
            reference: cluster_ref(),
            paused: false,
            deleting: false,
            infrastructure_ready: true,
            failure_domains: cluster,
            deletes_etcd_last: false,
        };
        assert_eq!(wait_reason(&plan(&o)), reason::NO_FAILURE_DOMAIN);
    }

    #[test]
    fn scale_down_victim_annotation_then_dead_then_crowded_domain_then_oldest() {
        let domains = zones();
        let mut o = zoned(3, false);
        o.machines
            .push(machine("c1-etcd-m3", Some("10.0.0.4"), Some("a")));
        members_mut(&mut o).push(member(4, "c1-etcd-m3", "10.0.0.4"));
        o.machines
            .push(machine("c1-etcd-m4", Some("10.0.0.5"), Some("b")));
        members_mut(&mut o).push(member(5, "c1-etcd-m4", "10.0.0.5"));
        let all: Vec<&MachineView> = o.machines.iter().collect();
        // Zones a and b hold two each: the oldest of the first crowded one goes.
        assert_eq!(pick_victim(&o, &domains, &all).unwrap().name, "c1-etcd-m0");
        // A Machine outside the allowed domains goes first.
        let mut outside = o.clone();
        outside.machines[2].failure_domain = Some("gone".into());
        let all: Vec<&MachineView> = outside.machines.iter().collect();
        assert_eq!(pick_victim(&outside, &domains, &all).unwrap().name, "c1-etcd-m2");
        // A dead member goes before that.
        let mut dead = outside.clone();
        members_mut(&mut dead)[4] = unhealthy(members_mut(&mut dead)[4].clone(), "connection refused");
        let all: Vec<&MachineView> = dead.machines.iter().collect();
        assert_eq!(pick_victim(&dead, &domains, &all).unwrap().name, "c1-etcd-m4");
        // The delete-machine annotation wins over everything.
        dead.machines[1].delete_requested = true;
        let all: Vec<&MachineView> = dead.machines.iter().collect();
        assert_eq!(pick_victim(&dead, &domains, &all).unwrap().name, "c1-etcd-m1");
        // Planned: 5 → 3 deletes the annotated Machine first.
        o.replicas = 3;
        o.machines[4].delete_requested = true;
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        assert!(
            matches!(plan(&o), Step::Machines(MachineStep::DeleteMachine { machine, purpose: Removal::ScaleDown, .. }) if machine == "c1-etcd-m4")
        );
    }
}
