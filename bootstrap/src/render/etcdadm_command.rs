//! The etcdadm command lines: which flags each etcdadm build accepts, and how cipher suites reach
//! etcd when the build has no flag for them.

use etcdadm_shared::api::config::{EtcdadmConfigSpec, EtcdadmFlavor};
use etcdadm_shared::validation::{is_etcd_version, quoted};

use super::EtcdadmCommand;
use super::error::RenderError;
use super::shell;

/// Written when etcd runs as configured; CAPI's cloud-init contract reads it.
pub const SUCCESS_SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";

/// The env file etcdadm writes and etcd's systemd unit reads.
const ETCD_ENV_FILE: &str = "/etc/etcd/etcd.env";

/// The upstream etcdadm release installed when the spec gives no install commands.
pub const DEFAULT_ETCDADM_RELEASE: &str = "v0.1.5";

/// Install commands used when etcdadm is not built into the image and the spec names none: the
/// pinned upstream release for the machine's architecture, to /usr/local/bin/etcdadm.
pub fn default_install_commands() -> Vec<String> {
    vec![
        format!(
            "curl -fsSL --retry 5 -o /usr/local/bin/etcdadm \
             https://github.com/kubernetes-sigs/etcdadm/releases/download/{DEFAULT_ETCDADM_RELEASE}/etcdadm-linux-$(uname -m | sed -e s/x86_64/amd64/ -e s/aarch64/arm64/)"
        ),
        "chmod 0755 /usr/local/bin/etcdadm".to_string(),
    ]
}

/// The runcmd entry that runs etcdadm and, only if everything before it succeeded, writes the
/// success sentinel.
pub fn etcdadm_runcmd(
    spec: &EtcdadmConfigSpec,
    machine_name: &str,
    command: &EtcdadmCommand,
) -> Result<String, RenderError> {
    if machine_name.is_empty() {
        return Err(RenderError::invalid(
            "machine name",
            "is empty: etcdadm --name needs the Machine's name",
        ));
    }
    let flavor = spec.flavor();
    let cipher_suites = cipher_suites(spec)?;

    let mut words: Vec<String> = vec!["etcdadm".into()];
    match command {
        EtcdadmCommand::Init => words.push("init".into()),
        EtcdadmCommand::Join { urls } => {
            words.push("join".into());
            words.push(shell::word(&join_target(urls, flavor)?));
        }
    }
    words.extend(["--init-system", "systemd", "--name"].map(String::from));
    words.push(shell::word(machine_name));

    let cloud_init = spec.cloud_init_config.clone().unwrap_or_default();
    if let Some(version) = non_empty(&cloud_init.version) {
        if !is_etcd_version(version) {
            return Err(RenderError::invalid(
                "spec.cloudInitConfig.version",
                format!(
                    "{} is not an etcd version like 3.5.9 (no leading v)",
                    quoted(version)
                ),
            ));
        }
        words.extend(["--version".into(), shell::word(version)]);
    }
    if let Some(url) = non_empty(&cloud_init.etcd_release_url) {
        words.extend(["--release-url".into(), shell::word(url)]);
    }
    if let Some(dir) = non_empty(&cloud_init.install_dir) {
        words.extend(["--install-dir".into(), shell::word(dir)]);
    }

    let mut steps = Vec::with_capacity(5);
    match (&cipher_suites, flavor) {
        (Some(list), EtcdadmFlavor::EksAnywhere) => {
            words.extend(["--cipher-suites".into(), list.clone()]);
            steps.push(words.join(" "));
        }
        (Some(list), EtcdadmFlavor::Upstream) => {
            // Upstream etcdadm has no --cipher-suites flag: etcd reads the same setting from its
            // env file, so replace the line there and restart etcd before declaring success.
            steps.push(words.join(" "));
            steps.push(format!("sed -i '/^ETCD_CIPHER_SUITES=/d' {ETCD_ENV_FILE}"));
            steps.push(format!("echo ETCD_CIPHER_SUITES={list} >> {ETCD_ENV_FILE}"));
            steps.push("systemctl restart etcd".into());
        }
        (None, _) => steps.push(words.join(" ")),
    }
    steps.push(format!("echo success > {SUCCESS_SENTINEL}"));
    Ok(steps.join(" && "))
}

/// Upstream etcdadm joins through exactly one URL (a list makes it time out listing members);
/// the EKS Anywhere build takes a comma list.
pub fn join_target(urls: &[String], flavor: EtcdadmFlavor) -> Result<String, RenderError> {
    let mut usable = urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty());
    match flavor {
        EtcdadmFlavor::Upstream => usable.next().map(str::to_string).ok_or(RenderError::NoJoinUrl),
        EtcdadmFlavor::EksAnywhere => {
            let all: Vec<&str> = usable.collect();
            if all.is_empty() {
                Err(RenderError::NoJoinUrl)
            } else {
                Ok(all.join(","))
            }
        }
    }
}

