//! A real etcd process run with certificates from `pki` trusts exactly the clients its CA signed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use etcdadm_shared::pki::{CertificateAuthority, LeafRequest};
use etcdadm_shared::testing::{TlsEtcd, mtls_http_client};

#[tokio::test]
async fn etcd_accepts_our_client_certificate_and_refuses_another_ca() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    let etcd = TlsEtcd::start(&ca);
    let health = format!("{}/health", etcd.client_url);

    let ours = ca.issue(&LeafRequest::apiserver_etcd_client("demo")).unwrap();
    let client = mtls_http_client(ca.cert_pem(), &ours);
    let mut last = String::new();
    let mut healthy = false;
    for _ in 0..100 {
        match client.get(&health).send().await {
            Ok(resp) if resp.status().is_success() => {
                let body: serde_json::Value = resp.json().await.unwrap();
                if body["health"] == "true" {
                    healthy = true;
                    break;
                }
                last = body.to_string();
            }
            Ok(resp) => last = format!("status {}", resp.status()),
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        healthy,
        "etcd never reported healthy to our client: {last}\n{}",
        etcd.log()
    );

    // The in-memory (ECDSA) client certificate the controller uses is accepted too.
    let in_memory = ca
        .issue(&LeafRequest::in_memory_client(
            "etcdadm-controller",
            Duration::from_secs(600),
        ))
        .unwrap();
    let resp = mtls_http_client(ca.cert_pem(), &in_memory)
        .get(&health)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // A client certificate from a different CA must not get an answer.
    let other_ca = CertificateAuthority::generate("other-ca").unwrap();
    let foreign = other_ca
        .issue(&LeafRequest::apiserver_etcd_client("demo"))
        .unwrap();
    let refused = mtls_http_client(ca.cert_pem(), &foreign)
        .get(&health)
        .send()
        .await;
    assert!(
        refused.is_err(),
        "etcd answered a client from another CA: {:?}",
        refused.map(|r| r.status())
    );
}
