#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `etcdadm-bootstrap render` prints the same user data the controller would write, from files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use etcdadm_bootstrap::render::{CaFiles, EtcdadmCommand, RenderInput, ResolvedSecrets, render_user_data};
use etcdadm_shared::api::config::EtcdadmConfig;
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::testing::TempDir;

fn full_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/full-config.yaml")
}

/// One real RSA CA for all tests: the CLI refuses a CA etcdadm could not use.
fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate("etcd-ca").unwrap())
}

fn ca_dir() -> TempDir {
    let dir = TempDir::new("render-cli-ca");
    std::fs::write(dir.path().join("ca.crt"), ca().cert_pem()).unwrap();
    std::fs::write(dir.path().join("ca.key"), ca().key_pem()).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etcdadm-bootstrap"))
        .arg("render")
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn prints_what_the_library_renders_with_secrets_from_files() {
    let ca_dir = ca_dir();
    let config = full_config();
    let passwd = write(ca_dir.path(), "passwd", "$6$cli$hash");
    let token = write(ca_dir.path(), "token", "token-from-file\n");
    let out = run(&[
        "-f",
        config.to_str().unwrap(),
        "--ca-dir",
        ca_dir.path().to_str().unwrap(),
        "--init",
        "--secret",
        &format!("deploy-password/passwd={passwd}"),
        "--secret",
        &format!("tokens/etcd-token={token}"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    let spec = serde_saphyr::from_str::<EtcdadmConfig>(&std::fs::read_to_string(&config).unwrap())
        .unwrap()
        .spec;
    let mut secrets = ResolvedSecrets::default();
    secrets
        .user_passwords
        .insert("deploy".into(), "$6$cli$hash".into());
    secrets
        .file_contents
        .insert("/etc/etcd/token".into(), "token-from-file\n".into());
    let expected = render_user_data(&RenderInput {
        spec: &spec,
        machine_name: "etcd-a1b2c",
        ca: CaFiles {
            cert_pem: ca().cert_pem(),
            key_pem: ca().key_pem(),
        },
        command: EtcdadmCommand::Init,
        secrets: &secrets,
    })
    .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
}

#[test]
fn a_missing_secret_value_names_the_field() {
    let ca_dir = ca_dir();
    let out = run(&[
        "-f",
        full_config().to_str().unwrap(),
        "--ca-dir",
        ca_dir.path().to_str().unwrap(),
        "--init",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("spec.users[1].passwdFrom: Secret deploy-password key passwd was not resolved"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn join_with_machine_name_override() {
    let dir = ca_dir();
    let config = write(
        dir.path(),
        "config.yaml",
        "apiVersion: bootstrap.cluster.x-k8s.io/v1beta1\nkind: EtcdadmConfig\nmetadata:\n  name: from-metadata\nspec: {}\n",
    );
    let out = run(&[
        "-f",
        &config,
        "--ca-dir",
        dir.path().to_str().unwrap(),
        "--join",
        "https://10.0.0.1:2379",
        "--join",
        "https://10.0.0.2:2379",
        "--machine-name",
        "etcd-x",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "  - \"etcdadm join https://10.0.0.1:2379 --init-system systemd --name etcd-x && echo success"
        ),
        "{text}"
    );
}

#[test]
fn bad_invocations_say_what_is_wrong() {
    let dir = ca_dir();
    let ca = dir.path().to_str().unwrap().to_string();
    let config = full_config().to_str().unwrap().to_string();
    let unnamed = write(
        dir.path(),
        "unnamed.yaml",
        "kind: EtcdadmConfig\nmetadata: {}\nspec: {}\n",
    );
    let wrong_kind = write(
        dir.path(),
        "machine.yaml",
        "kind: Machine\nmetadata:\n  name: m\nspec: {}\n",
    );
    let empty = TempDir::new("render-cli-empty");

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-f", &config, "--ca-dir", &ca], "--init"),
        (vec!["-f", &unnamed, "--ca-dir", &ca, "--init"], "no machine name"),
        (
            vec!["-f", &wrong_kind, "--ca-dir", &ca, "--init"],
            "expected EtcdadmConfig",
        ),
        (
            vec![
                "-f",
                &unnamed,
                "--ca-dir",
                empty.path().to_str().unwrap(),
                "--init",
                "--machine-name",
                "m",
            ],
            "ca.crt",
        ),
        (
            vec!["-f", &config, "--ca-dir", &ca, "--init", "--secret", "nope"],
            "expected NAME/KEY=FILE",
        ),
        (
            vec![
                "-f",
                &config,
                "--ca-dir",
                &ca,
                "--init",
                "--secret",
                "typo/passwd=/dev/null",
            ],
            "the config refers to no Secret typo key passwd",
        ),
    ];
    for (args, expected) in cases {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn a_config_marked_for_a_learner_join_previews_the_learner_join() {
    let dir = ca_dir();
    let config = |annotations: &str| {
        format!(
            "apiVersion: bootstrap.cluster.x-k8s.io/v1beta1\nkind: EtcdadmConfig\nmetadata:\n  \
             name: etcd-b2\n{annotations}spec: {{}}\n"
        )
    };
    let marked = write(
        dir.path(),
        "marked.yaml",
        &config("  annotations:\n    etcdcluster.cluster.x-k8s.io/learner-join: \"true\"\n"),
    );
    let plain = write(dir.path(), "plain.yaml", &config(""));
    let render = |file: &str| {
        let out = run(&[
            "-f",
            file,
            "--ca-dir",
            dir.path().to_str().unwrap(),
            "--join",
            "https://10.0.0.2:2379",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let learner = render(&marked);
    assert!(
        learner
            .contains("sh /run/cluster-api/etcd-learner-join.sh wait-listed 1200 https://10.0.0.2:2379 && "),
        "{learner}"
    );
    assert!(learner.contains("path: \"/run/cluster-api/etcd-learner-join.sh\""));
    let voter = render(&plain);
    assert!(!voter.contains("etcd-learner-join"), "{voter}");
    assert!(voter.contains("\"etcdadm join https://10.0.0.2:2379 --init-system systemd --name etcd-b2 && "));
}

#[test]
fn prints_bottlerocket_settings_with_the_mirror_login_from_files() {
    let dir = ca_dir();
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/bottlerocket-full-config.yaml");
    let token = write(dir.path(), "token", "t\n");
    let username = write(dir.path(), "username", "robot");
    let password = write(dir.path(), "password", "pw");
    let out = run(&[
        "-f",
        config.to_str().unwrap(),
        "--ca-dir",
        dir.path().to_str().unwrap(),
        "--join",
        "https://10.0.0.1:2379",
        "--secret",
        &format!("tokens/etcd-token={token}"),
        "--secret",
        &format!("registry-credentials/username={username}"),
        "--secret",
        &format!("registry-credentials/password={password}"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let settings: toml::Table = toml::from_str(&text).unwrap();
    let settings = &settings["settings"];
    assert_eq!(settings["network"]["hostname"].as_str(), Some("etcd-b1c2d"));
    assert_eq!(
        settings["container-registry"]["credentials"][0]["username"].as_str(),
        Some("robot")
    );

    // Without the login the machine pulls anonymously; the rest must still be given.
    let out = run(&[
        "-f",
        config.to_str().unwrap(),
        "--ca-dir",
        dir.path().to_str().unwrap(),
        "--init",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("spec.files[1].contentFrom: Secret tokens key etcd-token was not resolved"),
        "{}",
        stderr(&out)
    );
}
