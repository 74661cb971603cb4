//! Giving each machine its own `/etc`, `/var`, `/run`, ... on a shared host.
//!
//! All machines share the host's network namespace and filesystem. The runner re-executes
//! itself under `unshare --mount --uts --propagation private` and mounts an overlay over each
//! directory in [`ISOLATED_DIRS`]: the host's directory is the read-only lower layer and
//! `<root>/<dir>` the upper layer, so `echo x > /etc/hosts` inside the machine lands in
//! `<root>/etc/hosts` and the host's file is untouched. Directories outside that list (`/tmp`,
//! `/usr` except `/usr/local`, `/work`, ...) are shared with the host: the machine root itself
//! lives there, and overlay refuses an upper layer inside its own lower layer.
//! A machine with its own network (real etcdadm) also gets a private `/tmp`, `<root>/tmp` bound
//! over it; its runner's records (`<root>/sim`) stay reachable at [`RECORDS_VIEW`].
//! A mount that fails is fatal: the machine never falls back to writing host files.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::MachineError;

/// Directories each machine gets its own copy of (those that exist on the host).
pub const ISOLATED_DIRS: [&str; 8] = [
    "/etc",
    "/var",
    "/run",
    "/usr/local",
    "/opt",
    "/root",
    "/home",
    "/srv",
];

/// Where a machine with a private `/tmp` sees its runner's records (`<root>/sim` on the host),
/// which the bind of `<root>/tmp` over `/tmp` hides from their usual path.
pub const RECORDS_VIEW: &str = "/run/sim-machine";

/// One overlay to mount: `target` seen through `upper` (writes) over the host's `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayMount {
    pub target: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl OverlayMount {
    /// The `-o` argument of `mount -t overlay`.
    pub fn options(&self) -> String {
        format!(
            "lowerdir={},upperdir={},workdir={}",
            self.target.display(),
            self.upper.display(),
            self.work.display()
        )
    }
}

/// Whether `path` (absolute, machine view) lies in a directory the machine owns privately.
pub fn is_isolated(path: &Path) -> bool {
    ISOLATED_DIRS.iter().any(|dir| path.starts_with(dir))
}

/// Check that `root` can back overlays: absolute, outside every isolated directory (overlay
/// refuses an upper layer inside its lower layer, and the host must see the files), and free of
/// characters that the overlay option syntax gives meaning to.
pub fn check_root(root: &Path) -> Result<(), MachineError> {
    let text = root.to_string_lossy();
    let problem = if !root.is_absolute() {
        Some("must be an absolute path".to_string())
    } else if let Some(dir) = ISOLATED_DIRS.iter().find(|dir| root.starts_with(dir)) {
        Some(format!(
            "must not be under {dir}, which each machine overlays (use e.g. /tmp)"
        ))
    } else if text.contains([',', ':', '\\', ' ', '\n', '\t']) {
        Some("must not contain commas, colons, backslashes or whitespace (overlay mount options)".into())
    } else {
        None
    };
    match problem {
        Some(reason) => Err(MachineError::Usage(format!("machine root {text:?} {reason}"))),
        None => Ok(()),
    }
}

/// The overlays for a machine rooted at `root`, for those isolated directories `exists` says
/// are present on the host (a missing mount point cannot be created without touching the host).
pub fn plan_overlays(root: &Path, exists: impl Fn(&Path) -> bool) -> Vec<OverlayMount> {
    ISOLATED_DIRS
        .iter()
        .map(Path::new)
        .filter(|dir| exists(dir))
        .map(|dir| {
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            OverlayMount {
                target: dir.to_path_buf(),
                upper: root.join(relative),
                work: root.join("sim/overlay-work").join(relative),
            }
        })
        .collect()
}

/// `/etc/hosts` of a machine: its own name on its own address.
pub fn hosts_file(name: &str, ip: IpAddr) -> String {
    format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{name}\n")
}

