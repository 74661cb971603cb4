#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The S3 client against a real S3-compatible server (SeaweedFS on 127.0.0.1): multipart uploads
//! complete and abort, presigned GETs download, deletes and prefix listings work, and a missing
//! bucket, refused credentials and an unreachable endpoint each fail with their own cause; over
//! https, server-side encryption and the SHA-256 in an object's metadata.

use std::time::Duration;

use etcdadm_shared::api::snapshot::S3Store;
use etcdadm_shared::store::{MultipartWriter, PART_SIZE, StoreClient, StoreCredentials, StoreError};
use etcdadm_shared::testing::SeaweedFs;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Deterministic bytes that differ from part to part.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ (i / 4096) as u8).collect()
}

async fn get(url: reqwest::Url) -> reqwest::Response {
    reqwest::Client::new().get(url).send().await.unwrap()
}

#[tokio::test]
async fn multipart_upload_presigned_get_list_and_delete() {
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("snapshots").await;

    // Two full parts and a short last one.
    let data = pattern(2 * PART_SIZE + 12345);
    let upload = store.create_multipart_upload("c1/a.db").await.unwrap();
    let mut writer = MultipartWriter::new(&store, "c1/a.db", &upload);
    for chunk in data.chunks(32 * 1024 + 7) {
        writer.write(chunk).await.unwrap();
    }
    assert_eq!(writer.written(), data.len() as u64);
    assert!(
        store.list("c1/").await.unwrap().is_empty(),
        "nothing is visible before the upload completes"
    );
    assert_eq!(writer.complete().await.unwrap(), data.len() as u64);

    let url = store.presigned_get("c1/a.db", Duration::from_secs(60));
    let response = get(url).await;
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.unwrap();
    assert_eq!(body.len(), data.len());
    assert_eq!(
        Sha256::digest(&body),
        Sha256::digest(&data),
        "the object is the bytes written"
    );

    // A small object (one short part), and one under another prefix.
    for key in ["c1/b.db", "c2/c.db"] {
        let upload = store.create_multipart_upload(key).await.unwrap();
        let mut writer = MultipartWriter::new(&store, key, &upload);
        writer.write(b"small").await.unwrap();
        writer.complete().await.unwrap();
    }
    let listed = store.list("c1/").await.unwrap();
    let keys: Vec<(&str, u64)> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(keys, [("c1/a.db", data.len() as u64), ("c1/b.db", 5)]);
    assert_eq!(store.list("").await.unwrap().len(), 3);

    store.delete_object("c1/a.db").await.unwrap();
    let keys: Vec<String> = store
        .list("c1/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, ["c1/b.db"]);
    assert_eq!(
        get(store.presigned_get("c1/a.db", Duration::from_secs(60)))
            .await
            .status(),
        404
    );
    store.delete_object("c1/a.db").await.unwrap();
}

#[tokio::test]
async fn an_aborted_upload_leaves_nothing_and_cannot_be_completed() {
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("snapshots").await;
    let upload = store.create_multipart_upload("c1/aborted.db").await.unwrap();
    let mut writer = MultipartWriter::new(&store, "c1/aborted.db", &upload);
    writer.write(&pattern(PART_SIZE + 10)).await.unwrap();
    writer.abort().await.unwrap();

    assert!(store.list("").await.unwrap().is_empty(), "nothing stored");
    let err = store
        .complete_multipart_upload("c1/aborted.db", &upload, &["\"x\"".to_string()])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchUpload { .. }), "{err}");
    assert!(store.list("").await.unwrap().is_empty());
    // Aborting again (after a crash, say) is fine.
    store
        .abort_multipart_upload("c1/aborted.db", &upload)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_bucket_refused_credentials_and_an_unreachable_endpoint_are_named() {
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("snapshots").await;
    store.check_bucket().await.unwrap();

    let missing = s3.client("no-such-bucket");
    let err = missing.check_bucket().await.unwrap_err();
    assert_eq!(err.category().as_str(), "BucketMissing", "{err}");
    assert!(
        err.to_string()
            .contains("bucket \"no-such-bucket\" does not exist"),
        "{err}"
    );
    let err = missing.list("").await.unwrap_err();
    assert_eq!(err.category().as_str(), "BucketMissing", "{err}");

    let secret = "wrong-secret-never-logged";
    let wrong = StoreClient::new(
        &s3.store("snapshots"),
        StoreCredentials::new(s3.credentials_secret_data()["AWS_ACCESS_KEY_ID"].clone(), secret),
        None,
    )
    .unwrap();
    let err = wrong.create_multipart_upload("a.db").await.unwrap_err();
    assert_eq!(err.category().as_str(), "AuthRefused", "{err}");
    let err = wrong.check_bucket().await.unwrap_err();
    assert_eq!(err.category().as_str(), "AuthRefused", "{err}");
    assert!(!err.to_string().contains(secret), "{err}");
    let unknown = StoreClient::new(
        &s3.store("snapshots"),
        StoreCredentials::new("AKUNKNOWN", "whatever"),
        None,
    )
    .unwrap();
    let err = unknown.list("").await.unwrap_err();
    assert_eq!(err.category().as_str(), "AuthRefused", "{err}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut nowhere = s3.store("snapshots");
    nowhere.endpoint = format!("http://127.0.0.1:{port}");
    let nowhere = StoreClient::new(&nowhere, s3.credentials(), None).unwrap();
    let err = nowhere.check_bucket().await.unwrap_err();
    assert_eq!(err.category().as_str(), "StoreUnreachable", "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(
        !text.contains("X-Amz-Signature"),
        "no signed URL in errors: {text}"
    );
}

/// `store` of `s3` with `extra` merged into it.
fn store_with(s3: &SeaweedFs, bucket: &str, extra: serde_json::Value) -> StoreClient {
    let mut store = serde_json::to_value(s3.store(bucket)).unwrap();
    json_patch::merge(&mut store, &extra);
    let store: S3Store = serde_json::from_value(store).unwrap();
    StoreClient::new(&store, s3.credentials(), s3.ca_pem()).unwrap()
}

/// Upload `data` to `key` in parts.
async fn upload(store: &StoreClient, key: &str, data: &[u8]) -> Result<u64, StoreError> {
    let upload = store.create_multipart_upload(key).await?;
    let mut writer = MultipartWriter::new(store, key, &upload);
    writer.write(data).await?;
    writer.complete().await
}

/// Whether any of the 64-byte windows of `data` taken every 256 KiB appears in a file under
/// `dir`.
fn appears_under(dir: &std::path::Path, data: &[u8]) -> bool {
    let windows: Vec<&[u8]> = (0..data.len() - 64)
        .step_by(256 << 10)
        .map(|i| &data[i..i + 64])
        .collect();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().flatten().map(|e| e.path()));
        } else if let Ok(bytes) = std::fs::read(&path)
            && windows.iter().any(|w| bytes.windows(64).any(|b| b == *w))
        {
            return true;
        }
    }
    false
}

