//! Tests of the EtcdadmCluster API: defaults read through the spec, and every section's checks
//! with their field paths (as admission and the controller run them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use serde_json::{Value, json};

use super::*;
use crate::validation::field::FieldError;

fn spec_with_rollout_after(value: &str) -> Result<EtcdadmClusterSpec, serde_json::Error> {
    serde_json::from_value(serde_json::json!({"infrastructureTemplate": {}, "rolloutAfter": value}))
}

#[test]
fn defragmentation_defaults_follow_the_member_count_and_openshifts_thresholds() {
    let spec = |value: serde_json::Value| -> EtcdadmClusterSpec {
        let mut base = serde_json::json!({"infrastructureTemplate": {}});
        base.as_object_mut()
            .unwrap()
            .extend(value.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    };
    let one = spec(serde_json::json!({})).defragmentation_settings();
    assert!(!one.enabled, "one member: off");
    let three = spec(serde_json::json!({"replicas": 3})).defragmentation_settings();
    assert_eq!(
        three,
        DefragmentationSettings {
            enabled: true,
            fragmented_percent: 45,
            minimum_size: 100 << 20,
            quota_percent: 80,
            minimum_reclaimable: 100 << 20,
            interval: Duration::from_secs(600),
            window: DefragmentationWindow::Always,
        }
    );
    let forced = spec(serde_json::json!({"maintenance": {"defragmentation": {"mode": "Automatic"}}}));
    assert!(forced.defragmentation_settings().enabled);
    let off = spec(serde_json::json!({"replicas": 5, "maintenance": {"defragmentation": {"mode": "Off"}}}));
    assert!(!off.defragmentation_settings().enabled);
}

#[test]
fn a_window_is_open_from_each_start_for_its_duration() {
    let at = |text: &str| text.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
    let window = DefragmentationWindow::Recurring(
        crate::cron::Schedule::parse("0 2 * * *").unwrap(),
        Duration::from_secs(2 * 3600),
    );
    assert!(!window.is_open(at("2026-03-01T01:59:59Z")));
    assert!(window.is_open(at("2026-03-01T02:00:00Z")));
    assert!(window.is_open(at("2026-03-01T03:59:59Z")));
    assert!(!window.is_open(at("2026-03-01T04:00:00Z")));
    assert!(DefragmentationWindow::Always.is_open(at("2026-03-01T12:00:00Z")));
    assert!(!DefragmentationWindow::Unreadable.is_open(at("2026-03-01T02:30:00Z")));
}

#[test]
fn every_rollout_after_the_api_server_accepts_is_readable() {
    let last = spec_with_rollout_after("9999-12-31T23:59:59Z").unwrap();
    assert_eq!(last.rollout_after, Some(Time(k8s_openapi::jiff::Timestamp::MAX)));
    let ordinary = spec_with_rollout_after("2026-11-24T10:00:00Z").unwrap();
    assert_eq!(
        ordinary.rollout_after.unwrap().0.to_string(),
        "2026-11-24T10:00:00Z"
    );
    let earliest = spec_with_rollout_after("0000-01-01T00:00:00Z").unwrap();
    assert!(earliest.rollout_after.is_some());
    let none: EtcdadmClusterSpec =
        serde_json::from_value(serde_json::json!({"infrastructureTemplate": {}})).unwrap();
    assert_eq!(none.rollout_after, None);
    let garbage = spec_with_rollout_after("tomorrow").unwrap_err();
    assert!(
        garbage
            .to_string()
            .contains("\"tomorrow\" is not an RFC 3339 time"),
        "{garbage}"
    );
}

fn spec(value: Value) -> EtcdadmClusterSpec {
    let mut base = json!({"infrastructureTemplate": {"kind": "SimMachineTemplate", "name": "t"}});
    if let (Some(base), Some(extra)) = (base.as_object_mut(), value.as_object()) {
        base.extend(extra.clone());
    }
    serde_json::from_value(base).unwrap()
}

fn paths(errors: &[FieldError]) -> Vec<&str> {
    errors.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn a_plain_spec_is_valid() {
    let valid = spec(json!({"replicas": 3, "failureDomains": ["a", "b", "c"],
        "healthCheck": {"interval": "10s", "timeout": "5s", "unhealthyAfter": "5m"},
        "rolloutStrategy": {"rollingUpdate": {"maxSurge": 0}}}));
    assert_eq!(validate_spec(&valid, Some("default")), vec![]);
}

#[test]
fn the_defragmentation_policy_is_checked_with_its_field_paths() {
    let good = spec(json!({"replicas": 3, "maintenance": {"defragmentation": {
        "mode": "Automatic", "fragmentedPercent": 50, "minimumSize": "200Mi", "quotaPercent": 75,
        "minimumReclaimable": 104857600, "interval": "30m",
        "window": {"start": "0 2 * * *", "duration": "4h"}}}}));
    assert_eq!(validate_spec(&good, None), vec![]);
    let bad = spec(json!({"maintenance": {"defragmentation": {
        "fragmentedPercent": 100, "minimumSize": "lots", "quotaPercent": 0, "interval": "30s",
        "window": {"start": "0 25 * * *", "duration": "forever"}}}}));
    let errors = validate_spec(&bad, None);
    assert_eq!(
        paths(&errors),
        [
            "spec.maintenance.defragmentation.minimumSize",
            "spec.maintenance.defragmentation.fragmentedPercent",
            "spec.maintenance.defragmentation.quotaPercent",
            "spec.maintenance.defragmentation.interval",
            "spec.maintenance.defragmentation.window.duration",
            "spec.maintenance.defragmentation.window.start",
        ]
    );
    assert!(errors[3].message.contains("must be at least 1m"), "{}", errors[3]);
}

#[test]
fn replicas_must_be_odd_and_positive() {
    for bad in [0, 2, 4, -1] {
        let errors = validate_spec(&spec(json!({"replicas": bad})), None);
        assert_eq!(paths(&errors), ["spec.replicas"], "{bad}");
    }
    assert!(validate_spec(&spec(json!({"replicas": 5})), None).is_empty());
}

#[test]
fn the_template_must_be_named_and_in_our_namespace() {
    let errors = validate_spec(
        &spec(json!({"infrastructureTemplate": {"namespace": "other"}})),
        Some("default"),
    );
    assert_eq!(
        paths(&errors),
        [
            "spec.infrastructureTemplate.kind",
            "spec.infrastructureTemplate.name",
            "spec.infrastructureTemplate.namespace"
        ]
    );
    assert!(errors[2].message.contains("\"default\""));
    let same = spec(json!({"infrastructureTemplate": {"kind": "K", "name": "n", "namespace": "default"}}));
    assert!(validate_spec(&same, Some("default")).is_empty());
}

#[test]
fn the_template_is_an_infrastructure_providers() {
    let of = |api_version: &str| {
        spec(json!({"infrastructureTemplate": {"apiVersion": api_version, "kind": "K", "name": "n"}}))
    };
    assert!(validate_spec(&of("infrastructure.cluster.x-k8s.io/v1beta2"), None).is_empty());
    for bad in [
        "v1",
        "apps/v1",
        "cluster.x-k8s.io/v1beta2",
        "infrastructure.cluster.x-k8s.io/",
        "x.infrastructure.cluster.x-k8s.io/v1",
    ] {
        let errors = validate_spec(&of(bad), None);
        assert_eq!(
            paths(&errors),
            ["spec.infrastructureTemplate.apiVersion"],
            "{bad}"
        );
        assert!(
            errors[0]
                .message
                .contains("infrastructure.cluster.x-k8s.io/<version>")
        );
    }
}

#[test]
fn failure_domains_are_non_empty_and_unique() {
    let errors = validate_spec(&spec(json!({"failureDomains": ["a", "", "a"]})), None);
    assert_eq!(
        paths(&errors),
        ["spec.failureDomains[1]", "spec.failureDomains[2]"]
    );
    assert!(errors[1].message.contains("twice"));
}

#[test]
fn max_surge_is_zero_or_one() {
    let errors = validate_spec(
        &spec(json!({"rolloutStrategy": {"rollingUpdate": {"maxSurge": 2}}})),
        None,
    );
    assert_eq!(paths(&errors), ["spec.rolloutStrategy.rollingUpdate.maxSurge"]);
    assert!(
        validate_spec(
            &spec(json!({"rolloutStrategy": {"rollingUpdate": {"maxSurge": 1}}})),
            None
        )
        .is_empty()
    );
}

#[test]
fn parallel_machines_is_at_least_one() {
    for bad in [0, -1] {
        let errors = validate_spec(&spec(json!({"provisioning": {"parallelMachines": bad}})), None);
        assert_eq!(paths(&errors), ["spec.provisioning.parallelMachines"], "{bad}");
    }
    for good in [1, 2, 7] {
        assert!(
            validate_spec(&spec(json!({"provisioning": {"parallelMachines": good}})), None).is_empty(),
            "{good}"
        );
    }
}

#[test]
fn certificates_expiry_days_is_between_seven_and_180() {
    for bad in [6, 0, -30, 181, 365] {
        let errors = validate_spec(
            &spec(json!({"rolloutBefore": {"certificatesExpiryDays": bad}})),
            None,
        );
        assert_eq!(
            paths(&errors),
            ["spec.rolloutBefore.certificatesExpiryDays"],
            "{bad}"
        );
        assert!(
            errors[0].message.contains("at least 7 and at most 180"),
            "{}",
            errors[0].message
        );
    }
    for good in [7, 30, 180] {
        let valid = spec(json!({"rolloutBefore": {"certificatesExpiryDays": good}}));
        assert!(validate_spec(&valid, None).is_empty(), "{good}");
    }
    assert!(validate_spec(&spec(json!({"rolloutBefore": {}})), None).is_empty());
}

#[test]
fn health_check_durations_must_parse_and_fit_together() {
    let errors = validate_spec(&spec(json!({"healthCheck": {"interval": "soon"}})), None);
    assert_eq!(paths(&errors), ["spec.healthCheck.interval"]);
    let errors = validate_spec(&spec(json!({"healthCheck": {"interval": "500ms"}})), None);
    assert_eq!(paths(&errors), ["spec.healthCheck.interval"]);
    let errors = validate_spec(
        &spec(json!({"healthCheck": {"interval": "5s", "timeout": "10s"}})),
        None,
    );
    assert_eq!(paths(&errors), ["spec.healthCheck.timeout"]);
    let errors = validate_spec(
        &spec(json!({"healthCheck": {"interval": "10s", "unhealthyAfter": "5s"}})),
        None,
    );
    assert_eq!(paths(&errors), ["spec.healthCheck.unhealthyAfter"]);
    let errors = validate_spec(&spec(json!({"healthCheck": {"timeout": "0s"}})), None);
    assert_eq!(paths(&errors), ["spec.healthCheck.timeout"]);
}

#[test]
fn health_check_durations_are_bounded_above_and_the_controller_keeps_them_within() {
    let ok = spec(json!({"healthCheck": {"interval": "10m", "timeout": "30s", "unhealthyAfter": "1h"}}));
    assert!(validate_spec(&ok, None).is_empty());
    let settings = ok.health_settings();
    assert_eq!(
        (settings.interval, settings.timeout),
        (Duration::from_secs(600), Duration::from_secs(30))
    );
    for (health, path, words) in [
        (
            json!({"interval": "11m", "unhealthyAfter": "1h"}),
            "spec.healthCheck.interval",
            "must be 1s to 10m",
        ),
        (
            json!({"interval": "2562047h"}),
            "spec.healthCheck.interval",
            "must be 1s to 10m",
        ),
        (
            json!({"interval": "10m", "timeout": "31s"}),
            "spec.healthCheck.timeout",
            "must be at most 30s",
        ),
    ] {
        let errors = validate_spec(&spec(json!({ "healthCheck": health })), None);
        assert!(paths(&errors).contains(&path), "{health}: {errors:?}");
        assert!(
            errors.iter().any(|e| e.path == path && e.message.contains(words)),
            "{health}: {errors:?}"
        );
    }
    // What admission would refuse, kept within the bounds by the controller.
    let out_of_bounds = spec(json!({"healthCheck": {"interval": "1000h", "timeout": "1000h"}}));
    let settings = out_of_bounds.health_settings();
    assert_eq!(
        (settings.interval, settings.timeout),
        (Duration::from_secs(600), Duration::from_secs(30))
    );
    let timeout_over_interval = spec(json!({"healthCheck": {"interval": "2s", "timeout": "20s"}}));
    assert_eq!(
        timeout_over_interval.health_settings().timeout,
        Duration::from_secs(2)
    );
}

#[test]
fn an_automatic_recovery_waits_ten_minutes_at_least_and_needs_a_store() {
    let store = json!({"s3": {"endpoint": "https://s3.example", "bucket": "backups", "credentialsSecretRef": {"name": "s3"}}});
    let ok = validate_spec(
        &spec(json!({"backup": {"store": store}, "recovery": {"automatic": true, "after": "15m"}})),
        None,
    );
    assert!(ok.is_empty(), "{ok:?}");
    for (recovery, path) in [
        (json!({"automatic": true, "after": "5m"}), "spec.recovery.after"),
        (json!({"after": "soon"}), "spec.recovery.after"),
    ] {
        let errors = validate_spec(
            &spec(json!({"backup": {"store": store}, "recovery": recovery})),
            None,
        );
        assert_eq!(paths(&errors), [path], "{recovery}");
    }
    let errors = validate_spec(&spec(json!({"recovery": {"automatic": true}})), None);
    assert_eq!(paths(&errors), ["spec.recovery.automatic"]);
    assert!(errors[0].message.contains("spec.backup.store"));
}

#[test]
fn the_member_config_is_validated_under_its_own_path() {
    let errors = validate_spec(
        &spec(json!({"etcdadmConfigSpec": {"files": [{"path": "relative"}]}})),
        None,
    );
    assert_eq!(paths(&errors), ["spec.etcdadmConfigSpec.files[0].path"]);
    let errors = validate_spec(
        &spec(
            json!({"etcdadmConfigSpec": {"format": "bottlerocket", "preEtcdadmCommands": ["x"],
            "bottlerocketConfig": {"etcdImage": "e:v3.5.9", "bootstrapImage": "b", "pauseImage": "p"}}}),
        ),
        None,
    );
    assert_eq!(paths(&errors), ["spec.etcdadmConfigSpec.preEtcdadmCommands"]);
}

#[test]
fn downgrading_or_skipping_a_minor_is_refused_upgrading_one_minor_is_not() {
    let at = |v: &str| spec(json!({"etcdadmConfigSpec": {"cloudInitConfig": {"version": v}}}));
    let errors = validate_update(&at("3.5.9"), &at("3.4.27"));
    assert_eq!(paths(&errors), ["spec.etcdadmConfigSpec.cloudInitConfig.version"]);
    assert!(errors[0].message.contains("downgrades the minor version"));
    let errors = validate_update(&at("3.4.27"), &at("3.6.0"));
    assert_eq!(paths(&errors), ["spec.etcdadmConfigSpec.cloudInitConfig.version"]);
    assert!(errors[0].message.contains("skips a minor version"), "{errors:?}");
    assert!(validate_update(&at("3.4.27"), &at("3.5.9")).is_empty());
    assert!(
        validate_update(&at("3.5.9"), &at("3.5.1")).is_empty(),
        "patch releases may go back"
    );
}

#[test]
fn a_bottlerocket_etcd_image_tag_follows_the_same_version_rules() {
    let image = |tag: &str| {
        spec(
            json!({"etcdadmConfigSpec": {"format": "bottlerocket", "bottlerocketConfig": {
            "etcdImage": format!("public.ecr.aws/eks-distro/etcd-io/etcd:{tag}"),
            "bootstrapImage": "b", "pauseImage": "p"}}}),
        )
    };
    let errors = validate_update(&image("v3.5.9-eks-1-28-9"), &image("v3.4.27"));
    assert_eq!(
        paths(&errors),
        ["spec.etcdadmConfigSpec.bottlerocketConfig.etcdImage"]
    );
    assert!(errors[0].message.contains("downgrades the minor version"));
    assert!(validate_update(&image("v3.4.27"), &image("v3.5.9-eks-1-28-9")).is_empty());
    let cloud = spec(json!({"etcdadmConfigSpec": {"cloudInitConfig": {"version": "3.4.27"}}}));
    assert_eq!(
        paths(&validate_update(&cloud, &image("v3.6.0"))),
        ["spec.etcdadmConfigSpec.bottlerocketConfig.etcdImage"],
        "switching format is still one minor at a time"
    );
}

#[test]
fn backup_and_restore_are_validated_under_their_paths() {
    let store = json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "b",
                              "credentialsSecretRef": {"name": "c"}}});
    let errors = validate_spec(
        &spec(
            json!({"backup": {"store": store, "schedule": "0 25 * * *", "retention": {"keep": 0}},
                     "restore": {"snapshot": {}}}),
        ),
        None,
    );
    assert_eq!(
        paths(&errors),
        [
            "spec.backup.store.s3.bucket",
            "spec.backup.schedule",
            "spec.backup.retention.keep",
            "spec.restore.snapshot"
        ]
    );
    assert!(errors[1].message.contains("hour field"), "{}", errors[1].message);
}

