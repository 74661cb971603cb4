//! The etcd PKI: an RSA CA (etcdadm refuses any other key type) and the certificates it signs.
//!
//! The CA key is stored as PKCS#1 PEM (`RSA PRIVATE KEY`), as etcdadm writes it; PKCS#8 is read
//! too, because Secrets made by Go tools carry it. Nothing here ever replaces an existing CA.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData, SanType,
};
use rsa::RsaPrivateKey;
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPrivateKey};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey, LineEnding};

/// Lifetime of a generated CA (10 years, as the spec requires).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of issued leaf certificates unless a caller asks otherwise (1 year, like etcdadm).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Clock skew tolerated on `notBefore`.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// RSA key size for the CA and RSA leaves.
const RSA_BITS: usize = 2048;

/// What went wrong with keys or certificates; messages say which input is at fault.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate is not valid PEM/X.509: {0}")]
    BadCertificate(String),
    #[error("private key is not a valid PEM key: {0}")]
    BadKey(String),
    #[error("private key is not RSA ({0}); etcdadm requires an RSA CA key")]
    NotRsa(String),
    #[error("certificate and private key do not match")]
    KeyMismatch,
    #[error("certificate is not a CA (basicConstraints CA:TRUE missing)")]
    NotCa,
    #[error("generating a key or certificate failed: {0}")]
    Generate(String),
}

fn gen_err(e: impl std::fmt::Display) -> PkiError {
    PkiError::Generate(e.to_string())
}

/// An etcd CA that can sign certificates.
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    key: KeyPair,
    not_after: SystemTime,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new RSA-2048 CA, valid for ten years, key stored as PKCS#1.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let rsa_key = RsaPrivateKey::new(&mut rand::rngs::OsRng, RSA_BITS).map_err(gen_err)?;
        let key_pem = rsa_key.to_pkcs1_pem(LineEnding::LF).map_err(gen_err)?.to_string();
        let key = rcgen_rsa_key(&rsa_key)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_only(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        set_validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key).map_err(gen_err)?;
        let cert_pem = cert.pem();
        let not_after = cert_not_after(&cert_pem)?;
        Ok(CertificateAuthority {
            cert_pem,
            key_pem,
            key,
            not_after,
        })
    }

    /// Load a CA from PEM (key in PKCS#1 or PKCS#8). Refuses non-RSA keys, non-CA certificates
    /// and a key that does not belong to the certificate.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let rsa_key = parse_rsa_key(key_pem)?;
        let der = first_cert_der(cert_pem)?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::BadCertificate(e.to_string()))?;
        if !cert.is_ca() {
            return Err(PkiError::NotCa);
        }
        let public = rsa_key.to_public_key().to_public_key_der().map_err(gen_err)?;
        if cert.tbs_certificate.subject_pki.raw != public.as_bytes() {
            return Err(PkiError::KeyMismatch);
        }
        let not_after = to_system_time(cert.validity().not_after.timestamp());
        let key = rcgen_rsa_key(&rsa_key)?;
        Ok(CertificateAuthority {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            key,
            not_after,
        })
    }

    /// The same CA with `others` trusted beside it: its `cert_pem` is a bundle, this CA's own
    /// certificate first (what signs, as etcdadm and openssl read the first certificate of
    /// `ca.crt`), then each other CA's, as `--trusted-ca-file` reads them all.
    pub fn trusting(&self, others: &[&CertificateAuthority]) -> Result<Self, PkiError> {
        let mut bundle = der_to_pem(&first_cert_der(&self.cert_pem)?);
        for other in others {
            bundle.push_str(&der_to_pem(&first_cert_der(other.cert_pem())?));
        }
        CertificateAuthority::from_pem(&bundle, &self.key_pem)
    }

    /// SHA-256 of the CA's own certificate (DER), lowercase hex: how a CA is named across
    /// Secrets and annotations.
    pub fn fingerprint(&self) -> Result<String, PkiError> {
        Ok(der_fingerprint(&first_cert_der(&self.cert_pem)?))
    }

    /// Whether this CA's key signed the certificate `leaf_der` (as a TLS peer presents it).
    pub fn signed(&self, leaf_der: &[u8]) -> bool {
        let Ok(ca_der) = first_cert_der(&self.cert_pem) else {
            return false;
        };
        let (Ok((_, leaf)), Ok((_, ca))) = (
            x509_parser::parse_x509_certificate(leaf_der),
            x509_parser::parse_x509_certificate(&ca_der),
        ) else {
            return false;
        };
        leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA key, PEM, exactly as stored (PKCS#1 when generated here).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// When the CA expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Sign a new leaf certificate with a fresh key.
    pub fn issue(&self, request: &LeafRequest) -> Result<IssuedCertificate, PkiError> {
        let (key, key_pem) = match request.key_type {
            KeyType::Rsa2048 => {
                let rsa_key = RsaPrivateKey::new(&mut rand::rngs::OsRng, RSA_BITS).map_err(gen_err)?;
                let pem = rsa_key.to_pkcs1_pem(LineEnding::LF).map_err(gen_err)?.to_string();
                (rcgen_rsa_key(&rsa_key)?, pem)
            }
            KeyType::EcdsaP256 => {
                let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(gen_err)?;
                let pem = key.serialize_pem();
                (key, pem)
            }
        };
        let mut params = CertificateParams::default();
        let mut dn = common_name_only(&request.common_name);
        for org in &request.organizations {
            dn.push(DnType::OrganizationName, org.as_str());
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if request.usage.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if request.usage.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        for name in &request.dns_names {
            let name = name
                .clone()
                .try_into()
                .map_err(|_| PkiError::Generate(format!("bad DNS name {name:?}")))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in &request.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, request.validity);
        // The first certificate signs: `cert_pem` may be a bundle (a CA rotation's `ca.crt`).
        let signer = rustls::pki_types::CertificateDer::from(first_cert_der(&self.cert_pem)?);
        let issuer = Issuer::from_ca_cert_der(&signer, &self.key).map_err(gen_err)?;
        let cert = params.signed_by(&key, &issuer).map_err(gen_err)?;
        let cert_pem = cert.pem();
        let not_after = cert_not_after(&cert_pem)?;
        Ok(IssuedCertificate {
            cert_pem,
            key_pem,
            not_after,
        })
    }
}

/// Key algorithm of an issued certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// What etcdadm and kubeadm issue; the default for certificates that leave this process.
    Rsa2048,
    /// Cheap to generate; for short-lived in-memory certificates.
    EcdsaP256,
}

/// Extended key usages of a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub client: bool,
    pub server: bool,
}

