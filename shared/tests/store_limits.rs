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

/// The operator's store policy: a store whose name resolves to a refused address is refused by
/// the resolver when the client connects (nothing reaches the stand-in) and the refusal says
/// which rule, not what answered; an address refused as written is refused before anything is
/// sent; plain http is refused when the policy says so.
#[tokio::test]
async fn the_store_policy_refuses_by_name_and_by_resolved_address_before_anything_is_sent() {
    use std::sync::Arc;

    use etcdadm_shared::store::{HostRule, StorePolicy};

    let store = HostileStore::start(Hostility::InternalText).await;
    let port = store.endpoint().rsplit(':').next().unwrap().to_string();
    let spec = |endpoint: String| S3Store {
        endpoint,
        bucket: "tenant-bucket".into(),
        force_path_style: Some(true),
        insecure: Some(true),
        credentials_secret_ref: SecretReference { name: "c".into() },
        ..Default::default()
    };
    let policy = |denied: &[&str], deny_insecure: bool| {
        Arc::new(StorePolicy {
            denied: denied.iter().map(|d| HostRule::parse(d).unwrap()).collect(),
            deny_insecure,
            ..Default::default()
        })
    };
    let credentials = || StoreCredentials::new("id", "secret");

    // A name that resolves into a denied range: refused when connecting.
    let by_name = StoreClient::with_policy(
        &spec(format!("http://localhost:{port}")),
        credentials(),
        None,
        policy(&["127.0.0.0/8", "::1/128"], false),
    )
    .unwrap();
    let err = by_name.check_bucket().await.unwrap_err();
    assert_eq!(err.category().as_str(), "StorePolicyRefused", "{err}");
    let text = err.to_string();
    assert!(text.contains("localhost resolves to an address that is refused by the controller's store policy (--store-denied-hosts "), "{text}");
    assert!(
        !text.contains("127.0.0.1"),
        "the resolved address is not told: {text}"
    );
    assert_eq!(store.bytes_sent(), 0, "nothing reached the store");

    // An address as written, and plain http: refused before a request exists.
    for (endpoint, denied, deny_insecure, words) in [
        (
            store.endpoint().to_string(),
            vec!["127.0.0.1"],
            false,
            "127.0.0.1 is refused by the controller's store policy (--store-denied-hosts 127.0.0.1/32)",
        ),
        (
            format!("http://169.254.169.254:{port}"),
            vec![],
            false,
            "169.254.169.254 is a link-local address",
        ),
        (
            store.endpoint().to_string(),
            vec![],
            true,
            "plain http stores (insecure: true) are not allowed",
        ),
    ] {
        let Err(err) = StoreClient::with_policy(
            &spec(endpoint.clone()),
            credentials(),
            None,
            policy(&denied, deny_insecure),
        ) else {
            panic!("{endpoint}: a client was made");
        };
        assert_eq!(err.category().as_str(), "StorePolicyRefused", "{err}");
        assert!(err.to_string().contains(words), "{endpoint}: {err}");
    }

    // The same store under the default policy is reached.
    let reached = StoreClient::with_policy(
        &spec(format!("http://localhost:{port}")),
        credentials(),
        None,
        Arc::new(StorePolicy::default()),
    )
    .unwrap();
    let _answered = reached.check_bucket().await;
    assert!(store.bytes_sent() > 0, "the default policy lets loopback through");
}
