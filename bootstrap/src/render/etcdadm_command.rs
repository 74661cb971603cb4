//! The etcdadm command lines: which flags each etcdadm build accepts, how the settings etcdadm
//! has no flag for (cipher suites, the backend quota, corruption checks, `etcdSettings`) reach
//! etcd before its first start (a systemd drop-in written before etcdadm runs), and how a
//! learner join waits around `etcdadm join`.

use etcdadm_shared::api::config::{
    DEFAULT_LEARNER_LISTED_WAIT, EtcdadmConfigSpec, EtcdadmFlavor, QUOTA_BACKEND_BYTES_RANGE,
};
use etcdadm_shared::etcd_settings;
use etcdadm_shared::validation::{etcd_version, is_etcd_version, quoted};

use super::error::RenderError;
use super::files::FileEntry;
use super::input::EtcdadmCommand;
use super::{restore, shell};

/// Written when etcd runs as configured; CAPI's cloud-init contract reads it.
pub const SUCCESS_SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";

/// A drop-in of etcd's systemd unit holding the settings etcdadm has no flag for. Written by
/// cloud-init before etcdadm runs: upstream etcdadm writes `/etc/systemd/system/etcd.service`
/// (`EnvironmentFile=/etc/etcd/etcd.env`) and starts it, and systemd reads the unit's drop-ins
/// with it, so etcd starts with every setting and no member restarts after its join.
pub const SETTINGS_DROP_IN: &str = "/etc/systemd/system/etcd.service.d/10-etcdadm-bootstrap-settings.conf";

/// Where a learner join's user data writes its helper, `templates/cloud-init/learner-join.sh`.
pub const LEARNER_JOIN_SCRIPT: &str = "/run/cluster-api/etcd-learner-join.sh";
/// The helper: waits until the join URL lists this machine's member, then, if `etcdadm join`
/// failed its health check as an unpromoted learner, until the health phase passes.
pub const LEARNER_JOIN_SCRIPT_CONTENT: &str = include_str!("../../../templates/cloud-init/learner-join.sh");
/// Where the learner helper writes the machine address the learner list names (the Machine's
/// reported address, which the controller registered): etcdadm binds to it and names it in the
/// server certificate, instead of the default route's address it would pick by itself.
pub const MEMBER_ADDRESS_FILE: &str = "/run/cluster-api/etcd-member-address";
/// How long a learner join waits for the EtcdadmCluster controller to add its member when the
/// controller wrote no longer wait on its EtcdadmConfig (see
/// `EtcdadmConfig::learner_listed_wait`). A machine that gives up never becomes a member; the
/// controller replaces it.
pub const LEARNER_LISTED_WAIT_SECONDS: u64 = DEFAULT_LEARNER_LISTED_WAIT.as_secs();
/// How long a learner join waits for its promotion: a learner must catch up on the whole
/// database first, minutes for a large one.
pub const LEARNER_HEALTHY_WAIT_SECONDS: u32 = 1800;

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
    // The shell line is built in the order it runs (checks, install, etcdadm, waits, sentinel).
    if machine_name.is_empty() {
        return Err(RenderError::invalid(
            "machine name",
            "is empty: etcdadm --name needs the Machine's name",
        ));
    }
    let flavor = spec.flavor();
    let cipher_suites = cipher_suites(spec)?;

    let mut words: Vec<String> = vec!["etcdadm".into()];
    let mut learner_join = None;
    match command {
        EtcdadmCommand::Init | EtcdadmCommand::InitFromSnapshot(_) => words.push("init".into()),
        EtcdadmCommand::Join { urls, learner } => {
            let target = shell::word(&join_target(urls, flavor)?);
            if let Some(learner) = learner {
                if flavor != EtcdadmFlavor::Upstream {
                    return Err(RenderError::invalid(
                        "spec.etcdadmFlavor",
                        "eks-anywhere etcdadm builds join as voting members; a learner join needs \
                         upstream etcdadm",
                    ));
                }
                learner_join = Some((target.clone(), learner.listed_wait_seconds));
            }
            words.push("join".into());
            words.push(target);
        }
    }
    let flags_from = words.len();
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

    if let (Some(list), EtcdadmFlavor::EksAnywhere) = (&cipher_suites, flavor) {
        words.extend(["--cipher-suites".into(), list.clone()]);
    }
    let mut steps = Vec::with_capacity(5);
    if let EtcdadmCommand::InitFromSnapshot(download) = command {
        steps.extend(restore::before_init(download)?);
        words.extend(["--snapshot".into(), restore::RESTORE_SNAPSHOT_FILE.into()]);
    }
    match learner_join {
        None => match command {
            EtcdadmCommand::InitFromSnapshot(download) => steps.push(restore::init_command(
                download,
                &words.join(" "),
                non_empty(&cloud_init.install_dir),
            )),
            _ => steps.push(words.join(" ")),
        },
        // The member must be listed before etcdadm looks for it, or etcdadm adds a voter; it
        // binds to the address the list names; and etcdadm's own health check fails until the
        // learner is promoted, so it is re-run.
        Some((url, listed_wait_seconds)) => {
            let address = format!("\"$(cat {MEMBER_ADDRESS_FILE})\"");
            words.extend([
                "--bind-address".into(),
                address.clone(),
                "--server-cert-extra-sans".into(),
                address,
            ]);
            let flags = words[flags_from..].join(" ");
            steps.push(format!(
                "sh {LEARNER_JOIN_SCRIPT} wait-listed {listed_wait_seconds} {url}"
            ));
            steps.push(format!(
                "{{ {} || sh {LEARNER_JOIN_SCRIPT} wait-healthy {LEARNER_HEALTHY_WAIT_SECONDS} {url} {flags}; }}",
                words.join(" ")
            ));
        }
    }
    if let EtcdadmCommand::InitFromSnapshot(_) = command {
        steps.push(restore::after_init());
    }
    steps.push(format!("echo success > {SUCCESS_SENTINEL}"));
    Ok(steps.join(" && "))
}

