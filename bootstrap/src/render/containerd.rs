//! containerd's proxy drop-in and registry mirror, as the reference provider lays them out (EKS-A
//! machine images expect these paths), with values escaped for systemd and TOML.

use etcdadm_shared::api::config::{ProxyConfiguration, RegistryMirrorConfiguration};
use etcdadm_shared::validation::quoted;

use super::error::RenderError;
use super::files::FileEntry;

/// systemd drop-in that gives containerd its proxy environment.
pub const PROXY_DROP_IN_PATH: &str = "/etc/systemd/system/containerd.service.d/http-proxy.conf";
/// TOML appended to containerd's config for the mirror.
pub const MIRROR_CONFIG_APPEND_PATH: &str = "/etc/containerd/config_append.toml";
/// containerd's own config, which the mirror tables are appended to.
const CONTAINERD_CONFIG_PATH: &str = "/etc/containerd/config.toml";
/// The registry whose pulls the mirror serves (EKS-A images come from there).
const MIRRORED_REGISTRY: &str = "public.ecr.aws";

/// Files and runcmd entries that configure containerd.
#[derive(Debug, Default)]
pub struct ContainerdSetup {
    pub files: Vec<FileEntry>,
    pub commands: Vec<String>,
}

/// What proxy and mirror settings need on the machine; empty when neither is set.
pub fn containerd_setup(
    proxy: Option<&ProxyConfiguration>,
    mirror: Option<&RegistryMirrorConfiguration>,
) -> Result<ContainerdSetup, RenderError> {
    let mut setup = ContainerdSetup::default();
    if let Some(proxy) = proxy {
        setup.files.push(FileEntry::generated(
            PROXY_DROP_IN_PATH,
            "0644",
            proxy_drop_in(proxy)?,
        ));
    }
    if let Some(mirror) = mirror {
        let endpoint = mirror_endpoint(mirror)?;
        let ca_cert = mirror.ca_cert.as_deref().filter(|c| !c.is_empty());
        if let Some(ca_cert) = ca_cert {
            setup.files.push(FileEntry::generated(
                &mirror_ca_path(endpoint),
                "0644",
                ca_cert.to_string(),
            ));
        }
        let trust = match (ca_cert, mirror.insecure_skip_verify) {
            (Some(_), _) => MirrorTrust::CaFile,
            (None, Some(true)) => MirrorTrust::SkipVerify,
            (None, _) => MirrorTrust::System,
        };
        setup.files.push(FileEntry::generated(
            MIRROR_CONFIG_APPEND_PATH,
            "0644",
            mirror_config(endpoint, trust),
        ));
        // The echo keeps the appended tables off the last line of a config.toml that does not
        // end in a newline.
        setup.commands.push(format!(
            "echo >> {CONTAINERD_CONFIG_PATH} && cat {MIRROR_CONFIG_APPEND_PATH} >> {CONTAINERD_CONFIG_PATH}"
        ));
    }
    if proxy.is_some() || mirror.is_some() {
        // runcmd runs as root: no sudo, which minimal etcd images may lack.
        setup.commands.push("systemctl daemon-reload".into());
        setup.commands.push("systemctl restart containerd".into());
    }
    Ok(setup)
}

fn proxy_drop_in(proxy: &ProxyConfiguration) -> Result<String, RenderError> {
    let mut out = String::from("[Service]\n");
    let no_proxy = (!proxy.no_proxy.is_empty()).then(|| proxy.no_proxy.join(","));
    for (field, name, value) in [
        ("spec.proxy.httpProxy", "HTTP_PROXY", proxy.http_proxy.clone()),
        ("spec.proxy.httpsProxy", "HTTPS_PROXY", proxy.https_proxy.clone()),
        ("spec.proxy.noProxy", "NO_PROXY", no_proxy),
    ] {
        if let Some(value) = value {
            let escaped = systemd_quoted_value(&value)
                .ok_or_else(|| RenderError::invalid(field, "contains a NUL character"))?;
            out.push_str(&format!("Environment=\"{name}={escaped}\"\n"));
        }
    }
    Ok(out)
}

/// `value` escaped for use inside a double-quoted systemd `Environment=` assignment: systemd
/// unescapes C-style sequences there and expands `%` specifiers. `None` for NUL, which systemd
/// cannot carry.
pub fn systemd_quoted_value(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\0' => return None,
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    Some(out)
}

/// The endpoint is spliced into a file path and TOML keys, so only host[:port][/path] characters
/// pass, and no `.`/`..` segment can move the CA file elsewhere.
fn mirror_endpoint(mirror: &RegistryMirrorConfiguration) -> Result<&str, RenderError> {
    const FIELD: &str = "spec.registryMirror.endpoint";
    let endpoint = mirror.endpoint.as_deref().unwrap_or("");
    if endpoint.is_empty() {
        return Err(RenderError::invalid(
            FIELD,
            "is required when registryMirror is set (host[:port][/path], no scheme)",
        ));
    }
    let chars_ok = endpoint
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '/' | '[' | ']'));
    let segments_ok = endpoint
        .split('/')
        .all(|s| !s.is_empty() && s != "." && s != "..");
    if !chars_ok || !segments_ok {
        return Err(RenderError::invalid(
            FIELD,
            format!(
                "{} is not host[:port][/path] (no scheme, no spaces or quotes)",
                quoted(endpoint)
            ),
        ));
    }
    Ok(endpoint)
}

