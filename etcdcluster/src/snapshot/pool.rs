//! The snapshot slots every cluster shares, fair between namespaces: a namespace holds at most
//! half of them (rounded up) at once, and a slot that frees goes to the waiting namespace that
//! holds the fewest, the one waiting longest first. A tenant whose snapshots (or restore
//! checksums) take as long as their deadlines allow so keeps the others' at most half waiting.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A namespace that asked for a slot in vain counts as waiting for this long after it asked
/// (its reconcile asks again every few seconds while it waits).
pub const WAIT_MEMORY: Duration = Duration::from_secs(15);

/// The slots, and who holds and waits for them.
pub struct SnapshotPool {
    total: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Slots held, by namespace.
    held: BTreeMap<String, usize>,
    /// Namespaces that asked in vain: when they first asked, when they last did.
    waiting: BTreeMap<String, (Instant, Instant)>,
}

/// Why no slot was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Every slot is taken.
    AllTaken { total: usize },
    /// This namespace holds its share already.
    ShareTaken { held: usize, total: usize },
    /// A free slot is kept for a namespace that has waited with fewer.
    OthersFirst { total: usize },
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Busy::AllTaken { total } => write!(
                f,
                "all {total} snapshot slots of the controller are taken; it is taken when one frees"
            ),
            Busy::ShareTaken { held, total } => write!(
                f,
                "this namespace holds {held} of the controller's {total} snapshot slots, its share; \
                 it is taken when one of its own frees"
            ),
            Busy::OthersFirst { total } => write!(
                f,
                "the free one of the controller's {total} snapshot slots goes to a namespace that \
                 has waited longer with fewer; it is taken next"
            ),
        }
    }
}

/// One slot, held until dropped.
pub struct Slot {
    pool: Arc<SnapshotPool>,
    namespace: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut state) = self.pool.state.lock()
            && let Some(held) = state.held.get_mut(&self.namespace)
        {
            *held = held.saturating_sub(1);
            if *held == 0 {
                state.held.remove(&self.namespace);
            }
        }
    }
}

impl SnapshotPool {
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(SnapshotPool {
            total: total.max(1),
            state: Mutex::default(),
        })
    }

    /// How many slots there are.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The most one namespace holds at once: half, rounded up.
    pub fn share(&self) -> usize {
        self.total.div_ceil(2)
    }

    /// A slot for a snapshot (or a checksum) of `namespace`, or why there is none now.
    pub fn try_take(self: &Arc<Self>, namespace: &str) -> Result<Slot, Busy> {
        self.try_take_at(namespace, Instant::now())
    }

    fn try_take_at(self: &Arc<Self>, namespace: &str, now: Instant) -> Result<Slot, Busy> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| Busy::AllTaken { total: self.total })?;
        state.decide(namespace, now, self.total, self.share())?;
        Ok(Slot {
            pool: self.clone(),
            namespace: namespace.to_string(),
        })
    }
}

