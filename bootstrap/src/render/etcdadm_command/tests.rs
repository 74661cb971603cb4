//! Tests of `etcdadm_command`.

use super::*;
use crate::render::LearnerJoin;
use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::config::CloudInitConfig;
use etcdadm_shared::names;

fn init(spec: &EtcdadmConfigSpec) -> String {
    etcdadm_runcmd(spec, "etcd-0", &EtcdadmCommand::Init).unwrap()
}

#[test]
fn minimal_init_has_only_the_fixed_flags() {
    assert_eq!(
        init(&EtcdadmConfigSpec::default()),
        "etcdadm init --init-system systemd --name etcd-0 && echo success > /run/cluster-api/bootstrap-success.complete"
    );
}

#[test]
fn empty_optional_values_emit_no_flags() {
    let spec = EtcdadmConfigSpec {
        cloud_init_config: Some(CloudInitConfig {
            version: Some(String::new()),
            etcd_release_url: Some(String::new()),
            install_dir: None,
        }),
        cipher_suites: Some(" , ".into()),
        ..Default::default()
    };
    assert_eq!(init(&spec), init(&EtcdadmConfigSpec::default()));
}

#[test]
fn set_values_become_flags_in_order() {
    let spec = EtcdadmConfigSpec {
        cloud_init_config: Some(CloudInitConfig {
            version: Some("3.5.9".into()),
            etcd_release_url: Some("https://mirror.example/etcd".into()),
            install_dir: Some("/opt/etcd bin".into()),
        }),
        ..Default::default()
    };
    assert_eq!(
        init(&spec),
        "etcdadm init --init-system systemd --name etcd-0 --version 3.5.9 \
         --release-url https://mirror.example/etcd --install-dir '/opt/etcd bin' \
         && echo success > /run/cluster-api/bootstrap-success.complete"
    );
    assert!(!init(&spec).contains("  "));
}

#[test]
fn upstream_join_uses_the_first_url_only() {
    let urls = vec![
        " ".to_string(),
        "https://10.0.0.1:2379".into(),
        "https://10.0.0.2:2379".into(),
    ];
    let line = etcdadm_runcmd(
        &EtcdadmConfigSpec::default(),
        "etcd-1",
        &EtcdadmCommand::Join {
            urls: &urls,
            learner: None,
        },
    )
    .unwrap();
    assert!(
        line.starts_with("etcdadm join https://10.0.0.1:2379 --init-system systemd --name etcd-1 &&"),
        "{line}"
    );
}

#[test]
fn eks_anywhere_join_uses_a_comma_list_and_the_cipher_flag() {
    let spec = EtcdadmConfigSpec {
        etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
        cipher_suites: Some("TLS_A, TLS_B".into()),
        ..Default::default()
    };
    let urls = vec![
        "https://10.0.0.1:2379".to_string(),
        "https://10.0.0.2:2379".into(),
    ];
    let line = etcdadm_runcmd(
        &spec,
        "etcd-1",
        &EtcdadmCommand::Join {
            urls: &urls,
            learner: None,
        },
    )
    .unwrap();
    assert_eq!(
        line,
        "etcdadm join https://10.0.0.1:2379,https://10.0.0.2:2379 --init-system systemd --name etcd-1 \
         --cipher-suites TLS_A,TLS_B && echo success > /run/cluster-api/bootstrap-success.complete"
    );
}

/// The drop-in's text, and the runcmd line of an init, which never restarts etcd.
fn drop_in(spec: &EtcdadmConfigSpec) -> Option<String> {
    let line = init(spec);
    assert!(!line.contains("restart"), "{line}");
    assert!(!line.contains("etcd.env"), "{line}");
    settings_drop_in(spec).unwrap().map(|file| {
        assert_eq!(file.path, SETTINGS_DROP_IN);
        assert_eq!(file.permissions.as_deref(), Some("0644"));
        file.content
    })
}

const HEADER: &str = "# The etcd settings etcdadm has no flag for, written by the etcdadm bootstrap provider\n\
                      # before etcdadm runs, so that etcd starts with them.\n[Service]\n";

