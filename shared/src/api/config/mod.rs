//! `bootstrap.cluster.x-k8s.io/v1beta1`: EtcdadmConfig and EtcdadmConfigTemplate, wire-compatible
//! with the reference (aws/etcdadm-bootstrap-provider) plus the fields this project adds (docs/bootstrap.md).
//! The Bottlerocket settings (`bottlerocket`) and the users and files written on the machine
//! (`files`) are in files of their own.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::quantity::ByteQuantity;

pub mod allowed;
mod bottlerocket;
mod files;

pub use self::bottlerocket::*;
pub use self::files::*;

/// Desired user data of one etcd machine: etcdadm options and the cloud-init around them.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "EtcdadmConfig",
    namespaced,
    status = "EtcdadmConfigStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "EtcdadmConfig is the bootstrap configuration of one etcd machine: the Machine's bootstrap data Secret is rendered from it.",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("cluster.x-k8s.io/provider", "bootstrap-etcdadm"),
    category = "cluster-api",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this config belongs to"
    ),
    printcolumn(
        name = "Ready",
        type_ = "boolean",
        json_path = ".status.ready",
        description = "Bootstrap data Secret created"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.bottlerocketConfig) || (has(self.format) && self.format == 'bottlerocket')").message("bottlerocketConfig is only used with format bottlerocket").field_path(".bottlerocketConfig").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.format) || self.format != 'bottlerocket' || has(self.bottlerocketConfig)").message("bottlerocketConfig is required with format bottlerocket").field_path(".bottlerocketConfig").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.format) || self.format != 'bottlerocket' || !has(self.quotaBackendBytes)").message("quotaBackendBytes is cloud-config only: the bottlerocket bootstrap image passes etcd no quota").field_path(".quotaBackendBytes").reason(Reason::FieldValueForbidden))]
pub struct EtcdadmConfigSpec {
    /// Extra users to add (cloud-init `users:`), unique by name; at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub users: Vec<User>,

    /// The machine image already has etcdadm: no install commands run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcdadm_builtin: Option<bool>,

    /// Commands that install etcdadm when it is not built in (default: download a pinned
    /// release); at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub etcdadm_install_commands: Vec<String>,

    /// Commands run before etcdadm; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub pre_etcdadm_commands: Vec<String>,

    /// Commands run after etcdadm succeeded; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub post_etcdadm_commands: Vec<String>,

    /// Output format of the bootstrap data (default `cloud-config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,

    /// Settings for the Bottlerocket format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottlerocket_config: Option<BottlerocketConfig>,

    /// etcdadm options for the cloud-config format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_config: Option<CloudInitConfig>,

    /// Extra files written before etcdadm runs (cloud-init `write_files:`), unique by path; at
    /// most 128.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["path".into()]))]
    pub files: Vec<File>,

    /// HTTP(S) proxy for containerd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfiguration>,

    /// Image registry mirror for containerd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_mirror: Option<RegistryMirrorConfiguration>,

    /// Comma-separated TLS cipher suites for etcd (Go names). Empty: Go's defaults. At most
    /// 2048 characters (every suite Go knows fits in under 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = allowed::cipher_suites_rule())]
    pub cipher_suites: Option<String>,

    /// NTP configuration (cloud-init `ntp:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntp: Option<Ntp>,

    /// Extra trusted CA bundles, unique by name; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub cert_bundles: Vec<CertBundle>,

    /// Which etcdadm build runs on the machine. `upstream` (default) works everywhere: one join
    /// URL, cipher suites set in etcd.env. `eks-anywhere` uses that build's extra flags
    /// (`--cipher-suites`, a comma list of join URLs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcdadm_flavor: Option<EtcdadmFlavor>,

    /// etcd's backend quota (`--quota-backend-bytes`): the database size at which etcd raises
    /// the NOSPACE alarm and refuses writes. Bytes or a quantity (`8Gi`), 16Mi to 32Gi. Unset:
    /// etcd's default, 2Gi. Set through etcd's environment file, so cloud-config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = super::schema_rules::bytes_within("quotaBackendBytes", 16 << 20, 32 << 30))]
    pub quota_backend_bytes: Option<ByteQuantity>,

    /// etcd's corruption checks: `Enabled` turns on what the etcd version has (the check at
    /// start, before serving, and from 3.5.5 the leader's periodic check of compacted revisions'
    /// hashes; a mismatch raises CORRUPT, which the EtcdadmCluster controller contains);
    /// `Disabled` leaves them off. Unset: etcd's default (off), but an EtcdadmCluster gives its
    /// new members `Enabled` unless its etcdadmConfigSpec says `Disabled`. Cloud-config only
    /// (Bottlerocket passes etcd no such setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corruption_checks: Option<CorruptionChecks>,

