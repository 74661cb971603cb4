//! `spec.users` and `spec.files`: the users created and the files written on the machine, with
//! their contents inline or from a Secret.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A user to create (CAPI kubeadm v1beta1 `User`).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// User name: lower-case letters, digits, `_` and `-`, starting with a letter or `_`
    /// (a trailing `$` allowed), at most 32 characters.
    #[schemars(length(max = 32), regex(pattern = r"^[a-z_][a-z0-9_-]*[$]?$"))]
    pub name: String,
    /// GECOS field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gecos: Option<String>,
    /// Comma-separated additional groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,
    /// Home directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_dir: Option<String>,
    /// Create the user inactive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive: Option<bool>,
    /// Login shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Hashed password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passwd: Option<String>,
    /// Hashed password read from a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passwd_from: Option<PasswdSource>,
    /// Primary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_group: Option<String>,
    /// Lock the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_password: Option<bool>,
    /// sudo rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sudo: Option<String>,
    /// Authorized SSH public keys; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ssh_authorized_keys: Vec<String>,
}

/// Where a user's password comes from.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PasswdSource {
    /// The Secret key holding the hashed password.
    pub secret: SecretKeyRef,
}

/// A key of a Secret in the config's namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key within the Secret.
    pub key: String,
}

/// A file to write (CAPI kubeadm v1beta1 `File`).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.content) && has(self.contentFrom))").message("content and contentFrom are mutually exclusive"))]
pub struct File {
    /// Absolute path on the machine (at most 4096 characters, PATH_MAX).
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("path must be absolute"))]
    pub path: String,
    /// `user:group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Octal permissions, e.g. `0640`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Encoding of `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Append instead of replacing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append: Option<bool>,
    /// Inline content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Content read from a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_from: Option<FileSource>,
}

/// Where a file's content comes from.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileSource {
    /// The Secret key holding the content.
    pub secret: SecretKeyRef,
}

/// Encoding of a file's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Encoding {
    #[serde(rename = "base64")]
    Base64,
    #[serde(rename = "gzip")]
    Gzip,
    #[serde(rename = "gzip+base64")]
    GzipBase64,
}

impl Encoding {
    /// The wire name, which is also cloud-init's.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Base64 => "base64",
            Encoding::Gzip => "gzip",
            Encoding::GzipBase64 => "gzip+base64",
        }
    }
}