/// What to put in a leaf certificate.
#[derive(Clone, Debug)]
pub struct LeafRequest {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub usage: Usage,
    pub validity: Duration,
    pub key_type: KeyType,
}

impl LeafRequest {
    /// The kube-apiserver's etcd client certificate: CN `<cluster>-kube-apiserver-etcd-client`,
    /// O `system:masters`, clientAuth.
    pub fn apiserver_etcd_client(cluster: &str) -> Self {
        LeafRequest {
            common_name: crate::names::apiserver_client_common_name(cluster),
            organizations: vec!["system:masters".into()],
            dns_names: vec![],
            ips: vec![],
            usage: Usage {
                client: true,
                server: false,
            },
            validity: LEAF_VALIDITY,
            key_type: KeyType::Rsa2048,
        }
    }

    /// A short-lived client certificate held in memory by a controller.
    pub fn in_memory_client(common_name: &str, validity: Duration) -> Self {
        LeafRequest {
            common_name: common_name.into(),
            organizations: vec![],
            dns_names: vec![],
            ips: vec![],
            usage: Usage {
                client: true,
                server: false,
            },
            validity,
            key_type: KeyType::EcdsaP256,
        }
    }

    /// An etcd server/peer certificate for a member: serverAuth and clientAuth, SANs for its
    /// names and addresses.
    pub fn member(name: &str, dns_names: Vec<String>, ips: Vec<IpAddr>) -> Self {
        LeafRequest {
            common_name: name.into(),
            organizations: vec![],
            dns_names,
            ips,
            usage: Usage {
                client: true,
                server: true,
            },
            validity: LEAF_VALIDITY,
            key_type: KeyType::Rsa2048,
        }
    }
}

