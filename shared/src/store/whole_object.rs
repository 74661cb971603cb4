//! Small objects written and read in one request each: continuous backup's delta objects
//! (`backup::delta`), a few MiB at most, encrypted as every upload is and read back no further
//! than the size the caller allows.

use super::client::{REQUEST_SIGNATURE_TTL, StoreClient, with_headers};
use super::error::StoreError;
use super::limits::object_deadline;
use rusty_s3::S3Action;

impl StoreClient {
    /// Write `bytes` as `key` in one PutObject, encrypted as the store's `sse` says.
    pub async fn put_object(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        const OPERATION: &str = "PutObject";
        let size = bytes.len() as u64;
        let mut action = self.bucket.put_object(Some(&self.credentials), key);
        for (name, value) in self.upload_headers() {
            action.headers_mut().insert(*name, value.as_str());
        }
        let url = action.sign(REQUEST_SIGNATURE_TTL);
        let request = with_headers(self.http.put(url), self.upload_headers()).body(bytes);
        let response = self.send(OPERATION, request, object_deadline(size)).await?;
        let body = self.answer_text(OPERATION, response).await?;
        self.error_document(OPERATION, &body)
    }

    /// Read `key` whole; an object of more than `max` bytes is refused as it arrives.
    pub async fn get_object(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        const OPERATION: &str = "GetObject";
        let deadline = object_deadline(max);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), key)
            .sign(REQUEST_SIGNATURE_TTL);
        let mut response = self.send(OPERATION, self.http.get(url), deadline).await?;
        let mut bytes = vec![];
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport(OPERATION, deadline, &e))?
        {
            if (bytes.len() + chunk.len()) as u64 > max {
                return Err(self.unexpected(OPERATION, &format!("an object of more than {max} bytes")));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}
