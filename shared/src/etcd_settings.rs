//! The etcd settings a spec may give its members beyond etcdadm's own flags: the allowed names
//! and the shape of each value (`etcdSettings`), the corruption checks each etcd version has
//! (`corruptionChecks: Enabled`), and the lines of etcd's environment file both become. An
//! unused field renders nothing, so user data without them is byte for byte what it was.
//!
//! Facts this rests on, measured with etcd 3.4.23 (Debian) and 3.5.1 (`etcd --help`, and each
//! variable set and read back in etcd's start-up log): etcd reads every flag `--a-b` from
//! `ETCD_A_B`; a variable it does not know is logged ("unrecognized environment variable") and
//! ignored, it does not stop etcd; `--election-timeout` must be more than 0, at least five times
//! `--heartbeat-interval` and at most 50000 ms; `--auto-compaction-retention` is hours (a bare
//! number) or a Go duration in periodic mode, and a revision count in revision mode; both
//! versions have `--experimental-initial-corrupt-check` and `--experimental-corrupt-check-time`,
//! neither has `--experimental-compact-hash-check-enabled` (added in 3.5.5, and 3.5.16 uses it;
//! etcd 3.6 turns both
//! checks on with the feature gates `InitialCorruptCheck` and `CompactHashCheck`, its
//! replacement for the experimental flags).

use std::collections::BTreeMap;

use crate::api::config::allowed::{ALLOWED, COMPACT_HASH_CHECK_TIME, Shape};
use crate::api::config::{CorruptionChecks, EtcdadmConfigSpec, Format, SettingValue};
use crate::duration;
use crate::validation::field::{FieldError, quoted};

const DEFAULT_HEARTBEAT_MS: u64 = 100;
const DEFAULT_ELECTION_MS: u64 = 1_000;
/// Longest text value.
const MAX_VALUE_CHARS: usize = 64;

/// Why a name outside the list is refused, when a field or etcdadm sets it instead.
fn set_elsewhere(name: &str) -> Option<&'static str> {
    const ETCDADM: &str = "etcdadm sets it from the Machine (identity, URLs, TLS, data directory and initial cluster are never overridden)";
    match name {
        "quota-backend-bytes" => Some("it is the field quotaBackendBytes: set that instead"),
        "experimental-initial-corrupt-check"
        | "experimental-compact-hash-check-enabled"
        | "feature-gates" => Some("set corruptionChecks instead (Enabled by default)"),
        "cipher-suites" => Some("set cipherSuites instead"),
        "name" | "data-dir" | "wal-dir" | "auto-tls" | "peer-auto-tls" | "client-cert-auth"
        | "trusted-ca-file" | "cert-file" | "key-file" | "enable-v2" | "force-new-cluster" => Some(ETCDADM),
        _ if name.starts_with("initial-")
            || name.starts_with("listen-")
            || name.starts_with("advertise-")
            || name.starts_with("peer-")
            || name.starts_with("discovery")
            || name.ends_with("-urls") =>
        {
            Some(ETCDADM)
        }
        _ => None,
    }
}

/// `ETCD_<NAME>`: the environment variable etcd reads flag `--<name>` from.
pub fn env_name(name: &str) -> String {
    format!("ETCD_{}", name.to_ascii_uppercase().replace('-', "_"))
}

