//! The names the schema and admission both check a config against, and the CEL rules the CRD
//! carries for them: the etcd settings a spec may give (with the shape of each value) and Go's
//! TLS cipher suite names. Data only, so the API types can carry the rules without depending on
//! the checks that use the same lists.

use std::time::Duration;

/// etcd's compaction hash check interval (3.5.5 and later).
pub const COMPACT_HASH_CHECK_TIME: &str = "experimental-compact-hash-check-time";
/// etcd's largest election timeout, in milliseconds.
pub const MAX_ELECTION_TIMEOUT_MS: u64 = 50_000;

/// The shape of one allowed setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `periodic` or `revision`.
    CompactionMode,
    /// Hours or a duration (periodic), a revision count (revision).
    CompactionRetention,
    /// A whole number in this range.
    Count(u64, u64),
    /// Milliseconds in this range.
    Millis(u64, u64),
    /// Bytes (a number or a quantity) in this range.
    Bytes(u64, u64),
    /// A Go duration of at least this long.
    Duration(Duration),
}

/// Every allowed setting and the shape of its value.
pub const ALLOWED: &[(&str, Shape)] = &[
    ("auto-compaction-mode", Shape::CompactionMode),
    ("auto-compaction-retention", Shape::CompactionRetention),
    // Below a thousand entries etcd would snapshot its raft log almost continuously.
    ("snapshot-count", Shape::Count(1_000, 10_000_000)),
    ("heartbeat-interval", Shape::Millis(10, 10_000)),
    ("election-timeout", Shape::Millis(50, MAX_ELECTION_TIMEOUT_MS)),
    // etcd warns above 10 MiB; below 1 KiB no ordinary object fits.
    ("max-request-bytes", Shape::Bytes(1 << 10, 10 << 20)),
    // Each check hashes the whole keyspace on every member (etcd's docs suggest hours).
    (
        "experimental-corrupt-check-time",
        Shape::Duration(Duration::from_secs(60)),
    ),
    (COMPACT_HASH_CHECK_TIME, Shape::Duration(Duration::from_secs(60))),
];

/// The CEL rule `etcdSettings`' schema carries: every name from the list (each value's shape
/// stays admission's and the controller's).
pub fn names_rule() -> kube::core::Rule {
    let names: Vec<String> = ALLOWED.iter().map(|(n, _)| format!("'{n}'")).collect();
    let listed: Vec<&str> = ALLOWED.iter().map(|(n, _)| *n).collect();
    kube::core::Rule::new(format!("self.all(name, name in [{}])", names.join(", ")))
        .message(
            format!(
                "etcdSettings names a setting outside the list: allowed are {}",
                listed.join(", ")
            )
            .as_str(),
        )
        .reason(kube::core::Reason::FieldValueInvalid)
}

/// Cipher suite names Go's crypto/tls knows for TLS 1.0–1.2 (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()`), which is what etcd's `--cipher-suites` accepts.
pub const GO_TLS12_CIPHER_SUITES: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// TLS 1.3 suites: Go knows them but ignores them in a configured list, so naming one does
/// nothing; it is rejected rather than silently ignored.
pub const GO_TLS13_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// The CEL rule `cipherSuites`' schema carries: blank, or a comma list of names from
/// [`GO_TLS12_CIPHER_SUITES`] (entries trimmed as admission trims them).
pub fn cipher_suites_rule() -> kube::core::Rule {
    let names: Vec<String> = GO_TLS12_CIPHER_SUITES.iter().map(|n| format!("'{n}'")).collect();
    kube::core::Rule::new(format!(
        "self.trim() == '' || self.split(',').all(name, name.trim() in [{}])",
        names.join(", ")
    ))
    .message(
        "cipherSuites must be a comma list of Go's TLS 1.2 cipher suite names, such as \
         TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 (TLS 1.3 suites cannot be configured)",
    )
    .reason(kube::core::Reason::FieldValueInvalid)
}
