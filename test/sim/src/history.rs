//! Membership history recorded from etcd itself, and Machine lifetimes recorded from the API, so
//! scenarios can assert the safety rules on what really happened rather than on what a
//! controller says it did.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::etcd::{EtcdTls, Member, MemberClient};

/// Membership at one moment: members by ID, with whether each had started and is a learner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub at: Duration,
    /// `(id, name, started, learner)`, sorted by ID.
    pub members: Vec<(u64, String, bool, bool)>,
}

impl Snapshot {
    fn of(at: Duration, members: &[Member]) -> Snapshot {
        let mut members: Vec<_> = members
            .iter()
            .map(|m| (m.id, m.name.clone(), m.is_started(), m.is_learner))
            .collect();
        members.sort();
        Snapshot { at, members }
    }

    fn ids(&self) -> BTreeSet<u64> {
        self.members.iter().map(|m| m.0).collect()
    }

    fn learners(&self) -> BTreeSet<u64> {
        self.members.iter().filter(|m| m.3).map(|m| m.0).collect()
    }

    /// The members' names (empty for one added but not started yet).
    pub fn names(&self) -> BTreeSet<String> {
        self.members.iter().map(|m| m.1.clone()).collect()
    }

    /// Members added to the cluster that have not started yet: joins in flight.
    pub fn pending(&self) -> usize {
        self.members.iter().filter(|m| !m.2).count()
    }
}

/// Every distinct membership seen, in order.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub snapshots: Vec<Snapshot>,
}

impl History {
    /// Rule 1/2: never two joins in flight at once.
    pub fn max_pending_joins(&self) -> usize {
        self.snapshots
            .iter()
            .map(Snapshot::pending)
            .max()
            .unwrap_or_default()
    }

    /// Rule 1: between consecutive observations, at most one member was added, promoted or
    /// removed. (The recorder polls fast enough that two changes in one interval mean two were
    /// in flight: see [`RECORD_EVERY`].)
    pub fn max_changes_per_step(&self) -> usize {
        self.snapshots
            .windows(2)
            .map(|w| {
                let (a, b) = (&w[0], &w[1]);
                let added_or_removed = a.ids().symmetric_difference(&b.ids()).count();
                let promoted = a
                    .learners()
                    .difference(&b.learners())
                    .filter(|id| b.ids().contains(id))
                    .count();
                added_or_removed + promoted
            })
            .max()
            .unwrap_or_default()
    }

    /// etcd allows one learner at a time; the controller never asks for a second one.
    pub fn max_learners(&self) -> usize {
        self.snapshots
            .iter()
            .map(|s| s.learners().len())
            .max()
            .unwrap_or_default()
    }

    /// How each member that joined after the first snapshot joined: `(id, first seen as a
    /// learner, later seen as a voter)`, by ID.
    pub fn joins(&self) -> Vec<(u64, bool, bool)> {
        let Some(first) = self.snapshots.first() else {
            return vec![];
        };
        let mut joins: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
        for snapshot in &self.snapshots {
            for &(id, _, _, learner) in &snapshot.members {
                if first.ids().contains(&id) {
                    continue;
                }
                let entry = joins.entry(id).or_insert((learner, false));
                entry.1 |= !learner;
            }
        }
        joins
            .into_iter()
            .map(|(id, (learner, voter))| (id, learner, voter))
            .collect()
    }

    /// Largest membership ever seen.
    pub fn max_size(&self) -> usize {
        self.snapshots
            .iter()
            .map(|s| s.members.len())
            .max()
            .unwrap_or_default()
    }

    pub fn last(&self) -> Option<&Snapshot> {
        self.snapshots.last()
    }

    /// Largest membership seen between `from` and `to` (the snapshot in force at `from` counts).
    pub fn max_size_between(&self, from: Duration, to: Duration) -> usize {
        let before = self.snapshots.iter().rev().find(|s| s.at <= from);
        before
            .into_iter()
            .chain(self.snapshots.iter().filter(|s| s.at > from && s.at <= to))
            .map(|s| s.members.len())
            .max()
            .unwrap_or_default()
    }