/// The value as written to etcd's environment file (digits, a lower-case word or a Go
/// duration: safe unquoted in a shell line), or why `value` does not fit `name`'s shape.
/// `mode` is the spec's `auto-compaction-mode` (retention depends on it).
fn rendered(name: &str, value: &SettingValue, mode: Option<&str>) -> Result<String, String> {
    let shape = ALLOWED
        .iter()
        .find(|(allowed, _)| *allowed == name)
        .map(|(_, shape)| *shape)
        .ok_or_else(|| "is not an allowed etcd setting".to_string())?;
    let text = value.to_string();
    let text = text.trim();
    if text.chars().count() > MAX_VALUE_CHARS {
        return Err(format!(
            "{} is longer than {MAX_VALUE_CHARS} characters",
            quoted(text)
        ));
    }
    let number = || {
        text.parse::<u64>()
            .map_err(|_| format!("{} is not a whole number", quoted(text)))
    };
    let within = |n: u64, min: u64, max: u64, unit: &str| {
        if (min..=max).contains(&n) {
            Ok(n.to_string())
        } else {
            Err(format!("{n}{unit} is outside {min}{unit} to {max}{unit}"))
        }
    };
    match shape {
        Shape::CompactionMode => match text {
            "periodic" | "revision" => Ok(text.to_string()),
            _ => Err(format!("{} is not periodic or revision", quoted(text))),
        },
        Shape::CompactionRetention if mode == Some("revision") => number()
            .map(|n| n.to_string())
            .map_err(|why| format!("{why} (in revision mode the retention is a number of revisions)")),
        Shape::CompactionRetention => match number() {
            Ok(hours) => Ok(hours.to_string()),
            Err(_) => duration::parse(text)
                .map(duration::format)
                .map_err(|e| format!("{e}: give hours (a whole number) or a duration such as 30m")),
        },
        Shape::Count(min, max) => within(number()?, min, max, ""),
        Shape::Millis(min, max) => within(
            number().map_err(|why| format!("{why} of milliseconds"))?,
            min,
            max,
            " ms",
        ),
        Shape::Bytes(min, max) => {
            let bytes = crate::api::quantity::parse_bytes(text)?;
            if (min..=max).contains(&bytes) {
                Ok(bytes.to_string())
            } else {
                Err(format!("{text} is outside 1Ki to 10Mi"))
            }
        }
        Shape::Duration(min) => {
            let parsed = duration::parse(text).map_err(|e| e.to_string())?;
            if parsed < min {
                return Err(format!("{text} is shorter than {}", duration::format(min)));
            }
            Ok(duration::format(parsed))
        }
    }
}

/// The spec's `auto-compaction-mode`, as written.
fn compaction_mode(spec: &EtcdadmConfigSpec) -> Option<String> {
    spec.etcd_settings
        .get("auto-compaction-mode")
        .map(|v| v.to_string().trim().to_string())
}

/// Every problem with `etcdSettings` and `corruptionChecks` of `spec`, whose path is `base`;
/// `version` is the etcd version it asks for, if it names one (`validation::etcd_version`).
pub fn problems(spec: &EtcdadmConfigSpec, base: &str, version: Option<&str>) -> Vec<FieldError> {
    let (mut errors, allowed_values) = each_setting(spec, base);
    let millis = |name: &str, default: u64| {
        allowed_values
            .get(name)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let (heartbeat, election) = (
        millis("heartbeat-interval", DEFAULT_HEARTBEAT_MS),
        millis("election-timeout", DEFAULT_ELECTION_MS),
    );
    if election < 5 * heartbeat {
        let name = if spec.etcd_settings.contains_key("election-timeout") {
            "election-timeout"
        } else {
            "heartbeat-interval"
        };
        errors.push(FieldError::new(
            format!("{base}.etcdSettings[{}]", quoted(name)),
            format!(
                "election-timeout ({election} ms) must be at least five times heartbeat-interval ({heartbeat} ms), as etcd requires"
            ),
        ));
    }
    if allowed_values.contains_key(COMPACT_HASH_CHECK_TIME) {
        let path = format!("{base}.etcdSettings[{}]", quoted(COMPACT_HASH_CHECK_TIME));
        if spec.corruption_checks() == CorruptionChecks::Disabled {
            errors.push(FieldError::new(
                path,
                "sets how often the compacted-revision hash check runs, which corruptionChecks: Disabled turns off",
            ));
        } else if let Some(version) = version
            && !has_compact_hash_check(version)
        {
            errors.push(FieldError::new(
                path,
                format!("etcd {version} has no compacted-revision hash check (it came with 3.5.5)"),
            ));
        }
    }
    if spec.format() == Format::Bottlerocket {
        if !spec.etcd_settings.is_empty() {
            errors.push(FieldError::new(
                format!("{base}.etcdSettings"),
                "the bottlerocket bootstrap image passes etcd no settings besides its version and cipher suites, so these would be ignored: remove them or use format cloud-config",
            ));
        }
        if spec.corruption_checks == Some(CorruptionChecks::Enabled) {
            errors.push(FieldError::new(
                format!("{base}.corruptionChecks"),
                "the bottlerocket bootstrap image passes etcd no settings besides its version and cipher suites, so its corruption checks stay off: remove it or use format cloud-config",
            ));
        }
    }
    errors
}

/// Every problem of one setting alone (a name outside the list, a value of the wrong shape),
/// and the allowed settings' values as rendered.
fn each_setting<'a>(spec: &'a EtcdadmConfigSpec, base: &str) -> (Vec<FieldError>, BTreeMap<&'a str, String>) {
    let mut errors = Vec::new();
    let mode = compaction_mode(spec);
    let mut allowed_values = BTreeMap::new();
    for (name, value) in &spec.etcd_settings {
        let path = format!("{base}.etcdSettings[{}]", quoted(name));
        if let Some(bare) = name.strip_prefix("--") {
            errors.push(FieldError::new(
                path,
                format!("name the setting without the leading dashes: {bare}"),
            ));
            continue;
        }
        if let Some(why) = set_elsewhere(name) {
            errors.push(FieldError::new(path, format!("is not settable here: {why}")));
            continue;
        }
        match rendered(name, value, mode.as_deref()) {
            Ok(text) => {
                allowed_values.insert(name.as_str(), text);
            }
            Err(why) if !ALLOWED.iter().any(|(allowed, _)| allowed == name) => errors.push(FieldError::new(
                path,
                format!(
                    "{why}: allowed are {}",
                    ALLOWED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            )),
            Err(why) => errors.push(FieldError::new(path, why)),
        }
    }
    (errors, allowed_values)
}

/// `(major, minor, patch)` of an etcd version.
fn version_numbers(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.split(['.', '-', '+']);
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    ))
}

