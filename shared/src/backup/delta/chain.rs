//! Which delta objects a restore applies, decided from their names alone before anything is
//! downloaded: the chain after a full snapshot must be whole (numbered without a repeat, each
//! starting at the revision after the previous one's last) up to the point restored, or the
//! restore stops saying what is missing; nothing is restored partially. The names themselves
//! come from the store's listing (`listing.rs`).

use super::prefix;

/// A delta object as its key names it: `<snapshot key>.deltas/<seq>-<first>-<last>-<first ms>-<last ms>`,
/// numbers zero-padded so that a listing sorts in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeltaName {
    /// Its place after the full snapshot, from 1.
    pub seq: u32,
    pub first: i64,
    pub last: i64,
    /// When the watch delivered its first and last event (ms since the Unix epoch).
    pub first_ms: i64,
    pub last_ms: i64,
}

impl DeltaName {
    /// Its key beside the full snapshot `snapshot_key`.
    pub fn key(&self, snapshot_key: &str) -> String {
        format!(
            "{}{:08}-{:019}-{:019}-{:013}-{:013}",
            prefix(snapshot_key),
            self.seq,
            self.first,
            self.last,
            self.first_ms,
            self.last_ms
        )
    }

    /// The name in `key`, if it is one of `snapshot_key`'s deltas.
    pub fn parse(snapshot_key: &str, key: &str) -> Option<DeltaName> {
        let rest = key.strip_prefix(&prefix(snapshot_key))?;
        let mut parts = rest.split('-');
        let seq = parts.next()?.parse().ok()?;
        let mut number = || parts.next()?.parse::<i64>().ok();
        let name = DeltaName {
            seq,
            first: number()?,
            last: number()?,
            first_ms: number()?,
            last_ms: number()?,
        };
        (parts.next().is_none() && name.first <= name.last).then_some(name)
    }
}

/// The point a restore goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every write the deltas hold.
    Latest,
    /// Every write up to and including this revision.
    Revision(i64),
    /// Every write the watch delivered at or before this time (ms since the Unix epoch).
    Time(i64),
}

/// The deltas to download and apply, in order, and which of their events count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub deltas: Vec<DeltaName>,
    pub target: Target,
}

impl Chain {
    /// Whether an event at `revision`, delivered at `received_ms`, is restored.
    pub fn includes(&self, revision: i64, received_ms: i64) -> bool {
        match self.target {
            Target::Latest => true,
            Target::Revision(r) => revision <= r,
            Target::Time(t) => received_ms <= t,
        }
    }
}

/// Why the deltas cannot bring a restore to its point.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("revision {wanted} is before the full snapshot's revision {base}: restore an older snapshot")]
    BeforeSnapshot { wanted: i64, base: i64 },
    #[error("two delta objects are numbered {0}")]
    Repeated(u32),
    #[error("delta {seq} starts at revision {first}, not at {expected}: the writes between are missing")]
    Gap { seq: u32, first: i64, expected: i64 },
    #[error("the deltas reach revision {reached}, short of the {wanted} asked for")]
    Short { wanted: i64, reached: i64 },
    #[error(
        "the deltas reach revision {reached}, short of the {recorded} recorded as uploaded: a delta object is missing"
    )]
    MissingTail { recorded: i64, reached: i64 },
}

/// The chain after a full snapshot at revision `base` that reaches `target`, from the delta
/// objects listed (any order) and the last revision recorded as uploaded (the snapshot's
/// status; objects past it are welcome, fewer are a loss).
pub fn plan(
    base: i64,
    listed: &[DeltaName],
    recorded: Option<i64>,
    target: Target,
) -> Result<Chain, ChainError> {
    if let Target::Revision(wanted) = target
        && wanted < base
    {
        return Err(ChainError::BeforeSnapshot { wanted, base });
    }
    let mut sorted = listed.to_vec();
    sorted.sort();
    let mut deltas: Vec<DeltaName> = vec![];
    let mut reached = base;
    // Whether a delta past the point was listed (so none before it can be missing at the end).
    let mut stopped = false;
    for name in sorted {
        if deltas.last().is_some_and(|d| d.seq == name.seq) {
            return Err(ChainError::Repeated(name.seq));
        }
        let done = match target {
            Target::Latest => false,
            Target::Revision(wanted) => reached >= wanted,
            Target::Time(t) => name.first_ms > t,
        };
        if done {
            stopped = true;
            break;
        }
        let expected = reached.saturating_add(1);
        if name.first != expected {
            return Err(ChainError::Gap {
                seq: name.seq,
                first: name.first,
                expected,
            });
        }
        reached = name.last;
        deltas.push(name);
    }
    // A time inside the last delta taken needs nothing after it.
    let inside = matches!(target, Target::Time(t) if deltas.last().is_some_and(|d| d.last_ms > t));
    match target {
        Target::Revision(wanted) if reached < wanted => Err(ChainError::Short { wanted, reached }),
        // A point past every delta listed is as far as the uploads were recorded to go.
        Target::Latest | Target::Time(_) if !stopped && !inside && recorded.is_some_and(|r| reached < r) => {
            Err(ChainError::MissingTail {
                recorded: recorded.unwrap_or(reached),
                reached,
            })
        }
        _ => Ok(Chain { deltas, target }),
    }
}