#[test]
fn settings_reach_etcd_through_a_drop_in_written_before_etcdadm_and_nothing_restarts() {
    use etcdadm_shared::api::quantity::ByteQuantity;
    assert_eq!(drop_in(&EtcdadmConfigSpec::default()), None);
    let spec = EtcdadmConfigSpec {
        cipher_suites: Some("TLS_A".into()),
        quota_backend_bytes: Some(ByteQuantity::Text("8Gi".into())),
        ..Default::default()
    };
    assert_eq!(
        drop_in(&spec).unwrap(),
        format!(
            "{HEADER}Environment=\"ETCD_CIPHER_SUITES=TLS_A\"\n\
             Environment=\"ETCD_QUOTA_BACKEND_BYTES=8589934592\"\n"
        )
    );
    assert_eq!(
        init(&spec),
        "etcdadm init --init-system systemd --name etcd-0 && echo success > /run/cluster-api/bootstrap-success.complete"
    );
    // The eks-anywhere build takes the suites as a flag; the quota still needs the drop-in.
    let eks = EtcdadmConfigSpec {
        etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
        ..spec.clone()
    };
    let line = init(&eks);
    assert!(line.contains("--cipher-suites TLS_A &&"), "{line}");
    assert_eq!(
        drop_in(&eks).unwrap(),
        format!("{HEADER}Environment=\"ETCD_QUOTA_BACKEND_BYTES=8589934592\"\n")
    );
    let out_of_bounds = EtcdadmConfigSpec {
        quota_backend_bytes: Some(ByteQuantity::Text("1Mi".into())),
        ..Default::default()
    };
    let err = settings_drop_in(&out_of_bounds).unwrap_err();
    assert!(err.to_string().starts_with("spec.quotaBackendBytes: "), "{err}");
}

#[test]
fn corruption_checks_and_etcd_settings_join_the_drop_in_only_when_asked() {
    use etcdadm_shared::api::config::{CorruptionChecks, SettingValue};
    let unused = EtcdadmConfigSpec {
        corruption_checks: Some(CorruptionChecks::Disabled),
        etcd_settings: Default::default(),
        ..Default::default()
    };
    assert_eq!(drop_in(&unused), None);
    let spec = EtcdadmConfigSpec {
        cloud_init_config: Some(CloudInitConfig {
            version: Some("3.5.1".into()),
            ..Default::default()
        }),
        corruption_checks: Some(CorruptionChecks::Enabled),
        etcd_settings: [
            ("snapshot-count".to_string(), SettingValue::Number(20000)),
            (
                "auto-compaction-retention".to_string(),
                SettingValue::Text("30m".into()),
            ),
        ]
        .into(),
        ..Default::default()
    };
    assert_eq!(
        drop_in(&spec).unwrap(),
        format!(
            "{HEADER}Environment=\"ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK=true\"\n\
             Environment=\"ETCD_AUTO_COMPACTION_RETENTION=30m0s\"\n\
             Environment=\"ETCD_SNAPSHOT_COUNT=20000\"\n"
        )
    );
    let refused = EtcdadmConfigSpec {
        etcd_settings: [("data-dir".to_string(), SettingValue::Text("/tmp".into()))].into(),
        ..Default::default()
    };
    let err = settings_drop_in(&refused).unwrap_err();
    assert!(
        err.to_string().starts_with("spec.etcdSettings[\"data-dir\"]: "),
        "{err}"
    );
}

#[test]
fn a_value_systemd_would_change_is_refused_not_escaped() {
    assert_eq!(
        environment_line("ETCD_SNAPSHOT_COUNT", "20000").unwrap(),
        "Environment=\"ETCD_SNAPSHOT_COUNT=20000\"\n"
    );
    for bad in ["100%", "a b", "a\\b", "\"x\"", "$HOME"] {
        let err = environment_line("ETCD_X", bad).unwrap_err();
        assert!(err.to_string().starts_with("spec.etcdSettings: ETCD_X="), "{err}");
    }
}

#[test]
fn upstream_cipher_suites_go_to_the_drop_in_not_to_a_flag() {
    let spec = EtcdadmConfigSpec {
        cipher_suites: Some("TLS_A,TLS_B".into()),
        ..Default::default()
    };
    assert!(!init(&spec).contains("--cipher-suites"));
    assert_eq!(
        drop_in(&spec).unwrap(),
        format!("{HEADER}Environment=\"ETCD_CIPHER_SUITES=TLS_A,TLS_B\"\n")
    );
}

fn learner_join(spec: &EtcdadmConfigSpec) -> Result<String, RenderError> {
    let urls = vec![
        "https://10.0.0.1:2379".to_string(),
        "https://10.0.0.2:2379".into(),
    ];
    etcdadm_runcmd(
        spec,
        "etcd-1",
        &EtcdadmCommand::Join {
            urls: &urls,
            learner: Some(LearnerJoin::default()),
        },
    )
}

