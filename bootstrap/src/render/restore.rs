//! The first member of a cluster created from a snapshot: the user data downloads it through a
//! short-lived URL kept in a root-only curl config file (never on a command line, in runcmd or
//! in a log), over https unless the store is `insecure: true`, checks its SHA-256 (always: a
//! restore without one is not rendered), raises its revision where the machine's etcdutl can
//! (`restore-bump.sh`), and hands it to `etcdadm init --snapshot`.

use etcdadm_shared::names;
use etcdadm_shared::store::limits::{MAX_OBJECT_SIZE, object_deadline};

use super::error::RenderError;
use super::files::FileEntry;
use super::input::SnapshotDownload;

/// curl reads the URL (and the store's CA file) from here: root-only, removed after the restore.
pub const RESTORE_CURL_CONFIG: &str = "/run/cluster-api/etcd-restore.curlrc";
/// The store's CA bundle, when the restore Secret has one.
pub const RESTORE_CA_FILE: &str = "/run/cluster-api/etcd-restore-ca.crt";
/// Where the snapshot is downloaded to (outside etcd's data dir, which `etcdadm init` empties).
pub const RESTORE_SNAPSHOT_FILE: &str = "/var/lib/etcd-restore/snapshot.db";
/// The helper that raises the restored revision before etcdadm restores:
/// `templates/cloud-init/restore-bump.sh`.
pub const RESTORE_BUMP_SCRIPT: &str = "/run/cluster-api/etcd-restore-bump.sh";
pub const RESTORE_BUMP_SCRIPT_CONTENT: &str = include_str!("../../../templates/cloud-init/restore-bump.sh");
/// etcdadm's default `--install-dir`, where the helper also looks for etcdutl.
const ETCDADM_INSTALL_DIR: &str = "/opt/bin/";

fn field() -> String {
    format!("metadata.annotations[{}]", names::RESTORE_SECRET_ANNOTATION)
}

/// The files the download needs: curl's config (URL, CA) and the CA bundle.
pub fn files(download: &SnapshotDownload) -> Result<Vec<FileEntry>, RenderError> {
    let url = download.url.trim();
    // curl's config syntax quotes with `"` and `\`; the user data is a Jinja template. A
    // presigned URL has none of these characters, so one that does is not what we made.
    let unsafe_char = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\\' | '{' | '}');
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.chars().any(unsafe_char) {
        return Err(RenderError::invalid(
            field(),
            format!(
                "the restore Secret's {} is not a plain http(s) URL",
                names::RESTORE_URL_KEY
            ),
        ));
    }
    if url.starts_with("http://") && !download.insecure {
        return Err(RenderError::invalid(
            field(),
            format!(
                "the restore Secret's {} is plain http and its store is not insecure: true: the \
                 snapshot (every Secret of the cluster) is not downloaded in clear",
                names::RESTORE_URL_KEY
            ),
        ));
    }
    let mut config = format!("url = \"{url}\"\noutput = \"{RESTORE_SNAPSHOT_FILE}\"\n");
    let mut files = Vec::with_capacity(2);
    if let Some(ca_pem) = download.ca_pem.as_deref().filter(|pem| !pem.trim().is_empty()) {
        if ["{{", "{%", "{#"].iter().any(|opener| ca_pem.contains(opener)) {
            return Err(RenderError::invalid(
                field(),
                format!(
                    "the restore Secret's {} is not a PEM bundle",
                    names::RESTORE_CA_KEY
                ),
            ));
        }
        config.push_str(&format!("cacert = \"{RESTORE_CA_FILE}\"\n"));
        files.push(FileEntry::generated(RESTORE_CA_FILE, "0644", ca_pem.to_string()));
    }
    files.push(FileEntry::generated(RESTORE_CURL_CONFIG, "0600", config));
    if download.bump_revision.is_some() {
        files.push(FileEntry::generated(
            RESTORE_BUMP_SCRIPT,
            "0755",
            RESTORE_BUMP_SCRIPT_CONTENT.to_string(),
        ));
    }
    Ok(files)
}

/// The `etcdadm init --snapshot` command line, run through the helper that raises the
/// revision first when the restore asks for it (the install directory is where it also looks
/// for etcdutl).
pub fn init_command(download: &SnapshotDownload, etcdadm: &str, install_dir: Option<&str>) -> String {
    match download.bump_revision {
        Some(bump) => format!(
            "sh {RESTORE_BUMP_SCRIPT} {bump} {RESTORE_SNAPSHOT_FILE} {} {etcdadm}",
            super::shell::word(install_dir.unwrap_or(ETCDADM_INSTALL_DIR))
        ),
        None => etcdadm.to_string(),
    }
}

