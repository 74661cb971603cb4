//! Admission for EtcdadmCluster: fill the defaults a user would otherwise have to know, and
//! reject, with the field path, every spec the controller could not act on safely.

use std::time::Duration;

use serde_json::{Value, json};

use etcdadm_shared::api::cluster::{
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT, DEFAULT_REPLICAS, DEFAULT_UNHEALTHY_AFTER,
    MAX_CERTIFICATES_EXPIRY_DAYS, MIN_AUTOMATIC_RECOVERY_AFTER, MIN_CERTIFICATES_EXPIRY_DAYS,
    MIN_DEFRAGMENT_INTERVAL,
};
use etcdadm_shared::api::{EtcdadmCluster, EtcdadmClusterSpec, Format};
use etcdadm_shared::cron::Schedule;
use etcdadm_shared::duration;
use etcdadm_shared::manager::WebhookRoutes;
use etcdadm_shared::manager::admission::{self, AdmissionRequest, AdmissionResponse, DynamicObject};
use etcdadm_shared::names;
use etcdadm_shared::validation::{
    FieldError, backup_warnings, etcd_version, quoted, validate_backup, validate_config_spec,
    validate_restore, version_change_problem,
};

/// Defaulting webhook path (controller-runtime's naming).
pub const MUTATE_PATH: &str = "/mutate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster";
/// Validating webhook path.
pub const VALIDATE_PATH: &str = "/validate-etcdcluster-cluster-x-k8s-io-v1beta1-etcdadmcluster";

/// Shortest health-check interval accepted: every check opens TLS connections to every member.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

pub fn routes() -> WebhookRoutes {
    WebhookRoutes::new()
        .route(MUTATE_PATH, default_cluster)
        .route(VALIDATE_PATH, validate_cluster)
}

/// Defaults: replicas 1, the template in our namespace, health-check settings, cloud-config.
pub fn default_cluster(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let mut defaults: Vec<(&[&str], Value)> = vec![
        (&["spec", "replicas"], json!(DEFAULT_REPLICAS)),
        (
            &["spec", "healthCheck", "interval"],
            json!(duration::format(DEFAULT_HEALTH_INTERVAL)),
        ),
        (
            &["spec", "healthCheck", "timeout"],
            json!(duration::format(DEFAULT_HEALTH_TIMEOUT)),
        ),
        (
            &["spec", "healthCheck", "unhealthyAfter"],
            json!(duration::format(DEFAULT_UNHEALTHY_AFTER)),
        ),
        (&["spec", "healthCheck", "remediation"], json!("Enabled")),
        (
            &["spec", "etcdadmConfigSpec", "format"],
            json!(Format::CloudConfig.as_str()),
        ),
    ];
    if let Some(namespace) = &req.namespace {
        defaults.push((&["spec", "infrastructureTemplate", "namespace"], json!(namespace)));
    }
    admission::with_defaults(&req, &defaults)
}

pub fn validate_cluster(req: AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let new = match admission::object::<EtcdadmCluster>(&req) {
        Ok(Some(new)) => new,
        Ok(None) => return AdmissionResponse::from(&req),
        Err(message) => return admission::rejected(&req, message),
    };
    let old: Option<EtcdadmCluster> = req
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
        .and_then(|v| serde_json::from_value(v).ok());
    let namespace = req.namespace.clone().or_else(|| new.metadata.namespace.clone());
    let mut errors = validate_spec(&new.spec, namespace.as_deref());
    match old {
        Some(old) => errors.extend(validate_update(&old.spec, &new.spec)),
        None => errors.extend(restore_needs_cloud_config(&new.spec)),
    }
    let warnings = backup_warnings(new.spec.backup.as_ref(), new.spec.restore.as_ref());
    admission::with_warnings(admission::validated(&req, &errors), warnings)
}

/// The first member of a cluster created from a snapshot downloads and restores it in its
/// cloud-config user data; the Bottlerocket bootstrap image cannot.
pub fn restore_needs_cloud_config(spec: &EtcdadmClusterSpec) -> Option<FieldError> {
    (spec.restore.is_some() && spec.etcdadm_config_spec.format() == Format::Bottlerocket).then(|| {
        FieldError::new(
            "spec.restore",
            "a cluster created from a snapshot needs spec.etcdadmConfigSpec.format cloud-config: the \
             Bottlerocket bootstrap image cannot restore one",
        )
    })
}

