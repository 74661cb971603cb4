//! The per-machine runner (`etcdadm-sim-machine`): enters the machine's private namespaces,
//! plays systemd for it, runs its user data (cloud-config, or Bottlerocket settings whose
//! bootstrap container it plays), and stays alive as the machine's "PID 1".
//!
//! The runner reports through files under `<root>/sim/` (outside every overlay, so the host
//! sees them): `status` (`booting`, `running`, `failed: <reason>`), `units/<unit>.pid` and its
//! own log. Everything the machine itself writes lands in the overlays' upper layers, e.g.
//! `<root>/var/log/cloud-init-output.log` or `<root>/var/log/kubeadm-bootstrap.log`.
//!
//! Given `--etcdadm <path>`, the machine runs that (real) etcdadm instead of the stand-ins: its
//! PATH holds only `etcdadm` and the `systemctl` stand-in ahead of the host's tools (`hostname`
//! and `ip` are the real ones, answering from the machine's own UTS and network namespaces, which
//! the runtime provides), and its `/tmp` is private. Each `--image-tool <path>` is a program the
//! machine's image carries (e.g. an etcdutl that can raise a restored revision), linked into the
//! same directory.

use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bootstrap_container::{self, BOOTSTRAP_LOG};
use crate::bottlerocket;
use crate::cloud_config::parse_user_data;
use crate::error::MachineError;
use crate::executor::{CommandEnvironment, OUTPUT_LOG, execute};
use crate::isolation::{check_root, enter_machine_view};
use crate::systemd::protocol::{CONTROL_SOCKET, serve};
use crate::systemd::{ManagerPaths, ServiceManager};

/// The stand-ins linked into `<root>/sim/bin`, first on the machine's PATH.
pub const STANDINS: [&str; 4] = ["etcdadm", "systemctl", "hostname", "ip"];
/// The stand-ins a machine running the real etcdadm still needs: it has no systemd.
pub const REAL_ETCDADM_STANDINS: [&str; 1] = ["systemctl"];

/// What a runner is told about its machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerArgs {
    pub name: String,
    pub ip: IpAddr,
    pub root: PathBuf,
    pub user_data: PathBuf,
    /// The real etcdadm to run instead of the stand-in (the machine then has its own network
    /// namespace, entered by the runtime before the runner starts).
    pub etcdadm: Option<PathBuf>,
    /// Programs the machine's image carries, on its PATH by their file names.
    pub image_tools: Vec<PathBuf>,
}

impl RunnerArgs {
    /// As command-line flags.
    pub fn to_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--name".into(),
            self.name.clone(),
            "--ip".into(),
            self.ip.to_string(),
            "--root".into(),
            self.root.display().to_string(),
            "--user-data".into(),
            self.user_data.display().to_string(),
        ];
        if let Some(etcdadm) = &self.etcdadm {
            flags.extend(["--etcdadm".into(), etcdadm.display().to_string()]);
        }
        for tool in &self.image_tools {
            flags.extend(["--image-tool".into(), tool.display().to_string()]);
        }
        flags
    }

    /// Parse `--name N --ip IP --root DIR --user-data FILE [--etcdadm PATH] [--image-tool PATH]...`.
    pub fn parse(args: &[String]) -> Result<RunnerArgs, MachineError> {
        let mut name = None;
        let mut ip = None;
        let mut root = None;
        let mut user_data = None;
        let mut etcdadm = None;
        let mut image_tools = vec![];
        let mut iter = args.iter();
        while let Some(flag) = iter.next() {
            let value = iter
                .next()
                .ok_or_else(|| MachineError::Usage(format!("{flag} needs a value")))?;
            match flag.as_str() {
                "--name" => name = Some(value.clone()),
                "--ip" => {
                    ip =
                        Some(value.parse().map_err(|_| {
                            MachineError::Usage(format!("--ip {value:?} is not an IP address"))
                        })?);
                }
                "--root" => root = Some(PathBuf::from(value)),
                "--user-data" => user_data = Some(PathBuf::from(value)),
                "--etcdadm" => etcdadm = Some(PathBuf::from(value)),
                "--image-tool" => image_tools.push(PathBuf::from(value)),
                other => return Err(MachineError::Usage(format!("unknown flag {other}"))),
            }
        }
        let missing = |flag: &str| MachineError::Usage(format!("{flag} is required"));
        Ok(RunnerArgs {
            name: name.ok_or_else(|| missing("--name"))?,
            ip: ip.ok_or_else(|| missing("--ip"))?,
            root: root.ok_or_else(|| missing("--root"))?,
            user_data: user_data.ok_or_else(|| missing("--user-data"))?,
            etcdadm,
            image_tools,
        })
    }
}

/// `<root>/sim`: the runner's records, outside every overlay.
pub fn records_dir(root: &Path) -> PathBuf {
    root.join("sim")
}

/// `<root>/sim/status`.
pub fn status_path(root: &Path) -> PathBuf {
    records_dir(root).join("status")
}

/// `<root>/sim/units`: main PIDs of running units.
pub fn pid_dir(root: &Path) -> PathBuf {
    records_dir(root).join("units")
}

/// Record the machine's status for the runtime (atomically: write, then rename) in the records
/// directory `records` (`<root>/sim` as the host sees it).
pub fn write_status(records: &Path, status: &str) -> Result<(), MachineError> {
    let path = records.join("status");
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, status).map_err(MachineError::io(&temporary))?;
    std::fs::rename(&temporary, &path).map_err(MachineError::io(&path))
}