    /// More etcd settings, by etcd's flag name without `--`, from a short list:
    /// `auto-compaction-mode` (periodic, revision), `auto-compaction-retention`, `snapshot-count`,
    /// `heartbeat-interval` and `election-timeout` (milliseconds), `max-request-bytes`,
    /// `experimental-corrupt-check-time` and `experimental-compact-hash-check-time` (durations).
    /// Identity, URLs, TLS, the data directory and the initial cluster are etcdadm's and refused;
    /// the quota is `quotaBackendBytes`. Written to etcd's environment file, so cloud-config
    /// only; a change replaces the members one at a time. At most 16.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    #[x_kube(validation = allowed::names_rule())]
    pub etcd_settings: BTreeMap<String, SettingValue>,
}

/// Whether etcd checks its data against the other members'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CorruptionChecks {
    #[default]
    Enabled,
    Disabled,
}

/// One etcd setting's value: a number or a string, as a manifest writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SettingValue {
    Number(i64),
    Text(String),
}

impl std::fmt::Display for SettingValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingValue::Number(n) => write!(f, "{n}"),
            SettingValue::Text(text) => write!(f, "{text}"),
        }
    }
}

impl JsonSchema for SettingValue {
    fn schema_name() -> Cow<'static, str> {
        "SettingValue".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A number or a string (at most 64 characters).",
            "x-kubernetes-int-or-string": true,
        })
    }
}

impl EtcdadmConfigSpec {
    /// The format, with the default applied.
    pub fn format(&self) -> Format {
        self.format.unwrap_or_default()
    }

    /// The etcdadm flavor, with the default applied.
    pub fn flavor(&self) -> EtcdadmFlavor {
        self.etcdadm_flavor.unwrap_or_default()
    }

    /// Whether a machine of this spec can join as a learner the EtcdadmCluster controller
    /// pre-adds: upstream etcdadm run from cloud-config, whose join reuses a pre-added member.
    /// The eks-anywhere build and Bottlerocket join as voters.
    pub fn learner_joins(&self) -> bool {
        self.flavor() == EtcdadmFlavor::Upstream && self.format() == Format::CloudConfig
    }

    /// Whether etcdadm is already on the machine image.
    pub fn etcdadm_builtin(&self) -> bool {
        self.etcdadm_builtin.unwrap_or(false)
    }

    /// The backend quota this spec gives etcd, in bytes: `quotaBackendBytes` when set and within
    /// bounds (admission refuses anything else), else etcd's own default.
    pub fn quota_backend_bytes(&self) -> u64 {
        self.quota_backend_bytes
            .as_ref()
            .and_then(|q| q.bytes().ok())
            .filter(|bytes| QUOTA_BACKEND_BYTES_RANGE.contains(bytes))
            .unwrap_or(DEFAULT_QUOTA_BACKEND_BYTES)
    }

    /// The corruption checks an EtcdadmCluster's members run with: on unless turned off.
    pub fn corruption_checks(&self) -> CorruptionChecks {
        self.corruption_checks.unwrap_or_default()
    }

    /// The spec an EtcdadmCluster gives a new member: its own, with the corruption checks on
    /// unless it turns them off (cloud-config: Bottlerocket cannot pass them).
    pub fn for_new_member(&self) -> EtcdadmConfigSpec {
        let mut spec = self.clone();
        if spec.format() == Format::CloudConfig {
            spec.corruption_checks.get_or_insert(CorruptionChecks::Enabled);
        }
        spec
    }
}

/// etcd's backend quota when none is set (etcd 3.4 and 3.5 alike).
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 << 30;
/// The backend quotas admission accepts: below 16 MiB etcd is full after a few thousand writes;
/// above 32 GiB etcd warns that it may not start in time.
pub const QUOTA_BACKEND_BYTES_RANGE: std::ops::RangeInclusive<u64> = (16 << 20)..=(32 << 30);

/// The least a learner join waits for its member to be listed: beyond the usual seconds, room
/// for a controller restart. A machine that gives up never becomes a member; the controller
/// replaces it.
pub const DEFAULT_LEARNER_LISTED_WAIT: Duration = Duration::from_secs(1200);
/// The most a learner join waits for its member to be listed, whatever the annotation says.
pub const MAX_LEARNER_LISTED_WAIT: Duration = Duration::from_secs(7 * 86_400);

