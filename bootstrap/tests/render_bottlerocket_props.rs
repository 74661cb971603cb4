#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Whatever strings users put into a Bottlerocket spec, the rendered settings parse as TOML and
//! hand Bottlerocket back exactly what they wrote, in the setting each field maps to; the
//! kubeadm-bootstrap container's user data decodes to YAML with exactly the CA, the user's files
//! and the one etcdadm line; the admin container's to JSON with the user, hash and keys.

use std::collections::BTreeMap;

use base64::Engine;
use etcdadm_bootstrap::render::{
    CaFiles, DEFAULT_CIPHER_SUITES, EtcdadmCommand, HOST_ROOT, RenderInput, ResolvedSecrets, render_user_data,
};
use etcdadm_shared::api::config::{
    BottlerocketBootSettings, BottlerocketBootstrapContainer, BottlerocketConfig, BottlerocketHostContainer,
    BottlerocketKernelSettings, CertBundle, EtcdadmConfigSpec, File, Format, Ntp, ProxyConfiguration,
    RegistryMirrorConfiguration, User,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEfake\n-----END RSA PRIVATE KEY-----\n";
const JOIN_URL: &str = "https://10.0.0.1:2379";

/// Strings built from what breaks naive TOML (quotes, backslashes, controls, brackets, `=`,
/// `#`, dots in keys) and YAML, plus any char.
fn nasty() -> impl Strategy<Value = String> {
    let tricky = prop::sample::select(vec![
        "\"",
        "'",
        "\"\"\"",
        "'''",
        "\\",
        "\\u0041",
        "\n",
        "\r\n",
        "\t",
        "\u{0}",
        "\u{8}",
        "\u{c}",
        "\u{1b}",
        "\u{7f}",
        "\u{85}",
        "\u{2028}",
        "\u{feff}",
        "é",
        "😀",
        "#",
        "=",
        "[",
        "]",
        "[[",
        "{",
        "}",
        ".",
        ",",
        ":",
        ": ",
        "- ",
        "---",
        "true",
        "1979-05-27",
        "0x1F",
        "inf",
        "nan",
        " ",
        "$(x)",
        "{{ x }}",
    ]);
    let piece = prop_oneof![
        3 => any::<char>().prop_map(String::from),
        4 => tricky.prop_map(String::from),
        2 => "[a-z]{1,6}",
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// Fields admission requires to be non-blank.
fn filled() -> impl Strategy<Value = String> {
    nasty().prop_map(|s| format!("x{s}"))
}

fn base64_data() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 0..24)
        .prop_map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn names(prefix: &'static str) -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set("[a-z0-9_-]{1,8}", 0..3)
        .prop_map(move |set| set.into_iter().map(|n| format!("{prefix}{n}")).collect())
}

fn host_containers() -> impl Strategy<Value = Vec<BottlerocketHostContainer>> {
    names("h-").prop_flat_map(|names| {
        let n = names.len();
        (
            Just(names),
            prop::collection::vec((filled(), any::<bool>(), prop::option::of(base64_data())), n),
        )
            .prop_map(|(names, rest)| {
                names
                    .into_iter()
                    .zip(rest)
                    .map(
                        |(name, (image, superpowered, user_data))| BottlerocketHostContainer {
                            name,
                            superpowered,
                            image,
                            user_data,
                        },
                    )
                    .collect()
            })
    })
}

fn bootstrap_containers() -> impl Strategy<Value = Vec<BottlerocketBootstrapContainer>> {
    names("b-").prop_flat_map(|names| {
        let n = names.len();
        let mode = prop::sample::select(vec!["always", "off", "once"]);
        (
            Just(names),
            prop::collection::vec(
                (filled(), any::<bool>(), mode, prop::option::of(base64_data())),
                n,
            ),
        )
            .prop_map(|(names, rest)| {
                names
                    .into_iter()
                    .zip(rest)
                    .map(
                        |(name, (image, essential, mode, user_data))| BottlerocketBootstrapContainer {
                            name,
                            image,
                            essential,
                            mode: mode.into(),
                            user_data,
                        },
                    )
                    .collect()
            })
    })
}

fn bottlerocket_config() -> impl Strategy<Value = BottlerocketConfig> {
    let etcd_image = (
        "[a-z0-9][a-z0-9./-]{0,15}",
        any::<bool>(),
        "[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}(-[a-z0-9]{1,5})?",
    )
        .prop_map(|(repo, v, version)| format!("{repo}:{}{version}", if v { "v" } else { "" }));
    (
        (etcd_image, filled(), nasty(), nasty(), filled()),
        host_containers(),
        bootstrap_containers(),
        prop::collection::btree_map(filled(), nasty(), 0..3),
        prop::collection::btree_map(filled(), prop::collection::vec(nasty(), 0..3), 0..3),
    )
        .prop_map(
            |(
                (etcd_image, bootstrap_image, admin_image, control_image, pause_image),
                hosts,
                boots,
                sysctl,
                params,
            )| {
                BottlerocketConfig {
                    etcd_image: Some(etcd_image),
                    bootstrap_image,
                    admin_image,
                    control_image,
                    pause_image,
                    custom_host_containers: hosts,
                    custom_bootstrap_containers: boots,
                    kernel: Some(BottlerocketKernelSettings {
                        sysctl_settings: sysctl,
                    }),
                    boot: Some(BottlerocketBootSettings {
                        boot_kernel_parameters: params,
                    }),
                }
            },
        )
}

fn user() -> impl Strategy<Value = User> {
    (
        "[a-z_][a-z0-9_-]{0,10}",
        prop::collection::vec(nasty(), 0..3),
        prop::option::of(nasty()),
        prop::option::of(any::<bool>()),
        any::<bool>(),
    )
        .prop_map(|(name, keys, passwd, lock_password, sudo)| User {
            name,
            ssh_authorized_keys: keys,
            passwd,
            lock_password,
            sudo: sudo.then(|| "ALL=(ALL) NOPASSWD:ALL".into()),
            ..Default::default()
        })
}

fn files() -> impl Strategy<Value = Vec<File>> {
    let dir = prop::sample::select(vec!["/var", "/opt", "/local", "/mnt"]);
    let owner = prop::option::of(prop::sample::select(vec!["root", "root:root"]));
    let mode = prop::option::of(prop::sample::select(vec!["0600", "0644", "755"]));
    prop::collection::vec((dir, nasty(), owner, mode, prop::option::of(nasty())), 0..4).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (dir, name, owner, permissions, content))| {
                // A distinct directory per file (duplicates are refused); no `..` segment.
                let name: Vec<&str> = name.split('/').map(|s| if s == ".." { "_" } else { s }).collect();
                File {
                    path: format!("{dir}/f{i}/{}", name.join("/")),
                    owner: owner.map(str::to_string),
                    permissions: permissions.map(str::to_string),
                    content,
                    ..Default::default()
                }
            })
            .collect()
    })
}