#[test]
fn a_learner_join_waits_to_be_listed_then_for_its_promotion() {
    assert_eq!(
        learner_join(&EtcdadmConfigSpec::default()).unwrap(),
        "sh /run/cluster-api/etcd-learner-join.sh wait-listed 1200 https://10.0.0.1:2379 \
         && { etcdadm join https://10.0.0.1:2379 --init-system systemd --name etcd-1 \
         --bind-address \"$(cat /run/cluster-api/etcd-member-address)\" \
         --server-cert-extra-sans \"$(cat /run/cluster-api/etcd-member-address)\" \
         || sh /run/cluster-api/etcd-learner-join.sh wait-healthy 1800 https://10.0.0.1:2379 \
         --init-system systemd --name etcd-1 \
         --bind-address \"$(cat /run/cluster-api/etcd-member-address)\" \
         --server-cert-extra-sans \"$(cat /run/cluster-api/etcd-member-address)\"; } \
         && echo success > /run/cluster-api/bootstrap-success.complete"
    );
}

#[test]
fn a_learner_join_waits_to_be_listed_as_long_as_its_config_says() {
    let mut config = EtcdadmConfig::new("etcd-1", EtcdadmConfigSpec::default());
    config.metadata.annotations = Some(
        [
            (names::LEARNER_JOIN_ANNOTATION.to_string(), "true".to_string()),
            (
                names::LEARNER_LISTED_WAIT_ANNOTATION.to_string(),
                "2400".to_string(),
            ),
        ]
        .into(),
    );
    let learner = LearnerJoin::of(&config);
    assert_eq!(
        learner,
        Some(LearnerJoin {
            listed_wait_seconds: 2400
        })
    );
    let urls = vec!["https://10.0.0.1:2379".to_string()];
    let line = etcdadm_runcmd(
        &config.spec,
        "etcd-1",
        &EtcdadmCommand::Join { urls: &urls, learner },
    )
    .unwrap();
    assert!(
        line.starts_with(
            "sh /run/cluster-api/etcd-learner-join.sh wait-listed 2400 https://10.0.0.1:2379 && "
        ),
        "{line}"
    );
    // Without the controller's word, the default; without its learner-join mark, no wait.
    config.metadata.annotations =
        Some([(names::LEARNER_JOIN_ANNOTATION.to_string(), "true".to_string())].into());
    assert_eq!(LearnerJoin::of(&config), Some(LearnerJoin::default()));
    assert_eq!(
        LearnerJoin::default().listed_wait_seconds,
        LEARNER_LISTED_WAIT_SECONDS
    );
    config.metadata.annotations = None;
    assert_eq!(LearnerJoin::of(&config), None);
}

#[test]
fn a_learner_join_repeats_the_join_flags_and_restarts_nothing_after_promotion() {
    let spec = EtcdadmConfigSpec {
        cloud_init_config: Some(CloudInitConfig {
            version: Some("3.5.9".into()),
            install_dir: Some("/opt/etcd bin".into()),
            ..Default::default()
        }),
        cipher_suites: Some("TLS_A".into()),
        ..Default::default()
    };
    let line = learner_join(&spec).unwrap();
    let flags = "--init-system systemd --name etcd-1 --version 3.5.9 --install-dir '/opt/etcd bin' \
         --bind-address \"$(cat /run/cluster-api/etcd-member-address)\" \
         --server-cert-extra-sans \"$(cat /run/cluster-api/etcd-member-address)\"";
    assert!(
        line.contains(&format!(
            "{{ etcdadm join https://10.0.0.1:2379 {flags} || sh /run/cluster-api/etcd-learner-join.sh \
             wait-healthy 1800 https://10.0.0.1:2379 {flags}; }} \
             && echo success > /run/cluster-api/bootstrap-success.complete"
        )),
        "{line}"
    );
}

