#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Byte-exact user data for a spec with every field set and for an empty one: these files are
//! what machines run, so any change to them is reviewed. `UPDATE_GOLDEN=1` rewrites them.

use std::path::PathBuf;

use etcdadm_bootstrap::render::{
    CaFiles, EtcdadmCommand, LEARNER_JOIN_SCRIPT, LEARNER_LISTED_WAIT_SECONDS, RenderInput, ResolvedSecrets,
    SecretTarget, render_user_data, secret_refs,
};
use etcdadm_shared::api::config::{EtcdadmConfig, EtcdadmConfigSpec};

const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakeEtcdCA\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEfakeEtcdKey\n-----END RSA PRIVATE KEY-----\n";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn full_spec() -> EtcdadmConfigSpec {
    let text = std::fs::read_to_string(golden_dir().join("full-config.yaml")).unwrap();
    let config: EtcdadmConfig = serde_saphyr::from_str(&text).unwrap();
    config.spec
}

fn full_secrets(spec: &EtcdadmConfigSpec) -> ResolvedSecrets {
    let mut secrets = ResolvedSecrets::default();
    for r in secret_refs(spec) {
        let value = match &r.target {
            SecretTarget::UserPassword { .. } => "$6$rounds=4096$deploy$hash".to_string(),
            SecretTarget::FileContent { .. } => "token-from-secret\n".to_string(),
        };
        secrets.insert(&r.target, value);
    }
    secrets
}

fn render(spec: &EtcdadmConfigSpec, secrets: &ResolvedSecrets, command: EtcdadmCommand) -> String {
    render_user_data(&RenderInput {
        spec,
        machine_name: "etcd-a1b2c",
        ca: CaFiles {
            cert_pem: CA_CERT,
            key_pem: CA_KEY,
        },
        command,
        secrets,
    })
    .unwrap()
}

fn check_golden(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create it)", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the rendered user data (UPDATE_GOLDEN=1 rewrites it after review)\n\
         --- expected\n{expected}\n--- actual\n{actual}"
    );
}

fn join_urls() -> Vec<String> {
    vec![
        "https://10.0.0.11:2379".to_string(),
        "https://10.0.0.12:2379".to_string(),
    ]
}

#[test]
fn init_full() {
    let spec = full_spec();
    check_golden(
        "init-full.yaml",
        &render(&spec, &full_secrets(&spec), EtcdadmCommand::Init),
    );
}

#[test]
fn join_full() {
    let spec = full_spec();
    let urls = join_urls();
    check_golden(
        "join-full.yaml",
        &render(
            &spec,
            &full_secrets(&spec),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: false,
            },
        ),
    );
}

#[test]
fn join_learner_full() {
    let spec = full_spec();
    let urls = join_urls();
    check_golden(
        "join-learner-full.yaml",
        &render(
            &spec,
            &full_secrets(&spec),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: true,
            },
        ),
    );
}

#[test]
fn join_learner_minimal() {
    let spec = EtcdadmConfigSpec::default();
    let urls = join_urls();
    check_golden(
        "join-learner-minimal.yaml",
        &render(
            &spec,
            &ResolvedSecrets::default(),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: true,
            },
        ),
    );
}

#[test]
fn init_minimal() {
    let spec = EtcdadmConfigSpec::default();
    check_golden(
        "init-minimal.yaml",
        &render(&spec, &ResolvedSecrets::default(), EtcdadmCommand::Init),
    );
}

#[test]
fn join_minimal() {
    let spec = EtcdadmConfigSpec::default();
    let urls = join_urls();
    check_golden(
        "join-minimal.yaml",
        &render(
            &spec,
            &ResolvedSecrets::default(),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: false,
            },
        ),
    );
}

/// The goldens must be what cloud-init reads: parse them and check the parts machines depend on.
#[test]
fn full_golden_parses_to_the_intended_document() {
    let spec = full_spec();
    let text = render(&spec, &full_secrets(&spec), EtcdadmCommand::Init);
    assert!(text.starts_with("## template: jinja\n#cloud-config\n"));
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();

    let runcmd: Vec<&str> = doc["runcmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        runcmd[..2],
        spec.pre_etcdadm_commands
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()[..]
    );
    assert_eq!(
        runcmd.last().copied(),
        spec.post_etcdadm_commands.last().map(String::as_str)
    );
    assert!(runcmd.contains(&"systemctl stop kubelet"));

    let files = doc["write_files"].as_array().unwrap();
    let file = |path: &str| {
        files
            .iter()
            .find(|f| f["path"] == path)
            .unwrap_or_else(|| panic!("{path}"))
    };
    assert_eq!(file("/etc/etcd/pki/ca.crt")["content"], CA_CERT);
    assert_eq!(file("/etc/etcd/pki/ca.key")["permissions"], "0600");
    assert_eq!(file("/etc/etcd/token")["content"], "token-from-secret\n");
    assert_eq!(
        file("/etc/motd")["content"],
        "etcd member\nmanaged by \"etcdadm\"\n"
    );
    assert_eq!(file("/etc/sysctl.d/90-etcd.conf")["append"], true);
    assert_eq!(file("/etc/etcd/extra.b64")["encoding"], "base64");

    assert_eq!(doc["ntp"]["enabled"], false);
    assert_eq!(doc["users"][0]["lock_passwd"], false);
    assert_eq!(doc["users"][0]["sudo"], "ALL=(ALL) NOPASSWD:ALL");
    assert_eq!(doc["users"][1]["passwd"], "$6$rounds=4096$deploy$hash");
}

/// A learner join's helper reaches the machine byte for byte, and runs around etcdadm join.
#[test]
fn learner_golden_carries_the_helper_and_wraps_the_join() {
    let urls = join_urls();
    let text = render(
        &EtcdadmConfigSpec::default(),
        &ResolvedSecrets::default(),
        EtcdadmCommand::Join {
            urls: &urls,
            learner: true,
        },
    );
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let helper = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == LEARNER_JOIN_SCRIPT)
        .unwrap();
    assert_eq!(
        helper["content"].as_str().unwrap(),
        include_str!("../../templates/cloud-init/learner-join.sh")
    );
    assert_eq!(helper["permissions"], "0755");
    let runcmd = doc["runcmd"].as_array().unwrap();
    let last = runcmd.last().unwrap().as_str().unwrap();
    assert!(
        last.starts_with(&format!(
            "sh {LEARNER_JOIN_SCRIPT} wait-listed {LEARNER_LISTED_WAIT_SECONDS} https://10.0.0.11:2379 && \
             {{ etcdadm join https://10.0.0.11:2379 "
        )),
        "{last}"
    );
    assert!(!last.contains("10.0.0.12"), "{last}");
}