fn has_compact_hash_check(version: &str) -> bool {
    version_numbers(version).is_none_or(|v| v >= (3, 5, 5))
}

/// The environment lines that turn on the corruption checks `version` has. Without a version
/// (etcdadm installs its own default, 3.5.7 for upstream v0.1.5) both experimental variables
/// are written: an etcd that lacks one ignores it.
pub fn corruption_check_lines(version: Option<&str>) -> Vec<(String, String)> {
    let initial = (
        "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK".to_string(),
        "true".to_string(),
    );
    let compact = (
        "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED".to_string(),
        "true".to_string(),
    );
    match version.and_then(version_numbers) {
        None => vec![initial, compact],
        Some(v) if v >= (3, 6, 0) => vec![(
            "ETCD_FEATURE_GATES".to_string(),
            "InitialCorruptCheck=true,CompactHashCheck=true".to_string(),
        )],
        Some(v) if v >= (3, 5, 5) => vec![initial, compact],
        Some(_) => vec![initial],
    }
}

/// The lines of etcd's environment file for `spec`'s corruption checks and settings (the
/// settings in name order), or the first problem admission would have refused; `version` as
/// for [`problems`].
pub fn env_lines(
    spec: &EtcdadmConfigSpec,
    version: Option<&str>,
) -> Result<Vec<(String, String)>, FieldError> {
    if let Some(error) = problems(spec, "spec", version).into_iter().next() {
        return Err(error);
    }
    let mut lines = Vec::new();
    if spec.format() == Format::CloudConfig && spec.corruption_checks == Some(CorruptionChecks::Enabled) {
        lines.extend(corruption_check_lines(version));
    }
    let mode = compaction_mode(spec);
    for (name, value) in &spec.etcd_settings {
        let text = rendered(name, value, mode.as_deref())
            .map_err(|why| FieldError::new(format!("spec.etcdSettings[{}]", quoted(name)), why))?;
        lines.push((env_name(name), text));
    }
    Ok(lines)
}