impl State {
    /// Give `namespace` a slot (counted), or say why not (remembered as waiting).
    fn decide(&mut self, namespace: &str, now: Instant, total: usize, share: usize) -> Result<(), Busy> {
        self.waiting
            .retain(|_, (_, last)| now.saturating_duration_since(*last) < WAIT_MEMORY);
        let held_by = |held: &BTreeMap<String, usize>, ns: &str| held.get(ns).copied().unwrap_or(0);
        let mine = held_by(&self.held, namespace);
        if mine >= share {
            return Err(Busy::ShareTaken { held: mine, total });
        }
        let since = self.waiting.get(namespace).map_or(now, |(first, _)| *first);
        let wait = |state: &mut State, busy: Busy| {
            state.waiting.insert(namespace.to_string(), (since, now));
            Err(busy)
        };
        let free = total.saturating_sub(self.held.values().sum());
        if free == 0 {
            return wait(self, Busy::AllTaken { total });
        }
        // Namespaces that waited and come before this one: fewer slots, or as many and longer.
        let ahead = self
            .waiting
            .iter()
            .filter(|(ns, _)| ns.as_str() != namespace)
            .filter(|(ns, (first, _))| {
                let theirs = held_by(&self.held, ns);
                theirs < share && (theirs, *first) < (mine, since)
            })
            .count();
        if ahead >= free {
            return wait(self, Busy::OthersFirst { total });
        }
        self.waiting.remove(namespace);
        *self.held.entry(namespace.to_string()).or_default() += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_namespace_holds_at_most_half_the_slots_rounded_up() {
        for (total, share) in [(1, 1), (2, 1), (3, 2), (4, 2), (16, 8)] {
            let pool = SnapshotPool::new(total);
            assert_eq!(pool.share(), share, "{total}");
            let held: Vec<Slot> = (0..share).map(|_| pool.try_take("a").unwrap()).collect();
            assert_eq!(
                pool.try_take("a").err(),
                Some(Busy::ShareTaken { held: share, total }),
                "{total}"
            );
            if total > share {
                assert!(pool.try_take("b").is_ok(), "{total}: another namespace gets one");
            }
            drop(held);
            assert!(pool.try_take("a").is_ok(), "{total}: its own freed");
        }
    }

    #[test]
    fn a_freed_slot_goes_to_the_namespace_waiting_with_fewest_the_longest_waiting_first() {
        let pool = SnapshotPool::new(4);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let a1 = pool.try_take_at("a", at(0)).unwrap();
        let _a2 = pool.try_take_at("a", at(0)).unwrap();
        let b1 = pool.try_take_at("b", at(0)).unwrap();
        let _c1 = pool.try_take_at("c", at(0)).unwrap();
        // All four taken: d waits, then b asks for a second.
        assert_eq!(
            pool.try_take_at("d", at(1)).err(),
            Some(Busy::AllTaken { total: 4 })
        );
        assert_eq!(
            pool.try_take_at("b", at(2)).err(),
            Some(Busy::AllTaken { total: 4 })
        );
        drop(a1);
        // b holds one, d none: the free slot is d's.
        assert_eq!(
            pool.try_take_at("b", at(3)).err(),
            Some(Busy::OthersFirst { total: 4 })
        );
        assert_eq!(
            pool.try_take_at("a", at(3)).err(),
            Some(Busy::OthersFirst { total: 4 })
        );
        let _d1 = pool.try_take_at("d", at(4)).unwrap();
        drop(b1);
        // b (holding none now, waiting since 2) before a (one held).
        assert_eq!(
            pool.try_take_at("a", at(5)).err(),
            Some(Busy::OthersFirst { total: 4 })
        );
        let _b2 = pool.try_take_at("b", at(5)).unwrap();
    }

    #[test]
    fn a_namespace_that_stopped_asking_no_longer_keeps_a_slot_free() {
        let pool = SnapshotPool::new(2);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let a1 = pool.try_take_at("a", at(0)).unwrap();
        let _b1 = pool.try_take_at("b", at(0)).unwrap();
        assert_eq!(
            pool.try_take_at("c", at(1)).err(),
            Some(Busy::AllTaken { total: 2 })
        );
        drop(a1);
        assert_eq!(
            pool.try_take_at("d", at(2)).err(),
            Some(Busy::OthersFirst { total: 2 })
        );
        // c never came back; d waited since 2, and by 17 c is forgotten.
        assert!(pool.try_take_at("d", at(17)).is_ok());
    }

    #[test]
    fn busy_says_why() {
        assert!(
            Busy::AllTaken { total: 2 }
                .to_string()
                .contains("all 2 snapshot slots")
        );
        assert!(
            Busy::ShareTaken { held: 1, total: 2 }
                .to_string()
                .contains("holds 1 of the controller's 2")
        );
        assert!(
            Busy::OthersFirst { total: 2 }
                .to_string()
                .contains("waited longer")
        );
    }
}
