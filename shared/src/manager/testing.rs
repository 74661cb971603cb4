//! Test helpers for the manager runtime: a self-signed webhook certificate in a directory, and
//! an HTTPS client that trusts exactly that certificate.
//!
//! Only compiled with the `testing` feature; helpers panic on setup failures.
#![allow(clippy::panic, clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::webhook::{CERT_FILE, KEY_FILE};

/// A self-signed serving certificate (ECDSA P-256) for `localhost` and 127.0.0.1.
#[derive(Clone, Debug)]
pub struct SelfSignedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl SelfSignedCert {
    pub fn generate() -> Self {
        let certified =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("generate a self-signed certificate");
        SelfSignedCert {
            cert_pem: certified.cert.pem(),
            key_pem: certified.signing_key.serialize_pem(),
        }
    }

    /// Write `tls.crt` and `tls.key` into `dir` (created if needed), as cert-manager's Secret
    /// mount would hold them.
    pub fn write_to(&self, dir: &Path) {
        std::fs::create_dir_all(dir).expect("create the cert dir");
        std::fs::write(dir.join(CERT_FILE), &self.cert_pem).expect("write tls.crt");
        std::fs::write(dir.join(KEY_FILE), &self.key_pem).expect("write tls.key");
    }
}

/// A fresh, empty directory under `base` (e.g. `env!("CARGO_TARGET_TMPDIR")`).
pub fn fresh_dir(base: &Path, prefix: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = base.join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a test dir");
    dir
}

/// An HTTPS client (ring provider) that trusts only `cert_pem`, for one connection per request
/// (so a reloaded server certificate is seen by the next request).
pub fn https_client_trusting(cert_pem: &str) -> reqwest::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots
            .add(cert.expect("parse the certificate"))
            .expect("trust the certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("build the HTTPS client")
}

/// A plain HTTP client for the probe and metrics servers.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("build the HTTP client")
}