impl EtcdadmConfig {
    /// Whether this machine joins as a learner the EtcdadmCluster controller pre-adds
    /// (docs/day2.md, "Learner joins"): the controller asked for it on this config
    /// ([`LEARNER_JOIN_ANNOTATION`](crate::names::LEARNER_JOIN_ANNOTATION) `"true"`), and the
    /// user data runs upstream etcdadm from cloud-config, whose join reuses a pre-added member.
    /// The eks-anywhere build keeps its voter join. The bootstrap provider renders the learner
    /// join, and the controller pre-adds a learner, exactly for joining configs where this holds.
    pub fn joins_as_learner(&self) -> bool {
        let requested = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::names::LEARNER_JOIN_ANNOTATION))
            .is_some_and(|value| value == "true");
        requested && self.spec.learner_joins()
    }

    /// How long a learner join waits for its member to be listed: the seconds the
    /// EtcdadmCluster controller wrote ([`LEARNER_LISTED_WAIT_ANNOTATION`](crate::names::LEARNER_LISTED_WAIT_ANNOTATION)),
    /// never less than [`DEFAULT_LEARNER_LISTED_WAIT`] nor more than
    /// [`MAX_LEARNER_LISTED_WAIT`]; the default when it wrote none (or nothing readable).
    pub fn learner_listed_wait(&self) -> Duration {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::names::LEARNER_LISTED_WAIT_ANNOTATION))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
            .map_or(DEFAULT_LEARNER_LISTED_WAIT, |wait| {
                wait.clamp(DEFAULT_LEARNER_LISTED_WAIT, MAX_LEARNER_LISTED_WAIT)
            })
    }
}

/// Output format of the bootstrap data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Format {
    /// cloud-init cloud-config user data.
    #[default]
    #[serde(rename = "cloud-config")]
    CloudConfig,
    /// Bottlerocket TOML user data.
    #[serde(rename = "bottlerocket")]
    Bottlerocket,
}

impl Format {
    /// The wire name, also written under the data Secret's `format` key.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::CloudConfig => "cloud-config",
            Format::Bottlerocket => "bottlerocket",
        }
    }
}

/// Which etcdadm build the rendered commands must work with. With `upstream` and cloud-config a
/// member joins as a learner the EtcdadmCluster controller adds, one at a time, so its Machines
/// boot ahead of their turn; `eks-anywhere` joins as a voter by itself, so its Machines are
/// created one at a time, each once the previous member is healthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum EtcdadmFlavor {
    /// kubernetes-sigs/etcdadm: one join URL, no `--cipher-suites` flag.
    #[default]
    #[serde(rename = "upstream")]
    Upstream,
    /// EKS Anywhere's build: `--cipher-suites` and a comma list of join URLs.
    #[serde(rename = "eks-anywhere")]
    EksAnywhere,
}

/// etcdadm options for cloud-config machines.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitConfig {
    /// etcd version for etcdadm `--version` (semver without a leading `v`; at most 64 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"),
        length(max = 64)
    )]
    pub version: Option<String>,

    /// Where etcdadm downloads etcd from (`--release-url`; at most 2048 characters).
    #[serde(rename = "etcdReleaseURL", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub etcd_release_url: Option<String>,

    /// Where etcdadm installs the etcd binaries (`--install-dir`; at most 4096 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub install_dir: Option<String>,
}

/// Proxy settings for containerd.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfiguration {
    /// HTTP proxy URL.
    #[serde(rename = "httpProxy", default, skip_serializing_if = "Option::is_none")]
    pub http_proxy: Option<String>,
    /// HTTPS proxy URL.
    #[serde(rename = "httpsProxy", default, skip_serializing_if = "Option::is_none")]
    pub https_proxy: Option<String>,
    /// Hosts and CIDRs that bypass the proxy; at most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub no_proxy: Vec<String>,
}

/// Registry mirror settings for containerd. With format bottlerocket, the Secret
/// `registry-credentials` in the config's namespace (keys `username`, `password`), when it
/// exists, logs in to the mirror.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.endpoint) && self.endpoint != ''").message("endpoint is required when registryMirror is set (host[:port][/path], no scheme)").field_path(".endpoint").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!(has(self.insecureSkipVerify) && self.insecureSkipVerify && has(self.caCert) && self.caCert != '')").message("insecureSkipVerify skips the certificate check that caCert is for: remove one of them").field_path(".insecureSkipVerify").reason(Reason::FieldValueForbidden))]
pub struct RegistryMirrorConfiguration {
    /// Mirror endpoint (host[:port][/path]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("!self.contains('://') && self.matches('^[]A-Za-z0-9._:/[-]*$')").message("endpoint must be host[:port][/path]: no scheme (https is implied), only letters, digits and . - _ : / [ ]").reason(Reason::FieldValueInvalid))]
    pub endpoint: Option<String>,
    /// PEM CA certificate of the mirror. Without it (and without `insecureSkipVerify`),
    /// containerd checks the mirror's certificate against the machine's trusted CAs.
    #[serde(rename = "caCert", default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
    /// Pull from the mirror without checking its certificate (containerd's
    /// `insecure_skip_verify`): whoever can intercept the traffic can serve any image. An
    /// explicit opt-in, refused with `caCert` and on Bottlerocket. Default false.
    #[serde(
        rename = "insecureSkipVerify",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub insecure_skip_verify: Option<bool>,
}