/// The settings as etcd receives them, by name: what decides whether a change replaces members
/// (`100` and `"100"` are the same setting). A value that does not fit is kept as written.
pub fn effective(spec: &EtcdadmConfigSpec) -> BTreeMap<String, String> {
    let mode = compaction_mode(spec);
    spec.etcd_settings
        .iter()
        .map(|(name, value)| {
            let text = rendered(name, value, mode.as_deref()).unwrap_or_else(|_| value.to_string());
            (name.clone(), text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::api::config::{BottlerocketConfig, CloudInitConfig};
    use serde_json::json;

    fn spec(value: serde_json::Value) -> EtcdadmConfigSpec {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn version(spec: &EtcdadmConfigSpec) -> Option<&str> {
        crate::validation::etcd_version(spec).map(|(_, v)| v)
    }

    fn problems(spec: &EtcdadmConfigSpec, base: &str) -> Vec<FieldError> {
        super::problems(spec, base, version(spec))
    }

    fn env_lines(spec: &EtcdadmConfigSpec) -> Result<Vec<(String, String)>, FieldError> {
        super::env_lines(spec, version(spec))
    }

    fn paths(errors: &[FieldError]) -> Vec<String> {
        errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect()
    }

    #[test]
    fn allowed_settings_of_the_right_shape_pass_and_render_plainly() {
        let s = spec(json!({"corruptionChecks": "Enabled", "etcdSettings": {
            "auto-compaction-mode": "periodic", "auto-compaction-retention": "90m",
            "snapshot-count": 10000, "heartbeat-interval": "200", "election-timeout": 2000,
            "max-request-bytes": "2Mi", "experimental-corrupt-check-time": "2h",
            "experimental-compact-hash-check-time": "5m",
        }}));
        assert_eq!(paths(&problems(&s, "spec")), Vec::<String>::new());
        let lines = env_lines(&s).unwrap_or_else(|e| panic!("{e}"));
        let settings: Vec<String> = lines.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            settings,
            [
                "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK=true",
                "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED=true",
                "ETCD_AUTO_COMPACTION_MODE=periodic",
                "ETCD_AUTO_COMPACTION_RETENTION=1h30m0s",
                "ETCD_ELECTION_TIMEOUT=2000",
                "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_TIME=5m0s",
                "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME=2h0m0s",
                "ETCD_HEARTBEAT_INTERVAL=200",
                "ETCD_MAX_REQUEST_BYTES=2097152",
                "ETCD_SNAPSHOT_COUNT=10000",
            ]
        );
    }

    #[test]
    fn names_outside_the_list_are_refused_with_where_they_belong() {
        let s = spec(json!({"etcdSettings": {
            "quota-backend-bytes": "8Gi", "data-dir": "/tmp", "listen-client-urls": "http://0.0.0.0:2379",
            "initial-cluster": "a=b", "experimental-initial-corrupt-check": "false",
            "peer-trusted-ca-file": "/x", "log-level": "debug", "--snapshot-count": "5000",
        }}));
        let found = paths(&problems(&s, "spec.etcdadmConfigSpec"));
        let expect = [
            ("--snapshot-count", "without the leading dashes: snapshot-count"),
            ("data-dir", "etcdadm sets it"),
            (
                "experimental-initial-corrupt-check",
                "set corruptionChecks instead",
            ),
            ("initial-cluster", "etcdadm sets it"),
            ("listen-client-urls", "etcdadm sets it"),
            (
                "log-level",
                "is not an allowed etcd setting: allowed are auto-compaction-mode",
            ),
            ("peer-trusted-ca-file", "etcdadm sets it"),
            ("quota-backend-bytes", "it is the field quotaBackendBytes"),
        ];
        assert_eq!(found.len(), expect.len(), "{found:#?}");
        for ((name, why), line) in expect.iter().zip(&found) {
            let path = format!("spec.etcdadmConfigSpec.etcdSettings[\"{name}\"]: ");
            assert!(
                line.starts_with(&path) && line.contains(why),
                "{line} vs {name}: {why}"
            );
        }
    }

    #[test]
    fn values_of_the_wrong_shape_are_refused() {
        for (name, value, why) in [
            (
                "auto-compaction-mode",
                json!("hourly"),
                "not periodic or revision",
            ),
            ("auto-compaction-retention", json!("0.5"), "missing unit"),
            ("snapshot-count", json!(10), "outside 1000 to 10000000"),
            ("snapshot-count", json!("many"), "not a whole number"),
            (
                "heartbeat-interval",
                json!("100ms"),
                "not a whole number of milliseconds",
            ),
            ("election-timeout", json!(60000), "outside 50 ms to 50000 ms"),
            ("max-request-bytes", json!("64Mi"), "outside 1Ki to 10Mi"),
            ("experimental-corrupt-check-time", json!("10s"), "shorter than 1m"),
            ("experimental-corrupt-check-time", json!(5), "missing unit"),
        ] {
            let s = spec(json!({"etcdSettings": {name: value}}));
            let found = paths(&problems(&s, "spec"));
            assert!(
                found
                    .iter()
                    .any(|l| l.starts_with(&format!("spec.etcdSettings[\"{name}\"]")) && l.contains(why)),
                "{name}={value}: {found:?}"
            );
        }
        let revision = spec(
            json!({"etcdSettings": {"auto-compaction-mode": "revision", "auto-compaction-retention": "1h"}}),
        );
        assert!(paths(&problems(&revision, "spec"))[0].contains("number of revisions"));
        let too_fast = spec(json!({"etcdSettings": {"heartbeat-interval": 300}}));
        assert_eq!(
            paths(&problems(&too_fast, "spec")),
            [
                "spec.etcdSettings[\"heartbeat-interval\"]: election-timeout (1000 ms) must be at least five times heartbeat-interval (300 ms), as etcd requires"
            ]
        );
    }

    #[test]
    fn corruption_checks_follow_the_etcd_version() {
        let lines = |v: Option<&str>| -> Vec<String> {
            corruption_check_lines(v)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        let initial = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK=true";
        let compact = "ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED=true";
        assert_eq!(lines(Some("3.4.23")), [initial]);
        assert_eq!(lines(Some("3.5.1")), [initial]);
        assert_eq!(lines(Some("3.5.5")), [initial, compact]);
        assert_eq!(lines(Some("3.5.21")), [initial, compact]);
        assert_eq!(lines(None), [initial, compact]);
        assert_eq!(
            lines(Some("3.6.0")),
            ["ETCD_FEATURE_GATES=InitialCorruptCheck=true,CompactHashCheck=true"]
        );
        let old = spec(json!({"cloudInitConfig": {"version": "3.4.23"},
                              "etcdSettings": {"experimental-compact-hash-check-time": "5m"}}));
        assert!(
            paths(&problems(&old, "spec"))[0].contains("etcd 3.4.23 has no compacted-revision hash check")
        );
        for unset_or_off in [json!({}), json!({"corruptionChecks": "Disabled"})] {
            assert_eq!(
                env_lines(&spec(unset_or_off)).unwrap_or_else(|e| panic!("{e}")),
                vec![]
            );
        }
        assert_eq!(
            env_lines(&EtcdadmConfigSpec {
                cloud_init_config: Some(CloudInitConfig {
                    version: Some("3.4.23".into()),
                    ..Default::default()
                }),
                corruption_checks: Some(CorruptionChecks::Enabled),
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("{e}")),
            vec![(
                initial.split('=').next().unwrap_or_default().to_string(),
                "true".to_string()
            )]
        );
    }

    #[test]
    fn bottlerocket_refuses_settings_and_asked_for_checks_and_renders_none() {
        let s = EtcdadmConfigSpec {
            format: Some(Format::Bottlerocket),
            bottlerocket_config: Some(BottlerocketConfig::default()),
            corruption_checks: Some(CorruptionChecks::Enabled),
            etcd_settings: [("snapshot-count".to_string(), SettingValue::Number(5000))].into(),
            ..Default::default()
        };
        let found = paths(&problems(&s, "spec"));
        assert!(
            found[0].starts_with("spec.etcdSettings: the bottlerocket bootstrap image"),
            "{found:?}"
        );
        assert!(found[1].starts_with("spec.corruptionChecks: "), "{found:?}");
        let unset = EtcdadmConfigSpec {
            corruption_checks: None,
            etcd_settings: BTreeMap::new(),
            ..s
        };
        assert!(problems(&unset, "spec").is_empty());
        assert_eq!(env_lines(&unset).unwrap_or_else(|e| panic!("{e}")), vec![]);
    }

    #[test]
    fn the_same_setting_written_as_a_number_or_a_string_is_the_same() {
        let number = spec(json!({"etcdSettings": {"snapshot-count": 5000, "max-request-bytes": "2Mi"}}));
        let text = spec(json!({"etcdSettings": {"snapshot-count": "5000", "max-request-bytes": 2097152}}));
        assert_eq!(effective(&number), effective(&text));
    }
}
