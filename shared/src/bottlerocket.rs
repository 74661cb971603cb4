//! What a Bottlerocket machine can carry out of an EtcdadmConfigSpec: every field either has a
//! place in the Bottlerocket settings or is refused here, so admission and the renderer agree and
//! nothing is dropped on the way.
//!
//! Facts this rests on (from the reference provider, the EKS Anywhere bootstrap image and the
//! Bottlerocket admin container): the bootstrap image writes `write_files` (path, owner,
//! permissions, content; no encoding, no append) from inside its superpowered host container,
//! which sees the host's root at `/.bottlerocket/rootfs`, then runs one `EtcdadmInit`/`EtcdadmJoin`
//! line split on whitespace; the admin container has one login user (`user`, `password-hash`,
//! `ssh.authorized-keys`) who always gets `ALL=(ALL) NOPASSWD: ALL`; Bottlerocket proxies its
//! services' HTTPS traffic only (`settings.network.https-proxy`) and always runs its NTP client.

use base64::Engine;

use crate::api::config::{
    BottlerocketBootstrapContainer, BottlerocketConfig, BottlerocketHostContainer, EtcdadmConfigSpec,
};
use crate::validation::field::{FieldError, quoted};
use crate::validation::version::is_etcd_version;

/// The host container carrying the login user and its SSH keys (the renderer defines it, the
/// bootstrap container, and the control container when `controlImage` is set).
pub const ADMIN_CONTAINER: &str = "admin";
/// The host container that runs etcdadm.
pub const BOOTSTRAP_CONTAINER: &str = "kubeadm-bootstrap";
/// The optional control host container.
pub const CONTROL_CONTAINER: &str = "control";
/// The trust bundle name the registry mirror's CA is installed under.
pub const REGISTRY_MIRROR_CA_BUNDLE: &str = "registry-mirror-ca";
/// The sudo rule the admin container gives its user, whatever is asked.
pub const ADMIN_SUDO_RULE: &str = "ALL=(ALL) NOPASSWD:ALL";
/// Host directories a bootstrap container can write durably: the root filesystem is read-only and
/// `/etc` is rebuilt from settings at every boot.
pub const HOST_FILE_DIRS: [&str; 4] = ["/var", "/opt", "/local", "/mnt"];
/// Bootstrap container modes Bottlerocket knows.
pub const BOOTSTRAP_CONTAINER_MODES: [&str; 3] = ["always", "off", "once"];

/// `etcdImage` split at its last `:` into the repository and the etcd version (the tag without
/// a leading `v`), when it has both and the version is one etcdadm accepts.
pub fn split_etcd_image(image: &str) -> Option<(&str, &str)> {
    let (repository, tag) = image.rsplit_once(':')?;
    let version = tag.strip_prefix('v').unwrap_or(tag);
    let plain = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
    (plain(repository) && !repository.contains('@') && !tag.contains('/') && is_etcd_version(version))
        .then_some((repository, version))
}

/// Every reason `spec` (format bottlerocket) cannot be rendered as asked, with field paths under
/// `base`.
pub fn problems(spec: &EtcdadmConfigSpec, base: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut refuse = |field: String, message: String| errors.push(FieldError::new(field, message));
    match &spec.bottlerocket_config {
        None => refuse(
            format!("{base}.bottlerocketConfig"),
            "is required with format bottlerocket (etcdImage, bootstrapImage and pauseImage)".into(),
        ),
        Some(config) => config_problems(config, &format!("{base}.bottlerocketConfig"), &mut refuse),
    }
    etcdadm_problems(spec, base, &mut refuse);
    user_problems(spec, base, &mut refuse);
    file_problems(spec, base, &mut refuse);
    if let Some(proxy) = &spec.proxy
        && let Some(http) = &proxy.http_proxy
        && proxy.https_proxy.as_ref() != Some(http)
    {
        refuse(
            format!("{base}.proxy.httpProxy"),
            "Bottlerocket proxies HTTPS only (settings.network.https-proxy) and its services make \
             no plain-HTTP requests: set httpsProxy, and httpProxy only to the same value"
                .into(),
        );
    }
    if spec.ntp.as_ref().and_then(|n| n.enabled) == Some(false) {
        refuse(
            format!("{base}.ntp.enabled"),
            "Bottlerocket always runs its NTP client: remove enabled: false (servers may be set)".into(),
        );
    }
    if spec
        .registry_mirror
        .as_ref()
        .is_some_and(|m| m.insecure_skip_verify == Some(true))
    {
        refuse(
            format!("{base}.registryMirror.insecureSkipVerify"),
            "Bottlerocket always checks a registry mirror's certificate: give its CA in caCert instead"
                .into(),
        );
    }
    let mirror_has_ca = spec
        .registry_mirror
        .as_ref()
        .is_some_and(|m| m.ca_cert.as_deref().is_some_and(|c| !c.is_empty()));
    for (i, bundle) in spec.cert_bundles.iter().enumerate() {
        if mirror_has_ca && bundle.name == REGISTRY_MIRROR_CA_BUNDLE {
            refuse(
                format!("{base}.certBundles[{i}].name"),
                format!(
                    "{REGISTRY_MIRROR_CA_BUNDLE} is the registry mirror's CA bundle: choose another name"
                ),
            );
        }
    }
    errors
}

