//! One etcd member's snapshot streamed into an object store as it arrives: etcd's messages go
//! into a multipart upload as they are, and past the checksum trailer, and the upload is
//! completed only once etcd's SHA-256 matched, aborted otherwise: the key holds a verified
//! snapshot or nothing. The object is what `etcdctl snapshot save` writes (the database, then
//! etcd's 32-byte SHA-256 of it), so `snapshot restore` and `etcdadm init --snapshot` take it
//! and check it again.
//!
//! Once complete, the object's SHA-256 is recorded in its metadata (a copy onto itself: S3
//! fixes metadata when an upload starts, before the stream's hash is known), so a restore that
//! names only the store and key can check what it downloads.
//!
//! The revision: etcd's snapshot answer carries none, so the member's own revision is read (a
//! serializable read, which needs no quorum) before asking for the snapshot and again once its
//! first message arrived, when the snapshot's read transaction is already open. The snapshot
//! holds a revision between the two; when they differ, the lower one is reported (every write up
//! to it is in the snapshot) and marked inexact.

pub mod checksum;
pub mod delta;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tracing::warn;

pub use self::checksum::{CHECKSUM_LEN, ChecksumError, ChecksumTrailer, Verified, hex};
use crate::etcd::{EtcdError, MemberClient};
use crate::store::{MultipartWriter, StoreClient, StoreError};

/// What was stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSnapshot {
    /// Bytes of the object: the database and etcd's 32-byte checksum.
    pub size: u64,
    /// SHA-256 of the object, hex (what `sha256sum` of the downloaded file prints).
    pub sha256: String,
    /// SHA-256 of the database alone, hex (etcd's own, the object's last 32 bytes).
    pub database_sha256: String,
    /// Every write up to this revision is in the snapshot.
    pub revision: i64,
    /// The snapshot holds exactly `revision` (no write landed while it began).
    pub revision_exact: bool,
    /// `sha256` is in the object's metadata too (`x-amz-meta-etcdadm-sha256`), so a restore
    /// from the store and key alone checks it; false when the store refused to record it, or
    /// the object is over S3's 5 GiB single-copy limit.
    pub sha256_in_metadata: bool,
}

/// Why a snapshot was not stored; the upload was aborted.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Member(#[from] EtcdError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Checksum(#[from] ChecksumError),
}

impl SnapshotError {
    /// A stable CamelCase cause for Events, conditions and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            SnapshotError::Member(EtcdError::Unreachable { .. } | EtcdError::Timeout { .. }) => {
                "MemberUnreachable"
            }
            SnapshotError::Member(EtcdError::Tls { .. }) => "MemberTLSError",
            SnapshotError::Member(EtcdError::Refused { .. }) => "MemberRefused",
            SnapshotError::Member(e) => e.category().as_str(),
            SnapshotError::Store(e) => e.category().as_str(),
            SnapshotError::Checksum(ChecksumError::Mismatch { .. }) => "HashMismatch",
            SnapshotError::Checksum(_) => "SnapshotTruncated",
        }
    }
}

/// How long a snapshot may take, whatever the member does: each message within `idle`, and
/// the whole stream into the store within `base` plus the size the member announced at
/// `min_rate` bytes per second. The announced size counts up to the largest quota etcd is run
/// with (32 GiB), so a member that announces more, or trickles a message every `idle`, holds a
/// snapshot slot for at most `base` + 32 GiB at `min_rate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    pub idle: Duration,
    pub base: Duration,
    pub min_rate: u64,
}

/// The slowest snapshot accepted: 4 MiB/s, some 20 times below what etcd and a store on one
/// machine manage (BENCHMARKS.md, "Snapshots"): an 8 GiB database gets 35 min, 32 GiB 2 h 17 min.
pub const MIN_SNAPSHOT_RATE: u64 = 4 << 20;

/// The time every snapshot gets besides its size's.
pub const SNAPSHOT_BASE_TIME: Duration = Duration::from_secs(60);

impl StreamLimits {
    /// Messages within `idle`, the default base and rate.
    pub fn with_idle(idle: Duration) -> Self {
        StreamLimits {
            idle,
            base: SNAPSHOT_BASE_TIME,
            min_rate: MIN_SNAPSHOT_RATE,
        }
    }

    /// The whole stream's deadline for a database of `announced` bytes.
    pub fn total(&self, announced: u64) -> Duration {
        let size = announced.min(*crate::api::config::QUOTA_BACKEND_BYTES_RANGE.end());
        self.base + Duration::from_secs(size / self.min_rate.max(1))
    }
}

