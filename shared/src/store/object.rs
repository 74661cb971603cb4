//! What the controller asks of one stored object besides writing it: its size and recorded
//! SHA-256 (HeadObject), recording our SHA-256 in its metadata once an upload completed (a
//! CopyObject onto itself, the one way S3 changes an object's metadata), and reading it whole
//! to compute the SHA-256 of an object nobody recorded one for or to download it to a file.

use sha2::{Digest, Sha256};
use tracing::debug;

use super::client::{REQUEST_SIGNATURE_TTL, StoreClient, with_headers};
use super::error::StoreError;
use super::limits::object_deadline;
use crate::backup::checksum::hex;
use rusty_s3::S3Action;

/// The object metadata our SHA-256 of a snapshot is recorded in (`x-amz-meta-` + this).
pub const SHA256_METADATA: &str = "etcdadm-sha256";

/// S3's limit on an object copied in one request.
pub const MAX_SINGLE_COPY: u64 = 5 << 30;

/// What HeadObject tells of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectHead {
    pub size: u64,
    /// [`SHA256_METADATA`], when it holds 64 hex digits.
    pub sha256: Option<String>,
}

impl StoreClient {
    /// The size of `key` and the SHA-256 recorded in its metadata.
    pub async fn head_object(&self, key: &str) -> Result<ObjectHead, StoreError> {
        const OPERATION: &str = "HeadObject";
        let url = self
            .bucket
            .head_object(Some(&self.credentials), key)
            .sign(REQUEST_SIGNATURE_TTL);
        let response = match self.send(OPERATION, self.http.head(url), self.deadline).await {
            Ok(response) => response,
            // A HEAD answer has no body to name the error: its status has to.
            Err(StoreError::Refused { status: 404, .. }) => {
                return Err(StoreError::ObjectMissing {
                    endpoint: self.endpoint.clone(),
                    bucket: self.bucket.name().to_string(),
                    key: key.to_string(),
                    operation: OPERATION,
                });
            }
            Err(e) => return Err(e),
        };
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .map(str::to_string)
        };
        let size = header("content-length")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| self.unexpected(OPERATION, "no Content-Length"))?;
        let sha256 = header(&format!("x-amz-meta-{SHA256_METADATA}"))
            .filter(|v| crate::validation::is_sha256_hex(v))
            .map(|v| v.to_ascii_lowercase());
        Ok(ObjectHead { size, sha256 })
    }

    /// Record `sha256` in the metadata of `key` (`size` bytes), keeping it encrypted as the
    /// store's `sse` says. Returns false, recording nothing, for an object over S3's
    /// single-copy limit.
    pub async fn record_sha256(&self, key: &str, size: u64, sha256: &str) -> Result<bool, StoreError> {
        const OPERATION: &str = "CopyObject";
        if size > MAX_SINGLE_COPY {
            return Ok(false);
        }
        let mut headers = vec![
            (
                "x-amz-copy-source",
                format!("/{}/{}", self.bucket.name(), encode_key(key)),
            ),
            ("x-amz-metadata-directive", "REPLACE".to_string()),
            (metadata_header(), sha256.to_string()),
        ];
        headers.extend(self.upload_headers().iter().cloned());
        let mut action = self.bucket.put_object(Some(&self.credentials), key);
        for (name, value) in &headers {
            action.headers_mut().insert(*name, value.as_str());
        }
        let url = action.sign(REQUEST_SIGNATURE_TTL);
        let request = with_headers(self.http.put(url), &headers);
        let response = self.send(OPERATION, request, object_deadline(size)).await?;
        let body = self.answer_text(OPERATION, response).await?;
        self.error_document(OPERATION, &body)?;
        Ok(true)
    }

    /// Read `key` (`size` bytes, as HeadObject said) whole and return its SHA-256 (hex). The
    /// bytes are hashed as they arrive; more than `size` of them is refused.
    pub async fn sha256_of(&self, key: &str, size: u64) -> Result<String, StoreError> {
        let sha256 = self.read_whole(key, size, None).await?;
        debug!(key, size, "computed the SHA-256 of a stored object");
        Ok(sha256)
    }

    /// Download `key` (`size` bytes) into `file` and return its SHA-256 (hex), computed as the
    /// bytes arrive; more or fewer than `size` of them is refused.
    pub async fn download_to(
        &self,
        key: &str,
        size: u64,
        file: &mut tokio::fs::File,
    ) -> Result<String, StoreError> {
        self.read_whole(key, size, Some(file)).await
    }

    /// Read `key` whole within its deadline, hashing it and writing it to `file` when given.
    async fn read_whole(
        &self,
        key: &str,
        size: u64,
        mut file: Option<&mut tokio::fs::File>,
    ) -> Result<String, StoreError> {
        use tokio::io::AsyncWriteExt;
        const OPERATION: &str = "GetObject";
        let deadline = object_deadline(size);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), key)
            .sign(REQUEST_SIGNATURE_TTL);
        let mut response = self.send(OPERATION, self.http.get(url), deadline).await?;
        let mut hasher = Sha256::new();
        let mut read = 0u64;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport(OPERATION, deadline, &e))?
        {
            read += chunk.len() as u64;
            if read > size {
                return Err(self.unexpected(OPERATION, "more bytes than the object's size"));
            }
            hasher.update(&chunk);
            if let Some(file) = file.as_deref_mut() {
                file.write_all(&chunk).await.map_err(|e| written(key, &e))?;
            }
        }
        if read != size {
            return Err(self.unexpected(OPERATION, "fewer bytes than the object's size"));
        }
        if let Some(file) = file {
            file.flush().await.map_err(|e| written(key, &e))?;
        }
        Ok(hex(&hasher.finalize()))
    }
}

/// A download that could not be written locally (the store is not at fault).
fn written(key: &str, e: &std::io::Error) -> StoreError {
    StoreError::Interrupted(format!("writing the download of {key:?} to disk: {e}"))
}

/// `x-amz-meta-etcdadm-sha256`.
fn metadata_header() -> &'static str {
    "x-amz-meta-etcdadm-sha256"
}

/// `key` percent-encoded for `x-amz-copy-source`, its `/` kept.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_sources_are_percent_encoded_but_keep_slashes() {
        assert_eq!(encode_key("ns/c1/s-1.db"), "ns/c1/s-1.db");
        assert_eq!(encode_key("a b/ü+?.db"), "a%20b/%C3%BC%2B%3F.db");
        assert_eq!(metadata_header(), format!("x-amz-meta-{SHA256_METADATA}"));
    }
}
