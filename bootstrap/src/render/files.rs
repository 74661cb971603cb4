//! Everything the machine gets in `write_files`, in one shape, so path clashes are caught before
//! one file silently overwrites another (a user file must never replace the etcd CA).

use std::collections::BTreeMap;

use etcdadm_shared::api::config::{Encoding, EtcdadmConfigSpec};
use etcdadm_shared::validation::quoted;

use super::error::RenderError;
use super::input::CaFiles;
use super::secrets::ResolvedSecrets;

/// Where upstream etcdadm looks for the CA it signs member certificates with (`--certs-dir`).
pub const ETCDADM_CERTS_DIR: &str = "/etc/etcd/pki";
/// Writing a file here creates /run/cluster-api, where the success sentinel goes.
pub const PLACEHOLDER_PATH: &str = "/run/cluster-api/placeholder";
/// Directory `update-ca-certificates` reads extra trust anchors from.
pub const CERT_BUNDLE_DIR: &str = "/usr/local/share/ca-certificates";

/// One `write_files` entry with its values not yet quoted.
#[derive(Debug, Clone, PartialEq)]
pub struct FileEntry {
    pub path: String,
    pub owner: Option<String>,
    pub permissions: Option<String>,
    pub encoding: Option<Encoding>,
    pub append: Option<bool>,
    pub content: String,
    /// The spec field this entry comes from; `None` for files the provider itself writes.
    pub source_field: Option<String>,
}

impl FileEntry {
    /// A root-owned file the provider writes.
    pub fn generated(path: &str, permissions: &str, content: String) -> Self {
        FileEntry {
            path: path.to_string(),
            owner: Some("root:root".into()),
            permissions: Some(permissions.into()),
            encoding: None,
            append: None,
            content,
            source_field: None,
        }
    }
}

/// The CA pair etcdadm needs, as `ca.crt` and `ca.key` in `certs_dir`; the key is readable by
/// root only.
pub fn ca_files(ca: &CaFiles, certs_dir: &str) -> Result<Vec<FileEntry>, RenderError> {
    if ca.cert_pem.trim().is_empty() || ca.key_pem.trim().is_empty() {
        // An empty CA would make etcdadm mint its own: a member no other member trusts.
        return Err(RenderError::invalid(
            "etcd CA",
            "certificate or key is empty: the CA Secret must hold tls.crt and tls.key",
        ));
    }
    Ok(vec![
        FileEntry::generated(&format!("{certs_dir}/ca.crt"), "0640", ca.cert_pem.to_string()),
        FileEntry::generated(&format!("{certs_dir}/ca.key"), "0600", ca.key_pem.to_string()),
    ])
}

/// `spec.files`, with `contentFrom` replaced by the resolved Secret value.
pub fn user_files(
    spec: &EtcdadmConfigSpec,
    secrets: &ResolvedSecrets,
) -> Result<Vec<FileEntry>, RenderError> {
    let mut entries = Vec::with_capacity(spec.files.len());
    for (i, file) in spec.files.iter().enumerate() {
        let field = format!("spec.files[{i}]");
        if !file.path.starts_with('/') {
            return Err(RenderError::invalid(
                format!("{field}.path"),
                format!("{} is not an absolute path", quoted(&file.path)),
            ));
        }
        let content = match (&file.content, &file.content_from) {
            (Some(_), Some(_)) => return Err(both_content_sources(i)),
            (Some(content), None) => content.clone(),
            (None, Some(from)) => secrets.file_contents.get(&file.path).cloned().ok_or_else(|| {
                RenderError::UnresolvedSecret {
                    field_path: format!("{field}.contentFrom"),
                    secret_name: from.secret.name.clone(),
                    key: from.secret.key.clone(),
                }
            })?,
            (None, None) => String::new(),
        };
        entries.push(FileEntry {
            path: file.path.clone(),
            owner: file.owner.clone(),
            permissions: file.permissions.clone(),
            encoding: file.encoding,
            append: file.append,
            content,
            source_field: Some(field),
        });
    }
    Ok(entries)
}

/// Files with both `content` and `contentFrom` are ambiguous: reported before anything else about
/// them (such as the Secret value not being resolved).
pub fn check_content_sources(spec: &EtcdadmConfigSpec) -> Result<(), RenderError> {
    match spec
        .files
        .iter()
        .position(|f| f.content.is_some() && f.content_from.is_some())
    {
        Some(i) => Err(both_content_sources(i)),
        None => Ok(()),
    }
}

fn both_content_sources(index: usize) -> RenderError {
    RenderError::invalid(
        format!("spec.files[{index}]"),
        "content and contentFrom are mutually exclusive: keep one",
    )
}

/// `spec.certBundles` as trust anchors for `update-ca-certificates`.
pub fn cert_bundle_files(spec: &EtcdadmConfigSpec) -> Result<Vec<FileEntry>, RenderError> {
    let mut entries = Vec::with_capacity(spec.cert_bundles.len());
    for (i, bundle) in spec.cert_bundles.iter().enumerate() {
        let plain_name = !bundle.name.is_empty()
            && bundle.name != "."
            && bundle.name != ".."
            && bundle
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !plain_name {
            return Err(RenderError::invalid(
                format!("spec.certBundles[{i}].name"),
                format!(
                    "{} is not a plain file name (letters, digits, '.', '_', '-')",
                    quoted(&bundle.name)
                ),
            ));
        }
        let mut entry = FileEntry::generated(
            &format!("{CERT_BUNDLE_DIR}/{}.crt", bundle.name),
            "0644",
            bundle.data.clone(),
        );
        entry.source_field = Some(format!("spec.certBundles[{i}]"));
        entries.push(entry);
    }
    Ok(entries)
}

/// Creates /run/cluster-api without a command, which also works where `mkdir -p` does not.
pub fn placeholder_file() -> FileEntry {
    FileEntry::generated(
        PLACEHOLDER_PATH,
        "0640",
        "Exists so that /run/cluster-api exists for the bootstrap success sentinel.".into(),
    )
}

/// Each path at most once: cloud-init would write the later entry over the earlier one.
pub fn check_unique_paths(entries: &[FileEntry]) -> Result<(), RenderError> {
    let mut seen: BTreeMap<&str, &FileEntry> = BTreeMap::new();
    for entry in entries {
        if let Some(earlier) = seen.insert(&entry.path, entry) {
            let path = &entry.path;
            let ours = format!("path {path} is written by the bootstrap provider itself: choose another");
            return Err(match (&entry.source_field, &earlier.source_field) {
                (Some(later), Some(earlier)) => {
                    RenderError::invalid(later, format!("path {path} is also written by {earlier}"))
                }
                (Some(field), None) | (None, Some(field)) => RenderError::invalid(field, ours),
                (None, None) => RenderError::invalid("spec", ours),
            });
        }
    }
    Ok(())
}
