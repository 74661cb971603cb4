//! A member's `Maintenance.Snapshot` stream, read a message at a time (memory stays one message
//! however big the database), and the member's own revision, which needs no quorum.
//!
//! etcd (3.4 to 3.6) leaves the snapshot's response header empty (etcd-io/etcd#9037), so the
//! revision a snapshot holds is bracketed by [`MemberClient::local_revision`] reads instead; see
//! `crate::backup`.

use std::time::Duration;

use etcd_client::GetOptions;

use super::client::MemberClient;
use super::error::{EtcdError, from_client_error};

/// The snapshot stream of one member: its database, then the database's SHA-256 (32 bytes).
pub struct SnapshotStream {
    stream: etcd_client::SnapshotStreaming,
    endpoint: String,
    idle: Duration,
    database_size: Option<u64>,
    header_revision: Option<i64>,
}

impl std::fmt::Debug for SnapshotStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStream")
            .field("endpoint", &self.endpoint)
            .field("database_size", &self.database_size)
            .finish_non_exhaustive()
    }
}

impl SnapshotStream {
    /// The next message's bytes; `None` once the member ended the stream. Fails when no message
    /// arrives within the idle timeout.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, EtcdError> {
        const OPERATION: &str = "Snapshot";
        let message = tokio::time::timeout(self.idle, self.stream.message())
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: self.endpoint.clone(),
                operation: OPERATION,
                timeout: self.idle,
            })?
            .map_err(|e| from_client_error(&self.endpoint, OPERATION, self.idle, e))?;
        let Some(mut message) = message else {
            return Ok(None);
        };
        if self.database_size.is_none() {
            // The first message says how much follows it: the database's size.
            self.database_size = Some(message.blob().len() as u64 + message.remaining_bytes());
        }
        if let Some(header) = message.take_header()
            && header.revision() > 0
        {
            self.header_revision = Some(header.revision());
        }
        Ok(Some(message.blob().to_vec()))
    }

    /// The database size the member announced in its first message.
    pub fn database_size(&self) -> Option<u64> {
        self.database_size
    }

    /// The revision in the response headers, if the member filled them in (etcd 3.4–3.6 do not).
    pub fn header_revision(&self) -> Option<i64> {
        self.header_revision
    }
}

impl MemberClient {
    /// Start streaming the member's database. Every message (etcd sends 32 KiB at a time) must
    /// arrive within `idle`; the stream as a whole may take as long as it needs. The member
    /// answers from its own backend, so a member without quorum can be snapshotted.
    pub async fn snapshot(&self, idle: Duration) -> Result<SnapshotStream, EtcdError> {
        const OPERATION: &str = "Snapshot";
        let mut client = self.etcd_client().await?;
        let stream = tokio::time::timeout(idle, client.snapshot())
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: self.endpoint().to_string(),
                operation: OPERATION,
                timeout: idle,
            })?
            .map_err(|e| from_client_error(self.endpoint(), OPERATION, idle, e))?;
        Ok(SnapshotStream {
            stream,
            endpoint: self.endpoint().to_string(),
            idle,
            database_size: None,
            header_revision: None,
        })
    }

    /// The member's current revision, from a serializable (local, no quorum) count-only read.
    pub async fn local_revision(&self) -> Result<i64, EtcdError> {
        const OPERATION: &str = "Range";
        let options = GetOptions::new().with_serializable().with_count_only();
        let response = self
            .call(
                OPERATION,
                |mut c| async move { c.get(vec![0u8], Some(options)).await },
            )
            .await?;
        response
            .header()
            .map(|h| h.revision())
            .filter(|r| *r > 0)
            .ok_or_else(|| EtcdError::Protocol {
                endpoint: self.endpoint().to_string(),
                operation: OPERATION,
                message: "answer has no revision".into(),
            })
    }
}
