//! Continuous backup's delta objects (issue 47, docs/day2.md "Continuous backup"): the writes
//! etcd made after a full snapshot, as its watch delivered them, in numbered objects beside the
//! snapshot, each carrying its revision range and a SHA-256 of itself so a restore can tell a
//! gap, a swap or a flipped bit from a complete chain. Encoding and decoding only: pure, and
//! bounded by the bytes given (nothing is allocated beyond them, nothing panics on them).
//!
//! An object is `MAGIC`, a header (the full snapshot's revision, the first and last revision
//! held, the number of events), the events in revision order (each: kind, revision, the
//! milliseconds since the Unix epoch when the watch delivered it, lease, key, value), then the
//! SHA-256 of everything before it. Integers are big-endian.

use sha2::{Digest, Sha256};

pub mod apply;
pub mod chain;
pub mod listing;
pub mod record;
pub mod replay;

/// What every delta object starts with (format version 1).
pub const MAGIC: &[u8; 14] = b"etcdadm-delta1";

/// The folder of a full snapshot's deltas: beside its object, `<key>.deltas/`.
pub fn prefix(snapshot_key: &str) -> String {
    format!("{snapshot_key}.deltas/")
}

/// A write etcd made: a key put (with its value) or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put,
    Delete,
}

/// One event of etcd's watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// The revision of the write (several events share one when a transaction made them).
    pub revision: i64,
    /// When the watch delivered it, milliseconds since the Unix epoch: what a restore to a
    /// point in time compares with.
    pub received_ms: i64,
    /// The lease the key was put with (0: none).
    pub lease: i64,
    pub key: Vec<u8>,
    /// Empty for a delete.
    pub value: Vec<u8>,
}

impl Event {
    /// Bytes this event takes in an object.
    pub fn encoded_len(&self) -> usize {
        1 + 8 + 8 + 8 + 4 + self.key.len() + 4 + self.value.len()
    }
}

/// A delta object's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    /// The revision of the full snapshot it follows.
    pub base: i64,
    pub first: i64,
    pub last: i64,
    pub events: Vec<Event>,
}

/// Why bytes are not a delta object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    #[error(
        "not a delta object (it does not start with {:?})",
        String::from_utf8_lossy(MAGIC)
    )]
    NotADelta,
    #[error("truncated: {0}")]
    Truncated(&'static str),
    #[error("its SHA-256 does not match its content (altered or damaged)")]
    Checksum,
    #[error("{0}")]
    Inconsistent(String),
}

/// The events of one or more revisions, as an object: `events` must be in revision order,
/// contiguous (each revision the previous or the next) and after `base`.
pub fn encode(base: i64, events: &[Event]) -> Result<Vec<u8>, DeltaError> {
    let (first, last) = match (events.first(), events.last()) {
        (Some(first), Some(last)) => (first.revision, last.revision),
        _ => {
            return Err(DeltaError::Inconsistent(
                "a delta holds at least one event".into(),
            ));
        }
    };
    check_order(base, first, last, events)?;
    let count =
        u32::try_from(events.len()).map_err(|_| DeltaError::Inconsistent("too many events".into()))?;
    let size = MAGIC.len() + 8 * 3 + 4 + events.iter().map(Event::encoded_len).sum::<usize>() + 32;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    for n in [base, first, last] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    out.extend_from_slice(&count.to_be_bytes());
    for e in events {
        out.push(match e.kind {
            Kind::Put => 0,
            Kind::Delete => 1,
        });
        for n in [e.revision, e.received_ms, e.lease] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        for bytes in [&e.key, &e.value] {
            let len = u32::try_from(bytes.len())
                .map_err(|_| DeltaError::Inconsistent("a key or value over 4 GiB".into()))?;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(bytes);
        }
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    Ok(out)
}

/// The delta in `bytes`, checked: its SHA-256, its header against its events, and its events'
/// order (contiguous revisions after the base).
pub fn decode(bytes: &[u8]) -> Result<Delta, DeltaError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(DeltaError::NotADelta);
    }
    let Some(body_len) = bytes.len().checked_sub(32) else {
        return Err(DeltaError::Truncated("no checksum"));
    };
    let (body, sum) = bytes.split_at(body_len);
    if Sha256::digest(body).as_slice() != sum {
        return Err(DeltaError::Checksum);
    }
    let mut r = Reader(&body[MAGIC.len()..]);
    let (base, first, last) = (r.i64()?, r.i64()?, r.i64()?);
    let count = r.u32()?;
    // Each event takes at least 33 bytes: a count beyond what is left is a lie, not a reason to
    // reserve memory for it.
    if usize::try_from(count).unwrap_or(usize::MAX) > r.0.len() / 33 {
        return Err(DeltaError::Truncated("fewer events than its header counts"));
    }
    let mut events = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    for _ in 0..count {
        let kind = match r.u8()? {
            0 => Kind::Put,
            1 => Kind::Delete,
            other => return Err(DeltaError::Inconsistent(format!("unknown event kind {other}"))),
        };
        let (revision, received_ms, lease) = (r.i64()?, r.i64()?, r.i64()?);
        let key = r.bytes()?.to_vec();
        let value = r.bytes()?.to_vec();
        events.push(Event {
            kind,
            revision,
            received_ms,
            lease,
            key,
            value,
        });
    }
    if !r.0.is_empty() {
        return Err(DeltaError::Inconsistent("bytes after its last event".into()));
    }
    let held = (
        events.first().map(|e| e.revision),
        events.last().map(|e| e.revision),
    );
    if held != (Some(first), Some(last)) {
        return Err(DeltaError::Inconsistent(format!(
            "its header says revisions {first} to {last}, its events hold {held:?}"
        )));
    }
    check_order(base, first, last, &events)?;
    Ok(Delta {
        base,
        first,
        last,
        events,
    })
}

/// Events in revision order, each the revision before's or the next, all after `base`.
fn check_order(base: i64, first: i64, last: i64, events: &[Event]) -> Result<(), DeltaError> {
    if first <= base || last < first {
        return Err(DeltaError::Inconsistent(format!(
            "revisions {first} to {last} do not follow the full snapshot's {base}"
        )));
    }
    for pair in events.windows(2) {
        let (a, b) = (pair[0].revision, pair[1].revision);
        if b != a && b != a.saturating_add(1) {
            return Err(DeltaError::Inconsistent(format!(
                "revision {b} follows {a}: the events between are missing"
            )));
        }
    }
    Ok(())
}

/// Reads big-endian integers and length-prefixed bytes off a slice, never past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DeltaError> {
        if self.0.len() < n {
            return Err(DeltaError::Truncated("an event ends past the object's end"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DeltaError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, DeltaError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(b))
    }

    fn i64(&mut self) -> Result<i64, DeltaError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(i64::from_be_bytes(b))
    }

    fn bytes(&mut self) -> Result<&'a [u8], DeltaError> {
        let len = self.u32()?;
        self.take(usize::try_from(len).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests;
