//! Running a parsed cloud-config inside the machine view, the way cloud-init's modules would.
//!
//! `write_files` first, then `runcmd` entries in order. Like cloud-init (which joins runcmd into
//! one shell script without `set -e`), a failing entry does not stop the ones after it; the sim
//! runs each entry as its own process so it can record every exit code in the log. One
//! difference follows: shell state (`cd`, variables) does not carry from one entry to the next.
//! `users` and `ntp` are recorded, not applied: machines share the host's accounts and clock.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use crate::cloud_config::CloudConfig;
use crate::error::MachineError;
use crate::isolation::is_isolated;
use crate::write_files::write_entry;

/// Where cloud-init writes everything commands print, in the machine view.
pub const OUTPUT_LOG: &str = "/var/log/cloud-init-output.log";

/// What the commands see: extra environment, and the stand-in directory put first on PATH.
#[derive(Debug, Clone)]
pub struct CommandEnvironment {
    pub standin_dir: PathBuf,
    pub vars: Vec<(String, String)>,
}

impl CommandEnvironment {
    /// PATH with the stand-ins first, then the usual system directories.
    pub fn path(&self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.standin_dir.display()
        )
    }
}

/// The outcome of the `runcmd` stage: one exit code per entry (`None`: killed by a signal or
/// could not start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    pub exit_codes: Vec<Option<i32>>,
}

impl RunReport {
    /// Whether every entry exited 0.
    pub fn all_succeeded(&self) -> bool {
        self.exit_codes.iter().all(|code| *code == Some(0))
    }
}

/// The machine's log at `log_path`, opened for appending (its directory created).
pub fn open_log(log_path: &Path) -> Result<File, MachineError> {
    if let Some(parent) = log_path.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    File::options()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(MachineError::io(log_path))
}

/// Run `program args` from `/` with the stand-ins first on PATH and both outputs appended to
/// `log`. The outer error is about the log; the inner one is the program not starting.
pub fn run_logged(
    log: &File,
    log_path: &Path,
    environment: &CommandEnvironment,
    program: &str,
    args: &[String],
) -> Result<std::io::Result<ExitStatus>, MachineError> {
    let output = log.try_clone().map_err(MachineError::io(log_path))?;
    let errors = log.try_clone().map_err(MachineError::io(log_path))?;
    Ok(Command::new(program)
        .args(args)
        .current_dir("/")
        .env("PATH", environment.path())
        .envs(environment.vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(errors)
        .status())
}

/// Execute `config` with `/` as the machine's root (call inside the machine view), appending
/// to `log`. `write_files` outside the machine's private directories is refused: it would
/// change the host.
pub fn execute(
    config: &CloudConfig,
    environment: &CommandEnvironment,
    log_path: &Path,
) -> Result<RunReport, MachineError> {
    let mut log = open_log(log_path)?;
    let note = |log: &mut File, line: String| {
        let _ = writeln!(log, "[sim] {line}");
    };
    for file in &config.write_files {
        if !is_isolated(Path::new(&file.path)) {
            return Err(MachineError::UserData(format!(
                "write_files path {} is outside the machine's private directories ({}); the sim \
                 would write it on the host",
                file.path,
                crate::isolation::ISOLATED_DIRS.join(", ")
            )));
        }
        write_entry(Path::new("/"), file)?;
        note(
            &mut log,
            format!(
                "write_files: wrote {} (owner {} recorded, not applied)",
                file.path,
                file.owner.as_deref().unwrap_or("root:root")
            ),
        );
    }
    if let Some(users) = &config.users {
        note(&mut log, format!("users (recorded, not applied): {users}"));
    }
    if let Some(ntp) = &config.ntp {
        note(&mut log, format!("ntp (recorded, not applied): {ntp}"));
    }
    let mut report = RunReport::default();
    for (index, command) in config.runcmd.iter().enumerate() {
        note(&mut log, format!("runcmd[{index}]: {}", command.display()));
        let argv = command.argv();
        let Some((program, args)) = argv.split_first() else {
            note(&mut log, format!("runcmd[{index}]: empty command, skipped"));
            report.exit_codes.push(None);
            continue;
        };
        let code = match run_logged(&log, log_path, environment, program, args)? {
            Ok(status) => {
                note(&mut log, format!("runcmd[{index}] exited with {status}"));
                status.code()
            }
            Err(e) => {
                note(
                    &mut log,
                    format!("runcmd[{index}] could not start {program}: {e}"),
                );
                None
            }
        };
        report.exit_codes.push(code);
    }
    note(&mut log, format!("runcmd exit codes: {:?}", report.exit_codes));
    Ok(report)
}