#[test]
fn a_restore_needs_cloud_config_user_data() {
    let from = |format: &str| {
        spec(json!({"restore": {"snapshot": {"name": "s1"}}, "etcdadmConfigSpec": {"format": format}}))
    };
    let refused = restore_needs_cloud_config(&from("bottlerocket")).unwrap();
    assert_eq!(refused.path, "spec.restore");
    assert!(refused.message.contains("format cloud-config"));
    assert!(restore_needs_cloud_config(&from("cloud-config")).is_none());
    assert!(restore_needs_cloud_config(&spec(json!({}))).is_none());
}

#[test]
fn restore_is_set_only_at_creation_and_never_changed() {
    let plain = spec(json!({}));
    let from = |name: &str| spec(json!({"restore": {"snapshot": {"name": name}}}));
    let errors = validate_update(&plain, &from("s1"));
    assert_eq!(paths(&errors), ["spec.restore"]);
    assert!(
        errors[0]
            .message
            .contains("only be set when the EtcdadmCluster is created")
    );
    assert_eq!(
        paths(&validate_update(&from("s1"), &from("s2"))),
        ["spec.restore"]
    );
    assert_eq!(paths(&validate_update(&from("s1"), &plain)), ["spec.restore"]);
    assert!(validate_update(&from("s1"), &from("s1")).is_empty());
    assert!(validate_update(&plain, &plain).is_empty());
}

