//! Pure checks of an EtcdadmConfigSpec, shared by every admission webhook that embeds one
//! (EtcdadmConfig, EtcdadmConfigTemplate, EtcdadmCluster), so a bad spec is rejected with the
//! exact field path before any controller tries to render it; `backup` checks the snapshot
//! settings the same way.

mod backup;
pub(crate) mod field;
pub(crate) mod version;

pub use backup::{
    backup_warnings, is_sha256_hex, store_warnings, validate_backup, validate_restore, validate_store,
};
pub use field::{FieldError, QUOTED_CHARS, quoted};
pub use version::{is_etcd_version, major_minor, version_change_problem};

use std::collections::BTreeMap;

pub use crate::api::config::allowed::{GO_TLS12_CIPHER_SUITES, GO_TLS13_CIPHER_SUITES};
use crate::api::config::{EtcdadmConfigSpec, Format, QUOTA_BACKEND_BYTES_RANGE};
use crate::bottlerocket;

/// Longest user name useradd accepts.
const MAX_USER_NAME_LEN: usize = 32;

/// Every problem with `spec`, whose own path is `base` (`spec` for an EtcdadmConfig,
/// `spec.template.spec` for a template, `spec.etcdadmConfigSpec` for an EtcdadmCluster).
pub fn validate_config_spec(spec: &EtcdadmConfigSpec, base: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    format_fields(spec, base, &mut errors);
    cloud_init_version(spec, base, &mut errors);
    cipher_suites(spec, base, &mut errors);
    quota_backend_bytes(spec, base, &mut errors);
    errors.extend(crate::etcd_settings::problems(
        spec,
        base,
        etcd_version(spec).map(|(_, v)| v),
    ));
    files(spec, base, &mut errors);
    users(spec, base, &mut errors);
    registry_mirror(spec, base, &mut errors);
    errors
}

/// Each format's own settings are required with it and refused without it; what Bottlerocket
/// cannot carry is refused (see [`crate::bottlerocket`]).
fn format_fields(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    match spec.format() {
        Format::CloudConfig => {
            if spec.bottlerocket_config.is_some() {
                errors.push(FieldError::new(
                    format!("{base}.bottlerocketConfig"),
                    "is only used with format bottlerocket: remove it or set format: bottlerocket",
                ));
            }
        }
        Format::Bottlerocket => errors.extend(bottlerocket::problems(spec, base)),
    }
}

fn cloud_init_version(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let Some(version) = spec
        .cloud_init_config
        .as_ref()
        .and_then(|c| c.version.as_deref())
        .filter(|v| !v.is_empty())
    else {
        return;
    };
    if !is_etcd_version(version) {
        let hint = if version.starts_with('v') {
            " (drop the leading v)"
        } else {
            ""
        };
        errors.push(FieldError::new(
            format!("{base}.cloudInitConfig.version"),
            format!("{} is not an etcd version like 3.5.9{hint}", quoted(version)),
        ));
    }
}

/// The etcd version `spec` asks for, if it names one, with the field under the spec that does:
/// `cloudInitConfig.version` (cloud-config) or the tag of `bottlerocketConfig.etcdImage`.
pub fn etcd_version(spec: &EtcdadmConfigSpec) -> Option<(&'static str, &str)> {
    match spec.format() {
        Format::CloudConfig => spec
            .cloud_init_config
            .as_ref()
            .and_then(|c| c.version.as_deref())
            .filter(|v| !v.is_empty())
            .map(|v| ("cloudInitConfig.version", v)),
        Format::Bottlerocket => spec
            .bottlerocket_config
            .as_ref()
            .and_then(|b| b.etcd_image.as_deref())
            .and_then(|image| bottlerocket::split_etcd_image(image.trim()))
            .map(|(_, version)| ("bottlerocketConfig.etcdImage", version)),
    }
}

fn cipher_suites(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let Some(raw) = spec.cipher_suites.as_deref() else {
        return;
    };
    if raw.trim().is_empty() {
        return;
    }
    let path = format!("{base}.cipherSuites");
    for (i, name) in raw.split(',').map(str::trim).enumerate() {
        if name.is_empty() {
            errors.push(FieldError::new(
                path.clone(),
                format!("entry {} is empty: separate names with single commas", i + 1),
            ));
        } else if GO_TLS13_CIPHER_SUITES.contains(&name) {
            errors.push(FieldError::new(
                path.clone(),
                format!(
                    "{name} is a TLS 1.3 suite, which Go (and so etcd) does not let you configure: remove it"
                ),
            ));
        } else if !GO_TLS12_CIPHER_SUITES.contains(&name) {
            errors.push(FieldError::new(
                path.clone(),
                format!(
                    "{} is not a cipher suite Go's crypto/tls knows: use names such as \
                     TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                    quoted(name)
                ),
            ));
        }
    }
}