/// Mount the overlays (and, with `private_tmp`, bind `<root>/tmp` over `/tmp`) and set the
/// hostname. Must run inside the private mount and UTS namespaces: done on the host it would
/// shadow the host's directories. Returns where the runner's records (`<root>/sim`) are seen.
pub fn enter_machine_view(
    root: &Path,
    name: &str,
    ip: IpAddr,
    private_tmp: bool,
) -> Result<PathBuf, MachineError> {
    let fail = |reason: String| MachineError::Isolation {
        machine: name.to_string(),
        reason,
    };
    check_root(root)?;
    for overlay in plan_overlays(root, Path::is_dir) {
        for dir in [&overlay.upper, &overlay.work] {
            std::fs::create_dir_all(dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
        }
        let options = overlay.options();
        mount(&["-t", "overlay", "overlay", "-o", &options], &overlay.target).map_err(&fail)?;
    }
    // The overlays are only private if they did not propagate: the host must not see them.
    std::fs::write("/proc/sys/kernel/hostname", name)
        .map_err(|e| fail(format!("setting the hostname in the private UTS namespace: {e}")))?;
    std::fs::write("/etc/hostname", format!("{name}\n"))
        .map_err(|e| fail(format!("writing /etc/hostname: {e}")))?;
    std::fs::write("/etc/hosts", hosts_file(name, ip))
        .map_err(|e| fail(format!("writing /etc/hosts: {e}")))?;
    let records = root.join("sim");
    if !private_tmp {
        return Ok(records);
    }
    let view = Path::new(RECORDS_VIEW);
    let tmp = root.join("tmp");
    for dir in [view, tmp.as_path()] {
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| fail(format!("{}: {e}", tmp.display())))?;
    let records = records.display().to_string();
    mount(&["--bind", &records], view).map_err(&fail)?;
    let tmp = tmp.display().to_string();
    mount(&["--bind", &tmp], Path::new("/tmp")).map_err(&fail)?;
    Ok(view.to_path_buf())
}

/// `mount <args> <target>`; the error says what failed.
fn mount(args: &[&str], target: &Path) -> Result<(), String> {
    let output = Command::new("mount")
        .args(args)
        .arg(target)
        .output()
        .map_err(|e| format!("running `mount`: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`mount {} {}`: {} {}",
            args.join(" "),
            target.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_one_overlay_per_existing_isolated_dir() {
        let plan = plan_overlays(Path::new("/tmp/m1"), |dir| dir != Path::new("/srv"));
        assert_eq!(plan.len(), ISOLATED_DIRS.len() - 1);
        let etc = &plan[0];
        assert_eq!(etc.target, Path::new("/etc"));
        assert_eq!(etc.upper, Path::new("/tmp/m1/etc"));
        assert_eq!(etc.work, Path::new("/tmp/m1/sim/overlay-work/etc"));
        assert_eq!(
            etc.options(),
            "lowerdir=/etc,upperdir=/tmp/m1/etc,workdir=/tmp/m1/sim/overlay-work/etc"
        );
        assert!(plan.iter().any(|m| m.upper == Path::new("/tmp/m1/usr/local")));
    }

    #[test]
    fn roots_that_cannot_back_overlays_are_refused() {
        assert!(check_root(Path::new("/tmp/sim/m1")).is_ok());
        for bad in [
            "relative/m1",
            "/var/tmp/m1",
            "/etc/m1",
            "/tmp/a,b",
            "/tmp/a:b",
            "/tmp/a b",
        ] {
            assert!(check_root(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn isolation_covers_what_etcdadm_writes() {
        for path in [
            "/etc/etcd/etcd.env",
            "/var/lib/etcd",
            "/run/cluster-api/x",
            "/usr/local/bin/etcdadm",
            "/opt/bin/etcd",
        ] {
            assert!(is_isolated(Path::new(path)), "{path}");
        }
        assert!(!is_isolated(Path::new("/tmp/pre")));
        assert!(!is_isolated(Path::new("/usr/bin/etcd")));
    }

    #[test]
    fn hosts_file_names_the_machine() {
        let hosts = hosts_file("m1", "127.0.1.7".parse().unwrap());
        assert!(hosts.contains("127.0.1.7\tm1\n"));
        assert!(hosts.starts_with("127.0.0.1\tlocalhost\n"));
    }
}
