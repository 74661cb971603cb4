//! Membership history recorded from etcd itself, so scenarios can assert the safety rules on what
//! really happened rather than on what a controller says it did.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcdadm_shared::etcd::{EtcdTls, Member, MemberClient};

/// Membership at one moment: members by ID, with whether each had started.
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

    /// Rule 1: between consecutive observations, at most one member was added or removed. (The
    /// recorder polls fast enough that two changes in one interval mean two were in flight.)
    pub fn max_changes_per_step(&self) -> usize {
        self.snapshots
            .windows(2)
            .map(|w| w[0].ids().symmetric_difference(&w[1].ids()).count())
            .max()
            .unwrap_or_default()
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
}

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
        let history = Arc::new(Mutex::new(History::default()));
        let shared = history.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                for url in urls() {
                    let Ok(client) = MemberClient::new(&url, &tls, Duration::from_secs(2)) else {
                        continue;
                    };
                    if let Ok(members) = client.member_list().await {
                        let snapshot = Snapshot::of(started.elapsed(), &members);
                        let mut history = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        if history.last().map(|s| &s.members) != Some(&snapshot.members) {
                            history.snapshots.push(snapshot);
                        }
                        break;
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        Recorder { history, task }
    }

    /// Stop and return what was recorded.
    pub fn finish(self) -> History {
        self.task.abort();
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
