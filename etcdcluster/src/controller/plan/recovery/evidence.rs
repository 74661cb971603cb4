//! The only evidence an automatic recovery acts on (docs/day2.md, "Quorum loss"): the
//! infrastructure reporting the Machines of a majority of the voting members last recorded gone
//! or failed. What etcd's members say cannot tell a stall or a partition from a loss.

use etcdadm_shared::names;

use crate::controller::observation::{EtcdView, MachineView, MemberView, Observation};
use crate::controller::rules;

/// What the infrastructure says of one voting member's Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// The Machine is there and not reported failed: its member may be stalled, or serving
    /// behind a partition.
    Standing,
    /// The infrastructure reports it lost for good (`MachineView::failed`).
    Failed,
    /// No Machine of this EtcdadmCluster is the member's.
    Gone,
}

/// The voting members last recorded, each with its Machine's fate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// By member (its Machine's name where it has one), in name order.
    pub voters: Vec<(String, Fate)>,
}

impl Evidence {
    /// The voting members last recorded: etcd's own member list when a member answers with
    /// one, else those `status.members` last recorded (kept while their Machines go, see
    /// `status.rs`) and the Machines whose member voted. Counted against those members, never
    /// against `spec.replicas`: Machines created for a scale-up that never joined are no
    /// members.
    pub fn of(o: &Observation) -> Evidence {
        let mut voters: Vec<(String, Fate)> = match &o.etcd {
            EtcdView::Members(_) => o.voters().into_iter().map(|m| listed(o, m)).collect(),
            EtcdView::Unreachable { .. } | EtcdView::NotChecked => {
                let stored = o
                    .etcd_cluster
                    .status
                    .as_ref()
                    .map(|s| s.members.as_slice())
                    .unwrap_or_default();
                let mut names: Vec<String> = stored
                    .iter()
                    .filter(|s| s.member_id.is_some() && !s.is_learner)
                    .map(|s| s.machine_ref.as_ref().map_or(&s.name, |r| &r.name).clone())
                    .chain(o.machines.iter().filter(|m| m.was_member).map(|m| m.name.clone()))
                    .collect();
                names.sort();
                names.dedup();
                names
                    .into_iter()
                    .map(|name| {
                        let fate = fate(o.machines.iter().find(|m| m.name == name));
                        (name, fate)
                    })
                    .collect()
            }
        };
        voters.sort();
        Evidence { voters }
    }