fn cipher_suites() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop::sample::subsequence(
        vec![
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        ],
        0..3,
    ))
    .prop_map(|list| list.map(|l| l.join(",")))
}

#[derive(Debug, Clone)]
struct Case {
    spec: EtcdadmConfigSpec,
    machine_name: String,
    login: Option<(String, String)>,
    join: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let proxy = (
        prop::option::of(nasty()),
        any::<bool>(),
        prop::collection::vec(nasty(), 0..3),
    )
        .prop_map(|(https_proxy, same_http, no_proxy)| ProxyConfiguration {
            http_proxy: https_proxy.clone().filter(|_| same_http),
            https_proxy,
            no_proxy,
        });
    let mirror = (
        "[a-z]{1,8}\\.example(:[1-9][0-9]{1,3})?",
        prop::option::of(nasty()),
    )
        .prop_map(|(endpoint, ca_cert)| RegistryMirrorConfiguration {
            endpoint: Some(endpoint),
            ca_cert,
            insecure_skip_verify: None,
        });
    let ntp = (prop::option::of(Just(true)), prop::collection::vec(nasty(), 0..3))
        .prop_map(|(enabled, servers)| Ntp { servers, enabled });
    let bundles = names("c.").prop_flat_map(|names| {
        let n = names.len();
        (Just(names), prop::collection::vec(nasty(), n)).prop_map(|(names, data)| {
            names
                .into_iter()
                .zip(data)
                .map(|(name, data)| CertBundle { name, data })
                .collect::<Vec<_>>()
        })
    });
    (
        (
            bottlerocket_config(),
            prop::option::of(user()),
            files(),
            cipher_suites(),
        ),
        (
            prop::option::of(proxy),
            prop::option::of(mirror),
            prop::option::of(ntp),
            bundles,
        ),
        (filled(), prop::option::of((nasty(), nasty())), any::<bool>()),
    )
        .prop_map(
            |(
                (config, user, files, cipher_suites),
                (proxy, mirror, ntp, bundles),
                (machine_name, login, join),
            )| Case {
                spec: EtcdadmConfigSpec {
                    format: Some(Format::Bottlerocket),
                    bottlerocket_config: Some(config),
                    users: user.into_iter().collect(),
                    files,
                    cipher_suites,
                    proxy,
                    registry_mirror: mirror,
                    ntp,
                    cert_bundles: bundles,
                    ..Default::default()
                },
                machine_name,
                login,
                join,
            },
        )
}

