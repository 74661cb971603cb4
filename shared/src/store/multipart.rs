//! Writing a stream of unknown length into one object, a part at a time: while one part uploads
//! the next one fills, so reading the source and writing the store overlap, and memory holds at
//! most those two parts whatever the object's size.

use tokio::task::JoinHandle;

use super::client::StoreClient;
use super::error::StoreError;

/// Bytes per part: S3's minimum for every part but the last.
pub const PART_SIZE: usize = 5 << 20;
/// S3's limit on parts per upload (with [`PART_SIZE`], objects up to about 48 GiB; etcd refuses
/// databases beyond 8 GiB).
pub const MAX_PARTS: usize = 10_000;

/// A part being uploaded: its ETag once done.
type PartUpload = JoinHandle<Result<String, StoreError>>;

/// An open multipart upload being filled. Nothing is visible under its key until
/// [`MultipartWriter::complete`]; [`MultipartWriter::abort`] drops what was sent, and so does
/// the store's lifecycle if the writer is dropped.
#[derive(Debug)]
pub struct MultipartWriter {
    store: StoreClient,
    key: String,
    upload_id: String,
    buffer: Vec<u8>,
    /// ETags of the uploaded parts, in part order.
    etags: Vec<String>,
    written: u64,
    in_flight: Option<PartUpload>,
}

impl Drop for MultipartWriter {
    fn drop(&mut self) {
        if let Some(part) = self.in_flight.take() {
            part.abort();
        }
    }
}

impl MultipartWriter {
    /// Continue the upload `upload_id` of `key` (from
    /// [`StoreClient::create_multipart_upload`]) from its first part.
    pub fn new(store: &StoreClient, key: &str, upload_id: &str) -> Self {
        MultipartWriter {
            store: store.clone(),
            key: key.to_string(),
            upload_id: upload_id.to_string(),
            buffer: Vec::new(),
            etags: Vec::new(),
            written: 0,
            in_flight: None,
        }
    }

    /// Append bytes. A full part starts uploading once the one before it is done.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), StoreError> {
        self.written += bytes.len() as u64;
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
        self.written
    }

    /// Send the last part and complete the upload: the object now exists. Returns its size.
    pub async fn complete(mut self) -> Result<u64, StoreError> {
        if !self.buffer.is_empty() || (self.etags.is_empty() && self.in_flight.is_none()) {
            self.send_part().await?;
        }
        self.finish_part().await?;
        self.store
            .complete_multipart_upload(&self.key, &self.upload_id, &self.etags)
            .await?;
        Ok(self.written)
    }

    /// Abort the upload: its parts are dropped and nothing appears under the key. A part still
    /// uploading is waited for first, so none lands after the abort.
    pub async fn abort(mut self) -> Result<(), StoreError> {
        if let Some(part) = self.in_flight.take() {
            let _ = part.await;
        }
        self.store
            .abort_multipart_upload(&self.key, &self.upload_id)
            .await
    }

    /// Wait for the part in flight, then start uploading the buffer as the next part.
    async fn send_part(&mut self) -> Result<(), StoreError> {
        self.finish_part().await?;
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
        let (store, key, upload_id) = (self.store.clone(), self.key.clone(), self.upload_id.clone());
        self.in_flight = Some(tokio::spawn(async move {
            store.upload_part(&key, &upload_id, number, part).await
        }));
        Ok(())
    }

    async fn finish_part(&mut self) -> Result<(), StoreError> {
        let Some(part) = self.in_flight.take() else {
            return Ok(());
        };
        let etag = part.await.map_err(|e| {
            StoreError::Interrupted(format!("the upload of a part of {:?} ended: {e}", self.key))
        })??;
        self.etags.push(etag);
        Ok(())
    }
}