/// A signed leaf certificate and its private key, PEM.
#[derive(Clone)]
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Parse an RSA private key in PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8 (`PRIVATE KEY`) PEM.
pub fn parse_rsa_key(key_pem: &str) -> Result<RsaPrivateKey, PkiError> {
    let block = pem_label(key_pem).ok_or_else(|| PkiError::BadKey("no PEM block".into()))?;
    match block.as_str() {
        "RSA PRIVATE KEY" => {
            RsaPrivateKey::from_pkcs1_pem(key_pem.trim()).map_err(|e| PkiError::BadKey(e.to_string()))
        }
        "PRIVATE KEY" => RsaPrivateKey::from_pkcs8_pem(key_pem.trim()).map_err(|e| match e {
            rsa::pkcs8::Error::PublicKey(_) | rsa::pkcs8::Error::KeyMalformed => {
                PkiError::NotRsa("PKCS#8 key of another algorithm".into())
            }
            other => PkiError::BadKey(other.to_string()),
        }),
        "EC PRIVATE KEY" => Err(PkiError::NotRsa("EC key".into())),
        other => Err(PkiError::BadKey(format!("unexpected PEM block {other:?}"))),
    }
}

/// Expiry (`notAfter`) of the first certificate in a PEM bundle.
pub fn cert_not_after(cert_pem: &str) -> Result<SystemTime, PkiError> {
    Ok(der_validity(&first_cert_der(cert_pem)?)?.1)
}

/// Validity (`notBefore`, `notAfter`) of the first certificate in a PEM bundle.
pub fn cert_validity(cert_pem: &str) -> Result<(SystemTime, SystemTime), PkiError> {
    der_validity(&first_cert_der(cert_pem)?)
}

/// Validity (`notBefore`, `notAfter`) of one DER certificate, as a TLS peer presents it.
pub fn der_validity(der: &[u8]) -> Result<(SystemTime, SystemTime), PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::BadCertificate(e.to_string()))?;
    let validity = cert.validity();
    Ok((
        to_system_time(validity.not_before.timestamp()),
        to_system_time(validity.not_after.timestamp()),
    ))
}

/// Whether a certificate and a private key (RSA or ECDSA, any PEM form rustls reads) belong
/// together.
pub fn cert_matches_key(cert_pem: &str, key_pem: &str) -> Result<bool, PkiError> {
    let der = first_cert_der(cert_pem)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::BadCertificate(e.to_string()))?;
    let spki = match parse_rsa_key(key_pem) {
        Ok(rsa_key) => rsa_key
            .to_public_key()
            .to_public_key_der()
            .map_err(gen_err)?
            .as_bytes()
            .to_vec(),
        Err(PkiError::NotRsa(_)) => KeyPair::from_pem(key_pem)
            .map_err(|e| PkiError::BadKey(e.to_string()))?
            .subject_public_key_info(),
        Err(e) => return Err(e),
    };
    Ok(cert.tbs_certificate.subject_pki.raw == spki.as_slice())
}

/// A rustls client configuration for mutual TLS: trust only `ca_pem`, present `cert_pem`/`key_pem`.
pub fn client_tls_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::ClientConfig, PkiError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| PkiError::BadCertificate(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| PkiError::BadCertificate(e.to_string()))?;
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::BadCertificate(e.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| PkiError::BadKey(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(gen_err)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| PkiError::BadKey(e.to_string()))
}