/// What runs before `etcdadm init --snapshot`: the download (retried; curl names no URL in its
/// errors) and the checksum, joined by `&&` to what follows: a file that is not the one
/// expected never reaches etcdadm.
pub fn before_init(download: &SnapshotDownload) -> Result<Vec<String>, RenderError> {
    let Some(sha256) = download
        .sha256
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    else {
        return Err(RenderError::invalid(
            field(),
            format!(
                "the restore Secret has no {}: every restore is checked against one",
                names::RESTORE_SHA256_KEY
            ),
        ));
    };
    if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(RenderError::invalid(
            field(),
            format!(
                "the restore Secret's {} is not a hex SHA-256",
                names::RESTORE_SHA256_KEY
            ),
        ));
    }
    // The most it downloads and how long it may take: the object's size when the controller
    // knows it, else the largest snapshot (32 GiB), at the controller's own slowest rate for
    // reading an object (60 s and 1 s per MiB); retries within the same time.
    let limit = download.size.unwrap_or(MAX_OBJECT_SIZE).min(MAX_OBJECT_SIZE);
    let seconds = object_deadline(limit).as_secs();
    Ok(vec![
        format!(
            "curl -fsS --retry 5 --retry-max-time {seconds} --max-time {seconds} --max-filesize {limit} \
             --create-dirs --config {RESTORE_CURL_CONFIG}"
        ),
        format!(
            "echo '{}  {RESTORE_SNAPSHOT_FILE}' | sha256sum -c --quiet -",
            sha256.to_ascii_lowercase()
        ),
    ])
}

/// What runs once etcd is up on the restored data: the URL and the copy are not kept.
pub fn after_init() -> String {
    format!("rm -f {RESTORE_CURL_CONFIG} {RESTORE_CA_FILE} {RESTORE_SNAPSHOT_FILE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn download(url: &str, sha256: Option<&str>) -> SnapshotDownload {
        SnapshotDownload {
            url: url.into(),
            sha256: sha256.map(str::to_string),
            ca_pem: None,
            bump_revision: None,
            insecure: false,
            size: None,
        }
    }

    const URL: &str = "https://127.0.0.1:8333/b/c1/s.db?X-Amz-Signature=ab12&X-Amz-Expires=1200";
    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_url_goes_to_a_root_only_curl_config_and_nowhere_else() {
        let d = download(URL, Some(SHA));
        let files = files(&d).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, RESTORE_CURL_CONFIG);
        assert_eq!(files[0].permissions.as_deref(), Some("0600"));
        assert!(files[0].content.contains(&format!("url = \"{URL}\"")));
        let steps = before_init(&d).unwrap();
        assert!(steps.iter().all(|s| !s.contains("X-Amz")), "{steps:?}");
        assert!(!after_init().contains("X-Amz"));
        assert!(!format!("{d:?}").contains("X-Amz"), "Debug never shows it");
    }

    #[test]
    fn the_download_is_bounded_by_the_objects_size_or_the_largest_snapshot() {
        let mut d = download(URL, Some(SHA));
        let curl = |d: &SnapshotDownload| before_init(d).unwrap()[0].clone();
        assert!(
            curl(&d).starts_with(
                "curl -fsS --retry 5 --retry-max-time 32828 --max-time 32828 --max-filesize 34359738400 --create-dirs"
            ),
            "{}",
            curl(&d)
        );
        d.size = Some(100 << 20);
        assert!(
            curl(&d).contains("--retry-max-time 160 --max-time 160 --max-filesize 104857600 "),
            "{}",
            curl(&d)
        );
        d.size = Some(u64::MAX);
        assert!(curl(&d).contains("--max-filesize 34359738400 "), "{}", curl(&d));
    }

    #[test]
    fn the_checksum_and_the_ca_are_used_when_given() {
        let sha = "AB".repeat(32);
        let mut d = download(URL, Some(&sha));
        d.ca_pem = Some("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into());
        let steps = before_init(&d).unwrap();
        assert_eq!(
            steps[1],
            format!(
                "echo '{}  /var/lib/etcd-restore/snapshot.db' | sha256sum -c --quiet -",
                "ab".repeat(32)
            )
        );
        let files = files(&d).unwrap();
        assert_eq!(files[0].path, RESTORE_CA_FILE);
        assert!(
            files[1]
                .content
                .contains("cacert = \"/run/cluster-api/etcd-restore-ca.crt\"")
        );
    }

    #[test]
    fn what_is_not_a_plain_url_or_checksum_is_refused_naming_the_annotation() {
        for url in [
            "ftp://x/y",
            "http://x/\"; rm",
            "http://x/{{ y }}",
            "http://x/ y",
            "",
        ] {
            let err = files(&download(url, None)).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("metadata.annotations[etcdcluster.cluster.x-k8s.io/restore-secret]: "),
                "{err}"
            );
        }
        for sha in ["abc", "'; reboot; '", &"g".repeat(64)] {
            assert!(before_init(&download(URL, Some(sha))).is_err(), "{sha}");
        }
    }

    #[test]
    fn a_restore_without_a_sha256_or_over_plain_http_is_not_rendered() {
        for sha in [None, Some(""), Some("  ")] {
            let err = before_init(&download(URL, sha)).unwrap_err();
            assert!(err.to_string().contains("has no sha256"), "{err}");
        }
        let plain = "http://127.0.0.1:8333/b/c1/s.db?X-Amz-Signature=ab12";
        let err = files(&download(plain, Some(SHA))).unwrap_err();
        assert!(err.to_string().contains("is plain http"), "{err}");
        let mut insecure = download(plain, Some(SHA));
        insecure.insecure = true;
        assert!(files(&insecure).is_ok());
    }
}