/// Every rule on a spec on its own.
pub fn validate_spec(spec: &EtcdadmClusterSpec, namespace: Option<&str>) -> Vec<FieldError> {
    let mut errors = vec![];
    if let Some(replicas) = spec.replicas
        && (replicas < 1 || replicas % 2 == 0)
    {
        errors.push(FieldError::new(
            "spec.replicas",
            format!("{replicas}: must be odd and at least 1 (an even member count adds no fault tolerance)"),
        ));
    }
    errors.extend(template_problems(spec, namespace));
    for (i, domain) in spec.failure_domains.iter().enumerate() {
        if domain.is_empty() {
            errors.push(FieldError::new(
                format!("spec.failureDomains[{i}]"),
                "must not be empty",
            ));
        } else if spec.failure_domains[..i].contains(domain) {
            errors.push(FieldError::new(
                format!("spec.failureDomains[{i}]"),
                format!("{} is listed twice", quoted(domain)),
            ));
        }
    }
    if let Some(surge) = spec
        .rollout_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_surge)
        && !(0..=1).contains(&surge)
    {
        errors.push(FieldError::new(
            "spec.rolloutStrategy.rollingUpdate.maxSurge",
            format!("{surge}: must be 0 or 1 (members are replaced one at a time)"),
        ));
    }
    if let Some(parallel) = spec.provisioning.as_ref().and_then(|p| p.parallel_machines)
        && parallel < 1
    {
        errors.push(FieldError::new(
            "spec.provisioning.parallelMachines",
            format!("{parallel}: must be at least 1 (1 creates one Machine at a time)"),
        ));
    }
    if let Some(days) = spec
        .rollout_before
        .as_ref()
        .and_then(|r| r.certificates_expiry_days)
        && !(MIN_CERTIFICATES_EXPIRY_DAYS..=MAX_CERTIFICATES_EXPIRY_DAYS).contains(&days)
    {
        errors.push(FieldError::new(
            "spec.rolloutBefore.certificatesExpiryDays",
            format!(
                "{days}: must be at least {MIN_CERTIFICATES_EXPIRY_DAYS} and at most {MAX_CERTIFICATES_EXPIRY_DAYS} (days left on a certificate when it is renewed; a fresh one is valid 365 days)"
            ),
        ));
    }
    errors.extend(health_check(spec));
    if let Some(backup) = &spec.backup {
        errors.extend(validate_backup(backup, "spec.backup"));
    }
    if let Some(restore) = &spec.restore {
        errors.extend(validate_restore(restore, "spec.restore"));
    }
    errors.extend(automatic_recovery(spec));
    errors.extend(defragmentation(spec));
    errors.extend(validate_config_spec(
        &spec.etcdadm_config_spec,
        "spec.etcdadmConfigSpec",
    ));
    errors
}

/// An automatic recovery waits at least the minimum, and has a store for the survivor's snapshot.
fn automatic_recovery(spec: &EtcdadmClusterSpec) -> Vec<FieldError> {
    let Some(recovery) = &spec.recovery else {
        return vec![];
    };
    let mut errors = vec![];
    if let Some(after) = &recovery.after {
        let minimum = duration::format(MIN_AUTOMATIC_RECOVERY_AFTER);
        match duration::parse(after) {
            Ok(d) if d >= MIN_AUTOMATIC_RECOVERY_AFTER => {}
            Ok(_) => errors.push(FieldError::new(
                "spec.recovery.after",
                format!("{}: must be at least {minimum}", quoted(after)),
            )),
            Err(e) => errors.push(FieldError::new(
                "spec.recovery.after",
                format!("{}: {e}", quoted(after)),
            )),
        }
    }
    if recovery.automatic == Some(true) && spec.backup.is_none() {
        errors.push(FieldError::new(
            "spec.recovery.automatic",
            "needs spec.backup.store: an automatic recovery snapshots the surviving member into it",
        ));
    }
    errors
}

/// The defragmentation policy's sizes, interval and window parse (percentages are bounded by
/// the schema).
fn defragmentation(spec: &EtcdadmClusterSpec) -> Vec<FieldError> {
    let Some(policy) = spec.maintenance.as_ref().and_then(|m| m.defragmentation.as_ref()) else {
        return vec![];
    };
    let base = "spec.maintenance.defragmentation";
    let mut errors = vec![];
    for (field, value) in [
        ("minimumSize", &policy.minimum_size),
        ("minimumReclaimable", &policy.minimum_reclaimable),
    ] {
        if let Some(Err(why)) = value.as_ref().map(|q| q.bytes()) {
            errors.push(FieldError::new(format!("{base}.{field}"), why));
        }
    }
    for (field, value, bound) in [
        ("fragmentedPercent", policy.fragmented_percent, 99),
        ("quotaPercent", policy.quota_percent, 100),
    ] {
        if let Some(percent) = value
            && !(1..=bound).contains(&percent)
        {
            errors.push(FieldError::new(
                format!("{base}.{field}"),
                format!("{percent}: must be 1 to {bound} (percent)"),
            ));
        }
    }
    let minimum = duration::format(MIN_DEFRAGMENT_INTERVAL);
    let mut at_least = |field: String, value: &str| match duration::parse(value) {
        Ok(d) if d >= MIN_DEFRAGMENT_INTERVAL => {}
        Ok(_) => errors.push(FieldError::new(
            field,
            format!("{}: must be at least {minimum}", quoted(value)),
        )),
        Err(e) => errors.push(FieldError::new(field, format!("{}: {e}", quoted(value)))),
    };
    if let Some(interval) = &policy.interval {
        at_least(format!("{base}.interval"), interval);
    }
    if let Some(window) = &policy.window {
        at_least(format!("{base}.window.duration"), &window.duration);
        if let Err(e) = Schedule::parse(&window.start) {
            errors.push(FieldError::new(format!("{base}.window.start"), e.to_string()));
        }
    }
    errors
}

