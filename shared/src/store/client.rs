//! The S3 client of one bucket: SigV4-signed requests (rusty-s3) over reqwest with the store's
//! CA, and what the snapshots need of a store (bucket check, multipart upload, list, delete,
//! presigned download).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use rusty_s3::actions::{CreateMultipartUpload, ListObjectsV2};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use tracing::debug;

use super::answer::{Answer, read_capped};
use super::error::{NO_CODE, StoreError, error_code_and_message, is_auth_code};
use super::limits::{CONNECT_TIMEOUT, LIST_PAGE_KEYS, PART_DEADLINE, READ_TIMEOUT, REQUEST_DEADLINE};
use super::policy::{PolicyResolver, Refusal, StorePolicy};
use crate::api::snapshot::{ACCESS_KEY_ID_KEY, S3Store, SECRET_ACCESS_KEY_KEY, ServerSideEncryption};

/// How long the signature of one request stays valid: longer than any request takes, short
/// enough that a leaked URL is soon useless.
pub(super) const REQUEST_SIGNATURE_TTL: Duration = Duration::from_secs(300);

/// The access key pair of a store. Its `Debug` shows neither key.
#[derive(Clone)]
pub struct StoreCredentials {
    access_key_id: String,
    secret_access_key: String,
}

impl std::fmt::Debug for StoreCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCredentials(<redacted>)")
    }
}

impl StoreCredentials {
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        StoreCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        }
    }

    /// From a Secret's data (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); the error names the
    /// missing or unreadable key, never a value.
    pub fn from_secret_data(secret: &str, data: &BTreeMap<String, ByteString>) -> Result<Self, StoreError> {
        let read = |key: &str| -> Result<String, StoreError> {
            let value = data
                .get(key)
                .ok_or_else(|| StoreError::InvalidConfig(format!("Secret {secret} has no {key}")))?;
            let text = String::from_utf8(value.0.clone())
                .map_err(|_| StoreError::InvalidConfig(format!("Secret {secret}: {key} is not UTF-8")))?;
            let text = text.trim().to_string();
            if text.is_empty() {
                return Err(StoreError::InvalidConfig(format!(
                    "Secret {secret}: {key} is empty"
                )));
            }
            Ok(text)
        };
        Ok(StoreCredentials::new(
            read(ACCESS_KEY_ID_KEY)?,
            read(SECRET_ACCESS_KEY_KEY)?,
        ))
    }
}

/// One object in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    pub size: u64,
}

/// A client for one bucket. Cheap to clone (one connection pool). Its `Debug` shows the
/// endpoint and bucket only.
#[derive(Clone)]
pub struct StoreClient {
    pub(super) endpoint: String,
    pub(super) bucket: Arc<Bucket>,
    pub(super) credentials: Arc<Credentials>,
    pub(super) http: reqwest::Client,
    /// The server-side encryption headers of every upload.
    sse_headers: Arc<Vec<(&'static str, String)>>,
    /// The deadline of requests other than part uploads and whole-object reads.
    pub(super) deadline: Duration,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClient")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket.name())
            .finish_non_exhaustive()
    }
}

impl StoreClient {
    /// A client for `store`'s bucket with `credentials`, trusting `ca_pem` (a PEM bundle)
    /// instead of the system's CAs when given. Nothing is sent yet.
    pub fn new(
        store: &S3Store,
        credentials: StoreCredentials,
        ca_pem: Option<&str>,
    ) -> Result<Self, StoreError> {
        Self::with_policy(store, credentials, ca_pem, StorePolicy::current())
    }

