//! What a member says of itself beyond Status, read only when a decision needs it: a metric
//! from its `/metrics` (the backend quota it runs with, which etcd before 3.6 does not report
//! in Status) and etcd's hash of its key-value store at a revision (`HashKV`), its own evidence
//! of whether two members hold the same data.

use super::client::MemberClient;
use super::error::EtcdError;

/// The most of `/metrics` read looking for one metric (etcd's is about 100 KiB): a member
/// answering more is refused, never buffered.
pub const METRICS_CAP: usize = 4 << 20;

/// etcd's own hash of one member's key-value store up to a revision (`HashKV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashKv {
    /// The revision hashed up to.
    pub revision: i64,
    /// The member's compacted revision: hashes of members compacted at different revisions
    /// cover different histories and are not compared.
    pub compact_revision: i64,
    pub hash: u32,
}

impl MemberClient {
    /// The value of metric `name` (one without labels, e.g. `etcd_server_quota_backend_bytes`)
    /// on this member's `/metrics`, served on the client port; `None` when the member does not
    /// publish it. At most [`METRICS_CAP`] bytes are read.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>, EtcdError> {
        const OPERATION: &str = "GET /metrics";
        let read = async {
            let (status, text) = self.get(OPERATION, "/metrics", METRICS_CAP).await?;
            if !(200..300).contains(&status) {
                return Err(self.protocol(OPERATION, &format!("answered HTTP {status}")));
            }
            Ok(metric_value(&String::from_utf8_lossy(&text), name))
        };
        self.with_deadline(OPERATION, read).await
    }

    /// etcd's hash of this member's key-value store up to `revision` (served by the member
    /// alone, without quorum, also while an alarm refuses writes).
    pub async fn hash_kv(&self, revision: i64) -> Result<HashKv, EtcdError> {
        let response = self
            .call("HashKV", |mut c| async move { c.hash_kv(revision).await })
            .await?;
        Ok(HashKv {
            revision,
            compact_revision: response.compact_version(),
            hash: response.hash(),
        })
    }
}

/// The value of the unlabelled sample `name` in Prometheus text exposition `text`.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(name)).then(|| words.next()?.parse::<f64>().ok())?
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_metric_is_read_by_its_exact_name() {
        let text = "# HELP etcd_server_quota_backend_bytes Current backend storage quota size in bytes.\n\
                    # TYPE etcd_server_quota_backend_bytes gauge\n\
                    etcd_server_quota_backend_bytes_total 1\n\
                    etcd_server_quota_backend_bytes 1.6777216e+07\n\
                    etcd_server_has_leader 1\n";
        assert_eq!(
            metric_value(text, "etcd_server_quota_backend_bytes"),
            Some(16_777_216.0)
        );
        assert_eq!(metric_value(text, "etcd_server_has_leader"), Some(1.0));
        assert_eq!(metric_value(text, "etcd_missing"), None);
        assert_eq!(metric_value("etcd_x not-a-number\n", "etcd_x"), None);
    }
}
