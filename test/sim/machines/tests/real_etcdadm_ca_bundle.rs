#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The upstream etcdadm on the `ca.crt` and `ca.key` a rotating member's user data carries
//! (docs/security.md, "Rotating the etcd CA"): for each bundle of the rotation, as
//! `contract::ca::member_ca` makes it and the bootstrap provider writes it verbatim,
//! `etcdadm init phase certificates` signs the member's server, peer and client certificates with
//! the bundle's first CA and leaves the bundle in `ca.crt` as it was (where the etcd it configures
//! reads both `--trusted-ca-file` and `--peer-trusted-ca-file`). A bundle whose first
//! certificate is not the key's is refused by etcdadm: the signer must come first. Needs the
//! etcdadm binary (`target/etcdadm/etcdadm`, see ../shared/tools/etcdadm); no root.

use std::path::Path;
use std::process::Command;

use etcdadm_shared::contract::ca::{bundle_annotation, member_ca};
use etcdadm_shared::pki::{CertificateAuthority, certificates_der};
use etcdadm_shared::testing::TempDir;
use etcdadm_sim_machines::real_etcdadm::etcdadm_binary;

/// Run `etcdadm init phase certificates` on `certs_dir`; its combined output and success.
fn certificates_phase(certs_dir: &Path) -> (bool, String) {
    let etcdadm = etcdadm_binary().unwrap_or_else(|hint| panic!("{hint}"));
    let output = Command::new(etcdadm)
        .args([
            "init",
            "phase",
            "certificates",
            "--name",
            "m1",
            "--bind-address",
            "127.0.0.1",
        ])
        .arg("--certs-dir")
        .arg(certs_dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn write_ca(dir: &Path, cert_pem: &str, key_pem: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.crt"), cert_pem).unwrap();
    std::fs::write(dir.join("ca.key"), key_pem).unwrap();
}

fn leaf(dir: &Path, base: &str) -> Vec<u8> {
    let pem = std::fs::read_to_string(dir.join(format!("{base}.crt"))).unwrap();
    certificates_der(&pem).unwrap().remove(0)
}

#[test]
fn upstream_etcdadm_signs_with_the_bundles_first_ca_and_keeps_the_bundle() {
    let old = CertificateAuthority::generate("etcd-ca").unwrap();
    let new = CertificateAuthority::generate("etcd-ca-rotated").unwrap();
    let known = [&old, &new];
    let tmp = TempDir::new("etcdadm-ca-bundle");
    let bundles: [(&str, Vec<&CertificateAuthority>, &CertificateAuthority); 3] = [
        ("trust-both-old-signs", vec![&old, &new], &old),
        ("trust-both-new-signs", vec![&new, &old], &new),
        ("new-alone", vec![&new], &new),
    ];
    for (name, cas, signer) in bundles {
        let member = member_ca(Some(&bundle_annotation(&cas).unwrap()), &known).unwrap();
        let dir = tmp.path().join(name);
        write_ca(&dir, member.cert_pem(), member.key_pem());
        let (ok, output) = certificates_phase(&dir);
        assert!(ok, "{name}: etcdadm failed:\n{output}");
        for base in ["server", "peer", "etcdctl-etcd-client", "apiserver-etcd-client"] {
            let der = leaf(&dir, base);
            assert!(
                signer.signed(&der),
                "{name}: {base}.crt is not signed by the bundle's first CA"
            );
            for other in known.iter().filter(|ca| !std::ptr::eq(**ca, signer)) {
                assert!(!other.signed(&der), "{name}: {base}.crt signed by the other CA");
            }
        }
        let kept = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
        assert_eq!(kept, member.cert_pem(), "{name}: etcdadm rewrote ca.crt");
        assert_eq!(certificates_der(&kept).unwrap().len(), cas.len(), "{name}");
    }

    // The key of the second certificate: etcdadm refuses to sign.
    let dir = tmp.path().join("signer-not-first");
    write_ca(
        &dir,
        &format!("{}{}", old.cert_pem(), new.cert_pem()),
        new.key_pem(),
    );
    let (ok, output) = certificates_phase(&dir);
    assert!(
        !ok,
        "etcdadm signed with a key that is not the first certificate's:\n{output}"
    );
    assert!(output.contains("doesn't match parent's PublicKey"), "{output}");
}
