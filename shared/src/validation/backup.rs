//! Checks of `spec.backup` and `spec.restore`: the admission webhook rejects what fails them, and
//! the snapshot controller fails a snapshot with the same words when an object bypassed it.

use super::field::{FieldError, quoted};
use crate::api::snapshot::{
    Backup, CONTINUOUS_INTERVAL_RANGE, MAX_SAMPLE_KEYS, Restore, Retention, S3Store, ServerSideEncryption,
};
use crate::cron::Schedule;

/// Every problem with `backup` (whose path is `base`, e.g. `spec.backup`).
pub fn validate_backup(backup: &Backup, base: &str) -> Vec<FieldError> {
    let mut errors = validate_store(&backup.store.s3, &format!("{base}.store.s3"));
    if let Some(schedule) = backup.schedule.as_deref()
        && let Err(e) = Schedule::parse(schedule)
    {
        errors.push(FieldError::new(format!("{base}.schedule"), e.to_string()));
    }
    if let Some(retention) = &backup.retention {
        errors.extend(retention_problems(retention, &format!("{base}.retention")));
    }
    if let Some(text) = backup.continuous.as_ref().and_then(|c| c.interval.as_deref()) {
        let path = format!("{base}.continuous.interval");
        match crate::duration::parse(text) {
            Err(e) => errors.push(FieldError::new(path, e.to_string())),
            Ok(d) if !CONTINUOUS_INTERVAL_RANGE.contains(&d) => {
                errors.push(FieldError::new(path, format!("{text}: must be 5s to 10m")))
            }
            Ok(_) => {}
        }
    }
    if let Some(verify) = &backup.verify {
        let path = format!("{base}.verify");
        if let Err(e) = Schedule::parse(&verify.schedule) {
            errors.push(FieldError::new(format!("{path}.schedule"), e.to_string()));
        }
        if let Some(n) = verify.sample_keys
            && !(1..=MAX_SAMPLE_KEYS).contains(&n)
        {
            errors.push(FieldError::new(
                format!("{path}.sampleKeys"),
                format!("{n}: must be 1 to {MAX_SAMPLE_KEYS}"),
            ));
        }
    }
    if let Some(before) = &backup.before_change {
        let path = format!("{base}.beforeChange");
        if let Some(text) = before.max_age.as_deref()
            && let Err(e) = crate::duration::parse(text)
        {
            errors.push(FieldError::new(format!("{path}.maxAge"), e.to_string()));
        }
        if let Some(keep) = before.keep
            && !(1..=100).contains(&keep)
        {
            errors.push(FieldError::new(
                format!("{path}.keep"),
                format!("{keep}: must be 1 to 100"),
            ));
        }
    }
    errors
}

/// Every problem with `retention` (whose path is `base`): a count of at least 1 for `keep` and
/// each tier, and at least one of them.
fn retention_problems(retention: &Retention, base: &str) -> Vec<FieldError> {
    let counts = [
        ("keep", retention.keep, 10_000),
        ("hourly", retention.hourly, 1_000),
        ("daily", retention.daily, 1_000),
        ("weekly", retention.weekly, 1_000),
    ];
    let mut errors: Vec<FieldError> = counts
        .iter()
        .filter_map(|(field, count, max)| {
            let count = (*count)?;
            (!(1..=*max).contains(&count)).then(|| {
                FieldError::new(
                    format!("{base}.{field}"),
                    format!("{count}: must be 1 to {max} (to keep every snapshot, leave retention out)"),
                )
            })
        })
        .collect();
    if counts.iter().all(|(_, count, _)| count.is_none()) {
        errors.push(FieldError::new(
            base.to_string(),
            "set keep or a tier (hourly, daily, weekly); to keep every snapshot, leave retention out",
        ));
    }
    errors
}

