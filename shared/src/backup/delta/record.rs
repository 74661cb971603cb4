//! Continuous backup's recorder: etcd's watch of every key from the revision after a full
//! snapshot, its events sealed into a delta object every interval (sooner past a size bound,
//! always between two watch answers, so never inside a revision) and uploaded in order. It
//! resumes after the last delta uploaded; a watch that falls behind a compaction ends it and
//! says so, so the caller takes a new full snapshot instead of leaving a gap. A watch that
//! breaks (its member lost) uploads what it received first: a recovery then has every write
//! the watch saw, not only those of the last interval's end.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{EventType, WatchOptions};

use super::chain::DeltaName;
use super::{DeltaError, Event, Kind, encode};
use crate::store::{StoreClient, StoreError};

/// Events held before a delta is sealed whatever the interval: bounds the recorder's memory
/// per cluster (plus one watch answer, at most the client's 4 MiB message limit).
pub const MAX_DELTA_BYTES: usize = 8 << 20;

/// How the recorder paces its uploads.
#[derive(Clone, Copy, Debug)]
pub struct RecordLimits {
    /// A delta at most this often (`spec.backup.continuous.interval`).
    pub interval: Duration,
    /// A delta as soon as this many bytes of events are held.
    pub max_bytes: usize,
}

/// Why the recorder stopped, and the last revision uploaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Asked to: every event received was uploaded.
    Stopped { reached: i64 },
    /// The revisions after `reached` were compacted away before the watch read them: only a
    /// new full snapshot covers them.
    Compacted { reached: i64, compact_revision: i64 },
}

/// Why the recorder failed; it resumes from the last delta uploaded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("watch: {0}")]
    Watch(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Delta(#[from] DeltaError),
}

/// Where a cluster's deltas go: beside the full snapshot `snapshot_key`, at revision `base`.
pub struct Recorder<'a> {
    pub store: &'a StoreClient,
    pub snapshot_key: &'a str,
    pub base: i64,
    pub limits: RecordLimits,
}

/// Events not yet uploaded.
struct Pending {
    events: Vec<Event>,
    bytes: usize,
}

impl Recorder<'_> {
    /// Watch through `client` from the revision after `after` (the last delta uploaded; none:
    /// the full snapshot) and upload deltas until `stop` resolves, telling `uploaded` each one.
    pub async fn run(
        &self,
        client: &mut etcd_client::Client,
        after: Option<DeltaName>,
        uploaded: &mut (dyn FnMut(DeltaName) + Send),
        stop: impl Future<Output = ()>,
    ) -> Result<Ended, RecordError> {
        let mut last = after;
        let start = after.map_or(self.base, |d| d.last).saturating_add(1);
        let options = WatchOptions::new().with_all_keys().with_start_revision(start);
        let mut watch = client
            .watch(vec![0u8], Some(options))
            .await
            .map_err(|e| RecordError::Watch(e.to_string()))?;
        let mut pending = Pending {
            events: vec![],
            bytes: 0,
        };
        let mut tick = tokio::time::interval(self.limits.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => {
                    self.seal(&mut pending, &mut last, uploaded).await?;
                    return Ok(Ended::Stopped { reached: reached(self.base, last) });
                }
                _ = tick.tick() => self.seal(&mut pending, &mut last, uploaded).await?,
                answer = watch.message() => {
                    let answer = match answer {
                        Ok(Some(answer)) => answer,
                        // The member went away (lost, as in a quorum loss, or restarted): what
                        // it delivered is kept before the recorder says so.
                        lost => {
                            self.seal(&mut pending, &mut last, uploaded).await?;
                            return Err(RecordError::Watch(match lost {
                                Err(e) => e.to_string(),
                                Ok(_) => "the member closed the watch".into(),
                            }));
                        }
                    };
                    let received_ms = now_ms();
                    for e in answer.events() {
                        let Some(kv) = e.kv() else { continue };
                        let event = Event {
                            kind: match e.event_type() {
                                EventType::Put => Kind::Put,
                                EventType::Delete => Kind::Delete,
                            },
                            revision: kv.mod_revision(),
                            received_ms,
                            lease: kv.lease(),
                            key: kv.key().to_vec(),
                            value: kv.value().to_vec(),
                        };
                        pending.bytes += event.encoded_len();
                        pending.events.push(event);
                    }
                    if answer.compact_revision() > 0 {
                        self.seal(&mut pending, &mut last, uploaded).await?;
                        return Ok(Ended::Compacted {
                            reached: reached(self.base, last),
                            compact_revision: answer.compact_revision(),
                        });
                    }
                    if answer.canceled() {
                        return Err(RecordError::Watch(format!("canceled: {}", answer.cancel_reason())));
                    }
                    if pending.bytes >= self.limits.max_bytes {
                        self.seal(&mut pending, &mut last, uploaded).await?;
                    }
                }
            }
        }
    }

    /// Upload what is pending as the next delta (nothing when nothing is).
    async fn seal(
        &self,
        pending: &mut Pending,
        last: &mut Option<DeltaName>,
        uploaded: &mut (dyn FnMut(DeltaName) + Send),
    ) -> Result<(), RecordError> {
        let (Some(first), Some(end)) = (pending.events.first(), pending.events.last()) else {
            return Ok(());
        };
        let name = DeltaName {
            seq: last.map_or(1, |d| d.seq.saturating_add(1)),
            first: first.revision,
            last: end.revision,
            first_ms: first.received_ms,
            last_ms: end.received_ms,
        };
        let bytes = encode(self.base, &pending.events)?;
        self.store.put_object(&name.key(self.snapshot_key), bytes).await?;
        pending.events.clear();
        pending.bytes = 0;
        *last = Some(name);
        uploaded(name);
        Ok(())
    }
}

fn reached(base: i64, last: Option<DeltaName>) -> i64 {
    last.map_or(base, |d| d.last)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
