//! What the CA rotation sees of the objects it reads (docs/security.md, "Rotating the etcd CA"):
//! the next CA's Secret, each member's `ca-bundle` annotation and presented certificate, and what
//! the control plane's two Secrets hold, turned into the plain values `ca_rotation` decides from.
//! Pure; nothing here trusts the objects: what cannot be read is reported or left unknown.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use etcdadm_shared::contract::ca::ca_from_secret;
use etcdadm_shared::contract::secret_text;
use etcdadm_shared::names;
use etcdadm_shared::pki::{CertificateAuthority, certificates_der, der_fingerprint};

use super::{Bundle, ControlPlaneCa, Fingerprint, MemberCa, NextCa};

/// The CAs a rotation knows: the current one and, while one is under way, the next.
#[derive(Clone, Copy)]
pub struct KnownCas<'a> {
    pub current: &'a CertificateAuthority,
    pub next: Option<&'a CertificateAuthority>,
}

impl KnownCas<'_> {
    /// The fingerprint of the known CA that signed `der`, if one did.
    pub fn signer_of(&self, der: &[u8]) -> Option<Fingerprint> {
        std::iter::once(self.current)
            .chain(self.next)
            .find(|ca| ca.signed(der))
            .and_then(|ca| ca.fingerprint().ok())
    }
}

/// The request a CA Secret's CA was made for (`ca-rotated-for`), when it says.
pub fn rotated_for(secret: &Secret) -> Option<String> {
    secret
        .annotations()
        .get(names::CA_ROTATED_FOR_ANNOTATION)
        .filter(|v| !v.is_empty())
        .cloned()
}

/// `<cluster>-managed-etcd-next` as the rotation sees it, with its CA when usable. A Secret
/// without the request it was made for is unusable: it was not made by a rotation.
pub fn next_ca(secret: Option<&Secret>, namespace: &str) -> (NextCa, Option<CertificateAuthority>) {
    let Some(secret) = secret else {
        return (NextCa::Missing, None);
    };
    let name = secret.name_any();
    let ca = match ca_from_secret(secret, namespace, &name) {
        Ok(ca) => ca,
        Err(problem) => return (NextCa::Corrupt(problem), None),
    };
    let Some(request) = rotated_for(secret) else {
        return (
            NextCa::Corrupt(format!(
                "Secret {namespace}/{name} has no {} annotation: no rotation made it",
                names::CA_ROTATED_FOR_ANNOTATION
            )),
            None,
        );
    };
    match ca.fingerprint() {
        Ok(fingerprint) => (NextCa::Present { fingerprint, request }, Some(ca)),
        Err(e) => (NextCa::Corrupt(format!("Secret {namespace}/{name}: {e}")), None),
    }
}

/// The bundle a member's EtcdadmConfig annotations name: absent, the current CA alone; None
/// when the annotation is not a list of fingerprints.
pub fn bundle(annotations: &BTreeMap<String, String>, current: &str) -> Option<Bundle> {
    let Some(value) = annotations.get(names::CA_BUNDLE_ANNOTATION) else {
        return Some(Bundle(vec![current.to_string()]));
    };
    let named: Vec<String> = value.split(',').map(|f| f.trim().to_string()).collect();
    let hex = |f: &String| f.len() == 64 && f.bytes().all(|b| b.is_ascii_hexdigit());
    named.iter().all(hex).then_some(Bundle(named))
}

/// One member Machine: its config's annotations (None: the config is gone) and the server
/// certificate (DER) it presented at the last health check.
pub fn member(
    machine: &str,
    config_annotations: Option<&BTreeMap<String, String>>,
    presented: Option<&[u8]>,
    cas: KnownCas<'_>,
    current: &str,
) -> MemberCa {
    MemberCa {
        machine: machine.to_string(),
        bundle: config_annotations.and_then(|a| bundle(a, current)),
        signed_by: presented.and_then(|der| cas.signer_of(der)),
    }
}