/// The drop-in of etcd's unit with the settings etcdadm has no flag for ([`SETTINGS_DROP_IN`]),
/// `None` when the spec sets none. `Environment=` lines: systemd lets the unit's own
/// `EnvironmentFile=` (etcdadm's `etcd.env`, and whatever a person writes there) win over them,
/// and none of these names is one etcdadm writes.
pub fn settings_drop_in(spec: &EtcdadmConfigSpec) -> Result<Option<FileEntry>, RenderError> {
    let suites = cipher_suites(spec)?.filter(|_| spec.flavor() == EtcdadmFlavor::Upstream);
    let settings = env_settings(spec, suites)?;
    if settings.is_empty() {
        return Ok(None);
    }
    let mut text = String::from(
        "# The etcd settings etcdadm has no flag for, written by the etcdadm bootstrap provider\n\
         # before etcdadm runs, so that etcd starts with them.\n[Service]\n",
    );
    for (name, value) in &settings {
        text.push_str(&environment_line(name, value)?);
    }
    Ok(Some(FileEntry::generated(SETTINGS_DROP_IN, "0644", text)))
}

/// `Environment="NAME=value"`. systemd expands `%` specifiers and backslash escapes there; the
/// values are plain words (suite names, digits, Go durations, `Name=true` lists), and anything
/// else is refused rather than escaped.
fn environment_line(name: &str, value: &str) -> Result<String, RenderError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_.,=:+-".contains(c);
    if !value.chars().all(plain) {
        return Err(RenderError::invalid(
            "spec.etcdSettings",
            format!(
                "{name}={} holds a character a systemd unit would change",
                quoted(value)
            ),
        ));
    }
    Ok(format!("Environment=\"{name}={value}\"\n"))
}

/// The etcd settings etcdadm has no flag for, as environment variables: the cipher suites for
/// upstream etcdadm (`cipher_suites`, when given), the backend quota, the corruption checks the
/// etcd version has (unless `corruptionChecks: Disabled`) and `etcdSettings`
/// (`etcdadm_shared::etcd_settings`).
fn env_settings(
    spec: &EtcdadmConfigSpec,
    cipher_suites: Option<String>,
) -> Result<Vec<(String, String)>, RenderError> {
    let mut settings = Vec::new();
    if let Some(list) = cipher_suites {
        settings.push(("ETCD_CIPHER_SUITES".to_string(), list));
    }
    if let Some(quota) = &spec.quota_backend_bytes {
        let bytes = quota
            .bytes()
            .ok()
            .filter(|bytes| QUOTA_BACKEND_BYTES_RANGE.contains(bytes))
            .ok_or_else(|| {
                RenderError::invalid(
                    "spec.quotaBackendBytes",
                    format!("{quota} is not within 16Mi to 32Gi"),
                )
            })?;
        settings.push(("ETCD_QUOTA_BACKEND_BYTES".to_string(), bytes.to_string()));
    }
    let version = etcd_version(spec).map(|(_, version)| version);
    let more =
        etcd_settings::env_lines(spec, version).map_err(|e| RenderError::invalid(e.path, e.message))?;
    settings.extend(more);
    Ok(settings)
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
mod tests;