/// Re-execute this binary as `inside` in new private mount and UTS namespaces. Returns only on
/// failure.
pub fn boot(args: &RunnerArgs) -> MachineError {
    if let Err(e) = check_root(&args.root) {
        return e;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return MachineError::io("/proc/self/exe")(e),
    };
    let error = Command::new("unshare")
        .args(["--mount", "--uts", "--propagation", "private", "--"])
        .arg(exe)
        .arg("inside")
        .args(args.to_flags())
        .exec();
    let error = MachineError::Isolation {
        machine: args.name.clone(),
        reason: format!("executing `unshare`: {error}"),
    };
    let _ = write_status(&records_dir(&args.root), &format!("failed: {error}"));
    error
}

/// Inside the namespaces: isolate, start the service manager, run the user data, then serve
/// until killed. Returns only on failure.
pub fn inside(args: &RunnerArgs) -> MachineError {
    // Where the records are seen changes once the machine's /tmp hides `<root>`.
    let mut records = records_dir(&args.root);
    match run_inside(args, &mut records) {
        Ok(()) => loop {
            std::thread::park();
        },
        Err(e) => {
            let _ = write_status(&records, &format!("failed: {e}"));
            e
        }
    }
}

fn run_inside(args: &RunnerArgs, records: &mut PathBuf) -> Result<(), MachineError> {
    write_status(records, "booting")?;
    let user_data = std::fs::read_to_string(&args.user_data).map_err(MachineError::io(&args.user_data))?;
    *records = enter_machine_view(&args.root, &args.name, args.ip, args.etcdadm.is_some())?;
    let tool_dir = link_tools(records, args.etcdadm.as_deref(), &args.image_tools)?;
    let manager = ServiceManager::new(ManagerPaths {
        unit_dir: "/etc/systemd/system".into(),
        pid_dir: records.join("units"),
        journal_dir: "/var/log/sim-journal".into(),
        notify_dir: "/run/sim-systemd".into(),
    });
    serve(manager, Path::new(CONTROL_SOCKET))?;
    let environment = CommandEnvironment {
        standin_dir: tool_dir,
        vars: vec![
            ("SIM_MACHINE_NAME".into(), args.name.clone()),
            (crate::etcdadm::MACHINE_IP_ENV.into(), args.ip.to_string()),
            ("SIM_MACHINE_ROOT".into(), args.root.display().to_string()),
            ("HOME".into(), "/root".into()),
        ],
    };
    if bottlerocket::is_bottlerocket(&user_data) {
        let machine = bottlerocket::parse_user_data(&user_data)?;
        let succeeded = bootstrap_container::run(&machine, &environment, Path::new(BOOTSTRAP_LOG))?;
        eprintln!(
            "machine {}: Bottlerocket bootstrap succeeded: {succeeded}",
            args.name
        );
    } else {
        let config = parse_user_data(&user_data, &args.name)?;
        let report = execute(&config, &environment, Path::new(OUTPUT_LOG))?;
        eprintln!("machine {}: runcmd exit codes {:?}", args.name, report.exit_codes);
    }
    write_status(records, "running")
}

/// Link the machine's tools into `<records>/bin`, first on its PATH: the stand-ins (siblings of
/// this executable), or the real `etcdadm` and the `systemctl` stand-in.
fn link_tools(
    records: &Path,
    etcdadm: Option<&Path>,
    image_tools: &[PathBuf],
) -> Result<PathBuf, MachineError> {
    let exe = std::env::current_exe().map_err(MachineError::io("/proc/self/exe"))?;
    let source_dir = exe
        .parent()
        .ok_or_else(|| MachineError::Usage(format!("{} has no parent directory", exe.display())))?;
    let mut links: Vec<(&str, PathBuf)> = match etcdadm {
        None => STANDINS
            .iter()
            .map(|name| (*name, source_dir.join(name)))
            .collect(),
        Some(_) => REAL_ETCDADM_STANDINS
            .iter()
            .map(|name| (*name, source_dir.join(name)))
            .collect(),
    };
    if let Some(real) = etcdadm {
        if !real.is_file() {
            return Err(MachineError::Usage(format!(
                "etcdadm {} is missing: {}",
                real.display(),
                crate::real_etcdadm::ETCDADM_INSTALL_HINT
            )));
        }
        links.push(("etcdadm", real.to_path_buf()));
    }
    for tool in image_tools {
        let name = tool
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| MachineError::Usage(format!("image tool {} has no file name", tool.display())))?;
        if !tool.is_file() {
            return Err(MachineError::Usage(format!(
                "image tool {} is missing",
                tool.display()
            )));
        }
        links.push((name, tool.clone()));
    }
    let bin = records.join("bin");
    std::fs::create_dir_all(&bin).map_err(MachineError::io(&bin))?;
    for (name, source) in links {
        if !source.is_file() {
            return Err(MachineError::Usage(format!(
                "stand-in {} is missing: build the etcdadm-sim-machines package (all its binaries)",
                source.display()
            )));
        }
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&source, &link).map_err(MachineError::io(&link))?;
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_round_trip() {
        let args = RunnerArgs {
            name: "m1".into(),
            ip: "127.0.1.2".parse().unwrap(),
            root: "/tmp/m1".into(),
            user_data: "/tmp/m1/sim/user-data".into(),
            etcdadm: None,
            image_tools: vec![],
        };
        assert_eq!(RunnerArgs::parse(&args.to_flags()).unwrap(), args);
        let real = RunnerArgs {
            etcdadm: Some("/w/target/etcdadm/etcdadm".into()),
            image_tools: vec!["/w/target/etcd-3.5.16/etcdutl".into(), "/opt/x/jq".into()],
            ..args
        };
        assert_eq!(RunnerArgs::parse(&real.to_flags()).unwrap(), real);
        assert!(RunnerArgs::parse(&["--name".into()]).is_err());
        assert!(RunnerArgs::parse(&["--name".into(), "m1".into()]).is_err());
    }
}
