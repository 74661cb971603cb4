//! Why a member Machine no longer matches what the EtcdadmCluster asks for, read into each
//! Machine's view: the rollout-relevant parts of its config (docs/safety.md, "Rolling
//! replacement"), the template it was cloned from, `rolloutAfter`, and a server certificate
//! that expires inside `rolloutBefore.certificatesExpiryDays` (docs/day2.md, "Certificates").

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use etcdadm_shared::api::EtcdadmConfigSpec;
use etcdadm_shared::api::config::BottlerocketConfig;
use etcdadm_shared::etcd_settings;

use super::views::{CertificateView, EtcdView, MachineView};

/// The rollout-relevant parts of a config, by field name: what a running member was installed
/// and started with. NTP, proxies, registry mirrors, CA bundles and users' SSH keys are left
/// out: changing them alone replaces nothing. Every field is named here, without `..`: a new one
/// does not compile until someone decides whether it rolls members.
pub fn relevant_fields(spec: &EtcdadmConfigSpec) -> Map<String, Value> {
    let EtcdadmConfigSpec {
        users,
        etcdadm_install_commands,
        pre_etcdadm_commands,
        post_etcdadm_commands,
        bottlerocket_config,
        cloud_init_config,
        files,
        cipher_suites,
        // Relevant, read below with their defaults applied.
        etcdadm_builtin: _,
        format: _,
        etcdadm_flavor: _,
        quota_backend_bytes: _,
        corruption_checks: _,
        etcd_settings: _,
        // Containerd's, cloud-init's or trust settings only: a running member is unaffected.
        proxy: _,
        registry_mirror: _,
        ntp: _,
        cert_bundles: _,
    } = spec;
    let cloud = cloud_init_config.clone().unwrap_or_default();
    let users: Vec<Value> = users
        .iter()
        .map(|user| {
            let mut user = serde_json::to_value(user).unwrap_or(Value::Null);
            if let Some(fields) = user.as_object_mut() {
                fields.remove("sshAuthorizedKeys");
            }
            user
        })
        .collect();
    let mut fields = Map::new();
    let mut put = |name: &str, value: Value| {
        fields.insert(name.to_string(), value);
    };
    put("cloudInitConfig.version", json!(cloud.version));
    put("cloudInitConfig.etcdReleaseURL", json!(cloud.etcd_release_url));
    put("cloudInitConfig.installDir", json!(cloud.install_dir));
    put("cipherSuites", json!(cipher_suites));
    put("quotaBackendBytes", json!(spec.quota_backend_bytes()));
    put("corruptionChecks", json!(spec.corruption_checks()));
    put("etcdSettings", json!(etcd_settings::effective(spec)));
    put("etcdadmBuiltin", json!(spec.etcdadm_builtin()));
    put("etcdadmInstallCommands", json!(etcdadm_install_commands));
    put("etcdadmFlavor", json!(spec.flavor()));
    put("preEtcdadmCommands", json!(pre_etcdadm_commands));
    put("postEtcdadmCommands", json!(post_etcdadm_commands));
    put("files", serde_json::to_value(files).unwrap_or(Value::Null));
    put("users", Value::Array(users));
    put("format", json!(spec.format().as_str()));
    put(
        "bottlerocketConfig",
        bottlerocket_config
            .as_ref()
            .map_or(Value::Null, bottlerocket_fields),
    );
    fields
}

/// The rollout-relevant parts of a Bottlerocket config: every field, each named.
fn bottlerocket_fields(config: &BottlerocketConfig) -> Value {
    let BottlerocketConfig {
        etcd_image,
        bootstrap_image,
        admin_image,
        control_image,
        pause_image,
        custom_host_containers,
        custom_bootstrap_containers,
        kernel,
        boot,
    } = config;
    json!({
        "etcdImage": etcd_image,
        "bootstrapImage": bootstrap_image,
        "adminImage": admin_image,
        "controlImage": control_image,
        "pauseImage": pause_image,
        "customHostContainers": custom_host_containers,
        "customBootstrapContainers": custom_bootstrap_containers,
        // Applied by Bottlerocket at boot only: a running member never sees a change.
        "kernel": kernel,
        "boot": boot,
    })
}

/// A short stable fingerprint of the rollout-relevant fields (FNV-1a, 64 bits, hex).
pub fn config_hash(spec: &EtcdadmConfigSpec) -> String {
    let text = Value::Object(relevant_fields(spec)).to_string();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Names of the rollout-relevant fields that differ between a member's config and the spec.
pub fn changed_fields(member: &EtcdadmConfigSpec, desired: &EtcdadmConfigSpec) -> Vec<String> {
    let (old, new) = (relevant_fields(member), relevant_fields(desired));
    new.iter()
        .filter(|(name, value)| old.get(*name) != Some(*value))
        .map(|(name, _)| name.clone())
        .collect()
}

/// What is known about one Machine for the outdated check.
pub struct MemberSpec<'a> {
    /// Its EtcdadmConfig's spec (None: the config is gone; nothing is guessed).
    pub config: Option<&'a EtcdadmConfigSpec>,
    /// `cloned-from-name` and `cloned-from-groupkind` of its infra machine, when annotated.
    pub cloned_from: Option<(String, String)>,
    /// Its creation time, in seconds since the epoch.
    pub created: Option<i64>,
}