fn render(case: &Case) -> String {
    let mut secrets = ResolvedSecrets::default();
    if let Some((username, password)) = &case.login {
        secrets.registry_username = Some(username.clone());
        secrets.registry_password = Some(password.clone());
    }
    let urls = vec![JOIN_URL.to_string()];
    render_user_data(&RenderInput {
        spec: &case.spec,
        machine_name: &case.machine_name,
        ca: CaFiles {
            cert_pem: CA_CERT,
            key_pem: CA_KEY,
        },
        command: if case.join {
            EtcdadmCommand::Join {
                urls: &urls,
                learner: None,
            }
        } else {
            EtcdadmCommand::Init
        },
        secrets: &secrets,
    })
    .unwrap_or_else(|e| panic!("a valid spec must render: {e}"))
}

fn decode(value: &toml::Value) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.as_str().unwrap())
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

fn strings(items: &[String]) -> toml::Value {
    toml::Value::from(items.to_vec())
}

fn optional<'a>(table: &'a toml::Value, key: &str) -> Option<&'a str> {
    table.get(key).map(|v| v.as_str().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_value_reaches_its_setting_intact(case in case()) {
        let spec = &case.spec;
        let config = spec.bottlerocket_config.clone().unwrap();
        let text = render(&case);
        let doc: toml::Table = toml::from_str(&text)
            .unwrap_or_else(|e| panic!("rendered settings are not TOML: {e}\n{text}"));
        let settings = &doc["settings"];

        // Host containers: ours, then the spec's.
        let hosts = &settings["host-containers"];
        prop_assert_eq!(optional(&hosts["admin"], "source"), Some(config.admin_image.as_str()).filter(|i| !i.is_empty()));
        let user = spec.users.first();
        let admin: Value = serde_json::from_str(&decode(&hosts["admin"]["user-data"])).unwrap();
        let keys = user.map(|u| u.ssh_authorized_keys.clone()).unwrap_or_default();
        prop_assert_eq!(&admin["ssh"]["authorized-keys"], &json!(keys));
        prop_assert_eq!(admin.get("user").and_then(Value::as_str), user.map(|u| u.name.as_str()));
        let hash = user.filter(|u| u.lock_password == Some(false)).and_then(|u| u.passwd.as_deref());
        prop_assert_eq!(admin.get("password-hash").and_then(Value::as_str), hash);
        prop_assert_eq!(optional(&hosts["kubeadm-bootstrap"], "source"), Some(config.bootstrap_image.as_str()));
        prop_assert_eq!(hosts.get("control").is_some(), !config.control_image.is_empty());
        if !config.control_image.is_empty() {
            prop_assert_eq!(optional(&hosts["control"], "source"), Some(config.control_image.as_str()));
        }
        for c in &config.custom_host_containers {
            let host = &hosts[c.name.as_str()];
            prop_assert_eq!(optional(host, "source"), Some(c.image.as_str()));
            prop_assert_eq!(host["superpowered"].as_bool(), Some(c.superpowered));
            prop_assert_eq!(optional(host, "user-data"), c.user_data.as_deref());
        }
        prop_assert_eq!(hosts.as_table().unwrap().len(), 2 + usize::from(!config.control_image.is_empty()) + config.custom_host_containers.len());

        // The bootstrap container: exactly the CA, the user's files, and the etcdadm line.
        let container: Value = serde_saphyr::from_str(&decode(&hosts["kubeadm-bootstrap"]["user-data"])).unwrap();
        let mut expected_files = vec![
            json!({"path": "/var/lib/etcd/pki/ca.crt", "owner": "root:root", "permissions": "0640", "content": CA_CERT}),
            json!({"path": "/var/lib/etcd/pki/ca.key", "owner": "root:root", "permissions": "0600", "content": CA_KEY}),
        ];
        expected_files.extend(spec.files.iter().map(|f| json!({
            "path": format!("{HOST_ROOT}{}", f.path),
            "owner": f.owner.as_deref().unwrap_or("root:root"),
            "permissions": f.permissions.as_deref().unwrap_or("0644"),
            "content": f.content.as_deref().unwrap_or(""),
        })));
        let (repository, version) = config.etcd_image.as_deref().unwrap().rsplit_once(':').unwrap();
        let ciphers = spec.cipher_suites.clone().filter(|c| !c.is_empty()).unwrap_or_else(|| DEFAULT_CIPHER_SUITES.into());
        let words = format!("{repository} {} {ciphers}", version.trim_start_matches('v'));
        let runcmd = if case.join { format!("EtcdadmJoin {words} {JOIN_URL}") } else { format!("EtcdadmInit {words}") };
        prop_assert_eq!(container, json!({"write_files": expected_files, "runcmd": runcmd}));

        let kubernetes = &settings["kubernetes"];
        prop_assert_eq!(optional(kubernetes, "pod-infra-container-image"), Some(config.pause_image.as_str()));

        let network = &settings["network"];
        let proxy = spec.proxy.clone().unwrap_or_default();
        prop_assert_eq!(optional(network, "hostname"), Some(case.machine_name.as_str()));
        prop_assert_eq!(optional(network, "https-proxy"), proxy.https_proxy.as_deref());
        let no_proxy = (!proxy.no_proxy.is_empty()).then(|| strings(&proxy.no_proxy));
        prop_assert_eq!(network.get("no-proxy"), no_proxy.as_ref());

        for c in &config.custom_bootstrap_containers {
            let boot = &settings["bootstrap-containers"][c.name.as_str()];
            prop_assert_eq!(optional(boot, "source"), Some(c.image.as_str()));
            prop_assert_eq!(optional(boot, "mode"), Some(c.mode.as_str()));
            prop_assert_eq!(boot["essential"].as_bool(), Some(c.essential));
            prop_assert_eq!(optional(boot, "user-data"), c.user_data.as_deref());
        }

        // Registry mirror, its login and CA; trust bundles.
        let mirror = spec.registry_mirror.clone();
        let registry = settings.get("container-registry");
        match &mirror {
            None => prop_assert!(registry.is_none()),
            Some(m) => {
                let endpoint = m.endpoint.clone().unwrap();
                let registry = registry.unwrap();
                prop_assert_eq!(&registry["mirrors"]["public.ecr.aws"], &strings(&[format!("https://{endpoint}")]));
                match &case.login {
                    None => prop_assert!(registry.get("credentials").is_none()),
                    Some((username, password)) => {
                        let logins = registry["credentials"].as_array().unwrap();
                        let got: Vec<(&str, &str, &str)> = logins.iter().map(|l| (optional(l, "registry").unwrap(), optional(l, "username").unwrap(), optional(l, "password").unwrap())).collect();
                        prop_assert_eq!(got, vec![("public.ecr.aws", username.as_str(), password.as_str()), (endpoint.as_str(), username.as_str(), password.as_str())]);
                    }
                }
            }
        }
        let mut bundles: BTreeMap<String, String> = spec.cert_bundles.iter().map(|b| (b.name.clone(), b.data.clone())).collect();
        if let Some(ca) = mirror.and_then(|m| m.ca_cert).filter(|c| !c.is_empty()) {
            bundles.insert("registry-mirror-ca".into(), ca);
        }
        let pki: BTreeMap<String, String> = settings.get("pki").and_then(toml::Value::as_table).map(|t| t.iter().map(|(name, bundle)| {
            assert_eq!(bundle["trusted"].as_bool(), Some(true));
            (name.clone(), decode(&bundle["data"]))
        }).collect()).unwrap_or_default();
        prop_assert_eq!(pki, bundles);

        let servers = spec.ntp.as_ref().map(|n| n.servers.clone()).unwrap_or_default();
        let time_servers = (!servers.is_empty()).then(|| strings(&servers));
        prop_assert_eq!(settings.get("ntp").map(|n| &n["time-servers"]), time_servers.as_ref());

        let sysctl: BTreeMap<String, String> = settings.get("kernel").map(|k| k["sysctl"].as_table().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect()).unwrap_or_default();
        prop_assert_eq!(sysctl, config.kernel.clone().unwrap().sysctl_settings);
        let parameters: BTreeMap<String, Vec<String>> = settings.get("boot").map(|b| {
            assert_eq!(b["reboot-to-reconcile"].as_bool(), Some(true));
            b["kernel-parameters"].as_table().unwrap().iter().map(|(k, v)| (k.clone(), v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect())).collect()
        }).unwrap_or_default();
        prop_assert_eq!(parameters, config.boot.clone().unwrap().boot_kernel_parameters);
    }
}