fn mirror_ca_path(endpoint: &str) -> String {
    format!("/etc/containerd/certs.d/{endpoint}/ca.crt")
}

/// How containerd checks the mirror's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MirrorTrust {
    /// Against `caCert`, written beside the config.
    CaFile,
    /// Against the machine's trusted CAs (no `tls` table).
    System,
    /// Not at all: only with `insecureSkipVerify: true`.
    SkipVerify,
}

fn mirror_config(endpoint: &str, trust: MirrorTrust) -> String {
    const CRI: &str = r#"plugins."io.containerd.grpc.v1.cri""#;
    let mirrors = format!(
        "[{CRI}.registry.mirrors]\n  [{CRI}.registry.mirrors.\"{MIRRORED_REGISTRY}\"]\n    \
         endpoint = [\"https://{endpoint}\"]\n"
    );
    let tls = match trust {
        MirrorTrust::CaFile => format!("ca_file = \"{}\"", mirror_ca_path(endpoint)),
        MirrorTrust::SkipVerify => "insecure_skip_verify = true".to_string(),
        MirrorTrust::System => return mirrors,
    };
    format!("{mirrors}  [{CRI}.registry.configs.\"{endpoint}\".tls]\n    {tls}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(endpoint: &str) -> RegistryMirrorConfiguration {
        RegistryMirrorConfiguration {
            endpoint: Some(endpoint.into()),
            ca_cert: None,
            insecure_skip_verify: None,
        }
    }

    #[test]
    fn nothing_set_means_nothing_to_do() {
        let setup = containerd_setup(None, None).unwrap();
        assert!(setup.files.is_empty() && setup.commands.is_empty());
    }

    #[test]
    fn proxy_values_are_systemd_escaped_and_unset_ones_omitted() {
        let proxy = ProxyConfiguration {
            http_proxy: Some("http://u:p%40ss@proxy:3128/\"x\"\\".into()),
            https_proxy: None,
            no_proxy: vec!["10.0.0.0/8".into(), ".svc".into()],
        };
        assert_eq!(
            proxy_drop_in(&proxy).unwrap(),
            "[Service]\nEnvironment=\"HTTP_PROXY=http://u:p%%40ss@proxy:3128/\\\"x\\\"\\\\\"\n\
             Environment=\"NO_PROXY=10.0.0.0/8,.svc\"\n"
        );
        let nul = ProxyConfiguration {
            https_proxy: Some("a\0".into()),
            ..Default::default()
        };
        let err = proxy_drop_in(&nul).unwrap_err();
        assert!(err.to_string().starts_with("spec.proxy.httpsProxy: "), "{err}");
    }

    #[test]
    fn mirror_without_ca_trusts_the_machines_cas_and_skips_verification_only_when_asked() {
        let setup = containerd_setup(None, Some(&mirror("registry.local:5000"))).unwrap();
        assert_eq!(setup.files.len(), 1);
        assert!(
            !setup.files[0].content.contains("insecure_skip_verify"),
            "{}",
            setup.files[0].content
        );
        assert!(
            !setup.files[0].content.contains(".tls]"),
            "{}",
            setup.files[0].content
        );
        let mut opted_in = mirror("registry.local:5000");
        opted_in.insecure_skip_verify = Some(true);
        let skipping = containerd_setup(None, Some(&opted_in)).unwrap();
        assert!(skipping.files[0].content.contains("insecure_skip_verify = true"));
        assert!(
            setup.files[0]
                .content
                .contains("endpoint = [\"https://registry.local:5000\"]")
        );
        assert_eq!(
            setup.commands,
            [
                "echo >> /etc/containerd/config.toml && cat /etc/containerd/config_append.toml >> /etc/containerd/config.toml",
                "systemctl daemon-reload",
                "systemctl restart containerd"
            ]
        );
    }

    #[test]
    fn mirror_with_ca_writes_it_where_the_config_points() {
        let m = RegistryMirrorConfiguration {
            endpoint: Some("harbor.local/eks".into()),
            ca_cert: Some("PEM".into()),
            insecure_skip_verify: None,
        };
        let setup = containerd_setup(None, Some(&m)).unwrap();
        assert_eq!(
            setup.files[0].path,
            "/etc/containerd/certs.d/harbor.local/eks/ca.crt"
        );
        assert!(
            setup.files[1]
                .content
                .contains("ca_file = \"/etc/containerd/certs.d/harbor.local/eks/ca.crt\"")
        );
    }

    #[test]
    fn unsafe_endpoints_are_rejected_with_the_field() {
        for bad in [
            "",
            "https://r.local",
            "r.local/../../etc",
            "a b",
            "r\"x",
            "/abs",
            "r.local//x",
            "r.local/",
        ] {
            let err = containerd_setup(None, Some(&mirror(bad))).unwrap_err();
            assert!(
                err.to_string().starts_with("spec.registryMirror.endpoint: "),
                "{bad}: {err}"
            );
        }
        let none = RegistryMirrorConfiguration::default();
        assert!(containerd_setup(None, Some(&none)).is_err());
    }
}