/// A size in bytes within the bounds etcd is run with here.
fn quota_backend_bytes(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let Some(quota) = &spec.quota_backend_bytes else {
        return;
    };
    let path = format!("{base}.quotaBackendBytes");
    match quota.bytes() {
        Err(why) => errors.push(FieldError::new(path, why)),
        Ok(bytes) if !QUOTA_BACKEND_BYTES_RANGE.contains(&bytes) => errors.push(FieldError::new(
            path,
            format!("{quota} ({bytes} bytes) is outside 16Mi to 32Gi"),
        )),
        Ok(_) => {}
    }
}

fn files(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let mut first_with_path: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, file) in spec.files.iter().enumerate() {
        let field = format!("{base}.files[{i}]");
        if file.content.is_some() && file.content_from.is_some() {
            errors.push(FieldError::new(
                format!("{field}.contentFrom"),
                "content and contentFrom are mutually exclusive: keep one",
            ));
        }
        if !file.path.starts_with('/') {
            errors.push(FieldError::new(
                format!("{field}.path"),
                format!("{} is not an absolute path", quoted(&file.path)),
            ));
        }
        if let Some(first) = first_with_path.get(file.path.as_str()) {
            errors.push(FieldError::new(
                format!("{field}.path"),
                format!("{} is also written by {base}.files[{first}]", file.path),
            ));
        } else {
            first_with_path.insert(&file.path, i);
        }
    }
}

/// A name `useradd` accepts on common distributions: `[a-z_][a-z0-9_-]*[$]?`, at most 32.
pub fn is_user_name(name: &str) -> bool {
    let body = name.strip_suffix('$').unwrap_or(name);
    let mut chars = body.chars();
    name.len() <= MAX_USER_NAME_LEN
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn users(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let mut first_with_name: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, user) in spec.users.iter().enumerate() {
        let path = format!("{base}.users[{i}].name");
        if user.name.is_empty() {
            errors.push(FieldError::new(path, "is required"));
            continue;
        }
        if !is_user_name(&user.name) {
            errors.push(FieldError::new(
                path.clone(),
                format!(
                    "{} is not a valid user name: lower-case letters, digits, '_' and '-', \
                     starting with a letter or '_', at most {MAX_USER_NAME_LEN} characters",
                    quoted(&user.name)
                ),
            ));
        }
        if let Some(first) = first_with_name.get(user.name.as_str()) {
            errors.push(FieldError::new(
                path,
                format!(
                    "{} is already the name of {base}.users[{first}]",
                    quoted(&user.name)
                ),
            ));
        } else {
            first_with_name.insert(&user.name, i);
        }
    }
}

/// The endpoint becomes a containerd mirror URL (`https://<endpoint>`), a TOML key and a file
/// path, so only `host[:port][/path]` passes.
fn registry_mirror(spec: &EtcdadmConfigSpec, base: &str, errors: &mut Vec<FieldError>) {
    let Some(mirror) = &spec.registry_mirror else {
        return;
    };
    let path = format!("{base}.registryMirror.endpoint");
    let endpoint = mirror.endpoint.as_deref().unwrap_or("").trim();
    if endpoint.is_empty() {
        errors.push(FieldError::new(
            path,
            "is required when registryMirror is set (host[:port][/path], no scheme)",
        ));
        return;
    }
    if let Some(message) = registry_endpoint_problem(endpoint) {
        errors.push(FieldError::new(path, format!("{} {message}", quoted(endpoint))));
    }
    let has_ca = mirror.ca_cert.as_deref().is_some_and(|c| !c.trim().is_empty());
    if mirror.insecure_skip_verify == Some(true) && has_ca {
        errors.push(FieldError::new(
            format!("{base}.registryMirror.insecureSkipVerify"),
            "skips the certificate check that caCert is for: remove one of them",
        ));
    }
}

