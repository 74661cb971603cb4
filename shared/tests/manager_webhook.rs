//! The webhook server over real TLS: AdmissionReviews in and out, unreadable reviews answered
//! as invalid, outcomes counted, and a rotated certificate served without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use etcdadm_shared::manager::admission::{self, AdmissionRequest, AdmissionResponse, DynamicObject};
use etcdadm_shared::manager::testing::{SelfSignedCert, fresh_dir, https_client_trusting};
use etcdadm_shared::manager::{Metrics, Shutdown, WebhookRoutes, WebhookServer};
use etcdadm_shared::validation::FieldError;
use serde_json::{Value, json};

/// Denies objects named `bad`, with a field error; allows the rest.
fn names_must_not_be_bad(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let errors = match &req.object {
        Some(o) if o.metadata.name.as_deref() == Some("bad") => {
            vec![FieldError::new("metadata.name", "must not be \"bad\"")]
        }
        _ => vec![],
    };
    admission::validated(&req, &errors)
}

fn review(name: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{name}"),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": name,
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}},
        }
    })
}

async fn post(client: &reqwest::Client, url: &str, body: String) -> reqwest::Result<Value> {
    client.post(url).body(body).send().await?.json().await
}

#[tokio::test]
async fn reviews_are_answered_over_tls_and_a_rotated_certificate_is_picked_up() {
    let dir = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "webhook-reload");
    let first = SelfSignedCert::generate();
    first.write_to(&dir);
    let metrics = Metrics::new();
    let routes = WebhookRoutes::new().route("/validate-configmap", names_must_not_be_bad);
    let server = WebhookServer::new("127.0.0.1:0".parse().unwrap(), &dir, &routes, &metrics)
        .reload_interval(Duration::from_millis(100))
        .bind()
        .await
        .unwrap();
    let url = format!(
        "https://localhost:{}/validate-configmap",
        server.local_addr().port()
    );
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(server.serve(shutdown.signal()));
    let trusting_first = https_client_trusting(&first.cert_pem);

    let allowed = post(&trusting_first, &url, review("good").to_string())
        .await
        .unwrap();
    assert_eq!(allowed["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(allowed["kind"], "AdmissionReview");
    assert_eq!(allowed["response"]["uid"], "uid-good");
    assert_eq!(allowed["response"]["allowed"], true);

    let denied = post(&trusting_first, &url, review("bad").to_string())
        .await
        .unwrap();
    assert_eq!(denied["response"]["uid"], "uid-bad");
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(
        denied["response"]["status"]["message"],
        "ConfigMap default/bad is invalid: metadata.name: must not be \"bad\""
    );
    assert_eq!(denied["response"]["status"]["code"], 422);
    assert_eq!(denied["response"]["status"]["reason"], "Invalid");
    assert_eq!(
        denied["response"]["status"]["details"]["causes"][0]["field"],
        "metadata.name"
    );

    let garbage = post(&trusting_first, &url, "{not json".into()).await.unwrap();
    assert_eq!(garbage["response"]["allowed"], false);
    assert!(
        garbage["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not an AdmissionReview"),
        "{garbage}"
    );
    let no_request = post(
        &trusting_first,
        &url,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(no_request["response"]["allowed"], false);

    let text = metrics.encode().unwrap();
    for line in [
        r#"etcdadm_admission_requests_total{path="/validate-configmap",outcome="allowed"} 1"#,
        r#"etcdadm_admission_requests_total{path="/validate-configmap",outcome="denied"} 1"#,
        r#"etcdadm_admission_requests_total{path="/validate-configmap",outcome="invalid"} 2"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }

    // cert-manager rotates the Secret: a new key and certificate land in the directory.
    let second = SelfSignedCert::generate();
    second.write_to(&dir);
    let trusting_second = https_client_trusting(&second.cert_pem);
    let deadline = Instant::now() + Duration::from_secs(5);
    while post(&trusting_second, &url, review("good").to_string())
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        post(&trusting_first, &url, review("good").to_string())
            .await
            .is_err(),
        "the old certificate is no longer served"
    );

    // A broken pair (the key of another certificate) is not swapped in.
    let third = SelfSignedCert::generate();
    std::fs::write(dir.join("tls.crt"), &third.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    post(&trusting_second, &url, review("good").to_string())
        .await
        .expect("the last good certificate is still served");

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn binding_without_a_certificate_says_where_it_looked() {
    let dir = fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "webhook-missing");
    let routes = WebhookRoutes::new().route("/x", names_must_not_be_bad);
    let error = WebhookServer::new("127.0.0.1:0".parse().unwrap(), &dir, &routes, &Metrics::new())
        .bind()
        .await
        .err()
        .expect("no certificate");
    let message = error.to_string();
    assert!(message.contains(&dir.display().to_string()), "{message}");
    assert!(message.contains("tls.crt"), "{message}");
}