    /// Names that went with more than one member ID: a member added twice for one Machine (a
    /// membership change repeated).
    pub fn names_with_several_ids(&self) -> BTreeMap<String, BTreeSet<u64>> {
        let mut ids: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        for snapshot in &self.snapshots {
            for (id, name, _, _) in &snapshot.members {
                if !name.is_empty() {
                    ids.entry(name.clone()).or_default().insert(*id);
                }
            }
        }
        ids.retain(|_, ids| ids.len() > 1);
        ids
    }

    /// When the member named `name` was first seen gone after having been seen: the earliest
    /// snapshot without it that follows one with it.
    pub fn left_at(&self, name: &str) -> Option<Duration> {
        let mut seen = false;
        for snapshot in &self.snapshots {
            let present = snapshot.members.iter().any(|m| m.1 == name);
            if present {
                seen = true;
            } else if seen {
                return Some(snapshot.at);
            }
        }
        None
    }

    /// Whether a member named `name` was ever seen.
    pub fn ever_member(&self, name: &str) -> bool {
        self.snapshots
            .iter()
            .any(|s| s.members.iter().any(|m| m.1 == name))
    }

    /// When the member named `name` was last seen (snapshot times are taken before each read,
    /// so the member existed at or after that time).
    pub fn last_seen(&self, name: &str) -> Option<Duration> {
        self.snapshots
            .iter()
            .filter(|s| s.members.iter().any(|m| m.1 == name))
            .map(|s| s.at)
            .max()
    }

    /// Members added that never started and were removed again: failed joins, by ID.
    pub fn failed_joins(&self) -> BTreeSet<u64> {
        let started: BTreeSet<u64> = self
            .snapshots
            .iter()
            .flat_map(|s| s.members.iter().filter(|m| m.2).map(|m| m.0))
            .collect();
        let last = self.snapshots.last().map(Snapshot::ids).unwrap_or_default();
        self.snapshots
            .iter()
            .flat_map(|s| s.members.iter().map(|m| m.0))
            .filter(|id| !started.contains(id) && !last.contains(id))
            .collect()
    }

    /// A failed join is undone before anything else changes: from the snapshot where a member
    /// that never starts appears to the one where it is gone, the only membership change is its
    /// removal. Returns the violations.
    pub fn changes_while_a_failed_join_was_pending(&self) -> Vec<String> {
        let mut violations = vec![];
        for id in self.failed_joins() {
            let present: Vec<usize> = (0..self.snapshots.len())
                .filter(|&i| self.snapshots[i].ids().contains(&id))
                .collect();
            let (Some(&first), Some(&last)) = (present.first(), present.last()) else {
                continue;
            };
            for w in first..=last {
                let (a, b) = (&self.snapshots[w], self.snapshots.get(w + 1));
                let Some(b) = b else { break };
                let mut changed: BTreeSet<u64> = a.ids().symmetric_difference(&b.ids()).copied().collect();
                changed.remove(&id);
                if !changed.is_empty() {
                    violations.push(format!(
                        "members {changed:?} changed at {:?} while member {id:x} (added, never started) was pending",
                        b.at
                    ));
                }
            }
        }
        violations
    }

    /// Rule 4: no Machine disappeared while its member was still in etcd. A violation is a
    /// membership read that started after the Machine was seen gone and still lists the member
    /// (polling can only prove this direction). Returns the violations.
    pub fn machines_outliving_members(&self, machines: &MachineLog) -> Vec<String> {
        machines
            .lives
            .iter()
            .filter_map(|(name, life)| {
                let gone = life.gone?;
                let seen = self.last_seen(name)?;
                (seen > gone).then(|| {
                    format!(
                        "Machine {name} gone at {gone:?}, its member still in etcd at {seen:?} (left at {:?})",
                        self.left_at(name)
                    )
                })
            })
            .collect()
    }
}