/// Over https (the store's own CA), with `sse: AES256`: the object's SHA-256 is recorded in
/// its metadata and read back, the controller computes the same by reading it, the presigned
/// download works with the CA and says it is encrypted, and SeaweedFS's disk holds none of the
/// plaintext (while an unencrypted upload's plaintext is found there, so the check can fail).
#[tokio::test]
async fn over_https_an_aes256_object_is_encrypted_at_rest_and_carries_its_sha256() {
    let s3 = SeaweedFs::start_tls().await;
    s3.create_bucket("snapshots").await;
    let encrypted = store_with(&s3, "snapshots", json!({"sse": "AES256"}));
    let plain = s3.client("snapshots");
    let data: Vec<u8> = (0..PART_SIZE + (1 << 20)).map(|_| rand::random::<u8>()).collect();
    let size = upload(&encrypted, "c1/sse.db", &data).await.unwrap();
    let sha256 = etcdadm_shared::backup::hex(&Sha256::digest(&data));
    assert!(encrypted.record_sha256("c1/sse.db", size, &sha256).await.unwrap());
    let head = encrypted.head_object("c1/sse.db").await.unwrap();
    assert_eq!((head.size, head.sha256.as_deref()), (size, Some(sha256.as_str())));
    assert_eq!(encrypted.sha256_of("c1/sse.db", size).await.unwrap(), sha256);

    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(s3.ca_pem().unwrap().as_bytes()).unwrap())
        .build()
        .unwrap();
    let url = encrypted.presigned_get("c1/sse.db", Duration::from_secs(60));
    assert!(url.as_str().starts_with("https://"), "{url}");
    let response = trusting.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-amz-server-side-encryption"],
        "AES256",
        "still encrypted after the metadata copy"
    );
    assert_eq!(
        Sha256::digest(response.bytes().await.unwrap()),
        Sha256::digest(&data)
    );
    // Without the CA, the download is refused: the certificate is checked.
    let url = encrypted.presigned_get("c1/sse.db", Duration::from_secs(60));
    assert!(reqwest::Client::new().get(url).send().await.is_err());

    let control: Vec<u8> = (0..2 << 20).map(|_| rand::random::<u8>()).collect();
    upload(&plain, "c1/plain.db", &control).await.unwrap();
    assert!(
        appears_under(&s3.data_dir(), &control),
        "the unencrypted object is on disk as is"
    );
    assert!(!appears_under(&s3.data_dir(), &data), "the AES256 object is not");
}

/// `sse: aws:kms` is sent (with its key ID); SeaweedFS 4.48 without a KMS starts the upload and
/// refuses its parts, which fails the upload with the status and code only.
#[tokio::test]
async fn aws_kms_is_sent_and_a_store_without_a_kms_refuses_the_upload() {
    let s3 = SeaweedFs::start().await;
    s3.create_bucket("snapshots").await;
    let kms = store_with(
        &s3,
        "snapshots",
        json!({"sse": "aws:kms", "sseKMSKeyID": "alias/etcd"}),
    );
    let err = upload(&kms, "c1/kms.db", b"data").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "object store at {} answered UploadPart with HTTP 500 InternalError",
            s3.endpoint()
        )
    );
    assert!(kms.list("c1/").await.unwrap().is_empty());
}
