#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A store a tenant controls cannot hurt the client: a stand-in that trickles bytes is cut off
//! at the request's deadline, one that sends a 1 GiB error body is read no further than the
//! answer cap, and one that answers with internal-looking text has only its HTTP status and S3
//! code repeated. Each check can fail: the stand-in counts what it sent, and the errors are
//! compared whole.

use std::time::{Duration, Instant};

use etcdadm_shared::api::snapshot::{S3Store, SecretReference};
use etcdadm_shared::store::limits::MAX_ANSWER_BYTES;
use etcdadm_shared::store::{StoreClient, StoreCredentials, StoreError};
use etcdadm_shared::testing::{HostileStore, Hostility, INTERNAL_TEXT};

/// A client of the stand-in whose ordinary requests end within `deadline`.
fn client(store: &HostileStore, deadline: Duration) -> StoreClient {
    let spec = S3Store {
        endpoint: store.endpoint().to_string(),
        bucket: "tenant-bucket".into(),
        force_path_style: Some(true),
        insecure: Some(true),
        credentials_secret_ref: SecretReference { name: "c".into() },
        ..Default::default()
    };
    StoreClient::new(&spec, StoreCredentials::new("id", "secret"), None)
        .unwrap()
        .with_request_deadline(deadline)
}

#[tokio::test]
async fn a_store_that_trickles_is_cut_off_at_the_deadline() {
    for hostility in [Hostility::TrickleHeaders, Hostility::TrickleBody] {
        let store = HostileStore::start(hostility).await;
        let client = client(&store, Duration::from_secs(2));
        let started = Instant::now();
        let err = client.create_multipart_upload("k").await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(err, StoreError::Unreachable { deadline, .. } if deadline == Duration::from_secs(2)),
            "{hostility:?}: {err:?}"
        );
        assert!(
            err.to_string()
                .contains("no complete answer to CreateMultipartUpload within 2s"),
            "{err}"
        );
        // Ended by the deadline, not by the stand-in (which never stops): generous bounds, only
        // to tell a deadline from a hang.
        assert!(
            took >= Duration::from_secs(2),
            "{hostility:?} ended after {took:?}"
        );
        assert!(
            took < Duration::from_secs(30),
            "{hostility:?} ended after {took:?}"
        );
        assert!(store.bytes_sent() > 0, "the stand-in was talking");
    }
}

#[tokio::test]
async fn a_1_gib_error_body_is_read_no_further_than_the_answer_cap() {
    let store = HostileStore::start(Hostility::HugeErrorBody).await;
    let client = client(&store, Duration::from_secs(60));
    // The stand-in passes the bucket check; the request after it gets the 1 GiB body.
    client.check_bucket().await.unwrap();
    let err = client.create_multipart_upload("k").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "object store at {} answered CreateMultipartUpload with HTTP 500 InternalError",
            store.endpoint()
        ),
        "the code comes first; the message that follows is never read to its end"
    );
    // Give the stand-in time to notice the connection is gone, then count: what it pushed is
    // the cap plus what the kernel's socket buffers took, nowhere near 1 GiB.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = store.bytes_sent();
    assert!(sent >= MAX_ANSWER_BYTES as u64, "{sent}");
    assert!(sent < 32 << 20, "{sent} bytes sent: the body was read on");
}

#[tokio::test]
async fn internal_looking_text_never_reaches_an_error() {
    let store = HostileStore::start(Hostility::InternalText).await;
    let err = client(&store, Duration::from_secs(10))
        .create_multipart_upload("k")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} refused the credentials (CreateMultipartUpload): HTTP 403 AccessDenied; check \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the credentials Secret and what they \
             may do on bucket \"tenant-bucket\"",
            store.endpoint()
        )
    );
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");

    let store = HostileStore::start(Hostility::InternalPage).await;
    let err = client(&store, Duration::from_secs(10))
        .create_multipart_upload("k")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "object store at {} answered CreateMultipartUpload with HTTP 500 (no S3 error code)",
            store.endpoint()
        )
    );
    assert!(!format!("{err:?}").contains(INTERNAL_TEXT), "{err:?}");
}
