//! Rolling replacement and scale (SPEC-etcdcluster.md "Scale up / down", "Rolling
//! replacement"): which Machines are outdated (only the rollout-relevant parts of their config,
//! their template, `rolloutAfter`) and what the replica count and the rollout strategy want
//! next, health aside.

use serde_json::{Map, Value, json};

use etcdadm_shared::api::EtcdadmConfigSpec;

use super::observed::{MachineView, Observed, sorted_urls, voting_endpoints};
use super::step::{Growth, Removal};

/// What the replica count and the rollout strategy want next, health aside.
pub(super) enum Want<'a> {
    Add(Growth),
    /// Delete one of `candidates` (a victim is picked).
    Remove(Vec<&'a MachineView>, Removal),
    /// Point the control plane at these endpoints.
    SwitchKcp(Vec<String>),
    /// The control plane is rolling onto the endpoints it was given.
    WaitForKcp(String),
    Nothing,
}

/// Scale and rollout decisions (SPEC-etcdcluster.md "Scale up / down", "Rolling replacement").
pub(super) fn want(o: &Observed) -> Want<'_> {
    let active: Vec<&MachineView> = o.active_machines().collect();
    let outdated: Vec<&MachineView> = active.iter().copied().filter(|m| m.outdated.is_some()).collect();
    let n = usize::try_from(o.replicas).unwrap_or(0);
    let (a, old) = (active.len(), outdated.len());
    let up_to_date = a - old;
    if old == 0 {
        return match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => Want::Nothing,
        };
    }
    let kcp = o.kcp_in_use();
    match (kcp, o.surge()) {
        // Surge-then-switch: every new member first, one endpoint update, then the old ones go.
        (Some((name, endpoints, complete)), true) => {
            if up_to_date < n {
                if old > n {
                    return Want::Remove(outdated, Removal::ScaleDown);
                }
                return Want::Add(Growth::Rollout);
            }
            let desired = up_to_date_endpoints(o);
            let mut current = endpoints.to_vec();
            current.sort();
            if current != desired {
                Want::SwitchKcp(desired)
            } else if !complete {
                Want::WaitForKcp(name.to_string())
            } else {
                Want::Remove(outdated, Removal::Rollout)
            }
        }
        // One at a time, add first: never more than N+1 members.
        (None, true) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::ScaleUp),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::Rollout),
            std::cmp::Ordering::Equal => Want::Add(Growth::Rollout),
        },
        // One at a time, remove first: never more than N members; with a KCP, each new member
        // reaches the control plane before the next old one goes.
        (kcp, false) => match a.cmp(&n) {
            std::cmp::Ordering::Less => Want::Add(Growth::Rollout),
            std::cmp::Ordering::Greater => Want::Remove(active, Removal::ScaleDown),
            std::cmp::Ordering::Equal => {
                if let Some((name, endpoints, complete)) = kcp {
                    let mut current = endpoints.to_vec();
                    current.sort();
                    let voting = voting_endpoints(o);
                    if current != voting {
                        return Want::SwitchKcp(voting);
                    }
                    if !complete {
                        return Want::WaitForKcp(name.to_string());
                    }
                }
                Want::Remove(outdated, Removal::Rollout)
            }
        },
    }
}

impl Observed {
    /// Outdated members are replaced one at a time with a new one added first (`maxSurge` 1,
    /// or a single member, which cannot be replaced remove-first).
    pub(super) fn surge(&self) -> bool {
        self.max_surge >= 1 || self.replicas <= 1
    }
}

/// Client URLs of the members of up-to-date active Machines: the endpoints a rollout switches
/// the control plane to.
fn up_to_date_endpoints(o: &Observed) -> Vec<String> {
    sorted_urls(
        o,
        o.members().iter().filter(|m| {
            m.machine.as_deref().is_some_and(|name| {
                o.active_machines()
                    .any(|machine| machine.name == name && machine.outdated.is_none())
            })
        }),
    )
}