/// The health-check durations parse and make sense together.
fn health_check(spec: &EtcdadmClusterSpec) -> Vec<FieldError> {
    let Some(hc) = &spec.health_check else {
        return vec![];
    };
    let mut errors = vec![];
    let mut parsed = |field: &str, value: &Option<String>| -> Option<Duration> {
        let value = value.as_deref()?;
        match duration::parse(value) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                errors.push(FieldError::new(
                    format!("spec.healthCheck.{field}"),
                    "must be greater than zero",
                ));
                None
            }
            Err(e) => {
                errors.push(FieldError::new(
                    format!("spec.healthCheck.{field}"),
                    format!("{}: {e}", quoted(value)),
                ));
                None
            }
        }
    };
    let interval = parsed("interval", &hc.interval);
    let timeout = parsed("timeout", &hc.timeout);
    let unhealthy_after = parsed("unhealthyAfter", &hc.unhealthy_after);
    let interval_or_default = interval.unwrap_or(DEFAULT_HEALTH_INTERVAL);
    if interval.is_some_and(|i| i < MIN_INTERVAL) {
        errors.push(FieldError::new(
            "spec.healthCheck.interval",
            "must be at least 1s",
        ));
    }
    if let Some(timeout) = timeout
        && timeout > interval_or_default
    {
        errors.push(FieldError::new(
            "spec.healthCheck.timeout",
            format!(
                "{}: must not exceed the interval {}",
                duration::format(timeout),
                duration::format(interval_or_default)
            ),
        ));
    }
    if let Some(after) = unhealthy_after
        && after < interval_or_default
    {
        errors.push(FieldError::new(
            "spec.healthCheck.unhealthyAfter",
            format!(
                "{}: must be at least the interval {} (one failed check must never be enough)",
                duration::format(after),
                duration::format(interval_or_default)
            ),
        ));
    }
    errors
}

/// Changes that would strand the running members.
pub fn validate_update(old: &EtcdadmClusterSpec, new: &EtcdadmClusterSpec) -> Vec<FieldError> {
    let mut errors = vec![];
    if let (Some((_, old_version)), Some((field, new_version))) = (
        etcd_version(&old.etcdadm_config_spec),
        etcd_version(&new.etcdadm_config_spec),
    ) && let Some(problem) = version_change_problem(old_version, new_version)
    {
        errors.push(FieldError::new(
            format!("spec.etcdadmConfigSpec.{field}"),
            problem,
        ));
    }
    if old.infrastructure_template.namespace.is_some()
        && old.infrastructure_template.namespace != new.infrastructure_template.namespace
    {
        errors.push(FieldError::new(
            "spec.infrastructureTemplate.namespace",
            "is immutable",
        ));
    }
    match (&old.restore, &new.restore) {
        (None, Some(_)) => errors.push(FieldError::new(
            "spec.restore",
            "can only be set when the EtcdadmCluster is created: a running cluster's data is \
             never replaced (create a new EtcdadmCluster restored from the snapshot)",
        )),
        (Some(old), new) if new.as_ref() != Some(old) => {
            errors.push(FieldError::new("spec.restore", "is immutable"))
        }
        _ => {}
    }
    errors
}

/// `spec.infrastructureTemplate`: named, an infrastructure provider's kind, in our namespace.
fn template_problems(spec: &EtcdadmClusterSpec, namespace: Option<&str>) -> Vec<FieldError> {
    let template = &spec.infrastructure_template;
    let mut errors = vec![];
    if template.kind.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::new("spec.infrastructureTemplate.kind", "required"));
    }
    if template.name.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::new("spec.infrastructureTemplate.name", "required"));
    }
    if let Some(api_version) = template.api_version.as_deref()
        && let Some(problem) = infrastructure_group_problem(api_version)
    {
        errors.push(FieldError::new("spec.infrastructureTemplate.apiVersion", problem));
    }
    if let (Some(template_ns), Some(ns)) = (template.namespace.as_deref(), namespace)
        && template_ns != ns
    {
        errors.push(FieldError::new(
            "spec.infrastructureTemplate.namespace",
            format!(
                "{}: must be the EtcdadmCluster's own namespace {ns:?}",
                quoted(template_ns)
            ),
        ));
    }
    errors
}

/// Why `api_version` is not of the infrastructure providers' group, if it is not: the
/// controller clones only kinds of that group, and its RBAC reaches no other.
pub fn infrastructure_group_problem(api_version: &str) -> Option<String> {
    match api_version.split_once('/') {
        Some((group, version)) if group == names::INFRASTRUCTURE_GROUP && !version.is_empty() => None,
        _ => Some(format!(
            "{}: must be {}/<version> (the template of an infrastructure provider)",
            quoted(api_version),
            names::INFRASTRUCTURE_GROUP
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let same =
            spec(json!({"infrastructureTemplate": {"kind": "K", "name": "n", "namespace": "default"}}));
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
}