    /// The same under `policy` instead of the process's (tests of a policy).
    pub fn with_policy(
        store: &S3Store,
        credentials: StoreCredentials,
        ca_pem: Option<&str>,
        policy: Arc<StorePolicy>,
    ) -> Result<Self, StoreError> {
        let invalid = |why: String| StoreError::InvalidConfig(why);
        let endpoint = reqwest::Url::parse(store.endpoint.trim())
            .map_err(|e| invalid(format!("endpoint {:?} is not a URL: {e}", store.endpoint)))?;
        // The endpoint as written, before anything is sent; the addresses its name resolves
        // to, by the resolver at each connection.
        policy
            .check_endpoint(endpoint.scheme(), endpoint.host_str().unwrap_or_default())
            .map_err(|refusal| StoreError::PolicyRefused {
                endpoint: endpoint.as_str().trim_end_matches('/').to_string(),
                why: refusal.0,
            })?;
        let style = if store.force_path_style.unwrap_or(false) {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            endpoint.clone(),
            style,
            store.bucket.clone(),
            store.region().to_string(),
        )
        .map_err(|e| {
            invalid(format!(
                "bucket {:?} at {}: {e} (an IP address or a bucket name with dots needs \
                 forcePathStyle: true)",
                store.bucket,
                endpoint.as_str()
            ))
        })?;
        // kube and reqwest are built without a default crypto provider; the managers install
        // ring at start, tests and tools may not have.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // No redirects: a store must not send the controller's requests somewhere else.
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(PolicyResolver { policy });
        if let Some(ca_pem) = ca_pem {
            http = http.use_preconfigured_tls(tls_trusting(ca_pem).map_err(invalid)?);
        }
        let http = http
            .build()
            .map_err(|e| invalid(format!("building the HTTP client: {e}")))?;
        Ok(StoreClient {
            endpoint: endpoint.as_str().trim_end_matches('/').to_string(),
            bucket: Arc::new(bucket),
            credentials: Arc::new(Credentials::new(
                credentials.access_key_id,
                credentials.secret_access_key,
            )),
            http,
            sse_headers: Arc::new(sse_headers(store)),
            deadline: REQUEST_DEADLINE,
        })
    }