#[test]
fn a_restore_asking_for_a_bump_runs_etcdadm_through_the_helper() {
    let download = super::super::SnapshotDownload {
        url: "https://127.0.0.1:8333/b/k?X-Amz-Signature=1".into(),
        sha256: Some("ab".repeat(32)),
        ca_pem: None,
        bump_revision: Some(1_000_000_000),
        insecure: false,
        size: None,
    };
    let mut spec = EtcdadmConfigSpec::default();
    let line = etcdadm_runcmd(&spec, "etcd-0", &EtcdadmCommand::InitFromSnapshot(&download)).unwrap();
    assert!(
        line.contains(
            "&& sh /run/cluster-api/etcd-restore-bump.sh 1000000000 /var/lib/etcd-restore/snapshot.db /opt/bin/ \
             etcdadm init --init-system systemd --name etcd-0 --snapshot /var/lib/etcd-restore/snapshot.db &&"
        ),
        "{line}"
    );
    spec.cloud_init_config =
        Some(serde_json::from_value(serde_json::json!({"installDir": "/usr/local/bin"})).unwrap());
    let line = etcdadm_runcmd(&spec, "etcd-0", &EtcdadmCommand::InitFromSnapshot(&download)).unwrap();
    assert!(line.contains("snapshot.db /usr/local/bin etcdadm init"), "{line}");
    let files = super::super::restore::files(&download).unwrap();
    let script = files
        .iter()
        .find(|f| f.path == super::super::restore::RESTORE_BUMP_SCRIPT)
        .unwrap();
    assert_eq!(script.permissions.as_deref(), Some("0755"));
    assert!(script.content.starts_with("#!/bin/sh\n"));
    for opener in ["{{", "{%", "{#"] {
        assert!(!script.content.contains(opener), "{opener}");
    }
}

#[test]
fn a_restoring_init_downloads_checks_restores_then_forgets_the_snapshot() {
    let download = super::super::SnapshotDownload {
        url: "https://127.0.0.1:8333/b/k?X-Amz-Signature=1".into(),
        sha256: Some("0f".repeat(32)),
        ca_pem: None,
        bump_revision: None,
        insecure: false,
        size: Some(64 << 20),
    };
    let line = etcdadm_runcmd(
        &EtcdadmConfigSpec::default(),
        "etcd-0",
        &EtcdadmCommand::InitFromSnapshot(&download),
    )
    .unwrap();
    assert_eq!(
        line,
        format!(
            "curl -fsS --retry 5 --retry-max-time 124 --max-time 124 --max-filesize 67108864 \
             --create-dirs --config /run/cluster-api/etcd-restore.curlrc \
             && echo '{}  /var/lib/etcd-restore/snapshot.db' | sha256sum -c --quiet - \
             && etcdadm init --init-system systemd --name etcd-0 --snapshot /var/lib/etcd-restore/snapshot.db \
             && rm -f /run/cluster-api/etcd-restore.curlrc /run/cluster-api/etcd-restore-ca.crt /var/lib/etcd-restore/snapshot.db \
             && echo success > /run/cluster-api/bootstrap-success.complete",
            "0f".repeat(32)
        )
    );
    assert!(!line.contains("X-Amz"), "the URL never reaches runcmd");
}

#[test]
fn eks_anywhere_builds_never_render_a_learner_join() {
    let spec = EtcdadmConfigSpec {
        etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
        ..Default::default()
    };
    let err = learner_join(&spec).unwrap_err();
    assert!(err.to_string().starts_with("spec.etcdadmFlavor: "), "{err}");
}

#[test]
fn the_learner_join_helper_is_jinja_free_posix_sh() {
    // The user data is a Jinja template: `{{`, `{%` or `{#` in the helper would be expanded.
    for opener in ["{{", "{%", "{#"] {
        assert!(!LEARNER_JOIN_SCRIPT_CONTENT.contains(opener), "{opener}");
    }
    assert!(LEARNER_JOIN_SCRIPT_CONTENT.starts_with("#!/bin/sh\n"));
    assert!(
        LEARNER_JOIN_SCRIPT_CONTENT.contains(&format!("member_address_file={MEMBER_ADDRESS_FILE}\n")),
        "the helper writes the address where the join reads it"
    );
}

#[test]
fn join_without_urls_is_an_error() {
    for flavor in [EtcdadmFlavor::Upstream, EtcdadmFlavor::EksAnywhere] {
        let spec = EtcdadmConfigSpec {
            etcdadm_flavor: Some(flavor),
            ..Default::default()
        };
        for learner in [None, Some(LearnerJoin::default())] {
            let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Join { urls: &[], learner }).unwrap_err();
            assert!(matches!(err, RenderError::NoJoinUrl));
        }
    }
}

#[test]
fn bad_values_name_their_field() {
    let spec = EtcdadmConfigSpec {
        cipher_suites: Some("TLS_A;reboot".into()),
        ..Default::default()
    };
    let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Init).unwrap_err();
    assert!(err.to_string().starts_with("spec.cipherSuites: "), "{err}");

    let spec = EtcdadmConfigSpec {
        cloud_init_config: Some(CloudInitConfig {
            version: Some("v3.5.9".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = etcdadm_runcmd(&spec, "m", &EtcdadmCommand::Init).unwrap_err();
    assert!(
        err.to_string().starts_with("spec.cloudInitConfig.version: "),
        "{err}"
    );
}