/// A rustls client configuration for mutual TLS with members that may trust any of several
/// CAs (a CA rotation): every certificate of `roots_pem` is trusted, and of `identities` (each a
/// certificate and key issued by one of those CAs) the one whose issuer the member names among
/// the CAs it accepts (TLS `certificate_authorities`, which Go's servers send) is presented; the
/// first when it names none of them.
pub fn client_tls_config_each(
    roots_pem: &str,
    identities: &[(&str, &str)],
) -> Result<rustls::ClientConfig, PkiError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        let cert = cert.map_err(|e| PkiError::BadCertificate(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| PkiError::BadCertificate(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(PkiError::BadCertificate("no CA certificate to trust".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut keys = Vec::new();
    for (cert_pem, key_pem) in identities {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PkiError::BadCertificate(e.to_string()))?;
        let leaf = chain
            .first()
            .ok_or_else(|| PkiError::BadCertificate("no CERTIFICATE block".into()))?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(leaf).map_err(|e| PkiError::BadCertificate(e.to_string()))?;
        let issuer = parsed.issuer().as_raw().to_vec();
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| PkiError::BadKey(e.to_string()))?;
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| PkiError::BadKey(e.to_string()))?;
        keys.push((issuer, Arc::new(rustls::sign::CertifiedKey::new(chain, signing))));
    }
    if keys.is_empty() {
        return Err(PkiError::BadKey("no client identity".into()));
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(gen_err)?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(ByAcceptedIssuer { keys })))
}

/// Presents the client identity whose issuer the server accepts.
#[derive(Debug)]
struct ByAcceptedIssuer {
    /// Each identity with its issuer's distinguished name (DER), in order of preference.
    keys: Vec<(Vec<u8>, Arc<rustls::sign::CertifiedKey>)>,
}

impl rustls::client::ResolvesClientCert for ByAcceptedIssuer {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.keys
            .iter()
            .find(|(issuer, _)| root_hint_subjects.contains(&issuer.as_slice()))
            .or_else(|| self.keys.first())
            .map(|(_, key)| key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// SHA-256 of `der`, lowercase hex.
pub fn der_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every certificate of a PEM bundle, DER.
pub fn certificates_der(pem: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::BadCertificate(e.to_string()))
}

/// One DER certificate as PEM.
fn der_to_pem(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn rcgen_rsa_key(rsa_key: &RsaPrivateKey) -> Result<KeyPair, PkiError> {
    let pkcs8 = rsa_key.to_pkcs8_der().map_err(gen_err)?;
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from(pkcs8.as_bytes());
    KeyPair::from_pkcs8_der_and_sign_algo(&der, &PKCS_RSA_SHA256).map_err(gen_err)
}

fn common_name_only(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
}

fn pem_label(pem: &str) -> Option<String> {
    let start = pem.find("-----BEGIN ")? + "-----BEGIN ".len();
    let end = pem[start..].find("-----")? + start;
    Some(pem[start..end].to_string())
}

fn first_cert_der(cert_pem: &str) -> Result<Vec<u8>, PkiError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .ok_or_else(|| PkiError::BadCertificate("no CERTIFICATE block".into()))?
        .map(|c| c.to_vec())
        .map_err(|e| PkiError::BadCertificate(e.to_string()))
}

fn to_system_time(unix: i64) -> SystemTime {
    if unix >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(unix.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(unix.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use std::sync::OnceLock;

    /// RSA generation is the slow part; tests share one CA where the test does not care.
    fn shared_ca() -> &'static CertificateAuthority {
        static CA: OnceLock<CertificateAuthority> = OnceLock::new();
        CA.get_or_init(|| CertificateAuthority::generate("etcd-ca").unwrap())
    }

    fn parse(pem: &str) -> Vec<u8> {
        first_cert_der(pem).unwrap()
    }

    fn verify_signed_by(leaf_pem: &str, ca_pem: &str) -> bool {
        let leaf_der = parse(leaf_pem);
        let ca_der = parse(ca_pem);
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
    }

    #[test]
    fn generated_ca_is_rsa_pkcs1_self_signed_ten_years() {
        let ca = shared_ca();
        assert!(ca.key_pem().starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        assert!(verify_signed_by(ca.cert_pem(), ca.cert_pem()));
        let der = parse(ca.cert_pem());
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(cert.is_ca());
        let years = ca
            .not_after()
            .duration_since(SystemTime::now())
            .unwrap()
            .as_secs()
            / (365 * 24 * 3600);
        assert_eq!(years, 9, "a fresh 10-year CA has 9 full years left");
        assert!(cert_matches_key(ca.cert_pem(), ca.key_pem()).unwrap());
    }

    #[test]
    fn ca_round_trips_through_pem_in_pkcs1_and_pkcs8() {
        let ca = shared_ca();
        let reloaded = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(reloaded.not_after(), ca.not_after());
        let pkcs8 = parse_rsa_key(ca.key_pem())
            .unwrap()
            .to_pkcs8_pem(LineEnding::LF)
            .unwrap()
            .to_string();
        assert!(pkcs8.starts_with("-----BEGIN PRIVATE KEY-----"));
        let from_pkcs8 = CertificateAuthority::from_pem(ca.cert_pem(), &pkcs8).unwrap();
        let leaf = from_pkcs8
            .issue(&LeafRequest::in_memory_client("probe", Duration::from_secs(60)))
            .unwrap();
        assert!(verify_signed_by(&leaf.cert_pem, ca.cert_pem()));
    }

    #[test]
    fn refuses_ecdsa_ca_key() {
        let ec = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&ec).unwrap();
        let err = CertificateAuthority::from_pem(&cert.pem(), &ec.serialize_pem()).unwrap_err();
        assert!(matches!(err, PkiError::NotRsa(_)), "{err}");
        assert!(err.to_string().contains("RSA"));
        let sec1 = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI\n-----END EC PRIVATE KEY-----\n";
        assert!(matches!(parse_rsa_key(sec1), Err(PkiError::NotRsa(_))));
    }

    #[test]
    fn refuses_mismatched_key_garbage_and_non_ca() {
        let ca = shared_ca();
        let other_key = RsaPrivateKey::new(&mut rand::rngs::OsRng, 1024).unwrap();
        let other_pem = other_key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string();
        assert!(matches!(
            CertificateAuthority::from_pem(ca.cert_pem(), &other_pem),
            Err(PkiError::KeyMismatch)
        ));
        assert!(matches!(
            CertificateAuthority::from_pem("not pem", ca.key_pem()),
            Err(PkiError::BadCertificate(_))
        ));
        assert!(matches!(
            CertificateAuthority::from_pem(ca.cert_pem(), "junk"),
            Err(PkiError::BadKey(_))
        ));
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client("c1")).unwrap();
        assert!(matches!(
            CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem),
            Err(PkiError::NotCa)
        ));
    }