/// What the KubeadmControlPlane `kcp` was given: the CAs `<cluster>-etcd` holds and which CA
/// signed `<cluster>-apiserver-etcd-client` (and when it was re-issued), with its rollout.
pub fn control_plane(
    kcp: &str,
    rollout_after: Option<Timestamp>,
    rollout_complete: bool,
    etcd_ca: Option<&Secret>,
    client: Option<&Secret>,
    cas: KnownCas<'_>,
) -> ControlPlaneCa {
    let trusted = etcd_ca
        .and_then(|s| secret_text(s, names::TLS_CERT_KEY))
        .and_then(|pem| certificates_der(&pem).ok())
        .map(|ders| ders.iter().map(|der| der_fingerprint(der)).collect())
        .unwrap_or_default();
    let client_der = client
        .and_then(|s| secret_text(s, names::TLS_CERT_KEY))
        .and_then(|pem| certificates_der(&pem).ok())
        .and_then(|ders| ders.into_iter().next());
    let client_reissued = client
        .and_then(|s| s.annotations().get(names::APISERVER_CLIENT_RENEWED_ANNOTATION))
        .and_then(|t| t.parse().ok());
    ControlPlaneCa {
        kcp: kcp.to_string(),
        trusted,
        client_signed_by: client_der.and_then(|der| cas.signer_of(&der)),
        client_reissued,
        rollout_after,
        rollout_complete,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use etcdadm_shared::contract::bytes;
    use etcdadm_shared::pki::LeafRequest;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::OnceLock;

    fn cas() -> &'static (CertificateAuthority, CertificateAuthority) {
        static CAS: OnceLock<(CertificateAuthority, CertificateAuthority)> = OnceLock::new();
        CAS.get_or_init(|| {
            (
                CertificateAuthority::generate("etcd-ca").unwrap(),
                CertificateAuthority::generate("etcd-ca-rotated").unwrap(),
            )
        })
    }

    fn secret(name: &str, annotations: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.to_string(), bytes(v))).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn the_next_ca_is_usable_only_with_its_pair_and_its_request() {
        let (_, new) = cas();
        let pair = [
            (names::TLS_CERT_KEY, new.cert_pem()),
            (names::TLS_KEY_KEY, new.key_pem()),
        ];
        let made = secret(
            "c1-managed-etcd-next",
            &[(names::CA_ROTATED_FOR_ANNOTATION, "r1")],
            &pair,
        );
        let (view, ca) = next_ca(Some(&made), "ns");
        assert_eq!(
            view,
            NextCa::Present {
                fingerprint: new.fingerprint().unwrap(),
                request: "r1".into()
            }
        );
        assert_eq!(ca.unwrap().fingerprint().unwrap(), new.fingerprint().unwrap());
        assert_eq!(next_ca(None, "ns").0, NextCa::Missing);
        let unmarked = secret("c1-managed-etcd-next", &[], &pair);
        let NextCa::Corrupt(problem) = next_ca(Some(&unmarked), "ns").0 else {
            panic!("an unmarked Secret is not a rotation's")
        };
        assert!(problem.contains("no rotation made it"), "{problem}");
        let keyless = secret(
            "c1-managed-etcd-next",
            &[(names::CA_ROTATED_FOR_ANNOTATION, "r1")],
            &[(names::TLS_CERT_KEY, new.cert_pem())],
        );
        let NextCa::Corrupt(problem) = next_ca(Some(&keyless), "ns").0 else {
            panic!("a Secret without a key is unusable")
        };
        assert!(
            problem.contains("ns/c1-managed-etcd-next has no tls.key"),
            "{problem}"
        );
        assert_eq!(rotated_for(&made).as_deref(), Some("r1"));
        let empty = secret("x", &[(names::CA_ROTATED_FOR_ANNOTATION, "")], &[]);
        assert_eq!(rotated_for(&empty), None);
    }

    #[test]
    fn a_members_bundle_and_signer_come_from_its_config_and_its_handshake() {
        let (old, new) = cas();
        let (o, n) = (old.fingerprint().unwrap(), new.fingerprint().unwrap());
        let known = KnownCas {
            current: old,
            next: Some(new),
        };
        let annotated = BTreeMap::from([(names::CA_BUNDLE_ANNOTATION.to_string(), format!("{n}, {o}"))]);
        let server = new.issue(&LeafRequest::member("m0", vec![], vec![])).unwrap();
        let der = certificates_der(&server.cert_pem).unwrap().remove(0);
        let seen = member("m0", Some(&annotated), Some(&der), known, &o);
        assert_eq!(seen.bundle, Some(Bundle(vec![n.clone(), o.clone()])));
        assert_eq!(seen.signed_by.as_deref(), Some(n.as_str()));
        // No annotation: the current CA alone; no handshake yet: unknown.
        let plain = member("m1", Some(&BTreeMap::new()), None, known, &o);
        assert_eq!(plain.bundle, Some(Bundle(vec![o.clone()])));
        assert_eq!(plain.signed_by, None);
        // The config gone, or an annotation that is not a list of fingerprints.
        assert_eq!(member("m2", None, None, known, &o).bundle, None);
        for bad in ["", "abc", &format!("{o},"), &format!("{o};{n}")] {
            let a = BTreeMap::from([(names::CA_BUNDLE_ANNOTATION.to_string(), bad.to_string())]);
            assert_eq!(bundle(&a, &o), None, "{bad:?}");
        }
        // A certificate neither CA signed, or garbage.
        let stranger = CertificateAuthority::generate("stranger").unwrap();
        let foreign = stranger
            .issue(&LeafRequest::member("m3", vec![], vec![]))
            .unwrap();
        let foreign = certificates_der(&foreign.cert_pem).unwrap().remove(0);
        assert_eq!(member("m3", None, Some(&foreign), known, &o).signed_by, None);
        assert_eq!(member("m3", None, Some(&[1, 2, 3]), known, &o).signed_by, None);
    }

    #[test]
    fn the_control_plane_is_read_from_its_two_secrets() {
        let (old, new) = cas();
        let (o, n) = (old.fingerprint().unwrap(), new.fingerprint().unwrap());
        let known = KnownCas {
            current: old,
            next: Some(new),
        };
        let bundle_pem = format!("{}{}", old.cert_pem(), new.cert_pem());
        let etcd_ca = secret("c1-etcd", &[], &[(names::TLS_CERT_KEY, &bundle_pem)]);
        let leaf = new.issue(&LeafRequest::apiserver_etcd_client("c1")).unwrap();
        let client = secret(
            "c1-apiserver-etcd-client",
            &[(names::APISERVER_CLIENT_RENEWED_ANNOTATION, "2026-03-01T12:00:00Z")],
            &[(names::TLS_CERT_KEY, &leaf.cert_pem)],
        );
        let after: Timestamp = "2026-03-01T12:00:01Z".parse().unwrap();
        let cp = control_plane("cp", Some(after), true, Some(&etcd_ca), Some(&client), known);
        assert_eq!(cp.trusted, [o.clone(), n.clone()]);
        assert_eq!(cp.client_signed_by, Some(n));
        assert_eq!(cp.client_reissued, Some("2026-03-01T12:00:00Z".parse().unwrap()));
        assert_eq!(
            (cp.kcp.as_str(), cp.rollout_after, cp.rollout_complete),
            ("cp", Some(after), true)
        );
        // Missing or unreadable Secrets: nothing trusted, no signer, no time.
        let junk = secret(
            "c1-apiserver-etcd-client",
            &[(names::APISERVER_CLIENT_RENEWED_ANNOTATION, "yesterday")],
            &[(names::TLS_CERT_KEY, "not pem")],
        );
        let unknown = control_plane("cp", None, false, None, Some(&junk), known);
        assert!(unknown.trusted.is_empty());
        assert_eq!((unknown.client_signed_by, unknown.client_reissued), (None, None));
    }
}
