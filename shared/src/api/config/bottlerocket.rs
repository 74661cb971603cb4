//! `spec.bottlerocketConfig`: the images of etcd and of the host containers that run etcdadm,
//! extra containers, kernel and boot settings.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Bottlerocket settings: the images of etcd and of the host containers that run etcdadm, extra
/// containers, kernel and boot settings.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketConfig {
    /// etcd image used by etcdadm, `<repository>:<tag>`: the tag (a leading v dropped) is the etcd
    /// version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_image: Option<String>,
    /// Image of the kubeadm-bootstrap host container that runs etcdadm.
    #[serde(default)]
    pub bootstrap_image: String,
    /// Admin host container image (empty: Bottlerocket's default).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub admin_image: String,
    /// Control host container image (empty: no control container).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub control_image: String,
    /// Pause container image (`settings.kubernetes.pod-infra-container-image`).
    #[serde(default)]
    pub pause_image: String,
    /// Additional host containers, unique by name; at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub custom_host_containers: Vec<BottlerocketHostContainer>,
    /// Additional bootstrap containers, unique by name; at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub custom_bootstrap_containers: Vec<BottlerocketBootstrapContainer>,
    /// Kernel settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<BottlerocketKernelSettings>,
    /// Boot settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BottlerocketBootSettings>,
}

/// A Bottlerocket host container.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketHostContainer {
    /// Container name.
    pub name: String,
    /// Whether the container is superpowered.
    pub superpowered: bool,
    /// Image location.
    pub image: String,
    /// Base64 user data passed to the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
}

/// A Bottlerocket bootstrap container.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketBootstrapContainer {
    /// Container name.
    pub name: String,
    /// Image location.
    pub image: String,
    /// Whether a non-zero exit stops the boot.
    #[serde(default)]
    pub essential: bool,
    /// `always`, `off` or `once`.
    #[schemars(extend("enum" = ["always", "off", "once"]))]
    pub mode: String,
    /// Base64 user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
}

/// Bottlerocket kernel settings.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketKernelSettings {
    /// sysctl keys and values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sysctl_settings: std::collections::BTreeMap<String, String>,
}

/// Bottlerocket boot settings.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketBootSettings {
    /// Kernel parameters and their values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub boot_kernel_parameters: std::collections::BTreeMap<String, Vec<String>>,
}