#[test]
fn the_template_namespace_is_immutable() {
    let in_ns =
        |ns: &str| spec(json!({"infrastructureTemplate": {"kind": "K", "name": "n", "namespace": ns}}));
    assert_eq!(
        paths(&validate_update(&in_ns("a"), &in_ns("b"))),
        ["spec.infrastructureTemplate.namespace"]
    );
    assert!(validate_update(&in_ns("a"), &in_ns("a")).is_empty());
}

#[test]
fn version_changes_are_answered_with_the_field_and_the_reason() {
    let at = |v: &str| spec(json!({"etcdadmConfigSpec": {"cloudInitConfig": {"version": v}}}));
    // What admission runs on an update: the new spec on its own, then the change.
    let answer = |from: &str, to: &str| {
        let mut errors = validate_spec(&at(to), None);
        errors.extend(validate_update(&at(from), &at(to)));
        errors
    };
    let skip = answer("3.4.27", "3.6.0");
    assert_eq!(paths(&skip), ["spec.etcdadmConfigSpec.cloudInitConfig.version"]);
    assert!(skip[0].message.contains("skips a minor version"), "{skip:?}");
    for (from, to) in [("3.4.27", "3.5.9"), ("3.5.1", "3.5.9"), ("3.5.9", "3.5.1")] {
        assert_eq!(answer(from, to), vec![], "{from} → {to}");
    }
    for unparsable in ["3.6", "v3.6.0", "latest"] {
        let errors = answer("3.5.9", unparsable);
        assert_eq!(paths(&errors), ["spec.etcdadmConfigSpec.cloudInitConfig.version"]);
        assert!(
            errors[0].message.contains("is not an etcd version like 3.5.9"),
            "{unparsable}: {errors:?}"
        );
    }
}