/// Stream `member`'s snapshot into the multipart upload `upload_id` of `key` (already created,
/// so a caller can record it before any data moves) and complete it once etcd's checksum
/// matched; on any failure the upload is aborted. Each etcd message must arrive within
/// `limits.idle`, and the whole stream within `limits.total` of the size the member announced.
pub async fn stream_to_store(
    member: &MemberClient,
    store: &StoreClient,
    key: &str,
    upload_id: &str,
    limits: StreamLimits,
) -> Result<StoredSnapshot, SnapshotError> {
    let mut writer = MultipartWriter::new(store, key, upload_id);
    match fill(member, &mut writer, limits).await {
        Ok((verified, object_sha256, revision, revision_exact)) => {
            let size = match writer.complete().await {
                Ok(size) => size,
                Err(e) => {
                    abort(store, key, upload_id).await;
                    return Err(e.into());
                }
            };
            let sha256 = hex(&object_sha256);
            let sha256_in_metadata = match store.record_sha256(key, size, &sha256).await {
                Ok(recorded) => recorded,
                Err(e) => {
                    warn!(key, error = %e, "the snapshot is stored; recording its SHA-256 in the object's metadata failed");
                    false
                }
            };
            Ok(StoredSnapshot {
                size,
                sha256,
                database_sha256: hex(&verified.sha256),
                revision,
                revision_exact,
                sha256_in_metadata,
            })
        }
        Err(e) => {
            if let Err(abort) = writer.abort().await {
                warn_unaborted(key, upload_id, &abort);
            }
            Err(e)
        }
    }
}

/// How long a snapshot's first call waits out a member that does not answer: etcd restarting
/// (systemd's `Restart=on-failure`, a person's `systemctl restart`), about a second, or one too
/// busy to answer within the call's deadline (seen on two loaded cores).
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(15);

/// The member's revision, asked again every half second while it is unreachable or does not
/// answer in time, until [`FIRST_ANSWER_WAIT`] has passed (a call begun before then is the last).
async fn first_revision(member: &MemberClient) -> Result<i64, EtcdError> {
    let deadline = Instant::now() + FIRST_ANSWER_WAIT;
    loop {
        match member.local_revision().await {
            Err(EtcdError::Unreachable { .. } | EtcdError::Timeout { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            answer => return answer,
        }
    }
}

/// The verified database, the object's SHA-256, the revision and whether it is exact.
type Filled = (Verified, [u8; 32], i64, bool);

async fn fill(
    member: &MemberClient,
    writer: &mut MultipartWriter,
    limits: StreamLimits,
) -> Result<Filled, SnapshotError> {
    let before = first_revision(member).await?;
    let opened = tokio::time::Instant::now();
    let mut stream = member.snapshot(limits.idle).await?;
    let mut trailer = ChecksumTrailer::default();
    let mut object = Sha256::new();
    let mut after = None;
    // Until the first message says the size, the base time; then the size's.
    let mut allowed = limits.base;
    let mut received = 0u64;
    let overdue = |allowed: Duration| EtcdError::Timeout {
        endpoint: member.endpoint().to_string(),
        operation: "Snapshot",
        timeout: allowed,
    };
    loop {
        let next = tokio::time::timeout_at(opened + allowed, stream.next())
            .await
            .map_err(|_| overdue(allowed))??;
        let Some(piece) = next else { break };
        if after.is_none() {
            after = Some(member.local_revision().await?);
            allowed = limits.total(stream.database_size().unwrap_or(0));
        }
        received += piece.len() as u64;
        let announced = stream.database_size().unwrap_or(0);
        if received > announced.saturating_add(CHECKSUM_LEN as u64) {
            return Err(EtcdError::Protocol {
                endpoint: member.endpoint().to_string(),
                operation: "Snapshot",
                message: format!("sent more than the {announced} bytes it announced"),
            }
            .into());
        }
        trailer.push(&piece);
        object.update(&piece);
        tokio::time::timeout_at(opened + allowed, writer.write(&piece))
            .await
            .map_err(|_| overdue(allowed))??;
    }
    let verified = trailer.finish(stream.database_size())?;
    let (revision, exact) = match (stream.header_revision(), after) {
        (Some(revision), _) => (revision, true),
        (None, Some(after)) => (before, after == before),
        (None, None) => (before, false),
    };
    Ok((verified, object.finalize().into(), revision, exact))
}

async fn abort(store: &StoreClient, key: &str, upload_id: &str) {
    if let Err(e) = store.abort_multipart_upload(key, upload_id).await {
        warn_unaborted(key, upload_id, &e);
    }
}

fn warn_unaborted(key: &str, upload_id: &str, error: &StoreError) {
    warn!(key, upload_id, %error, "aborting the snapshot upload failed; its parts stay until the store expires them");
}