/// The rollout-relevant parts of a config, by field name: what a running member was installed
/// and started with. NTP, proxies, registry mirrors, CA bundles and users' SSH keys are left
/// out: changing them alone replaces nothing.
pub fn relevant_fields(spec: &EtcdadmConfigSpec) -> Map<String, Value> {
    let cloud = spec.cloud_init_config.clone().unwrap_or_default();
    let users: Vec<Value> = spec
        .users
        .iter()
        .map(|user| {
            let mut user = serde_json::to_value(user).unwrap_or(Value::Null);
            if let Some(fields) = user.as_object_mut() {
                fields.remove("sshAuthorizedKeys");
            }
            user
        })
        .collect();
    let bottlerocket = spec.bottlerocket_config.as_ref().map(|b| {
        json!({
            "etcdImage": b.etcd_image,
            "bootstrapImage": b.bootstrap_image,
            "adminImage": b.admin_image,
            "controlImage": b.control_image,
            "pauseImage": b.pause_image,
            "customHostContainers": b.custom_host_containers,
            "customBootstrapContainers": b.custom_bootstrap_containers,
            // Applied by Bottlerocket at boot only: a running member never sees a change.
            "kernel": b.kernel,
            "boot": b.boot,
        })
    });
    let mut fields = Map::new();
    let mut put = |name: &str, value: Value| {
        fields.insert(name.to_string(), value);
    };
    put("cloudInitConfig.version", json!(cloud.version));
    put("cloudInitConfig.etcdReleaseURL", json!(cloud.etcd_release_url));
    put("cloudInitConfig.installDir", json!(cloud.install_dir));
    put("cipherSuites", json!(spec.cipher_suites));
    put("etcdadmBuiltin", json!(spec.etcdadm_builtin()));
    put("etcdadmInstallCommands", json!(spec.etcdadm_install_commands));
    put("etcdadmFlavor", json!(spec.flavor()));
    put("preEtcdadmCommands", json!(spec.pre_etcdadm_commands));
    put("postEtcdadmCommands", json!(spec.post_etcdadm_commands));
    put("files", serde_json::to_value(&spec.files).unwrap_or(Value::Null));
    put("users", Value::Array(users));
    put("format", json!(spec.format().as_str()));
    put("bottlerocketConfig", bottlerocket.unwrap_or(Value::Null));
    fields
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::testing::*;
    use super::super::*;
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

    #[test]
    fn rollout_with_a_kcp_adds_all_then_switches_once_then_removes_the_old() {
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        let old = voting_endpoints(&o);
        let mut w = World::new(o);
        let steps = w.run();
        assert_eq!(w.max_members, 6, "surge to 2N");
        assert_eq!(w.kcp_writes.len(), 1, "one endpoint update: {:?}", w.kcp_writes);
        assert!(
            w.kcp_writes[0].iter().all(|e| !old.contains(e)),
            "{:?}",
            w.kcp_writes
        );
        assert!(new_members_only(&w), "{:?}", w.member_names());
        assert_eq!(w.o.machines.len(), 3);
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // Adds all come before the switch; removals all after it.
        let switch = steps
            .iter()
            .position(|s| matches!(s, Step::WriteKcpEndpoints { .. }))
            .unwrap();
        assert!(
            steps[..switch]
                .iter()
                .all(|s| !matches!(s, Step::DeleteMachine { .. }))
        );
        assert!(
            steps[switch..]
                .iter()
                .all(|s| !matches!(s, Step::CreateMachine { .. }))
        );
        assert_eq!(up_to_date_machines(&w.o), 3);
    }

    #[test]
    fn rollout_without_kcp_or_with_max_surge_zero_stays_within_its_bounds() {
        // No KCP, maxSurge 1: never more than N+1.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 4);
        assert_eq!(w.max_machines, 4);
        assert!(new_members_only(&w));
        assert_eq!(zone_counts(&w.o), vec![1, 1, 1]);
        // maxSurge 0 without KCP: never more than N.
        let mut o = zoned(3, false);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert!(new_members_only(&w));
        // maxSurge 0 with a KCP: never more than N, one control plane rollout per member.
        let mut o = zoned(3, true);
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 3);
        assert_eq!(w.kcp_writes.len(), 3, "{:?}", w.kcp_writes);
        assert!(new_members_only(&w));
        // A single member cannot be replaced remove-first: maxSurge 0 surges anyway.
        let mut o = zoned(1, true);
        o.replicas = 1;
        o.max_surge = 0;
        outdate_all(&mut o);
        let mut w = World::new(o);
        w.run();
        assert_eq!(w.max_members, 2);
        assert_eq!(w.kcp_writes.len(), 1);
        assert!(new_members_only(&w));
    }

    #[test]
    fn a_rollout_starts_only_healthy_pauses_when_health_is_lost_and_replaces_dead_members_first() {
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        members_mut(&mut o)[2] = unhealthy(members_mut(&mut o)[2].clone(), "connection refused");
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::ROLLOUT_PAUSED);
        assert!(step.is_refusal() && !step.writes());
        assert!(wait_message(&step).contains("c1-etcd-m2"), "{step:?}");
        // Mid-way (N+1 Machines), the dead member is the one removed.
        let mut o = zoned(3, false);
        outdate_all(&mut o);
        o.machines
            .push(machine("c1-etcd-n1", Some("10.0.1.1"), Some("a")));
        members_mut(&mut o).push(member(9, "c1-etcd-n1", "10.0.1.1"));
        members_mut(&mut o)[1] = unhealthy(members_mut(&mut o)[1].clone(), "connection refused");
        assert!(matches!(plan(&o), Step::DeleteMachine { machine, .. } if machine == "c1-etcd-m1"));
        // With a KCP, the switch waits for health too.
        let mut o = zoned(3, true);
        outdate_all(&mut o);
        for i in 0..3 {
            let name = format!("c1-etcd-n{i}");
            let address = format!("10.0.1.{i}");
            o.machines.push(machine(&name, Some(&address), Some("a")));
            members_mut(&mut o).push(MemberView {
                is_leader: false,
                ..member(10 + i, &name, &address)
            });
        }
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: healthy_client_urls(&o),
        });
        assert!(
            matches!(plan(&o), Step::WriteKcpEndpoints { .. }),
            "{:?}",
            plan(&o)
        );
        members_mut(&mut o)[4] = unhealthy(members_mut(&mut o)[4].clone(), "down");
        assert_eq!(wait_reason(&plan(&o)), reason::ROLLOUT_PAUSED);
    }
}
