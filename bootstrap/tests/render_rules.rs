#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Rules of the renderer beyond the goldens: errors that name the field to fix, and choices the
//! goldens only show one side of.

use etcdadm_bootstrap::render::{
    CaFiles, EtcdadmCommand, RenderError, RenderInput, ResolvedSecrets, render_user_data,
};
use etcdadm_shared::api::config::{
    BottlerocketConfig, CertBundle, EtcdadmConfigSpec, File, FileSource, Format, Ntp, PasswdSource,
    RegistryMirrorConfiguration, SecretKeyRef, User,
};
use serde_json::Value;

const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEfake\n-----END RSA PRIVATE KEY-----\n";

fn render_command(
    spec: &EtcdadmConfigSpec,
    secrets: &ResolvedSecrets,
    command: EtcdadmCommand,
) -> Result<String, RenderError> {
    render_user_data(&RenderInput {
        spec,
        machine_name: "etcd-0",
        ca: CaFiles {
            cert_pem: CA_CERT,
            key_pem: CA_KEY,
        },
        command,
        secrets,
    })
}

fn render_with(spec: &EtcdadmConfigSpec, secrets: &ResolvedSecrets) -> Result<String, RenderError> {
    render_command(spec, secrets, EtcdadmCommand::Init)
}

fn render(spec: &EtcdadmConfigSpec) -> Result<String, RenderError> {
    render_with(spec, &ResolvedSecrets::default())
}

fn parsed(spec: &EtcdadmConfigSpec) -> Value {
    serde_saphyr::from_str(&render(spec).unwrap()).unwrap()
}