/// Every problem with an S3 store (whose path is `base`, e.g. `spec.backup.store.s3`).
pub fn validate_store(store: &S3Store, base: &str) -> Vec<FieldError> {
    let mut errors = vec![];
    if let Some(problem) = endpoint_problem(&store.endpoint) {
        errors.push(FieldError::new(format!("{base}.endpoint"), problem));
    } else if store.endpoint.starts_with("http://") && !store.allows_insecure() {
        errors.push(FieldError::new(
            format!("{base}.endpoint"),
            format!(
                "{} is plain http: snapshots hold every Secret of the workload cluster; use \
                 https:// (caSecretRef for a private CA), or set insecure: true to accept this",
                quoted(&store.endpoint)
            ),
        ));
    }
    if store.sse_kms_key_id.is_some() && store.sse != Some(ServerSideEncryption::AwsKms) {
        errors.push(FieldError::new(
            format!("{base}.sseKMSKeyID"),
            "names a KMS key, which only sse: aws:kms uses: set sse: aws:kms, or remove it",
        ));
    }
    if let Some(key_id) = store.sse_kms_key_id.as_deref()
        && (key_id.trim().is_empty() || key_id.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        errors.push(FieldError::new(
            format!("{base}.sseKMSKeyID"),
            format!("{} is not a KMS key ID or ARN", quoted(key_id)),
        ));
    }
    if let Some(problem) = bucket_problem(&store.bucket) {
        errors.push(FieldError::new(format!("{base}.bucket"), problem));
    }
    if store.credentials_secret_ref.name.trim().is_empty() {
        errors.push(FieldError::new(
            format!("{base}.credentialsSecretRef.name"),
            "is required: the Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ));
    }
    if let Some(ca) = &store.ca_secret_ref
        && ca.name.trim().is_empty()
    {
        errors.push(FieldError::new(
            format!("{base}.caSecretRef.name"),
            "must name a Secret (or leave caSecretRef out to trust the system's CAs)",
        ));
    }
    if let Some(prefix) = store.prefix.as_deref()
        && prefix.starts_with('/')
    {
        errors.push(FieldError::new(
            format!("{base}.prefix"),
            format!(
                "{}: must not start with '/' (keys are relative to the bucket)",
                quoted(prefix)
            ),
        ));
    }
    errors
}

/// Every problem with `restore` on its own (whose path is `base`, e.g. `spec.restore`).
pub fn validate_restore(restore: &Restore, base: &str) -> Vec<FieldError> {
    let source = &restore.snapshot;
    let path = format!("{base}.snapshot");
    let by_name = source.name.as_deref().is_some_and(|n| !n.is_empty());
    let by_key = source.key.as_deref().is_some_and(|k| !k.is_empty());
    let mut errors = vec![];
    match (by_name, by_key, &source.store) {
        (true, false, None) => {}
        (false, true, Some(store)) => {
            errors.extend(validate_store(&store.s3, &format!("{path}.store.s3")));
            if let Some(sha256) = source.sha256.as_deref()
                && !is_sha256_hex(sha256)
            {
                errors.push(FieldError::new(
                    format!("{path}.sha256"),
                    format!(
                        "{} is not a SHA-256: 64 hex digits, as sha256sum prints",
                        quoted(sha256)
                    ),
                ));
            }
        }
        (false, true, None) => errors.push(FieldError::new(
            format!("{path}.store"),
            "is required with key: the store holding the object",
        )),
        (false, false, Some(_)) => errors.push(FieldError::new(
            format!("{path}.key"),
            "is required with store: the object key of the snapshot file",
        )),
        (false, false, None) => errors.push(FieldError::new(
            path.clone(),
            "names no snapshot: set name (an EtcdadmSnapshot), or store and key",
        )),
        (true, _, _) => errors.push(FieldError::new(
            path.clone(),
            "set either name (an EtcdadmSnapshot), or store and key, not both",
        )),
    }
    if by_name && source.sha256.is_some() {
        errors.push(FieldError::new(
            format!("{path}.sha256"),
            "goes with store and key only: an EtcdadmSnapshot's SHA-256 is the one it recorded",
        ));
    }
    if let Some(to) = &restore.to {
        if to.target().is_none() {
            errors.push(FieldError::new(
                format!("{base}.to"),
                "set exactly one of latest (true), revision (at least 1) and time",
            ));
        }
        if !by_name {
            errors.push(FieldError::new(
                format!("{base}.to"),
                "needs snapshot.name: the EtcdadmSnapshot records the revision its deltas follow",
            ));
        }
    }
    errors
}

/// What admission accepts but warns about in a store: a plain http endpoint.
pub fn store_warnings(store: &S3Store, base: &str) -> Vec<String> {
    if store.allows_insecure() && store.endpoint.starts_with("http://") {
        vec![format!(
            "{base}.endpoint is plain http (insecure: true): snapshots, which hold every Secret of \
             the workload cluster, and their restore downloads travel unencrypted"
        )]
    } else if store.allows_insecure() {
        vec![format!("{base}.insecure has no effect on an https:// endpoint")]
    } else {
        vec![]
    }
}

/// Warnings for `spec.backup` and `spec.restore` of an EtcdadmCluster spec.
pub fn backup_warnings(backup: Option<&Backup>, restore: Option<&Restore>) -> Vec<String> {
    let mut warnings = vec![];
    if let Some(backup) = backup {
        warnings.extend(store_warnings(&backup.store.s3, "spec.backup.store.s3"));
    }
    if let Some(store) = restore.and_then(|r| r.snapshot.store.as_ref()) {
        warnings.extend(store_warnings(&store.s3, "spec.restore.snapshot.store.s3"));
    }
    warnings
}

/// 64 hex digits.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit())
}

fn endpoint_problem(endpoint: &str) -> Option<String> {
    if endpoint.trim().is_empty() {
        return Some(
            "is required: the base URL of the S3 API, e.g. https://s3.eu-west-1.amazonaws.com".into(),
        );
    }
    let url = match reqwest::Url::parse(endpoint) {
        Ok(url) => url,
        Err(e) => return Some(format!("{} is not a URL: {e}", quoted(endpoint))),
    };
    let plain = url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none();
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() || !plain {
        return Some(format!(
            "{} must be an http:// or https:// URL with a host and without credentials, query \
             or fragment",
            quoted(endpoint)
        ));
    }
    None
}

/// S3's bucket naming rules, which every S3-compatible store accepts.
fn bucket_problem(bucket: &str) -> Option<String> {
    if bucket.is_empty() {
        return Some("is required: the bucket snapshots are stored in".into());
    }
    let chars_ok = bucket
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !(3..=63).contains(&bucket.len())
        || !chars_ok
        || !ends_ok(bucket.chars().next())
        || !ends_ok(bucket.chars().last())
    {
        return Some(format!(
            "{} is not a bucket name: 3 to 63 lower-case letters, digits, '.' and '-', starting \
             and ending with a letter or digit",
            quoted(bucket)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn backup(value: serde_json::Value) -> Backup {
        let mut base = json!({"store": {"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd-backups",
                              "credentialsSecretRef": {"name": "s3-creds"}}}});
        json_patch::merge(&mut base, &value);
        serde_json::from_value(base).unwrap()
    }

    fn paths(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn a_plain_backup_is_valid() {
        let valid = backup(json!({"schedule": "0 */6 * * *", "retention": {"keep": 7},
                                  "store": {"s3": {"prefix": "prod/", "region": "eu-west-1", "forcePathStyle": true,
                                                   "caSecretRef": {"name": "s3-ca"}}}}));
        assert_eq!(validate_backup(&valid, "spec.backup"), vec![]);
    }

    #[test]
    fn endpoint_bucket_and_credentials_are_required() {
        let errors = validate_backup(
            &backup(
                json!({"store": {"s3": {"endpoint": "", "bucket": "", "credentialsSecretRef": {"name": ""}}}}),
            ),
            "spec.backup",
        );
        assert_eq!(
            paths(&errors),
            [
                "spec.backup.store.s3.endpoint",
                "spec.backup.store.s3.bucket",
                "spec.backup.store.s3.credentialsSecretRef.name"
            ]
        );
        assert!(errors[0].message.contains("is required"));
    }

    #[test]
    fn endpoints_are_plain_http_urls_and_buckets_follow_s3_rules() {
        for bad in [
            "s3.example.com",
            "ftp://s3.example.com",
            "https://user:pw@s3.example.com",
            "https://s3.example.com/?x=1",
        ] {
            let errors = validate_backup(
                &backup(json!({"store": {"s3": {"endpoint": bad}}})),
                "spec.backup",
            );
            assert_eq!(paths(&errors), ["spec.backup.store.s3.endpoint"], "{bad}");
        }
        for good in ["https://minio.storage.svc:9000/", "https://s3.amazonaws.com"] {
            assert!(
                validate_backup(
                    &backup(json!({"store": {"s3": {"endpoint": good}}})),
                    "spec.backup"
                )
                .is_empty(),
                "{good}"
            );
        }
        for bad in ["ab", "Upper", "with_underscore", "-dash", "dot.", &"b".repeat(64)] {
            let errors = validate_backup(&backup(json!({"store": {"s3": {"bucket": bad}}})), "spec.backup");
            assert_eq!(paths(&errors), ["spec.backup.store.s3.bucket"], "{bad}");
        }
    }

    #[test]
    fn plain_http_needs_insecure_and_is_warned_about() {
        let plain = backup(json!({"store": {"s3": {"endpoint": "http://127.0.0.1:8333"}}}));
        let errors = validate_backup(&plain, "spec.backup");
        assert_eq!(paths(&errors), ["spec.backup.store.s3.endpoint"]);
        assert!(errors[0].message.contains("insecure: true"), "{errors:?}");
        assert!(store_warnings(&plain.store.s3, "s").is_empty());

        let allowed =
            backup(json!({"store": {"s3": {"endpoint": "http://127.0.0.1:8333", "insecure": true}}}));
        assert_eq!(validate_backup(&allowed, "spec.backup"), vec![]);
        let warnings = backup_warnings(Some(&allowed), None);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("spec.backup.store.s3.endpoint is plain http"));
        let tls = backup(json!({"store": {"s3": {"insecure": true}}}));
        assert!(store_warnings(&tls.store.s3, "s")[0].contains("no effect"));
    }

    #[test]
    fn a_kms_key_goes_with_aws_kms_only() {
        for sse in [
            json!({"sse": "AES256"}),
            json!({"sse": "aws:kms", "sseKMSKeyID": "alias/etcd"}),
        ] {
            let valid = backup(json!({"store": {"s3": sse}}));
            assert_eq!(validate_backup(&valid, "spec.backup"), vec![], "{sse}");
        }
        for sse in [
            json!({"sseKMSKeyID": "alias/etcd"}),
            json!({"sse": "AES256", "sseKMSKeyID": "alias/etcd"}),
            json!({"sse": "aws:kms", "sseKMSKeyID": "two words"}),
        ] {
            let errors = validate_backup(&backup(json!({"store": {"s3": sse}})), "spec.backup");
            assert_eq!(paths(&errors), ["spec.backup.store.s3.sseKMSKeyID"], "{sse}");
        }
    }

    #[test]
    fn schedules_must_parse_and_retention_keeps_at_least_one() {
        let errors = validate_backup(&backup(json!({"schedule": "every hour"})), "spec.backup");
        assert_eq!(paths(&errors), ["spec.backup.schedule"]);
        assert!(
            errors[0].message.contains("has 2 fields"),
            "{}",
            errors[0].message
        );
        let errors = validate_backup(&backup(json!({"retention": {"keep": 0}})), "spec.backup");
        assert_eq!(paths(&errors), ["spec.backup.retention.keep"]);
        let errors = validate_backup(
            &backup(json!({"retention": {"hourly": 0, "daily": 1001, "weekly": 4}})),
            "spec.backup",
        );
        assert_eq!(
            paths(&errors),
            ["spec.backup.retention.hourly", "spec.backup.retention.daily"]
        );
        let errors = validate_backup(&backup(json!({"retention": {}})), "spec.backup");
        assert_eq!(paths(&errors), ["spec.backup.retention"]);
        assert!(
            validate_backup(
                &backup(json!({"retention": {"hourly": 24, "daily": 7, "weekly": 4}})),
                "spec.backup"
            )
            .is_empty()
        );
        let errors = validate_backup(
            &backup(json!({"beforeChange": {"maxAge": "ten minutes", "keep": 0}})),
            "spec.backup",
        );
        assert_eq!(
            paths(&errors),
            ["spec.backup.beforeChange.maxAge", "spec.backup.beforeChange.keep"]
        );
        let errors = validate_backup(
            &backup(json!({"store": {"s3": {"prefix": "/abs"}}})),
            "spec.backup",
        );
        assert_eq!(paths(&errors), ["spec.backup.store.s3.prefix"]);
        for refused in ["1s", "11m", "soon"] {
            let errors = validate_backup(
                &backup(json!({"continuous": {"interval": refused}})),
                "spec.backup",
            );
            assert_eq!(paths(&errors), ["spec.backup.continuous.interval"], "{refused}");
        }
        for accepted in ["5s", "20s", "10m"] {
            let continuous = backup(json!({"continuous": {"interval": accepted}}));
            assert!(
                validate_backup(&continuous, "spec.backup").is_empty(),
                "{accepted}"
            );
        }
        assert!(validate_backup(&backup(json!({"continuous": {}})), "spec.backup").is_empty());
        for (verify, path) in [
            (json!({"schedule": "every day"}), "spec.backup.verify.schedule"),
            (json!({"schedule": ""}), "spec.backup.verify.schedule"),
            (
                json!({"schedule": "@daily", "sampleKeys": 0}),
                "spec.backup.verify.sampleKeys",
            ),
            (
                json!({"schedule": "@daily", "sampleKeys": 1001}),
                "spec.backup.verify.sampleKeys",
            ),
        ] {
            let errors = validate_backup(&backup(json!({"verify": verify})), "spec.backup");
            assert_eq!(paths(&errors), [path], "{verify}");
        }
        for fine in [
            json!({"schedule": "0 4 * * *"}),
            json!({"schedule": "* * * * *", "sampleKeys": 1}),
            json!({"schedule": "@daily", "sampleKeys": 1000}),
        ] {
            assert!(
                validate_backup(&backup(json!({"verify": fine})), "spec.backup").is_empty(),
                "{fine}"
            );
        }
    }

    #[test]
    fn a_restore_names_a_snapshot_or_a_store_and_key() {
        let restore = |value: serde_json::Value| -> Restore {
            serde_json::from_value(json!({"snapshot": value})).unwrap()
        };
        let store = json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd-backups",
                                  "credentialsSecretRef": {"name": "s3-creds"}}});
        assert!(validate_restore(&restore(json!({"name": "c1-snap"})), "spec.restore").is_empty());
        assert!(
            validate_restore(&restore(json!({"store": store, "key": "a/b.db"})), "spec.restore").is_empty()
        );
        let given = json!({"store": store, "key": "a/b.db", "sha256": "AB".repeat(32)});
        assert!(validate_restore(&restore(given), "spec.restore").is_empty());
        let to = |to: serde_json::Value, snapshot: serde_json::Value| -> Vec<String> {
            let restore: Restore = serde_json::from_value(json!({"snapshot": snapshot, "to": to})).unwrap();
            validate_restore(&restore, "spec.restore")
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        let named = json!({"name": "c1-snap"});
        for fine in [
            json!({"latest": true}),
            json!({"revision": 7}),
            json!({"time": "2026-11-28T12:00:00Z"}),
        ] {
            assert!(to(fine.clone(), named.clone()).is_empty(), "{fine}");
        }
        for bad in [
            json!({}),
            json!({"latest": false}),
            json!({"revision": 0}),
            json!({"latest": true, "revision": 7}),
        ] {
            assert_eq!(to(bad.clone(), named.clone()), ["spec.restore.to"], "{bad}");
        }
        assert_eq!(
            to(json!({"latest": true}), json!({"store": store, "key": "a/b.db"})),
            ["spec.restore.to"],
            "a point needs an EtcdadmSnapshot"
        );
        for (value, path) in [
            (json!({}), "spec.restore.snapshot"),
            (
                json!({"name": "n", "store": store, "key": "k"}),
                "spec.restore.snapshot",
            ),
            (json!({"key": "k"}), "spec.restore.snapshot.store"),
            (json!({"store": store}), "spec.restore.snapshot.key"),
            (
                json!({"store": {"s3": {"endpoint": "x", "bucket": "etcd-backups", "credentialsSecretRef": {"name": "c"}}}, "key": "k"}),
                "spec.restore.snapshot.store.s3.endpoint",
            ),
            (
                json!({"store": store, "key": "k", "sha256": "abc"}),
                "spec.restore.snapshot.sha256",
            ),
            (
                json!({"name": "n", "sha256": "ab".repeat(32)}),
                "spec.restore.snapshot.sha256",
            ),
        ] {
            assert_eq!(
                paths(&validate_restore(&restore(value.clone()), "spec.restore")),
                [path],
                "{value}"
            );
        }
    }
}