    /// The same client with another deadline for ordinary requests (tests of slow stores).
    pub fn with_request_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The headers that ask the store to encrypt what an upload writes (empty without `sse`).
    pub(super) fn upload_headers(&self) -> &[(&'static str, String)] {
        &self.sse_headers
    }

    /// `<bucket>/<key>`, as EtcdadmSnapshot `status.location` shows it.
    pub fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.bucket.name())
    }

    /// Create the bucket (tests and demos; snapshots never create buckets).
    pub async fn create_bucket(&self) -> Result<(), StoreError> {
        let action = self.bucket.create_bucket(&self.credentials);
        let body = action.body();
        let url = action.sign(REQUEST_SIGNATURE_TTL);
        self.send("CreateBucket", self.http.put(url).body(body), self.deadline)
            .await?;
        Ok(())
    }

    /// Check that the bucket exists and the credentials may use it. Worth doing first: some
    /// stores (SeaweedFS) start multipart uploads into buckets that do not exist.
    pub async fn check_bucket(&self) -> Result<(), StoreError> {
        let url = self
            .bucket
            .head_bucket(Some(&self.credentials))
            .sign(REQUEST_SIGNATURE_TTL);
        match self.send("HeadBucket", self.http.head(url), self.deadline).await {
            // A HEAD answer has no body to name the error: its status has to.
            Err(StoreError::Refused { status: 404, .. }) => Err(StoreError::BucketMissing {
                endpoint: self.endpoint.clone(),
                bucket: self.bucket.name().to_string(),
                operation: "HeadBucket",
            }),
            result => result.map(drop),
        }
    }

    /// Start a multipart upload of `key` (encrypted as the store's `sse` says); returns its
    /// upload ID.
    pub async fn create_multipart_upload(&self, key: &str) -> Result<String, StoreError> {
        const OPERATION: &str = "CreateMultipartUpload";
        let mut action = self.bucket.create_multipart_upload(Some(&self.credentials), key);
        for (name, value) in self.upload_headers() {
            action.headers_mut().insert(*name, value.as_str());
        }
        let url = action.sign(REQUEST_SIGNATURE_TTL);
        let request = with_headers(self.http.post(url), self.upload_headers());
        let response = self.send(OPERATION, request, self.deadline).await?;
        let body = self.answer_text(OPERATION, response).await?;
        let parsed = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| self.unexpected(OPERATION, &format!("unreadable answer: {e}")))?;
        Ok(parsed.upload_id().to_string())
    }

    /// Upload part `number` (1-based) of an upload; returns its ETag.
    pub async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u16,
        bytes: Vec<u8>,
    ) -> Result<String, StoreError> {
        const OPERATION: &str = "UploadPart";
        let url = self
            .bucket
            .upload_part(Some(&self.credentials), key, number, upload_id)
            .sign(REQUEST_SIGNATURE_TTL);
        let request = self.http.put(url).body(bytes);
        let response = self
            .send_upload(OPERATION, key, upload_id, request, PART_DEADLINE)
            .await?;
        response
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .filter(|etag| etag.len() <= 256)
            .map(str::to_string)
            .ok_or_else(|| self.unexpected(OPERATION, "no ETag in the answer"))
    }

    /// Complete an upload from its parts' ETags, in part order: only now does `key` exist.
    pub async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
    ) -> Result<(), StoreError> {
        const OPERATION: &str = "CompleteMultipartUpload";
        let action = self.bucket.complete_multipart_upload(
            Some(&self.credentials),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(REQUEST_SIGNATURE_TTL);
        let body = action.body();
        let request = self.http.post(url).body(body);
        let response = self
            .send_upload(OPERATION, key, upload_id, request, self.deadline)
            .await?;
        // S3 may answer 200 and still fail, with an error document as the body.
        let body = self.answer_text(OPERATION, response).await?;
        self.error_document(OPERATION, &body)
    }

    /// Abort an upload, dropping its parts. An upload that no longer exists is fine.
    pub async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        const OPERATION: &str = "AbortMultipartUpload";
        let url = self
            .bucket
            .abort_multipart_upload(Some(&self.credentials), key, upload_id)
            .sign(REQUEST_SIGNATURE_TTL);
        match self
            .send_upload(OPERATION, key, upload_id, self.http.delete(url), self.deadline)
            .await
        {
            Ok(_) | Err(StoreError::NoSuchUpload { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A URL anyone holding it may GET `key` with, for `ttl`.
    pub fn presigned_get(&self, key: &str, ttl: Duration) -> reqwest::Url {
        self.bucket.get_object(Some(&self.credentials), key).sign(ttl)
    }

    /// Delete `key` (deleting a key that does not exist succeeds, as in S3).
    pub async fn delete_object(&self, key: &str) -> Result<(), StoreError> {
        let url = self
            .bucket
            .delete_object(Some(&self.credentials), key)
            .sign(REQUEST_SIGNATURE_TTL);
        self.send("DeleteObject", self.http.delete(url), self.deadline)
            .await?;
        Ok(())
    }

    /// Every object whose key starts with `prefix`, in key order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<StoredObject>, StoreError> {
        const OPERATION: &str = "ListObjectsV2";
        let mut objects = vec![];
        let mut token: Option<String> = None;
        loop {
            let mut action = self.bucket.list_objects_v2(Some(&self.credentials));
            action.with_prefix(prefix);
            action.with_max_keys(LIST_PAGE_KEYS);
            if let Some(token) = &token {
                action.with_continuation_token(token.clone());
            }
            let url = action.sign(REQUEST_SIGNATURE_TTL);
            let response = self.send(OPERATION, self.http.get(url), self.deadline).await?;
            let body = self.answer_text(OPERATION, response).await?;
            let page = ListObjectsV2::parse_response(&body)
                .map_err(|e| self.unexpected(OPERATION, &format!("unreadable answer: {e}")))?;
            objects.extend(page.contents.into_iter().map(|o| StoredObject {
                key: o.key,
                size: o.size.unwrap_or(0),
            }));
            match page.next_continuation_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(objects),
            }
        }
    }

    /// Send a request about an upload: a 404 `NoSuchUpload` names the upload.
    async fn send_upload(
        &self,
        operation: &'static str,
        key: &str,
        upload_id: &str,
        request: reqwest::RequestBuilder,
        deadline: Duration,
    ) -> Result<reqwest::Response, StoreError> {
        self.send(operation, request, deadline)
            .await
            .map_err(|e| match e {
                StoreError::NoSuchUpload { operation, .. } => StoreError::NoSuchUpload {
                    key: key.to_string(),
                    upload_id: upload_id.to_string(),
                    operation,
                },
                e => e,
            })
    }

    /// Send `request`, which must end (answer and body) within `deadline`; a failure answer is
    /// sorted by its status and S3 error code, its body read no further than the answer cap.
    pub(super) async fn send(
        &self,
        operation: &'static str,
        request: reqwest::RequestBuilder,
        deadline: Duration,
    ) -> Result<reqwest::Response, StoreError> {
        let response = request
            .timeout(deadline)
            .send()
            .await
            .map_err(|e| self.transport(operation, deadline, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let answer = read_capped(response).await.map(|a| a.text()).unwrap_or_default();
        let (code, message) = error_code_and_message(&answer);
        debug!(endpoint = %self.endpoint, operation, status = status.as_u16(), code = ?code,
               message = %clipped(&message), "the object store refused a request");
        Err(self.classify(operation, status.as_u16(), code))
    }

    /// A successful answer's body as text; one over the answer cap is refused.
    pub(super) async fn answer_text(
        &self,
        operation: &'static str,
        response: reqwest::Response,
    ) -> Result<String, StoreError> {
        let answer: Answer = read_capped(response)
            .await
            .map_err(|e| self.transport(operation, self.deadline, &e))?;
        if answer.truncated {
            return Err(self.unexpected(operation, "an answer larger than 64 KiB"));
        }
        Ok(answer.text())
    }

    /// A 200 answer that is an S3 error document (CompleteMultipartUpload, CopyObject) fails.
    pub(super) fn error_document(&self, operation: &'static str, body: &str) -> Result<(), StoreError> {
        if !body.contains("<Error>") {
            return Ok(());
        }
        let (code, message) = error_code_and_message(body);
        debug!(endpoint = %self.endpoint, operation, code = ?code, message = %clipped(&message),
               "the object store answered 200 with an error");
        Err(self.classify(operation, 200, code))
    }

    pub(super) fn classify(&self, operation: &'static str, status: u16, code: Option<String>) -> StoreError {
        let bucket = self.bucket.name().to_string();
        let endpoint = self.endpoint.clone();
        match code.as_deref() {
            Some("NoSuchBucket") => StoreError::BucketMissing {
                endpoint,
                bucket,
                operation,
            },
            Some("NoSuchUpload") => StoreError::NoSuchUpload {
                key: String::new(),
                upload_id: String::new(),
                operation,
            },
            Some(code) if is_auth_code(code) => StoreError::AuthRefused {
                endpoint,
                bucket,
                operation,
                status,
                code: code.to_string(),
            },
            None if matches!(status, 401 | 403) => StoreError::AuthRefused {
                endpoint,
                bucket,
                operation,
                status,
                code: NO_CODE.into(),
            },
            _ => StoreError::Refused {
                endpoint,
                operation,
                status,
                code: code.unwrap_or_else(|| NO_CODE.into()),
            },
        }
    }

    /// A request that got no complete answer. What went wrong is only logged (at debug): its
    /// text names what answered on the endpoint, and reqwest's carries the signed URL.
    pub(super) fn transport(
        &self,
        operation: &'static str,
        deadline: Duration,
        error: &reqwest::Error,
    ) -> StoreError {
        let mut causes = Vec::new();
        let mut tls = false;
        let mut refused = None;
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
        while let Some(cause) = source {
            tls |= cause.downcast_ref::<rustls::Error>().is_some();
            refused = refused.or_else(|| cause.downcast_ref::<Refusal>().cloned());
            causes.push(cause.to_string());
            source = cause.source();
        }
        debug!(endpoint = %self.endpoint, operation, timed_out = error.is_timeout(),
               cause = %clipped(&causes.join(": ")), "no answer from the object store");
        let endpoint = self.endpoint.clone();
        // Our own words, not the store's: the policy's refusal is said as it is.
        if let Some(Refusal(why)) = refused {
            return StoreError::PolicyRefused { endpoint, why };
        }
        if tls {
            StoreError::Tls { endpoint, operation }
        } else {
            StoreError::Unreachable {
                endpoint,
                operation,
                deadline,
            }
        }
    }

    /// An answer this client cannot use; `what` is our description, never the store's text.
    pub(super) fn unexpected(&self, operation: &'static str, what: &str) -> StoreError {
        StoreError::Refused {
            endpoint: self.endpoint.clone(),
            operation,
            status: 200,
            code: format!("({what})"),
        }
    }
}

/// The encryption headers `store.sse` asks for on uploads.
fn sse_headers(store: &S3Store) -> Vec<(&'static str, String)> {
    let Some(sse) = store.sse else {
        return vec![];
    };
    let mut headers = vec![("x-amz-server-side-encryption", sse.as_str().to_string())];
    if sse == ServerSideEncryption::AwsKms
        && let Some(key_id) = store
            .sse_kms_key_id
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
    {
        headers.push(("x-amz-server-side-encryption-aws-kms-key-id", key_id.to_string()));
    }
    headers
}

/// `request` with `headers` (the signed ones must be sent as signed).
pub(super) fn with_headers(
    mut request: reqwest::RequestBuilder,
    headers: &[(&'static str, String)],
) -> reqwest::RequestBuilder {
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request
}

/// At most 200 characters of a store's text, for a debug log line.
fn clipped(text: &str) -> String {
    text.chars().take(200).collect()
}

/// TLS trusting exactly the certificates of `ca_pem`.
fn tls_trusting(ca_pem: &str) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("CA bundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("CA bundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::api::snapshot::SecretReference;

    fn store(endpoint: &str, path_style: bool) -> S3Store {
        S3Store {
            endpoint: endpoint.into(),
            bucket: "etcd-backups".into(),
            force_path_style: Some(path_style),
            credentials_secret_ref: SecretReference { name: "c".into() },
            ..Default::default()
        }
    }

    fn credentials() -> StoreCredentials {
        StoreCredentials::new("AKIDSECRETID", "very-secret-key")
    }

    #[test]
    fn debug_output_never_shows_credentials() {
        let client = StoreClient::new(&store("https://s3.example.com", false), credentials(), None).unwrap();
        for text in [format!("{client:?}"), format!("{:?}", credentials())] {
            assert!(!text.contains("AKIDSECRETID"), "{text}");
            assert!(!text.contains("very-secret-key"), "{text}");
        }
        assert!(format!("{client:?}").contains("s3.example.com"));
    }

    #[test]
    fn presigned_urls_address_the_bucket_by_path_or_host() {
        let path = StoreClient::new(&store("http://127.0.0.1:8333", true), credentials(), None).unwrap();
        let url = path.presigned_get("a/b.db", Duration::from_secs(60));
        assert!(
            url.as_str()
                .starts_with("http://127.0.0.1:8333/etcd-backups/a/b.db?"),
            "{url}"
        );
        assert!(url.as_str().contains("X-Amz-Expires=60"), "{url}");
        assert!(!url.as_str().contains("very-secret-key"));
        let host = StoreClient::new(&store("https://s3.example.com", false), credentials(), None).unwrap();
        let url = host.presigned_get("a.db", Duration::from_secs(60));
        assert!(
            url.as_str()
                .starts_with("https://etcd-backups.s3.example.com/a.db?"),
            "{url}"
        );
        assert_eq!(host.location("a.db"), "etcd-backups/a.db");
    }

    #[test]
    fn an_ip_endpoint_without_path_style_is_refused_with_the_fix() {
        let err = StoreClient::new(&store("http://127.0.0.1:8333", false), credentials(), None).unwrap_err();
        assert_eq!(err.category().as_str(), "InvalidStore");
        assert!(err.to_string().contains("forcePathStyle: true"), "{err}");
    }

    #[test]
    fn credentials_come_from_the_two_secret_keys() {
        let mut data = BTreeMap::new();
        data.insert(ACCESS_KEY_ID_KEY.to_string(), ByteString(b"id".to_vec()));
        let err = StoreCredentials::from_secret_data("default/s3", &data).unwrap_err();
        assert!(
            err.to_string()
                .contains("Secret default/s3 has no AWS_SECRET_ACCESS_KEY"),
            "{err}"
        );
        data.insert(
            SECRET_ACCESS_KEY_KEY.to_string(),
            ByteString(b"secret\n".to_vec()),
        );
        let creds = StoreCredentials::from_secret_data("default/s3", &data).unwrap();
        assert_eq!(creds.secret_access_key, "secret");
    }
}