fn registry_endpoint_problem(endpoint: &str) -> Option<&'static str> {
    if endpoint.contains("://") {
        return Some("must not have a scheme: give host[:port][/path], https is implied");
    }
    let chars_ok = endpoint
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '/' | '[' | ']'));
    if !chars_ok {
        return Some("is not host[:port][/path]: only letters, digits and . - _ : / [ ] are allowed");
    }
    let (host_port, rest) = endpoint
        .split_once('/')
        .map_or((endpoint, None), |(h, r)| (h, Some(r)));
    if rest.is_some_and(|r| r.split('/').any(|s| s.is_empty() || s == "." || s == "..")) {
        return Some("has an empty, '.' or '..' path segment");
    }
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let Some((inside, after)) = v6.split_once(']') else {
            return Some("has an unclosed '[' in its IPv6 host");
        };
        if inside.parse::<std::net::Ipv6Addr>().is_err() {
            return Some("has an invalid IPv6 address in brackets");
        }
        match after {
            "" => (inside, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (inside, Some(port)),
                None => return Some("has text after its IPv6 host that is not :port"),
            },
        }
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Some("has no host");
    }
    if !host_port.starts_with('[')
        && !host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    {
        return Some("has an invalid host name");
    }
    if let Some(port) = port
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Some("has an invalid port (1-65535)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_a_size_between_16mi_and_32gi_and_cloud_config_only() {
        use crate::api::config::{BottlerocketConfig, DEFAULT_QUOTA_BACKEND_BYTES};
        use crate::api::quantity::ByteQuantity;
        let with = |quota: ByteQuantity| EtcdadmConfigSpec {
            quota_backend_bytes: Some(quota),
            ..Default::default()
        };
        for ok in [
            ByteQuantity::Text("16Mi".into()),
            ByteQuantity::Text("32Gi".into()),
            ByteQuantity::Bytes(8 << 30),
        ] {
            let spec = with(ok.clone());
            assert_eq!(validate_config_spec(&spec, "spec"), vec![], "{ok}");
            assert_eq!(spec.quota_backend_bytes(), ok.bytes().unwrap_or_default());
        }
        for (bad, words) in [
            (ByteQuantity::Text("15Mi".into()), "outside 16Mi to 32Gi"),
            (ByteQuantity::Text("33Gi".into()), "outside 16Mi to 32Gi"),
            (ByteQuantity::Bytes(0), "outside 16Mi to 32Gi"),
            (ByteQuantity::Text("8GB".into()), "not a size in bytes"),
        ] {
            let spec = with(bad.clone());
            let errors = validate_config_spec(&spec, "spec.etcdadmConfigSpec");
            assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
            assert_eq!(errors[0].path, "spec.etcdadmConfigSpec.quotaBackendBytes");
            assert!(errors[0].message.contains(words), "{bad}: {errors:?}");
            assert_eq!(spec.quota_backend_bytes(), DEFAULT_QUOTA_BACKEND_BYTES);
        }
        let bottlerocket = EtcdadmConfigSpec {
            format: Some(Format::Bottlerocket),
            bottlerocket_config: Some(BottlerocketConfig::default()),
            ..with(ByteQuantity::Text("8Gi".into()))
        };
        let errors = validate_config_spec(&bottlerocket, "spec");
        assert!(
            errors
                .iter()
                .any(|e| e.path == "spec.quotaBackendBytes" && e.message.contains("cloud-config")),
            "{errors:?}"
        );
    }

    #[test]
    fn versions() {
        for ok in ["3.5.9", "3.6.0-rc.1", "3.5.9+eks.1", "3.5.9-alpha-1+b.2"] {
            assert!(is_etcd_version(ok), "{ok}");
        }
        for bad in [
            "v3.5.9",
            "3.5",
            "3.5.9.1",
            "3.5.x",
            "3.5.9-",
            "3.5.9 ",
            "3.5.9;ls",
            "3.5.9-a..b",
        ] {
            assert!(!is_etcd_version(bad), "{bad}");
        }
    }

    #[test]
    fn minor_versions_move_one_at_a_time_and_never_back() {
        for (from, to) in [
            ("3.4.23", "3.5.9"),
            ("3.5.9", "3.5.10"),
            ("3.5.10", "3.5.9"),
            ("3.5.9", "3.6.0-rc.1"),
            ("3.5.9", "3.5.9+eks.1"),
        ] {
            assert_eq!(version_change_problem(from, to), None, "{from} → {to}");
        }
        for (from, to, words) in [
            ("3.4.23", "3.6.0", "skips a minor version"),
            ("3.4.23", "3.6.0", "3.4 → 3.5 first"),
            ("3.5.9", "3.4.23", "downgrades the minor version"),
            ("3.5.9", "4.0.0", "changes the major version"),
        ] {
            let problem = version_change_problem(from, to).unwrap_or_default();
            assert!(problem.contains(words), "{from} → {to}: {problem:?}");
        }
        assert_eq!(
            version_change_problem("latest", "3.6.0"),
            None,
            "unparsable: is_etcd_version answers"
        );
        assert_eq!(major_minor("3.5.9-rc.1"), Some((3, 5)));
    }

    #[test]
    fn user_names() {
        for ok in [
            "etcd",
            "_svc",
            "a-b_c9",
            "machine$",
            "a2345678901234567890123456789012",
        ] {
            assert!(is_user_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Root",
            "9lives",
            "-x",
            "a b",
            "a$b",
            "$",
            "a23456789012345678901234567890123",
        ] {
            assert!(!is_user_name(bad), "{bad}");
        }
    }

    #[test]
    fn registry_endpoints() {
        for ok in [
            "mirror.local",
            "mirror.local:5000",
            "10.0.0.1:443/v2/ns",
            "[fd00::1]:5000",
            "[::1]",
        ] {
            assert_eq!(registry_endpoint_problem(ok), None, "{ok}");
        }
        for bad in [
            "https://mirror",
            "mirror:0",
            "mirror:99999",
            "mirror:x",
            ":5000",
            "mirror//a",
            "mirror/../etc",
            "[fd00::1",
            "[nope]:1",
            "mir ror",
            "-bad.host",
        ] {
            assert!(registry_endpoint_problem(bad).is_some(), "{bad}");
        }
    }
}