fn config_problems(config: &BottlerocketConfig, path: &str, refuse: &mut impl FnMut(String, String)) {
    // One check per field of the Bottlerocket settings, in field order: read as a list, not split.
    match config.etcd_image.as_deref().map(str::trim) {
        None | Some("") => refuse(
            format!("{path}.etcdImage"),
            "is required with format bottlerocket (the etcd image etcdadm runs, with a version tag)".into(),
        ),
        Some(image) if split_etcd_image(image).is_none() => refuse(
            format!("{path}.etcdImage"),
            format!(
                "{} is not <repository>:<etcd version> (e.g. public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9): \
                 the tag is the etcd version, no digest, no whitespace",
                quoted(image)
            ),
        ),
        Some(_) => {}
    }
    for (field, value) in [
        ("bootstrapImage", &config.bootstrap_image),
        ("pauseImage", &config.pause_image),
    ] {
        if value.trim().is_empty() {
            refuse(
                format!("{path}.{field}"),
                "is required with format bottlerocket".into(),
            );
        }
    }
    let mut reserved = vec![ADMIN_CONTAINER, BOOTSTRAP_CONTAINER];
    if !config.control_image.is_empty() {
        reserved.push(CONTROL_CONTAINER);
    }
    for (i, container) in config.custom_host_containers.iter().enumerate() {
        let BottlerocketHostContainer {
            name,
            image,
            user_data,
            ..
        } = container;
        let at = format!("{path}.customHostContainers[{i}]");
        container_name(name, &format!("{at}.name"), refuse);
        if reserved.contains(&name.as_str()) {
            refuse(
                format!("{at}.name"),
                format!("{name} is a host container the provider defines: choose another name"),
            );
        }
        required_image(image, &format!("{at}.image"), refuse);
        user_data_base64(user_data.as_deref(), &format!("{at}.userData"), refuse);
    }
    for (i, container) in config.custom_bootstrap_containers.iter().enumerate() {
        let BottlerocketBootstrapContainer {
            name,
            image,
            mode,
            user_data,
            ..
        } = container;
        let at = format!("{path}.customBootstrapContainers[{i}]");
        container_name(name, &format!("{at}.name"), refuse);
        required_image(image, &format!("{at}.image"), refuse);
        if !BOOTSTRAP_CONTAINER_MODES.contains(&mode.as_str()) {
            refuse(
                format!("{at}.mode"),
                format!("{} is not one of always, off, once", quoted(mode)),
            );
        }
        user_data_base64(user_data.as_deref(), &format!("{at}.userData"), refuse);
    }
    if let Some(kernel) = &config.kernel
        && kernel.sysctl_settings.keys().any(|k| k.trim().is_empty())
    {
        refuse(format!("{path}.kernel.sysctlSettings"), "has an empty key".into());
    }
    if let Some(boot) = &config.boot
        && boot.boot_kernel_parameters.keys().any(|k| k.trim().is_empty())
    {
        refuse(
            format!("{path}.boot.bootKernelParameters"),
            "has an empty key".into(),
        );
    }
}

/// Names become containerd ids and systemd unit instances on the host.
fn container_name(name: &str, path: &str, refuse: &mut impl FnMut(String, String)) {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain {
        refuse(
            path.into(),
            format!(
                "{} is not a container name (letters, digits, '-', '_')",
                quoted(name)
            ),
        );
    }
}

fn required_image(image: &str, path: &str, refuse: &mut impl FnMut(String, String)) {
    if image.trim().is_empty() {
        refuse(path.into(), "is required".into());
    }
}

/// Bottlerocket refuses the whole user data, and so boots unconfigured, if one `user-data`
/// setting is not base64.
fn user_data_base64(user_data: Option<&str>, path: &str, refuse: &mut impl FnMut(String, String)) {
    if let Some(data) = user_data
        && base64::engine::general_purpose::STANDARD.decode(data).is_err()
    {
        refuse(
            path.into(),
            "is not base64: Bottlerocket would reject the whole user data".into(),
        );
    }
}

fn etcdadm_problems(spec: &EtcdadmConfigSpec, base: &str, refuse: &mut impl FnMut(String, String)) {
    if spec.cloud_init_config.is_some() {
        refuse(
            format!("{base}.cloudInitConfig"),
            "is only used with format cloud-config: with bottlerocket the etcd version is the \
             bottlerocketConfig.etcdImage tag and etcd runs from that image"
                .into(),
        );
    }
    if spec.quota_backend_bytes.is_some() {
        refuse(
            format!("{base}.quotaBackendBytes"),
            "the bottlerocket bootstrap image passes etcd no settings besides its version and \
             cipher suites, so the quota would be ignored: remove it (etcd's default, 2Gi, applies) \
             or use format cloud-config"
                .into(),
        );
    }
    if spec.etcdadm_builtin == Some(false) {
        refuse(
            format!("{base}.etcdadmBuiltin"),
            "etcdadm comes with the bottlerocket bootstrap image: remove it or set true".into(),
        );
    }
    for (field, commands) in [
        ("etcdadmInstallCommands", &spec.etcdadm_install_commands),
        ("preEtcdadmCommands", &spec.pre_etcdadm_commands),
        ("postEtcdadmCommands", &spec.post_etcdadm_commands),
    ] {
        if !commands.is_empty() {
            refuse(
                format!("{base}.{field}"),
                "Bottlerocket has no shell to run commands in: the bootstrap container runs etcdadm \
                 only (use bottlerocketConfig.customBootstrapContainers for extra steps)"
                    .into(),
            );
        }
    }
}

