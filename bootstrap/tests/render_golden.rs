#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Byte-exact user data for a spec with every field set and for an empty one, in both formats:
//! these files are what machines run, so any change to them is reviewed. The Bottlerocket
//! goldens come with the bootstrap container's user data decoded next to them, since the TOML
//! carries it as base64. `UPDATE_GOLDEN=1` rewrites them.

use std::path::PathBuf;

use base64::Engine;

use etcdadm_bootstrap::render::{
    CaFiles, EtcdadmCommand, LEARNER_JOIN_SCRIPT, LEARNER_LISTED_WAIT_SECONDS, LearnerJoin, RenderInput,
    ResolvedSecrets, SecretTarget, render_user_data, secret_refs,
};
use etcdadm_shared::api::config::{EtcdadmConfig, EtcdadmConfigSpec};

const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakeEtcdCA\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEfakeEtcdKey\n-----END RSA PRIVATE KEY-----\n";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn spec_from(file: &str) -> EtcdadmConfigSpec {
    let text = std::fs::read_to_string(golden_dir().join(file)).unwrap();
    let config: EtcdadmConfig = serde_saphyr::from_str(&text).unwrap();
    config.spec
}

fn full_spec() -> EtcdadmConfigSpec {
    spec_from("full-config.yaml")
}

fn full_secrets(spec: &EtcdadmConfigSpec) -> ResolvedSecrets {
    let mut secrets = ResolvedSecrets::default();
    for r in secret_refs(spec) {
        let value = match &r.target {
            SecretTarget::UserPassword { .. } => "$6$rounds=4096$deploy$hash".to_string(),
            SecretTarget::FileContent { .. } => "token-from-secret\n".to_string(),
            SecretTarget::RegistryUsername => "mirror-robot".to_string(),
            SecretTarget::RegistryPassword => "s3cr\"et\\pa$$".to_string(),
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
                learner: None,
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
                learner: Some(LearnerJoin::default()),
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
                learner: Some(LearnerJoin::default()),
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
                learner: None,
            },
        ),
    );
}

fn bottlerocket_full() -> EtcdadmConfigSpec {
    spec_from("bottlerocket-full-config.yaml")
}

fn bottlerocket_minimal() -> EtcdadmConfigSpec {
    spec_from("bottlerocket-minimal-config.yaml")
}

/// The TOML, and next to it (`<name>.bootstrap-container.yaml`) the kubeadm-bootstrap host
/// container's user data, decoded.
fn check_bottlerocket_golden(name: &str, toml_text: &str) {
    check_golden(&format!("{name}.toml"), toml_text);
    let settings: toml::Table = toml::from_str(toml_text).unwrap();
    let encoded = settings["settings"]["host-containers"]["kubeadm-bootstrap"]["user-data"]
        .as_str()
        .unwrap();
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    check_golden(
        &format!("{name}.bootstrap-container.yaml"),
        &String::from_utf8(decoded).unwrap(),
    );
}

#[test]
fn bottlerocket_init_full() {
    let spec = bottlerocket_full();
    check_bottlerocket_golden(
        "bottlerocket-init-full",
        &render(&spec, &full_secrets(&spec), EtcdadmCommand::Init),
    );
}

#[test]
fn bottlerocket_join_full() {
    let spec = bottlerocket_full();
    let urls = join_urls();
    check_bottlerocket_golden(
        "bottlerocket-join-full",
        &render(
            &spec,
            &full_secrets(&spec),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: None,
            },
        ),
    );
}

#[test]
fn bottlerocket_init_minimal() {
    check_bottlerocket_golden(
        "bottlerocket-init-minimal",
        &render(
            &bottlerocket_minimal(),
            &ResolvedSecrets::default(),
            EtcdadmCommand::Init,
        ),
    );
}

#[test]
fn bottlerocket_join_minimal() {
    let urls = join_urls();
    check_bottlerocket_golden(
        "bottlerocket-join-minimal",
        &render(
            &bottlerocket_minimal(),
            &ResolvedSecrets::default(),
            EtcdadmCommand::Join {
                urls: &urls,
                learner: None,
            },
        ),
    );
}