    /// The members whose Machines are gone or failed.
    pub fn lost(&self) -> Vec<&str> {
        self.voters
            .iter()
            .filter(|(_, fate)| *fate != Fate::Standing)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The Machines of a majority of the voting members are gone or failed.
    pub fn majority_lost(&self) -> bool {
        !self.voters.is_empty() && self.lost().len() >= rules::quorum(self.voters.len())
    }

    /// What the infrastructure says, for the `Recovery` condition.
    pub fn describe(&self) -> String {
        let named = |wanted: Fate| -> Vec<&str> {
            self.voters
                .iter()
                .filter(|(_, fate)| *fate == wanted)
                .map(|(name, _)| name.as_str())
                .collect()
        };
        let mut parts = vec![];
        for (fate, word) in [
            (Fate::Gone, "gone"),
            (Fate::Failed, "reported failed by the infrastructure"),
            (Fate::Standing, "standing"),
        ] {
            let names = named(fate);
            if !names.is_empty() {
                parts.push(format!("{} {word} ({})", names.len(), names.join(", ")));
            }
        }
        format!(
            "of the {} voting members last recorded, the Machines of {}",
            self.voters.len(),
            if parts.is_empty() {
                "none".to_string()
            } else {
                parts.join(", ")
            }
        )
    }
}

fn fate(machine: Option<&MachineView>) -> Fate {
    match machine {
        None => Fate::Gone,
        Some(m) if m.failed => Fate::Failed,
        Some(_) => Fate::Standing,
    }
}

/// A voter of etcd's member list and its Machine: the one rule 5 found, else one of the
/// member's name or at its peer URL's address (a member whose Machine exists is never counted
/// gone for want of a match).
fn listed(o: &Observation, member: &MemberView) -> (String, Fate) {
    let peer_addresses: Vec<String> = o
        .machines
        .iter()
        .filter_map(|m| m.address.as_deref().map(|a| (m, names::peer_url(a))))
        .filter(|(_, url)| member.peer_urls.contains(url))
        .map(|(m, _)| m.name.clone())
        .collect();
    let machine = o.machines.iter().find(|m| {
        member.machine.as_deref() == Some(m.name.as_str())
            || (!member.name.is_empty() && m.name == member.name)
            || peer_addresses.contains(&m.name)
    });
    let name = match (machine, member.name.is_empty()) {
        (Some(m), _) => m.name.clone(),
        (None, false) => member.name.clone(),
        (None, true) => etcdadm_shared::etcd::member_id_hex(member.id),
    };
    (name, fate(machine))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::*;
    use etcdadm_shared::api::MemberStatus;
    use etcdadm_shared::api::cluster::MachineReference;

    fn recorded(name: &str, learner: bool) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            machine_ref: Some(MachineReference { name: name.into() }),
            member_id: Some("0000000000000001".into()),
            is_learner: learner,
            ..Default::default()
        }
    }

    /// Three voters recorded in status, no member answering, Machines as `machines` says.
    fn silent(machines: &[(&str, bool)], stored: &[MemberStatus]) -> Observation {
        let mut o = running(0);
        o.etcd = EtcdView::Unreachable {
            message: "timed out".into(),
        };
        o.machines = machines
            .iter()
            .map(|(name, failed)| MachineView {
                failed: *failed,
                ..machine(name, Some("10.0.0.9"), None)
            })
            .collect();
        o.etcd_cluster.status = Some(etcdadm_shared::api::EtcdadmClusterStatus {
            members: stored.to_vec(),
            ..Default::default()
        });
        o
    }

    #[test]
    fn a_majority_of_the_recorded_voters_gone_or_failed_is_evidence_and_nothing_else_is() {
        let three = [recorded("a", false), recorded("b", false), recorded("c", false)];
        // Two of three members silent or stalled, their Machines standing: no evidence.
        let standing = Evidence::of(&silent(&[("a", false), ("b", false), ("c", false)], &three));
        assert!(!standing.majority_lost());
        assert_eq!(
            standing.describe(),
            "of the 3 voting members last recorded, the Machines of 3 standing (a, b, c)"
        );
        // One failed, one standing: no majority.
        assert!(!Evidence::of(&silent(&[("a", false), ("b", true), ("c", false)], &three)).majority_lost());
        // Two failed, or one failed and one gone: evidence.
        let failed = Evidence::of(&silent(&[("a", false), ("b", true), ("c", true)], &three));
        assert!(failed.majority_lost());
        assert_eq!(failed.lost(), ["b", "c"]);
        let mixed = Evidence::of(&silent(&[("a", false), ("b", true)], &three));
        assert!(mixed.majority_lost());
        assert_eq!(
            mixed.describe(),
            "of the 3 voting members last recorded, the Machines of 1 gone (c), \
             1 reported failed by the infrastructure (b), 1 standing (a)"
        );
    }

    #[test]
    fn machines_that_never_held_a_voter_count_for_nothing() {
        // Scaling 1 → 3 while etcd is unreachable: one voter recorded, two new Machines that
        // never joined (one already failed). Counted against spec.replicas this looked like a
        // lost majority; against the members it is none.
        let mut o = silent(
            &[("a", false), ("new-1", false), ("new-2", true)],
            &[recorded("a", false), recorded("new-1", true)],
        );
        o.replicas = 3;
        let evidence = Evidence::of(&o);
        assert_eq!(evidence.voters, [("a".to_string(), Fate::Standing)]);
        assert!(!evidence.majority_lost());
        // Nothing recorded at all is never evidence.
        assert!(!Evidence::of(&silent(&[], &[])).majority_lost());
    }

    #[test]
    fn a_member_list_is_etcds_own_record_and_a_member_whose_machine_exists_is_never_gone() {
        let mut o = running(3);
        // m1 is mapped to no Machine (rule 5 had no answer) but its Machine stands by name.
        members_mut(&mut o)[1].machine = None;
        // m2 is on no Machine at all: its Machine was deleted.
        o.machines.truncate(2);
        members_mut(&mut o)[2].machine = None;
        let evidence = Evidence::of(&o);
        assert_eq!(
            evidence.voters,
            [
                ("c1-etcd-m0".to_string(), Fate::Standing),
                ("c1-etcd-m1".to_string(), Fate::Standing),
                ("c1-etcd-m2".to_string(), Fate::Gone),
            ]
        );
        assert!(!evidence.majority_lost());
        // A learner is no voter.
        members_mut(&mut o)[1].is_learner = true;
        o.machines[1].failed = true;
        assert_eq!(Evidence::of(&o).voters.len(), 2);
        // Two of three voters' Machines gone or failed.
        members_mut(&mut o)[1].is_learner = false;
        assert!(Evidence::of(&o).majority_lost());
    }
}
