//! The certificates etcdadm leaves in `--certs-dir`, issued from the CA found there.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use etcdadm_shared::etcd::EtcdTls;
use etcdadm_shared::pki::{CertificateAuthority, KeyType, LEAF_VALIDITY, LeafRequest, PkiError, Usage};

/// Validity of the certificates the stand-in issues, in whole seconds, when a scenario wants
/// members whose certificates expire soon; unset: [`LEAF_VALIDITY`] (365 days), as upstream.
/// The machine runtime sets it (see `MachineSpec::member_certificate_validity`).
pub const CERT_VALIDITY_ENV: &str = "SIM_MEMBER_CERT_VALIDITY_SECONDS";

/// The validity [`CERT_VALIDITY_ENV`] asks for (`None`: unset).
pub fn validity(value: Option<&str>) -> Result<Duration, String> {
    let Some(text) = value else {
        return Ok(LEAF_VALIDITY);
    };
    match text.trim().parse::<u64>() {
        Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
        _ => Err(format!(
            "{CERT_VALIDITY_ENV}={text:?} is not a positive whole number of seconds"
        )),
    }
}

/// File base names, as upstream etcdadm names them.
pub const SERVER: &str = "server";
pub const PEER: &str = "peer";
pub const ETCDCTL_CLIENT: &str = "etcdctl-etcd-client";
pub const APISERVER_CLIENT: &str = "apiserver-etcd-client";

/// Load `<certs_dir>/ca.crt|ca.key`; generate a CA when neither exists, as upstream does.
/// A non-RSA key is refused with upstream's message.
pub fn load_or_create_ca(certs_dir: &Path) -> Result<CertificateAuthority, String> {
    let cert_path = certs_dir.join("ca.crt");
    let key_path = certs_dir.join("ca.key");
    if !cert_path.exists() && !key_path.exists() {
        let ca = CertificateAuthority::generate("etcd-ca").map_err(|e| e.to_string())?;
        write_pair(certs_dir, "ca", ca.cert_pem(), ca.key_pem())?;
        return Ok(ca);
    }
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            format!(
                "failure loading ca certificate authority: {}: {e}",
                path.display()
            )
        })
    };
    let cert = read(&cert_path)?;
    let key = read(&key_path)?;
    CertificateAuthority::from_pem(&cert, &key).map_err(|e| match e {
        PkiError::NotRsa(_) => format!(
            "failure loading ca certificate authority: the private key file {} isn't in RSA format",
            key_path.display()
        ),
        other => format!("failure loading ca certificate authority: {other}"),
    })
}

fn client_request(common_name: &str, validity: Duration) -> LeafRequest {
    LeafRequest {
        common_name: common_name.into(),
        organizations: vec!["system:masters".into()],
        dns_names: vec![],
        ips: vec![],
        usage: Usage {
            client: true,
            server: false,
        },
        validity,
        key_type: KeyType::Rsa2048,
    }
}

/// Who the member certificates are for.
#[derive(Debug, Clone, Copy)]
pub struct MemberIdentity<'a> {
    pub name: &'a str,
    /// The address the member advertises.
    pub ip: IpAddr,
    /// `--server-cert-extra-sans`: IPs and DNS names the server certificate also names.
    pub server_extra_sans: &'a [String],
}

/// Issue every missing leaf, valid for `validity`: server (SANs: name, address, 127.0.0.1 and the
/// extra SANs) and peer (name, address and, unlike upstream's, 127.0.0.1: machines sharing the
/// host's network namespace reach each other from source address 127.0.0.1, which etcd checks
/// against the peer certificate), the etcdctl and kube-apiserver client certificates. Existing
/// pairs are kept, as upstream keeps them.
pub fn ensure_leaf_certificates(
    ca: &CertificateAuthority,
    certs_dir: &Path,
    identity: &MemberIdentity<'_>,
    validity: Duration,
) -> Result<(), String> {
    let name = identity.name;
    let mut server_ips = vec![identity.ip, IpAddr::from([127, 0, 0, 1])];
    let mut server_dns = vec![name.to_string()];
    for san in identity.server_extra_sans {
        match san.parse::<IpAddr>() {
            Ok(ip) if !server_ips.contains(&ip) => server_ips.push(ip),
            Ok(_) => {}
            Err(_) if !server_dns.contains(san) => server_dns.push(san.clone()),
            Err(_) => {}
        }
    }
    let member = |dns: Vec<String>, ips: Vec<IpAddr>| LeafRequest {
        validity,
        ..LeafRequest::member(name, dns, ips)
    };
    let requests = [
        (SERVER, member(server_dns, server_ips)),
        (
            PEER,
            member(
                vec![name.to_string()],
                vec![identity.ip, IpAddr::from([127, 0, 0, 1])],
            ),
        ),
        (
            ETCDCTL_CLIENT,
            client_request(&format!("{name}-etcdctl"), validity),
        ),
        (
            APISERVER_CLIENT,
            client_request("kube-apiserver-etcd-client", validity),
        ),
    ];
    for (base, request) in requests {
        if certs_dir.join(format!("{base}.crt")).exists() && certs_dir.join(format!("{base}.key")).exists() {
            continue;
        }
        let issued = ca
            .issue(&request)
            .map_err(|e| format!("issuing {base} certificate: {e}"))?;
        write_pair(certs_dir, base, &issued.cert_pem, &issued.key_pem)?;
    }
    Ok(())
}

fn write_pair(certs_dir: &Path, base: &str, cert: &str, key: &str) -> Result<(), String> {
    std::fs::create_dir_all(certs_dir).map_err(|e| format!("{}: {e}", certs_dir.display()))?;
    for (path, content, mode) in [
        (certs_dir.join(format!("{base}.crt")), cert, 0o644),
        (certs_dir.join(format!("{base}.key")), key, 0o600),
    ] {
        std::fs::write(&path, content).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The PEM material to talk to etcd as etcdctl does.
pub fn etcdctl_tls(certs_dir: &Path) -> Result<EtcdTls, String> {
    let read = |name: &str| {
        let path = certs_dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
    };
    Ok(EtcdTls {
        ca_pem: read("ca.crt")?,
        cert_pem: read(&format!("{ETCDCTL_CLIENT}.crt"))?,
        key_pem: read(&format!("{ETCDCTL_CLIENT}.key"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_upstreams_year_unless_the_sim_says_otherwise() {
        assert_eq!(validity(None).unwrap(), Duration::from_secs(365 * 24 * 3600));
        assert_eq!(
            validity(Some("1728000")).unwrap(),
            Duration::from_secs(20 * 24 * 3600)
        );
        for bad in ["", "0", "-5", "20d", "1.5"] {
            let err = validity(Some(bad)).unwrap_err();
            assert!(err.contains(CERT_VALIDITY_ENV), "{err}");
        }
    }
}
