//! The critical path of one creation on slow Machines, phase by phase (`etcdadm-sim bench boot`
//! prints it after each run): which seconds are boots, which are joins, and which are neither
//! (the controllers' reactions, etcd's own checks), since the last are the ones to cut.

use std::time::Duration;

use crate::bench_steps::MemberSteps;

/// What a creation's run saw, each time from the EtcdadmCluster's creation.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// `<cluster>-etcd-init` exists: the first member's client URL is published.
    pub init_published: Option<Duration>,
    pub ready: Duration,
    /// In creation order; the first is the `etcdadm init` member.
    pub members: Vec<MemberSteps>,
}

/// One phase of the critical path: what ends it, and how long it took from the previous one's
/// end (a phase whose end was not seen is left out, and the next counts from the last seen end).
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub what: String,
    pub took: Duration,
}

/// The critical path of a creation: the first Machine's bootstrap data, its boot, `etcdadm
/// init`, the init Secret, the joiners' bootstrap data and boot, then each join in the order
/// their learners were added (the wait for its turn, then learner → healthy voter), then Ready.
/// The phases add up to `ready` when every end was seen.
pub fn critical_path(t: &Timeline) -> Vec<Phase> {
    let mut ends: Vec<(String, Option<Duration>)> = Vec::new();
    if let Some(first) = t.members.first() {
        ends.push(("first Machine's bootstrap data".into(), first.bootstrap_data));
        ends.push(("first Machine's boot".into(), first.address));
        ends.push(("etcdadm init (booted → healthy)".into(), first.healthy));
        ends.push(("init Secret published".into(), t.init_published));
    }
    let mut joiners: Vec<&MemberSteps> = t.members.iter().skip(1).collect();
    joiners.sort_by_key(|s| s.listed.unwrap_or(Duration::MAX));
    if let Some(next) = joiners.first() {
        ends.push(("first joiner's bootstrap data".into(), next.bootstrap_data));
        ends.push(("first joiner's boot".into(), next.address));
    }
    for (i, joiner) in joiners.iter().enumerate() {
        let n = i + 2;
        ends.push((format!("member {n}: its turn (learner added)"), joiner.listed));
        ends.push((format!("member {n}: learner → healthy voter"), joiner.healthy));
    }
    ends.push(("Ready".into(), Some(t.ready)));
    let mut last = Duration::ZERO;
    ends.into_iter()
        .filter_map(|(what, end)| {
            let end = end?;
            let took = end.saturating_sub(last);
            last = last.max(end);
            Some(Phase { what, took })
        })
        .collect()
}

/// A joiner's own steps once its learner is added: the node noticing it is listed and etcdadm
/// installing and configuring (`etcd.env` written), etcd starting, the learner caught up and
/// promoted, and the member answering healthy.
pub fn join_steps(s: &MemberSteps) -> String {
    let step = |later: Option<Duration>, earlier: Option<Duration>| match (later, earlier) {
        (Some(l), Some(e)) => format!("{:.1} s", l.saturating_sub(e).as_secs_f64()),
        _ => "-".into(),
    };
    format!(
        "listed → configured {}, → started {}, → voter {}, → healthy {}",
        step(s.configured, s.listed),
        step(s.started, s.configured),
        step(s.voter, s.started),
        step(s.healthy, s.voter),
    )
}

/// Print `t`'s critical path and each joiner's steps.
pub fn print(t: &Timeline) {
    println!("  critical path:");
    for phase in critical_path(t) {
        println!("    {:>6.1} s  {}", phase.took.as_secs_f64(), phase.what);
    }
    let mut joiners: Vec<&MemberSteps> = t.members.iter().skip(1).collect();
    joiners.sort_by_key(|s| s.listed.unwrap_or(Duration::MAX));
    for (i, joiner) in joiners.iter().enumerate() {
        println!("    member {}: {}", i + 2, join_steps(joiner));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> Option<Duration> {
        Some(Duration::from_secs_f64(secs))
    }

    fn member(data: f64, address: f64, listed: f64, healthy: f64) -> MemberSteps {
        MemberSteps {
            bootstrap_data: at(data),
            address: at(address),
            listed: at(listed),
            healthy: at(healthy),
            ..Default::default()
        }
    }

    #[test]
    fn the_critical_path_adds_up_to_ready_through_the_joins_in_the_order_their_learners_were_added() {
        let t = Timeline {
            init_published: at(34.0),
            ready: Duration::from_secs_f64(75.0),
            // Created in this order; the third member's learner was added before the second's.
            members: vec![
                member(1.0, 31.0, 31.5, 33.0),
                member(35.0, 65.0, 70.0, 72.0),
                member(34.5, 64.5, 65.0, 67.0),
            ],
        };
        let phases = critical_path(&t);
        let took: Vec<(&str, f64)> = phases
            .iter()
            .map(|p| (p.what.as_str(), (p.took.as_secs_f64() * 10.0).round() / 10.0))
            .collect();
        assert_eq!(
            took,
            vec![
                ("first Machine's bootstrap data", 1.0),
                ("first Machine's boot", 30.0),
                ("etcdadm init (booted → healthy)", 2.0),
                ("init Secret published", 1.0),
                ("first joiner's bootstrap data", 0.5),
                ("first joiner's boot", 30.0),
                ("member 2: its turn (learner added)", 0.5),
                ("member 2: learner → healthy voter", 2.0),
                ("member 3: its turn (learner added)", 3.0),
                ("member 3: learner → healthy voter", 2.0),
                ("Ready", 3.0),
            ]
        );
        let sum: Duration = phases.iter().map(|p| p.took).sum();
        assert_eq!(sum, t.ready);
    }

    #[test]
    fn a_phase_not_seen_is_left_out_and_the_next_counts_from_the_last_end_seen() {
        let t = Timeline {
            init_published: None,
            ready: Duration::from_secs(40),
            members: vec![member(1.0, 31.0, 31.5, 33.0)],
        };
        let phases = critical_path(&t);
        assert_eq!(phases.len(), 4);
        assert_eq!(
            phases[3],
            Phase {
                what: "Ready".into(),
                took: Duration::from_secs(7)
            }
        );
    }
}
