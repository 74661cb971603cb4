//! "Installing" etcd: instead of downloading a release, the stand-in maps the requested
//! major.minor to a local etcd (`SIM_ETCD_RELEASES=3.4=/usr/bin,3.5=/opt/etcd-3.5.1`, else the
//! etcd on the host if its version matches) and links it into `--install-dir`. A version with
//! no local etcd fails the way an unreachable download does.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable mapping major.minor to a directory holding `etcd`.
pub const RELEASES_ENV: &str = "SIM_ETCD_RELEASES";

/// `3.5.9` / `v3.5.9` → `3.5`.
pub fn major_minor(version: &str) -> Option<String> {
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some(format!("{major}.{minor}"))
}

/// Parse `3.4=/usr/bin,3.5=/opt/etcd-3.5.1`.
pub fn parse_release_map(text: &str) -> Result<Vec<(String, PathBuf)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (version, dir) = entry
                .split_once('=')
                .ok_or_else(|| format!("{RELEASES_ENV} entry {entry:?} is not `<major.minor>=<dir>`"))?;
            let version = major_minor(&format!("{}.0", version.trim()))
                .filter(|mm| mm == version.trim().trim_start_matches('v'))
                .ok_or_else(|| format!("{RELEASES_ENV} entry {entry:?}: {version:?} is not major.minor"))?;
            Ok((version, PathBuf::from(dir.trim())))
        })
        .collect()
}

/// The version `etcd --version` reports (`etcd Version: 3.4.23`).
pub fn parse_version_output(output: &str) -> Option<String> {
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
}

fn binary_version(binary: &Path) -> Option<String> {
    let output = Command::new(binary).arg("--version").output().ok()?;
    parse_version_output(&String::from_utf8_lossy(&output.stdout))
}

/// The host's etcd: `$ETCD_BIN`, else `etcd` on PATH, else `/usr/bin/etcd`.
pub fn host_etcd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(path);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .chain(std::iter::once(PathBuf::from("/usr/bin/etcd")))
        .find(|candidate| candidate.is_file())
}

/// A release chosen for a requested version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub etcd: PathBuf,
    pub etcdctl: Option<PathBuf>,
}

/// Pick the local etcd for `requested` (`None`: whatever the host has).
pub fn resolve(requested: Option<&str>, release_url: &str) -> Result<Release, String> {
    let unavailable = |version: &str, why: String| {
        format!(
            "unable to fetch artifact from upstream: etcd v{version} from {release_url}: {why}; \
             the sim installs etcd from local directories: set {RELEASES_ENV}=<major.minor>=<dir with etcd>"
        )
    };
    let map = match std::env::var(RELEASES_ENV) {
        Ok(text) => parse_release_map(&text)?,
        Err(_) => Vec::new(),
    };
    let with_etcdctl = |etcd: PathBuf, version: String| {
        let etcdctl = etcd.parent().map(|d| d.join("etcdctl")).filter(|p| p.is_file());
        Release {
            version,
            etcd,
            etcdctl,
        }
    };
    let host = host_etcd().and_then(|path| binary_version(&path).map(|version| (path, version)));
    let Some(requested) = requested else {
        let (path, version) = host.ok_or_else(|| unavailable("(default)", "no etcd on this host".into()))?;
        return Ok(with_etcdctl(path, version));
    };
    let wanted = major_minor(requested).ok_or_else(|| format!("invalid etcd version {requested:?}"))?;
    if let Some((_, dir)) = map.iter().find(|(mm, _)| *mm == wanted) {
        let etcd = dir.join("etcd");
        if !etcd.is_file() {
            return Err(unavailable(
                requested,
                format!("{} does not exist", etcd.display()),
            ));
        }
        return Ok(with_etcdctl(etcd, requested.to_string()));
    }
    match host {
        Some((path, version)) if major_minor(&version).as_deref() == Some(wanted.as_str()) => {
            Ok(with_etcdctl(path, requested.to_string()))
        }
        Some((path, version)) => Err(unavailable(
            requested,
            format!("only etcd {version} ({}) is available locally", path.display()),
        )),
        None => Err(unavailable(requested, "no etcd on this host".into())),
    }
}

/// Link the release's binaries into `install_dir`; returns the installed etcd path.
pub fn install(release: &Release, install_dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(install_dir).map_err(|e| format!("{}: {e}", install_dir.display()))?;
    let mut installed = None;
    for (name, source) in [
        ("etcd", Some(&release.etcd)),
        ("etcdctl", release.etcdctl.as_ref()),
    ] {
        let Some(source) = source else { continue };
        let target = install_dir.join(name);
        let _ = std::fs::remove_file(&target);
        std::os::unix::fs::symlink(source, &target)
            .map_err(|e| format!("linking {}: {e}", target.display()))?;
        if name == "etcd" {
            installed = Some(target);
        }
    }
    installed.ok_or_else(|| "no etcd binary".to_string())
}

/// Remove what [`install`] put in `install_dir`.
pub fn uninstall(install_dir: &Path) {
    for name in ["etcd", "etcdctl"] {
        let _ = std::fs::remove_file(install_dir.join(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_reduce_to_major_minor() {
        assert_eq!(major_minor("3.5.9").as_deref(), Some("3.5"));
        assert_eq!(major_minor("v3.4.23").as_deref(), Some("3.4"));
        assert_eq!(major_minor("3").as_deref(), None);
        assert_eq!(major_minor("x.y").as_deref(), None);
    }

    #[test]
    fn release_maps_parse() {
        assert_eq!(
            parse_release_map("3.4=/usr/bin, 3.5=/opt/etcd-3.5.1").unwrap(),
            vec![
                ("3.4".into(), "/usr/bin".into()),
                ("3.5".into(), "/opt/etcd-3.5.1".into())
            ]
        );
        assert!(parse_release_map("3.4").is_err());
        assert!(parse_release_map("3.4.1=/x").is_err());
    }

    #[test]
    fn version_output_parses() {
        let text = "etcd Version: 3.4.23\nGit SHA: Not provided\nGo Version: go1.19.8\n";
        assert_eq!(parse_version_output(text).as_deref(), Some("3.4.23"));
        assert_eq!(parse_version_output("nope"), None);
    }
}