/// When one Machine was first seen, first seen deleting, and seen gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineLife {
    pub first_seen: Duration,
    pub deleting_since: Option<Duration>,
    pub gone: Option<Duration>,
}

/// Machine lifetimes and how many existed at each poll.
#[derive(Clone, Debug, Default)]
pub struct MachineLog {
    pub lives: BTreeMap<String, MachineLife>,
    /// `(at, Machines existing)` at every change of the set.
    pub counts: Vec<(Duration, usize)>,
}

impl MachineLog {
    /// Most Machines that existed at once between `from` and `to`.
    pub fn max_between(&self, from: Duration, to: Duration) -> usize {
        let before = self.counts.iter().rev().find(|(at, _)| *at <= from);
        before
            .into_iter()
            .chain(self.counts.iter().filter(|(at, _)| *at > from && *at <= to))
            .map(|(_, n)| *n)
            .max()
            .unwrap_or_default()
    }
}

/// Polls the Machines matching a label selector and records their lifetimes.
pub struct MachineRecorder {
    log: Arc<Mutex<MachineLog>>,
    task: tokio::task::JoinHandle<()>,
}

impl MachineRecorder {
    /// Start polling every `every`; times are measured from `started` (share it with the
    /// membership [`Recorder`] to compare the two).
    pub fn start(
        client: Client,
        ns: &str,
        selector: &str,
        started: Instant,
        every: Duration,
    ) -> MachineRecorder {
        let log = Arc::new(Mutex::new(MachineLog::default()));
        let shared = log.clone();
        let api: Api<Machine> = Api::namespaced(client, ns);
        let params = ListParams::default().labels(selector);
        let task = tokio::spawn(async move {
            loop {
                if let Ok(list) = api.list(&params).await {
                    let at = started.elapsed();
                    let mut log = shared.lock().unwrap_or_else(PoisonError::into_inner);
                    let present: BTreeSet<String> = list.items.iter().map(|m| m.name_any()).collect();
                    for machine in &list.items {
                        let life = log.lives.entry(machine.name_any()).or_insert(MachineLife {
                            first_seen: at,
                            ..Default::default()
                        });
                        if machine.is_deleting() && life.deleting_since.is_none() {
                            life.deleting_since = Some(at);
                        }
                    }
                    for (name, life) in log.lives.iter_mut() {
                        if life.gone.is_none() && !present.contains(name) {
                            life.gone = Some(at);
                        }
                    }
                    if log.counts.last().map(|(_, n)| *n) != Some(present.len()) {
                        log.counts.push((at, present.len()));
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        MachineRecorder { log, task }
    }

    /// What was recorded so far.
    pub fn snapshot(&self) -> MachineLog {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stop and return what was recorded.
    pub fn finish(self) -> MachineLog {
        self.task.abort();
        self.snapshot()
    }
}

/// How often a [`Recorder`] polls: well under the shortest time the controller leaves between
/// two membership changes (a new reconcile with a fresh health round of every member, ~100 ms
/// here), so that two changes seen in one interval really were two in flight. A learner's
/// promotion followed at once by an old member's removal comes that close.
pub const RECORD_EVERY: Duration = Duration::from_millis(25);

/// Polls `MemberList` through any reachable URL from `urls()` and records each change.
pub struct Recorder {
    history: Arc<Mutex<History>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Start recording; `urls` is asked afresh on every poll (members come and go).
    pub fn start<F>(tls: EtcdTls, urls: F, every: Duration) -> Recorder
    where
        F: Fn() -> Vec<String> + Send + 'static,
    {
        Recorder::start_at(Instant::now(), tls, urls, every)
    }

    /// [`Recorder::start`] with times measured from `started`.
    pub fn start_at<F>(started: Instant, tls: EtcdTls, urls: F, every: Duration) -> Recorder
    where
        F: Fn() -> Vec<String> + Send + 'static,
    {
        // An identity that does not load records nothing, as an unreachable cluster would.
        let tls = Arc::new(Mutex::new(tls.client_config().ok()));
        Recorder::following(started, tls, urls, every, Duration::from_secs(2))
    }

    /// [`Recorder::start_at`] with TLS settings that may be swapped while it records (a CA
    /// rotation's client of both CAs): clients made with the settings it replaces are dropped;
    /// none, nothing is recorded. A member that does not answer within `patience` is passed
    /// over for the next (a member whose machine is gone holds a poll that long).
    pub fn following<F>(
        started: Instant,
        tls: Arc<Mutex<Option<Arc<rustls::ClientConfig>>>>,
        urls: F,
        every: Duration,
        patience: Duration,
    ) -> Recorder
    where
        F: Fn() -> Vec<String> + Send + 'static,
    {
        let history = Arc::new(Mutex::new(History::default()));
        let shared = history.clone();
        let task = tokio::spawn(async move {
            // Kept between polls (a new TLS connection every 25 ms would load the machine);
            // dropped when a read through it fails.
            let mut clients: BTreeMap<String, MemberClient> = BTreeMap::new();
            let current = || tls.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let mut config = current();
            loop {
                let now = current();
                let same = match (&now, &config) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (a, b) => a.is_none() && b.is_none(),
                };
                if !same {
                    clients.clear();
                    config = now;
                }
                let Some(config) = config.clone() else {
                    tokio::time::sleep(every).await;
                    continue;
                };
                for url in urls() {
                    // No traffic to a lab's subnet once its bridge is gone.
                    if etcdadm_sim_machines::network::guard(&url).is_err() {
                        clients.remove(&url);
                        continue;
                    }
                    if !clients.contains_key(&url) {
                        let Ok(client) = MemberClient::with_config(&url, config.clone(), patience) else {
                            continue;
                        };
                        clients.insert(url.clone(), client);
                    }
                    let Some(client) = clients.get(&url) else { continue };
                    // Stamped before the read: what it lists existed at this time or later.
                    let at = started.elapsed();
                    match client.member_list().await {
                        Ok(members) => {
                            let snapshot = Snapshot::of(at, &members);
                            let mut history = shared.lock().unwrap_or_else(PoisonError::into_inner);
                            if history.last().map(|s| &s.members) != Some(&snapshot.members) {
                                history.snapshots.push(snapshot);
                            }
                            break;
                        }
                        Err(_) => {
                            clients.remove(&url);
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        Recorder { history, task }
    }

    /// What was recorded so far.
    pub fn snapshot(&self) -> History {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stop and return what was recorded.
    pub fn finish(self) -> History {
        self.task.abort();
        self.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(ids: &[(u64, bool)]) -> Snapshot {
        Snapshot {
            at: Duration::ZERO,
            members: ids
                .iter()
                .map(|&(id, started)| (id, String::new(), started, false))
                .collect(),
        }
    }

    #[test]
    fn two_joins_in_flight_are_counted() {
        let history = History {
            snapshots: vec![snap(&[(1, true)]), snap(&[(1, true), (2, false), (3, false)])],
        };
        assert_eq!(history.max_pending_joins(), 2);
        assert_eq!(history.max_changes_per_step(), 2);
        assert_eq!(history.max_size(), 3);
    }

    #[test]
    fn a_failed_join_must_be_undone_before_any_other_change() {
        let good = History {
            snapshots: vec![
                snap(&[(1, true), (2, true)]),
                snap(&[(1, true), (2, true), (9, false)]),
                snap(&[(1, true), (2, true)]),
                snap(&[(1, true), (2, true), (3, false)]),
                snap(&[(1, true), (2, true), (3, true)]),
            ],
        };
        assert_eq!(good.failed_joins(), BTreeSet::from([9]));
        assert!(good.changes_while_a_failed_join_was_pending().is_empty());
        let bad = History {
            snapshots: vec![
                snap(&[(1, true), (2, true), (9, false)]),
                snap(&[(1, true), (9, false)]),
                snap(&[(1, true)]),
            ],
        };
        assert_eq!(bad.changes_while_a_failed_join_was_pending().len(), 1);
    }

    fn named(at: u64, members: &[(u64, &str)]) -> Snapshot {
        Snapshot {
            at: Duration::from_secs(at),
            members: members
                .iter()
                .map(|&(id, name)| (id, name.to_string(), true, false))
                .collect(),
        }
    }

    #[test]
    fn a_machine_outliving_its_member_and_a_re_added_name_are_caught() {
        let history = History {
            snapshots: vec![
                named(1, &[(1, "a"), (2, "b")]),
                named(3, &[(1, "a")]),
                named(5, &[(1, "a"), (3, "b")]),
            ],
        };
        assert_eq!(history.left_at("b"), Some(Duration::from_secs(3)));
        assert_eq!(history.left_at("a"), None);
        assert_eq!(history.names_with_several_ids().len(), 1);
        assert_eq!(
            history.max_size_between(Duration::from_secs(2), Duration::from_secs(4)),
            2
        );
        let life = |gone| MachineLife {
            gone: Some(Duration::from_secs(gone)),
            ..Default::default()
        };
        let mut machines = MachineLog::default();
        machines.lives.insert("b".into(), life(6));
        assert!(history.machines_outliving_members(&machines).is_empty());
        // Gone at 2 s while a read started at 5 s still lists a member named b.
        machines.lives.insert("b".into(), life(2));
        assert_eq!(history.machines_outliving_members(&machines).len(), 1);
        machines.lives.insert("never-joined".into(), life(2));
        assert_eq!(history.machines_outliving_members(&machines).len(), 1);
        // Seen last at 1 s, gone at 2 s: fine even if the next read came late.
        machines.lives.insert("a".into(), life(2));
        let history = History {
            snapshots: vec![named(1, &[(1, "a")]), named(3, &[])],
        };
        assert!(history.machines_outliving_members(&machines).is_empty());
    }

    fn with_learners(members: &[(u64, bool, bool)]) -> Snapshot {
        Snapshot {
            at: Duration::ZERO,
            members: members
                .iter()
                .map(|&(id, started, learner)| (id, String::new(), started, learner))
                .collect(),
        }
    }

    #[test]
    fn a_promotion_is_a_change_and_learner_joins_are_told_from_voter_adds() {
        let history = History {
            snapshots: vec![
                with_learners(&[(1, true, false)]),
                with_learners(&[(1, true, false), (2, false, true)]),
                with_learners(&[(1, true, false), (2, true, true)]),
                with_learners(&[(1, true, false), (2, true, false)]),
                with_learners(&[(1, true, false), (2, true, false), (3, false, false)]),
            ],
        };
        assert_eq!(history.max_changes_per_step(), 1);
        assert_eq!(history.max_learners(), 1);
        assert_eq!(history.joins(), vec![(2, true, true), (3, false, true)]);
        // A promotion and an add seen in one step are two changes; two learners are counted.
        let history = History {
            snapshots: vec![
                with_learners(&[(1, true, false), (2, true, true)]),
                with_learners(&[(1, true, false), (2, true, false), (3, false, true)]),
                with_learners(&[(1, true, false), (2, true, true), (3, false, true)]),
            ],
        };
        assert_eq!(history.max_changes_per_step(), 2);
        assert_eq!(history.max_learners(), 2);
    }

    #[test]
    fn serialized_joins_stay_at_one() {
        let history = History {
            snapshots: vec![
                snap(&[(1, true)]),
                snap(&[(1, true), (2, false)]),
                snap(&[(1, true), (2, true)]),
                snap(&[(1, true), (2, true), (3, false)]),
            ],
        };
        assert_eq!(history.max_pending_joins(), 1);
        assert_eq!(history.max_changes_per_step(), 1);
    }
}