/// What the spec asks for.
pub struct DesiredSpec<'a> {
    pub config: &'a EtcdadmConfigSpec,
    /// Template name and `Kind.group`.
    pub template: (String, String),
    /// `spec.rolloutAfter`, in seconds since the epoch.
    pub rollout_after: Option<i64>,
    pub now: i64,
}

/// Why a Machine must be replaced, or None when it matches the spec.
pub fn outdated_reason(member: &MemberSpec<'_>, desired: &DesiredSpec<'_>) -> Option<String> {
    let mut reasons = Vec::new();
    if let Some(config) = member.config {
        let changed = changed_fields(config, desired.config);
        if !changed.is_empty() {
            reasons.push(format!("etcdadmConfigSpec changed ({})", changed.join(", ")));
        }
    }
    if let Some((name, group_kind)) = &member.cloned_from
        && (name != &desired.template.0 || group_kind != &desired.template.1)
    {
        reasons.push(format!(
            "cloned from {group_kind} {name}, the template is now {} {}",
            desired.template.1, desired.template.0
        ));
    }
    if let (Some(after), Some(created)) = (desired.rollout_after, member.created)
        && after <= desired.now
        && created < after
    {
        reasons.push("created before spec.rolloutAfter".to_string());
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Whether `expiry` falls before `now + window` (an expired one does too).
pub fn inside(expiry: Timestamp, now: Timestamp, window: Duration) -> bool {
    let window = SignedDuration::try_from(window).unwrap_or(SignedDuration::MAX);
    now.checked_add(window).is_ok_and(|edge| expiry < edge)
}

/// Why a member must be replaced for its certificate, if it must (unknown expiry: never).
fn renewal_reason(expiry: Option<Timestamp>, now: Timestamp, renew_before: Duration) -> Option<String> {
    let expiry = expiry?;
    inside(expiry, now, renew_before).then(|| format!("certificate expires {expiry}"))
}

/// Add the certificate rule to each Machine's outdated reasons: a member whose server
/// certificate expires within the window is rolled like any other outdated member.
pub fn outdate_expiring(machines: &mut [MachineView], etcd: &EtcdView, certificates: &CertificateView) {
    let EtcdView::Members(members) = etcd else {
        return;
    };
    for machine in machines.iter_mut() {
        let expiry = members
            .iter()
            .find(|m| m.machine.as_deref() == Some(machine.name.as_str()))
            .and_then(|m| m.certificate_expiry);
        if let Some(why) = renewal_reason(expiry, certificates.now, certificates.renew_before) {
            machine.outdated = Some(match machine.outdated.take() {
                Some(other) => format!("{other}; {why}"),
                None => why,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn spec(value: Value) -> EtcdadmConfigSpec {
        serde_json::from_value(value).unwrap()
    }

    fn config_json() -> Value {
        json!({
            "cloudInitConfig": {"version": "3.4.22"},
            "ntp": {"servers": ["a.pool"], "enabled": true},
            "users": [{"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA one"], "sudo": "ALL=(ALL) NOPASSWD:ALL"}],
            "preEtcdadmCommands": ["echo hi"],
        })
    }

    fn with(mut value: Value, pointer: &str, new: Value) -> Value {
        *value.pointer_mut(pointer).unwrap() = new;
        value
    }

    #[test]
    fn bottlerocket_kernel_and_boot_settings_roll() {
        let bottlerocket = |sysctl: &str, console: &str| {
            spec(json!({"format": "bottlerocket", "bottlerocketConfig": {
                "etcdImage": "r/etcd:v3.5.9", "bootstrapImage": "b", "pauseImage": "p",
                "kernel": {"sysctlSettings": {"vm.max_map_count": sysctl}},
                "boot": {"bootKernelParameters": {"console": [console]}}}}))
        };
        let old = bottlerocket("262144", "tty0");
        assert!(changed_fields(&old, &bottlerocket("262144", "tty0")).is_empty());
        for new in [bottlerocket("524288", "tty0"), bottlerocket("262144", "ttyS0")] {
            assert_eq!(changed_fields(&old, &new), vec!["bottlerocketConfig".to_string()]);
        }
    }

    #[test]
    fn ntp_and_ssh_keys_alone_roll_nothing() {
        let old = spec(config_json());
        let new = spec(with(
            with(config_json(), "/ntp/servers", json!(["b.pool", "c.pool"])),
            "/users/0/sshAuthorizedKeys",
            json!(["ssh-ed25519 BBBB two"]),
        ));
        assert!(changed_fields(&old, &new).is_empty());
        assert_eq!(config_hash(&old), config_hash(&new));
        let proxy = spec(with(config_json(), "/ntp", json!(null)));
        assert_eq!(config_hash(&old), config_hash(&proxy));
    }

    #[test]
    fn version_install_dir_commands_files_and_users_roll() {
        let old = spec(config_json());
        let cases = [
            (
                with(config_json(), "/cloudInitConfig/version", json!("3.4.23")),
                "cloudInitConfig.version",
            ),
            (
                with(
                    config_json(),
                    "/cloudInitConfig",
                    json!({"version": "3.4.22", "installDir": "/usr/local/bin"}),
                ),
                "cloudInitConfig.installDir",
            ),
            (
                with(config_json(), "/preEtcdadmCommands", json!(["echo bye"])),
                "preEtcdadmCommands",
            ),
            (with(config_json(), "/users/0/sudo", json!(null)), "users"),
        ];
        for (value, field) in cases {
            let new = spec(value);
            assert_eq!(changed_fields(&old, &new), vec![field.to_string()]);
            assert_ne!(config_hash(&old), config_hash(&new), "{field}");
        }
        let mut files = config_json();
        files["files"] = json!([{"path": "/etc/x", "content": "1"}]);
        assert_eq!(changed_fields(&old, &spec(files)), vec!["files".to_string()]);
        let mut cipher = config_json();
        cipher["cipherSuites"] = json!("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256");
        assert_eq!(
            changed_fields(&old, &spec(cipher)),
            vec!["cipherSuites".to_string()]
        );
    }

    #[test]
    fn etcd_settings_and_corruption_checks_roll_as_etcd_receives_them() {
        let old = spec(json!({"etcdSettings": {"snapshot-count": 5000}}));
        let same = spec(json!({"etcdSettings": {"snapshot-count": "5000"}, "corruptionChecks": "Enabled"}));
        assert!(
            changed_fields(&old, &same).is_empty(),
            "unset is Enabled; 5000 is \"5000\""
        );
        let more = spec(
            json!({"etcdSettings": {"snapshot-count": 5000, "heartbeat-interval": 200, "election-timeout": 2000}}),
        );
        assert_eq!(changed_fields(&old, &more), vec!["etcdSettings".to_string()]);
        let off = spec(json!({"etcdSettings": {"snapshot-count": 5000}, "corruptionChecks": "Disabled"}));
        assert_eq!(changed_fields(&old, &off), vec!["corruptionChecks".to_string()]);
        assert!(
            changed_fields(&EtcdadmConfigSpec::default(), &spec(json!({"etcdSettings": {}}))).is_empty(),
            "an empty map is no map"
        );
    }

    #[test]
    fn the_hash_is_stable_across_calls_and_field_order() {
        let a = spec(json!({"cloudInitConfig": {"version": "3.5.9", "installDir": "/opt/bin"}}));
        let b = spec(json!({"cloudInitConfig": {"installDir": "/opt/bin", "version": "3.5.9"}}));
        assert_eq!(config_hash(&a), config_hash(&b));
        assert_eq!(config_hash(&a).len(), 16);
    }

    #[test]
    fn a_machine_is_outdated_by_config_template_or_rollout_after() {
        let old = spec(config_json());
        let new = spec(with(config_json(), "/cloudInitConfig/version", json!("3.4.23")));
        let template = (
            "etcd-v2".to_string(),
            "SimMachineTemplate.infrastructure.cluster.x-k8s.io".to_string(),
        );
        let desired = DesiredSpec {
            config: &new,
            template: template.clone(),
            rollout_after: None,
            now: 1000,
        };
        let member = MemberSpec {
            config: Some(&old),
            cloned_from: Some(template.clone()),
            created: Some(10),
        };
        let why = outdated_reason(&member, &desired).unwrap();
        assert!(why.contains("cloudInitConfig.version"), "{why}");
        let current = MemberSpec {
            config: Some(&new),
            ..member
        };
        assert_eq!(outdated_reason(&current, &desired), None);
        // Another template.
        let moved = MemberSpec {
            config: Some(&new),
            cloned_from: Some(("etcd-v1".into(), template.1.clone())),
            created: Some(10),
        };
        assert!(outdated_reason(&moved, &desired).unwrap().contains("etcd-v1"));
        // rolloutAfter: only once it has passed, only for Machines created before it.
        let mut after = DesiredSpec {
            rollout_after: Some(500),
            ..desired
        };
        assert!(
            outdated_reason(&current, &after)
                .unwrap()
                .contains("rolloutAfter")
        );
        after.now = 400;
        assert_eq!(outdated_reason(&current, &after), None);
        after.now = 1000;
        let young = MemberSpec {
            config: Some(&new),
            cloned_from: None,
            created: Some(600),
        };
        assert_eq!(outdated_reason(&young, &after), None);
        // No config to compare: nothing is guessed.
        let unknown = MemberSpec {
            config: None,
            cloned_from: None,
            created: Some(600),
        };
        assert_eq!(outdated_reason(&unknown, &after), None);
    }
}