/// The goldens must be what cloud-init reads: run its Jinja stage (a real Jinja engine, set up
/// as cloud-init sets it up), parse the result and check the parts machines depend on.
#[test]
fn full_golden_parses_to_the_intended_document() {
    let spec = full_spec();
    let text = render(&spec, &full_secrets(&spec), EtcdadmCommand::Init);
    let template = text.strip_prefix("## template: jinja\n").unwrap();
    assert!(template.starts_with("#cloud-config\n"));
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    let hostname = "etcd-a1b2c.example";
    let rendered = env
        .render_str(
            template,
            minijinja::context! { ds => minijinja::context! { meta_data => minijinja::context! { hostname } } },
        )
        .unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&rendered).unwrap();

    let runcmd: Vec<&str> = doc["runcmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    // The user's commands are templates: their Jinja ran.
    assert_eq!(
        runcmd[..2],
        [
            "echo \"pre: etcd-a1b2c.example\" > /tmp/pre",
            spec.pre_etcdadm_commands[1].as_str()
        ]
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
    // Everything else is literal, braces included.
    assert_eq!(
        file("/etc/motd")["content"],
        "etcd member\nmanaged by \"etcdadm\", not by {{ jinja }} or {% raw %}\n"
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
            learner: Some(LearnerJoin::default()),
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

/// Where every field of the full Bottlerocket config lands, read back from the TOML (and from
/// the admin and bootstrap containers' user data inside it).
#[test]
fn bottlerocket_full_golden_parses_to_the_intended_settings() {
    let spec = bottlerocket_full();
    let urls = join_urls();
    let text = render(
        &spec,
        &full_secrets(&spec),
        EtcdadmCommand::Join {
            urls: &urls,
            learner: None,
        },
    );
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let settings = &doc["settings"];
    let decode = |value: &toml::Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(value.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let config = spec.bottlerocket_config.clone().unwrap();

    let hosts = &settings["host-containers"];
    let admin = &hosts["admin"];
    assert_eq!(admin["source"].as_str(), Some(config.admin_image.as_str()));
    assert_eq!(admin["superpowered"].as_bool(), Some(true));
    let admin_data: serde_json::Value = serde_json::from_str(&decode(&admin["user-data"])).unwrap();
    assert_eq!(
        admin_data,
        serde_json::json!({"user": "ec2-user", "password-hash": "$6$salt$hashed",
            "ssh": {"authorized-keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample ops@example"]}})
    );
    let bootstrap = &hosts["kubeadm-bootstrap"];
    assert_eq!(
        bootstrap["source"].as_str(),
        Some(config.bootstrap_image.as_str())
    );
    assert_eq!(bootstrap["superpowered"].as_bool(), Some(true));
    assert_eq!(bootstrap["enabled"].as_bool(), Some(true));
    let control = &hosts["control"];
    assert_eq!(control["source"].as_str(), Some(config.control_image.as_str()));
    assert_eq!(control["superpowered"].as_bool(), Some(false));
    let custom = &hosts["metrics-agent"];
    assert_eq!(
        custom["source"].as_str(),
        Some("registry.example/metrics-agent:1.2")
    );
    assert_eq!(custom["user-data"].as_str(), Some("eyJpbnRlcnZhbCI6ICIxMHMifQ=="));

    let kubernetes = &settings["kubernetes"];
    assert_eq!(
        kubernetes["pod-infra-container-image"].as_str(),
        Some(config.pause_image.as_str())
    );
    assert_eq!(kubernetes["standalone-mode"].as_bool(), Some(true));
    assert_eq!(kubernetes["authentication-mode"].as_str(), Some("tls"));

    let network = &settings["network"];
    assert_eq!(network["hostname"].as_str(), Some("etcd-a1b2c"));
    assert_eq!(network["https-proxy"].as_str(), Some("http://proxy.example:3128"));
    assert_eq!(network["no-proxy"], toml::Value::from(vec!["10.0.0.0/8", ".svc"]));

    let disk_setup = &settings["bootstrap-containers"]["disk-setup"];
    assert_eq!(disk_setup["mode"].as_str(), Some("once"));
    assert_eq!(disk_setup["essential"].as_bool(), Some(true));
    assert_eq!(
        disk_setup["source"].as_str(),
        Some("registry.example/disk-setup:0.3")
    );

    let registry = &settings["container-registry"];
    assert_eq!(
        registry["mirrors"]["public.ecr.aws"],
        toml::Value::from(vec!["https://harbor.example:8443/ecr"])
    );
    let logins = registry["credentials"].as_array().unwrap();
    let registries: Vec<&str> = logins.iter().map(|l| l["registry"].as_str().unwrap()).collect();
    assert_eq!(registries, ["public.ecr.aws", "harbor.example:8443/ecr"]);
    assert!(
        logins
            .iter()
            .all(|l| l["password"].as_str() == Some("s3cr\"et\\pa$$"))
    );

    let pki = &settings["pki"];
    assert_eq!(
        decode(&pki["registry-mirror-ca"]["data"]),
        "-----BEGIN CERTIFICATE-----\nMIIBmirrorCA\n-----END CERTIFICATE-----\n"
    );
    assert_eq!(pki["corp-root"]["trusted"].as_bool(), Some(true));
    assert_eq!(decode(&pki["corp-root"]["data"]), spec.cert_bundles[0].data);

    assert_eq!(
        settings["ntp"]["time-servers"],
        toml::Value::from(vec!["0.pool.ntp.org", "time.example"])
    );
    assert_eq!(
        settings["kernel"]["sysctl"]["net.ipv4.ip_forward"].as_str(),
        Some("1")
    );
    assert_eq!(settings["boot"]["reboot-to-reconcile"].as_bool(), Some(true));
    assert_eq!(
        settings["boot"]["kernel-parameters"]["console"],
        toml::Value::from(vec!["tty0", "ttyS0,115200n8"])
    );

    let container: serde_json::Value = serde_saphyr::from_str(&decode(&bootstrap["user-data"])).unwrap();
    assert_eq!(
        container["runcmd"],
        "EtcdadmJoin public.ecr.aws/eks-distro/etcd-io/etcd 3.5.9-eks-1-28-9 \
         TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 \
         https://10.0.0.11:2379,https://10.0.0.12:2379"
    );
    let paths: Vec<&str> = container["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/lib/etcd/pki/ca.crt",
            "/var/lib/etcd/pki/ca.key",
            "/.bottlerocket/rootfs/var/lib/etcd-backup/config.json",
            "/.bottlerocket/rootfs/opt/etcd/token"
        ]
    );
    assert_eq!(container["write_files"][3]["content"], "token-from-secret\n");
}
