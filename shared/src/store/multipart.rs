//! Writing a stream of unknown length into one object, a part at a time: memory holds at most the
//! part being filled and the one being sent, whatever the object's size.

use super::{StoreClient, StoreError};

/// Bytes per part: S3's minimum for every part but the last.
pub const PART_SIZE: usize = 5 << 20;
/// S3's limit on parts per upload (with [`PART_SIZE`], objects up to about 48 GiB; etcd refuses
/// databases beyond 8 GiB).
pub const MAX_PARTS: usize = 10_000;

/// An open multipart upload being filled. Nothing is visible under its key until
/// [`MultipartWriter::complete`]; [`MultipartWriter::abort`] drops what was sent.
#[derive(Debug)]
pub struct MultipartWriter<'a> {
    store: &'a StoreClient,
    key: String,
    upload_id: String,
    buffer: Vec<u8>,
    etags: Vec<String>,
    sent: u64,
}

impl<'a> MultipartWriter<'a> {
    /// Continue the upload `upload_id` of `key` (from
    /// [`StoreClient::create_multipart_upload`]) from its first part.
    pub fn new(store: &'a StoreClient, key: &str, upload_id: &str) -> Self {
        MultipartWriter {
            store,
            key: key.to_string(),
            upload_id: upload_id.to_string(),
            buffer: Vec::new(),
            etags: Vec::new(),
            sent: 0,
        }
    }

    /// Append bytes; every full part is uploaded before this returns.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), StoreError> {
        while !bytes.is_empty() {
            if self.buffer.capacity() == 0 {
                self.buffer.reserve_exact(PART_SIZE);
            }
            let take = (PART_SIZE - self.buffer.len()).min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buffer.len() == PART_SIZE {
                self.send_part().await?;
            }
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.sent + self.buffer.len() as u64
    }

    /// Send the last part and complete the upload: the object now exists. Returns its size.
    pub async fn complete(mut self) -> Result<u64, StoreError> {
        if !self.buffer.is_empty() || self.etags.is_empty() {
            self.send_part().await?;
        }
        self.store
            .complete_multipart_upload(&self.key, &self.upload_id, &self.etags)
            .await?;
        Ok(self.sent)
    }

    /// Abort the upload: its parts are dropped and nothing appears under the key.
    pub async fn abort(self) -> Result<(), StoreError> {
        self.store
            .abort_multipart_upload(&self.key, &self.upload_id)
            .await
    }

    async fn send_part(&mut self) -> Result<(), StoreError> {
        let number = self.etags.len() + 1;
        let number = u16::try_from(number)
            .ok()
            .filter(|n| usize::from(*n) <= MAX_PARTS)
            .ok_or_else(|| {
                StoreError::InvalidConfig(format!(
                    "{:?} would need more than {MAX_PARTS} parts of {PART_SIZE} bytes",
                    self.key
                ))
            })?;
        let part = std::mem::take(&mut self.buffer);
        let len = part.len() as u64;
        let etag = self
            .store
            .upload_part(&self.key, &self.upload_id, number, part)
            .await?;
        self.etags.push(etag);
        self.sent += len;
        Ok(())
    }
}