    #[test]
    fn apiserver_client_cert_has_the_names_kcp_expects() {
        let ca = shared_ca();
        let leaf = ca.issue(&LeafRequest::apiserver_etcd_client("prod")).unwrap();
        assert!(verify_signed_by(&leaf.cert_pem, ca.cert_pem()));
        assert!(leaf.key_pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        assert!(cert_matches_key(&leaf.cert_pem, &leaf.key_pem).unwrap());
        let der = parse(&leaf.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        let org: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        assert_eq!(cn, ["prod-kube-apiserver-etcd-client"]);
        assert_eq!(org, ["system:masters"]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
    }

    #[test]
    fn member_cert_carries_sans_and_both_usages() {
        let ca = shared_ca();
        let ip: IpAddr = "127.0.1.7".parse().unwrap();
        let leaf = ca
            .issue(&LeafRequest::member("etcd-a", vec!["etcd-a".into()], vec![ip]))
            .unwrap();
        let der = parse(&leaf.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        let text = format!("{:?}", san.general_names);
        assert!(text.contains("etcd-a") && text.contains("127"), "{text}");
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && eku.server_auth);
    }

    #[test]
    fn in_memory_client_is_short_lived_ecdsa() {
        let ca = shared_ca();
        let leaf = ca
            .issue(&LeafRequest::in_memory_client(
                "etcdadm-controller",
                Duration::from_secs(3600),
            ))
            .unwrap();
        assert!(verify_signed_by(&leaf.cert_pem, ca.cert_pem()));
        let left = leaf.not_after.duration_since(SystemTime::now()).unwrap();
        assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3500));
        assert!(cert_matches_key(&leaf.cert_pem, &leaf.key_pem).unwrap());
        assert!(client_tls_config(ca.cert_pem(), &leaf.cert_pem, &leaf.key_pem).is_ok());
    }

    #[test]
    fn a_ca_trusting_another_signs_with_its_own_key_and_lists_itself_first() {
        let (old, new) = (
            shared_ca(),
            CertificateAuthority::generate("etcd-ca-next").unwrap(),
        );
        let bundle = new.trusting(&[old]).unwrap();
        let certs = certificates_der(bundle.cert_pem()).unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(der_fingerprint(&certs[0]), new.fingerprint().unwrap());
        assert_eq!(der_fingerprint(&certs[1]), old.fingerprint().unwrap());
        assert_eq!(bundle.fingerprint().unwrap(), new.fingerprint().unwrap());
        assert_ne!(old.fingerprint().unwrap(), new.fingerprint().unwrap());
        assert_eq!(bundle.not_after(), new.not_after());
        // What a member's etcdadm issues from this `ca.crt` and `ca.key`: signed by the new CA.
        let leaf = bundle
            .issue(&LeafRequest::member("etcd-a", vec![], vec![]))
            .unwrap();
        let der = parse(&leaf.cert_pem);
        assert!(new.signed(&der) && bundle.signed(&der) && !old.signed(&der));
        assert!(!new.signed(&[1, 2, 3]));
        // The key must be the first certificate's: a bundle led by the other CA is refused.
        let led_by_old = format!("{}{}", old.cert_pem(), new.cert_pem());
        assert!(matches!(
            CertificateAuthority::from_pem(&led_by_old, new.key_pem()),
            Err(PkiError::KeyMismatch)
        ));
        // Trusting nothing else is the CA itself.
        assert_eq!(
            new.trusting(&[]).unwrap().cert_pem().trim(),
            new.cert_pem().trim()
        );
    }

    #[test]
    fn a_client_of_several_cas_presents_the_identity_the_member_accepts() {
        let (old, new) = (
            shared_ca(),
            CertificateAuthority::generate("etcd-ca-next").unwrap(),
        );
        let issue = |ca: &CertificateAuthority| {
            ca.issue(&LeafRequest::in_memory_client(
                "etcdadm-controller",
                Duration::from_secs(60),
            ))
            .unwrap()
        };
        let (from_old, from_new) = (issue(old), issue(&new));
        let roots = format!("{}{}", old.cert_pem(), new.cert_pem());
        let identities = [
            (from_old.cert_pem.as_str(), from_old.key_pem.as_str()),
            (from_new.cert_pem.as_str(), from_new.key_pem.as_str()),
        ];
        assert!(client_tls_config_each(&roots, &identities).is_ok());
        assert!(client_tls_config_each(&roots, &[]).is_err());
        assert!(client_tls_config_each("junk", &identities).is_err());
        let subject = |ca: &CertificateAuthority| {
            let der = parse(ca.cert_pem());
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            cert.subject().as_raw().to_vec()
        };
        let issuer_of = |leaf: &IssuedCertificate| {
            let der = parse(&leaf.cert_pem);
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            cert.issuer().as_raw().to_vec()
        };
        let provider = rustls::crypto::ring::default_provider();
        let keys = [&from_old, &from_new]
            .iter()
            .map(|leaf| {
                let chain = vec![rustls::pki_types::CertificateDer::from(parse(&leaf.cert_pem))];
                let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
                let signing = provider.key_provider.load_private_key(key).unwrap();
                (
                    issuer_of(leaf),
                    Arc::new(rustls::sign::CertifiedKey::new(chain, signing)),
                )
            })
            .collect();
        let resolver = ByAcceptedIssuer { keys };
        use rustls::client::ResolvesClientCert;
        let presented = |hints: &[&[u8]]| {
            let key = resolver.resolve(hints, &[]).unwrap();
            key.cert[0].to_vec()
        };
        let (old_subject, new_subject) = (subject(old), subject(&new));
        assert!(new.signed(&presented(&[&new_subject])));
        assert!(old.signed(&presented(&[&old_subject])));
        assert!(
            old.signed(&presented(&[&new_subject, &old_subject])),
            "the first accepted"
        );
        assert!(old.signed(&presented(&[])), "no hint: the first identity");
    }

    #[test]
    fn leaf_from_another_ca_does_not_verify() {
        let other = CertificateAuthority::generate("other-ca").unwrap();
        let leaf = other
            .issue(&LeafRequest::in_memory_client("x", Duration::from_secs(60)))
            .unwrap();
        assert!(!verify_signed_by(&leaf.cert_pem, shared_ca().cert_pem()));
    }
}