fn user_problems(spec: &EtcdadmConfigSpec, base: &str, refuse: &mut impl FnMut(String, String)) {
    for i in 1..spec.users.len() {
        refuse(
            format!("{base}.users[{i}]"),
            "Bottlerocket's admin container has one login user: keep one user".into(),
        );
    }
    let Some(user) = spec.users.first() else {
        return;
    };
    let at = format!("{base}.users[0]");
    if user.name.ends_with('$') {
        refuse(
            format!("{at}.name"),
            "the admin container refuses names ending in $".into(),
        );
    }
    for (field, set) in [
        ("gecos", user.gecos.is_some()),
        ("groups", user.groups.is_some()),
        ("homeDir", user.home_dir.is_some()),
        ("shell", user.shell.is_some()),
        ("primaryGroup", user.primary_group.is_some()),
        ("inactive", user.inactive == Some(true)),
    ] {
        if set {
            refuse(
                format!("{at}.{field}"),
                "the Bottlerocket admin container sets up its user itself (groups users and api, \
                 home /home/<name>, bash): remove it"
                    .into(),
            );
        }
    }
    if let Some(sudo) = &user.sudo
        && !is_admin_sudo_rule(sudo)
    {
        refuse(
            format!("{at}.sudo"),
            format!(
                "{} cannot be honoured: the admin container's user always gets {ADMIN_SUDO_RULE}",
                quoted(sudo)
            ),
        );
    }
}

/// `sudo` that asks for exactly what the admin container grants (spaces aside).
pub fn is_admin_sudo_rule(sudo: &str) -> bool {
    let compact = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    compact(sudo) == compact(ADMIN_SUDO_RULE)
}

fn file_problems(spec: &EtcdadmConfigSpec, base: &str, refuse: &mut impl FnMut(String, String)) {
    for (i, file) in spec.files.iter().enumerate() {
        let at = format!("{base}.files[{i}]");
        let durable = HOST_FILE_DIRS.iter().any(|dir| {
            file.path
                .strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with('/'))
        });
        if !durable || file.path.split('/').any(|segment| segment == "..") {
            refuse(
                format!("{at}.path"),
                format!(
                    "{} is not under {}: the rest of a Bottlerocket host is read-only or rebuilt at boot",
                    quoted(&file.path),
                    HOST_FILE_DIRS.join(", ")
                ),
            );
        }
        if file.encoding.is_some() {
            refuse(
                format!("{at}.encoding"),
                "the bottlerocket bootstrap container writes content as given: give it as text".into(),
            );
        }
        if file.append == Some(true) {
            refuse(
                format!("{at}.append"),
                "the bottlerocket bootstrap container only writes whole files".into(),
            );
        }
        if let Some(owner) = &file.owner
            && owner != "root"
            && owner != "root:root"
        {
            refuse(
                format!("{at}.owner"),
                format!(
                    "{}: the bottlerocket bootstrap container resolves owners in its own user database \
                     and sets the user's primary group only; use root:root",
                    quoted(owner)
                ),
            );
        }
        if let Some(permissions) = &file.permissions
            && (!(1..=4).contains(&permissions.len())
                || !permissions.chars().all(|c| ('0'..='7').contains(&c)))
        {
            refuse(
                format!("{at}.permissions"),
                format!("{} is not an octal mode like 0640", quoted(permissions)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_images_split_at_the_last_colon() {
        assert_eq!(
            split_etcd_image("public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9"),
            Some(("public.ecr.aws/eks-distro/etcd-io/etcd", "3.5.9-eks-1-28-9"))
        );
        assert_eq!(
            split_etcd_image("registry:5000/etcd:3.4.23"),
            Some(("registry:5000/etcd", "3.4.23"))
        );
        for bad in [
            "registry:5000/etcd",
            "etcd",
            "etcd:",
            ":v3.5.9",
            "etcd:latest",
            "etcd@sha256:abc",
            "etcd:v3.5.9@sha256:abc",
            "my etcd:v3.5.9",
            "etcd:v3.5",
        ] {
            assert_eq!(split_etcd_image(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_admin_rule_is_accepted_as_sudo() {
        assert!(is_admin_sudo_rule("ALL=(ALL) NOPASSWD:ALL"));
        assert!(is_admin_sudo_rule("ALL=(ALL) NOPASSWD: ALL"));
        assert!(!is_admin_sudo_rule("ALL=(ALL) ALL"));
        assert!(!is_admin_sudo_rule(""));
    }
}