/// `spec.cipherSuites` normalised to `A,B,C`; `None` when unset or empty (Go's defaults). Names
/// are Go constant names, so anything else is a typo worth rejecting — and keeps the list safe to
/// put in a shell command and an env file unquoted.
pub fn cipher_suites(spec: &EtcdadmConfigSpec) -> Result<Option<String>, RenderError> {
    let Some(raw) = spec.cipher_suites.as_deref() else {
        return Ok(None);
    };
    let mut names = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(RenderError::invalid(
                "spec.cipherSuites",
                format!(
                    "{} is not a cipher suite name: use Go names such as \
                     TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, separated by commas",
                    quoted(name)
                ),
            ));
        }
        names.push(name);
    }
    Ok((!names.is_empty()).then(|| names.join(",")))
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdadm_shared::api::config::CloudInitConfig;

    fn init(spec: &EtcdadmConfigSpec) -> String {
        etcdadm_runcmd(spec, "etcd-0", &EtcdadmCommand::Init).unwrap()
    }

    #[test]
    fn minimal_init_has_only_the_fixed_flags() {
        assert_eq!(
            init(&EtcdadmConfigSpec::default()),
            "etcdadm init --init-system systemd --name etcd-0 && echo success > /run/cluster-api/bootstrap-success.complete"
        );
    }

    #[test]
    fn empty_optional_values_emit_no_flags() {
        let spec = EtcdadmConfigSpec {
            cloud_init_config: Some(CloudInitConfig {
                version: Some(String::new()),
                etcd_release_url: Some(String::new()),
                install_dir: None,
            }),
            cipher_suites: Some(" , ".into()),
            ..Default::default()
        };
        assert_eq!(init(&spec), init(&EtcdadmConfigSpec::default()));
    }

    #[test]
    fn set_values_become_flags_in_order() {
        let spec = EtcdadmConfigSpec {
            cloud_init_config: Some(CloudInitConfig {
                version: Some("3.5.9".into()),
                etcd_release_url: Some("https://mirror.example/etcd".into()),
                install_dir: Some("/opt/etcd bin".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            init(&spec),
            "etcdadm init --init-system systemd --name etcd-0 --version 3.5.9 \
             --release-url https://mirror.example/etcd --install-dir '/opt/etcd bin' \
             && echo success > /run/cluster-api/bootstrap-success.complete"
        );
        assert!(!init(&spec).contains("  "));
    }

    #[test]
    fn upstream_join_uses_the_first_url_only() {
        let urls = vec![
            " ".to_string(),
            "https://10.0.0.1:2379".into(),
            "https://10.0.0.2:2379".into(),
        ];
        let line = etcdadm_runcmd(
            &EtcdadmConfigSpec::default(),
            "etcd-1",
            &EtcdadmCommand::Join { urls: &urls },
        )
        .unwrap();
        assert!(
            line.starts_with("etcdadm join https://10.0.0.1:2379 --init-system systemd --name etcd-1 &&"),
            "{line}"
        );
    }

    #[test]
    fn eks_anywhere_join_uses_a_comma_list_and_the_cipher_flag() {
        let spec = EtcdadmConfigSpec {
            etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
            cipher_suites: Some("TLS_A, TLS_B".into()),
            ..Default::default()
        };
        let urls = vec![
            "https://10.0.0.1:2379".to_string(),
            "https://10.0.0.2:2379".into(),
        ];
        let line = etcdadm_runcmd(&spec, "etcd-1", &EtcdadmCommand::Join { urls: &urls }).unwrap();
        assert_eq!(
            line,
            "etcdadm join https://10.0.0.1:2379,https://10.0.0.2:2379 --init-system systemd --name etcd-1 \
             --cipher-suites TLS_A,TLS_B && echo success > /run/cluster-api/bootstrap-success.complete"
        );
    }

    #[test]
    fn upstream_cipher_suites_go_to_the_env_file_before_success() {
        let spec = EtcdadmConfigSpec {
            cipher_suites: Some("TLS_A,TLS_B".into()),
            ..Default::default()
        };
        let line = init(&spec);
        assert!(!line.contains("--cipher-suites"));
        assert!(
            line.ends_with(
                "&& sed -i '/^ETCD_CIPHER_SUITES=/d' /etc/etcd/etcd.env \
             && echo ETCD_CIPHER_SUITES=TLS_A,TLS_B >> /etc/etcd/etcd.env \
             && systemctl restart etcd && echo success > /run/cluster-api/bootstrap-success.complete"
            ),
            "{line}"
        );
    }

    #[test]
    fn join_without_urls_is_an_error() {
        for flavor in [EtcdadmFlavor::Upstream, EtcdadmFlavor::EksAnywhere] {
            let spec = EtcdadmConfigSpec {
                etcdadm_flavor: Some(flavor),
                ..Default::default()
            };
            let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Join { urls: &[] }).unwrap_err();
            assert!(matches!(err, RenderError::NoJoinUrl));
        }
    }

    #[test]
    fn bad_values_name_their_field() {
        let spec = EtcdadmConfigSpec {
            cipher_suites: Some("TLS_A;reboot".into()),
            ..Default::default()
        };
        let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Init).unwrap_err();
        assert!(err.to_string().starts_with("spec.cipherSuites: "), "{err}");

        let spec = EtcdadmConfigSpec {
            cloud_init_config: Some(CloudInitConfig {
                version: Some("v3.5.9".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Init).unwrap_err();
        assert!(
            err.to_string().starts_with("spec.cloudInitConfig.version: "),
            "{err}"
        );
    }
}