/// NTP settings (CAPI kubeadm `NTP`).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ntp {
    /// NTP servers; at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub servers: Vec<String>,
    /// Whether NTP is enabled; `false` is rendered as false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// An extra trusted CA bundle.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertBundle {
    /// Bundle name (file name under /usr/local/share/ca-certificates; at most 253 characters).
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9._-]+$')").message("name must be a plain file name"))]
    pub name: String,
    /// PEM certificates.
    pub data: String,
}

/// Observed state of an EtcdadmConfig: the two CAPI bootstrap contracts at once.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmConfigStatus {
    /// v1beta1 contract: the data Secret exists.
    #[serde(default)]
    pub ready: bool,
    /// v1beta2 contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<BootstrapInitialization>,
    /// Name of the Secret holding the user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    /// Generation the status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `DataSecretAvailable`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// CAPI v1beta2 bootstrap contract: `status.initialization`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapInitialization {
    /// The bootstrap data Secret has been created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_created: Option<bool>,
}

/// A template of EtcdadmConfigs (the CAPI v1beta2 contract requires a Template kind).
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "EtcdadmConfigTemplate",
    namespaced,
    derive = "Default",
    derive = "PartialEq",
    doc = "EtcdadmConfigTemplate holds an EtcdadmConfigSpec that CAPI copies into each Machine's EtcdadmConfig.",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    label("cluster.x-k8s.io/v1beta2", "v1beta1"),
    label("cluster.x-k8s.io/provider", "bootstrap-etcdadm"),
    category = "cluster-api",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmConfigTemplateSpec {
    /// The template.
    pub template: EtcdadmConfigTemplateResource,
}

/// The object a template stamps out.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdadmConfigTemplateResource {
    /// Labels and annotations for the stamped-out configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMetaTemplate>,
    /// The config spec.
    #[serde(default)]
    pub spec: EtcdadmConfigSpec,
}

/// Labels and annotations carried by templates.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaTemplate {
    /// Labels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(annotation: Option<&str>, spec: EtcdadmConfigSpec) -> EtcdadmConfig {
        let mut config = EtcdadmConfig::new("m1", spec);
        config.metadata.annotations = annotation.map(|value| {
            [(
                crate::names::LEARNER_JOIN_ANNOTATION.to_string(),
                value.to_string(),
            )]
            .into()
        });
        config
    }

    #[test]
    fn only_a_requested_upstream_cloud_config_join_is_a_learner_join() {
        assert!(config(Some("true"), EtcdadmConfigSpec::default()).joins_as_learner());
        for value in [None, Some("false"), Some("True"), Some("")] {
            assert!(
                !config(value, EtcdadmConfigSpec::default()).joins_as_learner(),
                "{value:?}"
            );
        }
        let eks_anywhere = EtcdadmConfigSpec {
            etcdadm_flavor: Some(EtcdadmFlavor::EksAnywhere),
            ..Default::default()
        };
        assert!(!config(Some("true"), eks_anywhere).joins_as_learner());
        let bottlerocket = EtcdadmConfigSpec {
            format: Some(Format::Bottlerocket),
            ..Default::default()
        };
        assert!(!config(Some("true"), bottlerocket).joins_as_learner());
    }

    #[test]
    fn the_listed_wait_is_the_controllers_within_bounds_else_the_default() {
        let with = |value: Option<&str>| {
            let mut config = config(Some("true"), EtcdadmConfigSpec::default());
            if let (Some(value), Some(annotations)) = (value, config.metadata.annotations.as_mut()) {
                annotations.insert(
                    crate::names::LEARNER_LISTED_WAIT_ANNOTATION.to_string(),
                    value.to_string(),
                );
            }
            config.learner_listed_wait()
        };
        assert_eq!(with(None), DEFAULT_LEARNER_LISTED_WAIT);
        assert_eq!(with(Some("2400")), Duration::from_secs(2400));
        assert_eq!(with(Some(" 2400 ")), Duration::from_secs(2400));
        for short_or_unreadable in ["0", "60", "-5", "20m", ""] {
            assert_eq!(
                with(Some(short_or_unreadable)),
                DEFAULT_LEARNER_LISTED_WAIT,
                "{short_or_unreadable:?}"
            );
        }
        assert_eq!(with(Some("99999999999")), MAX_LEARNER_LISTED_WAIT);
    }
}