fn runcmd(doc: &Value) -> Vec<String> {
    doc["runcmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

fn secret(name: &str, key: &str) -> SecretKeyRef {
    SecretKeyRef {
        name: name.into(),
        key: key.into(),
    }
}

fn file(path: &str, content: &str) -> File {
    File {
        path: path.into(),
        content: Some(content.into()),
        ..Default::default()
    }
}

#[test]
fn unresolved_passwd_from_names_the_user_field() {
    let spec = EtcdadmConfigSpec {
        users: vec![
            User {
                name: "ops".into(),
                ..Default::default()
            },
            User {
                name: "deploy".into(),
                passwd_from: Some(PasswdSource {
                    secret: secret("deploy-password", "passwd"),
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let err = render(&spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.users[1].passwdFrom: Secret deploy-password key passwd was not resolved"
    );
    assert_eq!(err.field_path(), Some("spec.users[1].passwdFrom"));

    let mut secrets = ResolvedSecrets::default();
    secrets.user_passwords.insert("deploy".into(), "$6$x".into());
    let doc: Value = serde_saphyr::from_str(&render_with(&spec, &secrets).unwrap()).unwrap();
    assert_eq!(doc["users"][1]["passwd"], "$6$x");
}

#[test]
fn unresolved_content_from_names_the_file_field() {
    let spec = EtcdadmConfigSpec {
        files: vec![File {
            path: "/etc/token".into(),
            content_from: Some(FileSource {
                secret: secret("tokens", "t"),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        render(&spec).unwrap_err().to_string(),
        "spec.files[0].contentFrom: Secret tokens key t was not resolved"
    );
}

fn bottlerocket() -> EtcdadmConfigSpec {
    EtcdadmConfigSpec {
        format: Some(Format::Bottlerocket),
        bottlerocket_config: Some(BottlerocketConfig {
            etcd_image: Some("public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9".into()),
            bootstrap_image: "bootstrap:v1".into(),
            pause_image: "pause:3.9".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Admission refuses these; a spec that reaches the controller anyway (webhook down, object
/// created before it) gets the same answer from the renderer, never a document without them.
#[test]
fn bottlerocket_refuses_what_it_cannot_carry_by_field() {
    assert!(render(&bottlerocket()).is_ok());
    let cases: [(EtcdadmConfigSpec, &str); 5] = [
        (
            EtcdadmConfigSpec {
                bottlerocket_config: None,
                ..bottlerocket()
            },
            "spec.bottlerocketConfig",
        ),
        (
            EtcdadmConfigSpec {
                pre_etcdadm_commands: vec!["echo hi".into()],
                ..bottlerocket()
            },
            "spec.preEtcdadmCommands",
        ),
        (
            EtcdadmConfigSpec {
                cloud_init_config: Some(Default::default()),
                ..bottlerocket()
            },
            "spec.cloudInitConfig",
        ),
        (
            EtcdadmConfigSpec {
                files: vec![file("/etc/motd", "hi")],
                ..bottlerocket()
            },
            "spec.files[0].path",
        ),
        (
            EtcdadmConfigSpec {
                users: vec![User {
                    name: "ops".into(),
                    shell: Some("/bin/zsh".into()),
                    ..Default::default()
                }],
                ..bottlerocket()
            },
            "spec.users[0].shell",
        ),
    ];
    for (spec, field) in cases {
        let err = render(&spec).unwrap_err();
        assert_eq!(err.field_path(), Some(field), "{err}");
    }
}

#[test]
fn a_bottlerocket_mirror_login_needs_both_keys() {
    let spec = EtcdadmConfigSpec {
        registry_mirror: Some(RegistryMirrorConfiguration {
            endpoint: Some("mirror.example:5000".into()),
            ca_cert: None,
            insecure_skip_verify: None,
        }),
        ..bottlerocket()
    };
    assert!(
        !render(&spec).unwrap().contains("credentials"),
        "no Secret: anonymous pulls"
    );
    let mut secrets = ResolvedSecrets {
        registry_username: Some("robot".into()),
        ..Default::default()
    };
    let err = render_with(&spec, &secrets).unwrap_err();
    assert_eq!(err.field_path(), Some("spec.registryMirror"));
    assert!(err.to_string().contains("both username and password"), "{err}");
    secrets.registry_password = Some("pw".into());
    assert!(
        render_with(&spec, &secrets)
            .unwrap()
            .contains("[[settings.container-registry.credentials]]")
    );
}

#[test]
fn file_errors_name_the_offending_entry() {
    let both = File {
        content_from: Some(FileSource {
            secret: secret("s", "k"),
        }),
        ..file("/etc/x", "inline")
    };
    let cases = [
        (
            vec![both],
            "spec.files[0]: content and contentFrom are mutually exclusive",
        ),
        (
            vec![file("etc/x", "")],
            "spec.files[0].path: \"etc/x\" is not an absolute path",
        ),
        (
            vec![file("/etc/etcd/pki/ca.key", "mine")],
            "spec.files[0]: path /etc/etcd/pki/ca.key is written by the bootstrap provider itself",
        ),
        (
            vec![file("/etc/a", "1"), file("/etc/a", "2")],
            "spec.files[1]: path /etc/a is also written by spec.files[0]",
        ),
    ];
    for (files, expected) in cases {
        let spec = EtcdadmConfigSpec {
            files,
            ..Default::default()
        };
        let err = render(&spec).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{err}");
    }
}

#[test]
fn cert_bundle_names_must_be_plain_file_names() {
    for name in ["../etc/passwd", "", "a b", ".."] {
        let spec = EtcdadmConfigSpec {
            cert_bundles: vec![CertBundle {
                name: name.into(),
                data: "PEM".into(),
            }],
            ..Default::default()
        };
        let err = render(&spec).unwrap_err().to_string();
        assert!(err.starts_with("spec.certBundles[0].name: "), "{err}");
    }
}

#[test]
fn an_empty_ca_is_refused() {
    let err = render_user_data(&RenderInput {
        spec: &EtcdadmConfigSpec::default(),
        machine_name: "etcd-0",
        ca: CaFiles {
            cert_pem: CA_CERT,
            key_pem: " \n",
        },
        command: EtcdadmCommand::Init,
        secrets: &ResolvedSecrets::default(),
    })
    .unwrap_err();
    assert!(err.to_string().starts_with("etcd CA: "), "{err}");
}

#[test]
fn builtin_etcdadm_gets_no_install_commands() {
    let spec = EtcdadmConfigSpec {
        etcdadm_builtin: Some(true),
        etcdadm_install_commands: vec!["never run".into()],
        ..Default::default()
    };
    let commands = runcmd(&parsed(&spec));
    assert_eq!(commands[0], "systemctl stop kubelet");
    assert!(
        !commands
            .iter()
            .any(|c| c == "never run" || c.contains("releases/download"))
    );
}

#[test]
fn ntp_enabled_is_rendered_as_given() {
    for (enabled, expected) in [(Some(true), Some(true)), (Some(false), Some(false)), (None, None)] {
        let spec = EtcdadmConfigSpec {
            ntp: Some(Ntp {
                servers: vec!["pool.ntp.org".into()],
                enabled,
            }),
            ..Default::default()
        };
        let doc = parsed(&spec);
        assert_eq!(doc["ntp"].get("enabled").and_then(Value::as_bool), expected);
        assert_eq!(doc["ntp"]["servers"][0], "pool.ntp.org");
    }
    assert!(parsed(&EtcdadmConfigSpec::default()).get("ntp").is_none());
}

#[test]
fn cert_bundles_are_trusted_before_install_commands_run() {
    let spec = EtcdadmConfigSpec {
        pre_etcdadm_commands: vec!["first".into()],
        cert_bundles: vec![CertBundle {
            name: "corp".into(),
            data: "-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n".into(),
        }],
        ..Default::default()
    };
    let doc = parsed(&spec);
    let commands = runcmd(&doc);
    assert_eq!(commands[..2], ["first", "update-ca-certificates"]);
    assert!(commands[2].contains("releases/download"));
    let bundle = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/usr/local/share/ca-certificates/corp.crt")
        .unwrap();
    assert_eq!(bundle["content"], spec.cert_bundles[0].data);
}

#[test]
fn bottlerocket_settings_under_cloud_config_are_refused_not_dropped() {
    let spec = EtcdadmConfigSpec {
        bottlerocket_config: Some(Default::default()),
        ..Default::default()
    };
    match render(&spec) {
        Err(RenderError::InvalidField { field_path, message }) => {
            assert_eq!(field_path, "spec.bottlerocketConfig");
            assert!(message.contains("format bottlerocket"), "{message}");
        }
        other => panic!("expected an InvalidField error, got {other:?}"),
    }
}

#[test]
fn two_users_with_one_name_are_refused() {
    let user = |name: &str| User {
        name: name.into(),
        ..Default::default()
    };
    let spec = EtcdadmConfigSpec {
        users: vec![user("ops"), user("dev"), user("ops")],
        ..Default::default()
    };
    match render(&spec) {
        Err(RenderError::InvalidField { field_path, message }) => {
            assert_eq!(field_path, "spec.users[2].name");
            assert!(message.contains("spec.users[0]"), "{message}");
        }
        other => panic!("expected an InvalidField error, got {other:?}"),
    }
}

#[test]
fn a_password_from_a_secret_wins_over_an_inline_one() {
    let spec = EtcdadmConfigSpec {
        users: vec![User {
            name: "ops".into(),
            passwd: Some("inline-hash".into()),
            passwd_from: Some(PasswdSource {
                secret: secret("pw", "hash"),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut secrets = ResolvedSecrets::default();
    secrets.user_passwords.insert("ops".into(), "secret-hash".into());
    let doc: Value = serde_saphyr::from_str(&render_with(&spec, &secrets).unwrap()).unwrap();
    assert_eq!(doc["users"][0]["passwd"], "secret-hash");
}

#[test]
fn every_file_encoding_is_passed_to_cloud_init() {
    use etcdadm_shared::api::config::Encoding;
    for (encoding, name) in [
        (Encoding::Base64, "base64"),
        (Encoding::Gzip, "gzip"),
        (Encoding::GzipBase64, "gzip+base64"),
    ] {
        let spec = EtcdadmConfigSpec {
            files: vec![File {
                encoding: Some(encoding),
                ..file("/etc/blob", "H4sIAAAAAAAA")
            }],
            ..Default::default()
        };
        let doc = parsed(&spec);
        let blob = doc["write_files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/etc/blob")
            .unwrap();
        assert_eq!(blob["encoding"], name);
        assert_eq!(blob["content"], "H4sIAAAAAAAA");
    }
}

#[test]
fn eks_anywhere_init_passes_cipher_suites_as_a_flag() {
    use etcdadm_shared::api::config::EtcdadmFlavor;
    let spec = EtcdadmConfigSpec {
        etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
        cipher_suites: Some("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()),
        ..Default::default()
    };
    let commands = runcmd(&parsed(&spec));
    let etcdadm = commands.iter().find(|c| c.starts_with("etcdadm init")).unwrap();
    assert!(
        etcdadm.contains("--cipher-suites TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
        "{etcdadm}"
    );
    assert!(
        !commands.iter().any(|c| c.contains("ETCD_CIPHER_SUITES")),
        "{commands:?}"
    );
}

/// A restoring first member: the URL only in the root-only curl config, the runcmd line valid
/// POSIX sh (shellcheck, every severity), and Bottlerocket refusing with the field to fix.
#[test]
fn a_restoring_init_keeps_the_url_in_a_root_only_file_and_is_shellcheck_clean() {
    use etcdadm_bootstrap::render::{RESTORE_CURL_CONFIG, SnapshotDownload};
    let download = SnapshotDownload {
        url:
            "https://s3.example/etcd-backups/ns/c0/s.db?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=0a1b"
                .into(),
        sha256: Some("c".repeat(64)),
        ca_pem: None,
        bump_revision: Some(1_000_000_000),
        insecure: false,
        size: Some(10 << 20),
    };
    let secrets = ResolvedSecrets::default();
    let render_for = |spec: &EtcdadmConfigSpec| {
        render_command(spec, &secrets, EtcdadmCommand::InitFromSnapshot(&download))
    };
    let doc: Value = serde_saphyr::from_str(&render_for(&EtcdadmConfigSpec::default()).unwrap()).unwrap();
    let config = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == RESTORE_CURL_CONFIG)
        .unwrap();
    assert_eq!(config["permissions"], "0600");
    assert!(config["content"].as_str().unwrap().contains(&download.url));
    let commands = runcmd(&doc);
    assert!(commands.iter().all(|c| !c.contains("X-Amz")), "{commands:?}");
    let line = commands.iter().find(|c| c.contains("etcdadm init")).unwrap();
    assert!(
        line.contains("--snapshot /var/lib/etcd-restore/snapshot.db"),
        "{line}"
    );

    let shellcheck = std::env::var_os("SHELLCHECK").unwrap_or_else(|| "shellcheck".into());
    let mut child = std::process::Command::new(&shellcheck)
        .args(["--severity=style", "--shell=sh", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run shellcheck ({e}): install it with `apt-get install shellcheck` (.ci/setup does), or set SHELLCHECK")
        });
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("#!/bin/sh\n{line}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );

    let bottlerocket = EtcdadmConfigSpec {
        format: Some(Format::Bottlerocket),
        bottlerocket_config: Some(BottlerocketConfig {
            etcd_image: Some("r/etcd:v3.5.9".into()),
            bootstrap_image: "r/bootstrap:1".into(),
            admin_image: "r/admin:1".into(),
            control_image: "r/control:1".into(),
            pause_image: "r/pause:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = render_for(&bottlerocket).unwrap_err();
    assert_eq!(err.field_path(), Some("spec.format"), "{err}");
}
