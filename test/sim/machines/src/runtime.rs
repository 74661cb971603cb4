//! How the sim's CAPI stand-in boots, stops and breaks machines: the built-in runtime spawns
//! `etcdadm-sim-machine` processes; an external runtime hands the same actions to a command.

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::error::MachineError;
use crate::etcdadm::certs::CERT_VALIDITY_ENV;
use crate::runner::{RunnerArgs, pid_dir, status_path, write_status};
use crate::systemd::manager::{recorded_main_pid, signal};
use crate::systemd::unit::parse_env_file;

/// Where a machine's bootstrap reports success (CAPI's sentinel file), relative to its root.
pub const BOOTSTRAP_SUCCESS_MARKER: &str = "run/cluster-api/bootstrap-success.complete";

/// A machine to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    pub name: String,
    pub ip: IpAddr,
    /// The machine's disk: overlays' upper layers and the runner's records. Kept across
    /// power-off, like a disk.
    pub root: PathBuf,
    pub user_data: String,
    /// Validity of the certificates the machine's etcdadm issues; `None`: etcdadm's 365 days.
    /// Handed to the machine as [`CERT_VALIDITY_ENV`].
    pub member_certificate_validity: Option<Duration>,
}

impl MachineSpec {
    /// The machine's environment entry for [`MachineSpec::member_certificate_validity`].
    pub fn certificate_validity_env(&self) -> Option<(&'static str, String)> {
        self.member_certificate_validity
            .map(|validity| (CERT_VALIDITY_ENV, validity.as_secs().to_string()))
    }
}

/// A fault injected into a running machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL etcd's main process (a crash; the unit's `Restart=` decides what follows).
    Kill,
    /// SIGSTOP etcd.
    Pause,
    /// SIGCONT etcd.
    Resume,
    /// Delete etcd's data directory under the running member.
    WipeData,
    /// Kill every process of the machine; nothing listens on its address afterwards.
    PowerOff,
}

impl Fault {
    /// The word used on the external runtime's command line.
    pub fn as_arg(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Resume => "resume",
            Fault::WipeData => "wipe-data",
            Fault::PowerOff => "power-off",
        }
    }
}

/// What the runtime knows about a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineState {
    /// Started; user data still running.
    Booting,
    /// User data ran; `bootstrap_succeeded` when the sentinel file exists.
    Running { bootstrap_succeeded: bool },
    /// The machine could not boot (bad user data, isolation failure) or its runner died.
    Failed { reason: String },
    /// Never booted, stopped or powered off.
    Off,
}

/// Boots and drives machines.
pub trait MachineRuntime: Send + Sync {
    /// Start booting; returns once the machine process is started.
    fn boot(&self, spec: &MachineSpec) -> Result<(), MachineError>;
    /// Power off: kill everything, keep the root.
    fn stop(&self, name: &str) -> Result<(), MachineError>;
    fn fault(&self, name: &str, fault: Fault) -> Result<(), MachineError>;
    fn state(&self, name: &str) -> MachineState;
}

fn bootstrap_succeeded(root: &Path) -> bool {
    root.join(BOOTSTRAP_SUCCESS_MARKER).exists()
}

fn write_user_data(spec: &MachineSpec) -> Result<PathBuf, MachineError> {
    let dir = spec.root.join("sim");
    std::fs::create_dir_all(&dir).map_err(MachineError::io(&dir))?;
    let path = dir.join("user-data");
    std::fs::write(&path, &spec.user_data).map_err(MachineError::io(&path))?;
    Ok(path)
}

#[derive(Debug)]
struct BuiltInMachine {
    root: PathBuf,
    ip: IpAddr,
    /// What the machine's processes find in their environment beyond the runner's own.
    env: Vec<(&'static str, String)>,
    child: Option<Child>,
}

/// Machines as local `etcdadm-sim-machine` processes, each leading its own process group so a
/// power-off reaches every process it started. All machines are killed when this is dropped.
#[derive(Debug)]
pub struct BuiltInRuntime {
    runner: PathBuf,
    machines: Mutex<HashMap<String, BuiltInMachine>>,
}

impl BuiltInRuntime {
    /// A runtime starting machines with the `etcdadm-sim-machine` binary at `runner` (the
    /// stand-ins must sit beside it).
    pub fn new(runner: impl Into<PathBuf>) -> BuiltInRuntime {
        BuiltInRuntime {
            runner: runner.into(),
            machines: Mutex::new(HashMap::new()),
        }
    }

    /// A runtime using the `etcdadm-sim-machine` beside the current executable.
    pub fn beside_current_exe() -> Result<BuiltInRuntime, MachineError> {
        let exe = std::env::current_exe().map_err(MachineError::io("/proc/self/exe"))?;
        let runner = exe.with_file_name("etcdadm-sim-machine");
        if !runner.is_file() {
            return Err(MachineError::Usage(format!(
                "{} not found: build the etcdadm-sim-machines package",
                runner.display()
            )));
        }
        Ok(BuiltInRuntime::new(runner))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, BuiltInMachine>> {
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The runner's PID (also the machine's process group), while it runs.
    pub fn runner_pid(&self, name: &str) -> Option<u32> {
        self.lock()
            .get(name)
            .and_then(|m| m.child.as_ref())
            .map(Child::id)
    }

    /// Run a shell command inside a running machine (its mount and UTS namespaces, with the
    /// environment its user data gets), like an operator logged in on it.
    pub fn run_in_machine(
        &self,
        name: &str,
        shell_command: &str,
    ) -> Result<std::process::Output, MachineError> {
        let (pid, root, ip, env) = {
            let machines = self.lock();
            let machine = machines
                .get(name)
                .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
            let pid = machine
                .child
                .as_ref()
                .map(Child::id)
                .ok_or_else(|| MachineError::Usage(format!("machine {name} is off")))?;
            (pid, machine.root.clone(), machine.ip, machine.env.clone())
        };
        let environment = crate::executor::CommandEnvironment {
            standin_dir: root.join("sim/bin"),
            vars: vec![],
        };
        Command::new("nsenter")
            .args(["--target", &pid.to_string(), "--mount", "--uts", "--", "env"])
            .arg(format!("PATH={}", environment.path()))
            .arg(format!("SIM_MACHINE_NAME={name}"))
            .arg(format!("{}={ip}", crate::etcdadm::MACHINE_IP_ENV))
            .args(env.iter().map(|(key, value)| format!("{key}={value}")))
            .args(["HOME=/root", "sh", "-c", shell_command])
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| MachineError::Spawn {
                program: "nsenter".into(),
                reason: e.to_string(),
            })
    }

    fn power_off(machine: &mut BuiltInMachine) {
        if let Some(mut child) = machine.child.take() {
            // The runner leads its process group; every unit and command inherited it.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
            // Orphaned units are reaped by whoever is PID 1, maybe never: wait until every
            // process of the group is dead (a zombie holds no sockets), not until it is reaped.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while live_group_members(child.id()) > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(pid_dir(&machine.root));
    }

    fn etcd_pid(&self, name: &str) -> Result<u32, MachineError> {
        let machines = self.lock();
        let machine = machines
            .get(name)
            .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
        recorded_main_pid(&pid_dir(&machine.root), "etcd").ok_or_else(|| {
            MachineError::Usage(format!("machine {name} runs no etcd to inject the fault into"))
        })
    }

    fn wipe_data(&self, name: &str) -> Result<(), MachineError> {
        let (pid, root) = {
            let machines = self.lock();
            let machine = machines
                .get(name)
                .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
            let pid = machine
                .child
                .as_ref()
                .map(Child::id)
                .ok_or_else(|| MachineError::Usage(format!("machine {name} is off")))?;
            (pid, machine.root.clone())
        };
        let data_dir = std::fs::read_to_string(root.join("etc/etcd/etcd.env"))
            .ok()
            .and_then(|text| {
                parse_env_file(&text)
                    .into_iter()
                    .find(|(k, _)| k == "ETCD_DATA_DIR")
            })
            .map_or_else(|| "/var/lib/etcd".to_string(), |(_, v)| v);
        // Inside the machine's mount namespace: the data dir lives in its overlay.
        let status = Command::new("nsenter")
            .args([
                "--target",
                &pid.to_string(),
                "--mount",
                "--",
                "rm",
                "-rf",
                "--",
                &data_dir,
            ])
            .status()
            .map_err(|e| MachineError::Spawn {
                program: "nsenter".into(),
                reason: e.to_string(),
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(MachineError::Tool(format!(
                "wiping {data_dir} on {name}: nsenter exited with {status}"
            )))
        }
    }
}

impl MachineRuntime for BuiltInRuntime {
    fn boot(&self, spec: &MachineSpec) -> Result<(), MachineError> {
        crate::isolation::check_root(&spec.root)?;
        let mut machines = self.lock();
        if let Some(existing) = machines.get_mut(&spec.name)
            && let Some(child) = existing.child.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            return Err(MachineError::AlreadyRunning(spec.name.clone()));
        }
        let user_data = write_user_data(spec)?;
        write_status(&spec.root, "booting")?;
        let log_path = spec.root.join("sim/machine.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(MachineError::io(&log_path))?;
        let args = RunnerArgs {
            name: spec.name.clone(),
            ip: spec.ip,
            root: spec.root.clone(),
            user_data,
        };
        let env: Vec<_> = spec.certificate_validity_env().into_iter().collect();
        let child = Command::new(&self.runner)
            .arg("boot")
            .args(args.to_flags())
            .env_remove(CERT_VALIDITY_ENV)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(MachineError::io(&log_path))?)
            .stderr(log)
            .spawn()
            .map_err(|e| MachineError::Spawn {
                program: self.runner.display().to_string(),
                reason: e.to_string(),
            })?;
        machines.insert(
            spec.name.clone(),
            BuiltInMachine {
                root: spec.root.clone(),
                ip: spec.ip,
                env,
                child: Some(child),
            },
        );
        Ok(())
    }

    fn stop(&self, name: &str) -> Result<(), MachineError> {
        let mut machines = self.lock();
        let machine = machines
            .get_mut(name)
            .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
        BuiltInRuntime::power_off(machine);
        Ok(())
    }

    fn fault(&self, name: &str, fault: Fault) -> Result<(), MachineError> {
        match fault {
            Fault::Kill => signal(self.etcd_pid(name)?, "KILL"),
            Fault::Pause => signal(self.etcd_pid(name)?, "STOP"),
            Fault::Resume => signal(self.etcd_pid(name)?, "CONT"),
            Fault::WipeData => self.wipe_data(name)?,
            Fault::PowerOff => self.stop(name)?,
        }
        Ok(())
    }

    fn state(&self, name: &str) -> MachineState {
        let mut machines = self.lock();
        let Some(machine) = machines.get_mut(name) else {
            return MachineState::Off;
        };
        let Some(child) = machine.child.as_mut() else {
            return MachineState::Off;
        };
        let status = std::fs::read_to_string(status_path(&machine.root)).unwrap_or_default();
        if let Some(reason) = status.strip_prefix("failed: ") {
            return MachineState::Failed {
                reason: reason.to_string(),
            };
        }
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(exit)) => {
                return MachineState::Failed {
                    reason: format!(
                        "the machine runner exited with {exit}; see {}",
                        machine.root.join("sim/machine.log").display()
                    ),
                };
            }
            Err(e) => {
                return MachineState::Failed {
                    reason: e.to_string(),
                };
            }
        }
        match status.as_str() {
            "running" => MachineState::Running {
                bootstrap_succeeded: bootstrap_succeeded(&machine.root),
            },
            _ => MachineState::Booting,
        }
    }
}

/// How many processes of process group `pgid` are alive (not zombies), from `/proc`.
pub fn live_group_members(pgid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
            let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let mut fields = after_comm.split_whitespace();
            let state = fields.next();
            let group = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
            group == Some(pgid) && !matches!(state, Some("Z" | "X"))
        })
        .count()
}

impl Drop for BuiltInRuntime {
    fn drop(&mut self) {
        let mut machines = self.lock();
        for machine in machines.values_mut() {
            BuiltInRuntime::power_off(machine);
        }
    }
}

#[derive(Debug, Clone)]
struct ExternalMachine {
    spec: MachineSpec,
    user_data: PathBuf,
    on: bool,
    failure: Option<String>,
}

/// Machines booted by another program: `CMD boot|stop|fault <kind> --name N --ip IP
/// --user-data FILE --root DIR`. Its state is what this side asked for, plus the bootstrap
/// sentinel, which the command must leave at `<root>/run/cluster-api/bootstrap-success.complete`.
/// A spec's certificate validity reaches the command as [`CERT_VALIDITY_ENV`] in its environment;
/// the command hands it to the machine's etcdadm.
#[derive(Debug)]
pub struct ExternalRuntime {
    command: Vec<String>,
    machines: Mutex<HashMap<String, ExternalMachine>>,
}

impl ExternalRuntime {
    /// `command` is split on whitespace: a program and leading arguments.
    pub fn new(command: &str) -> Result<ExternalRuntime, MachineError> {
        let command: Vec<String> = command.split_whitespace().map(str::to_string).collect();
        if command.is_empty() {
            return Err(MachineError::Usage("--machine-runtime needs a command".into()));
        }
        Ok(ExternalRuntime {
            command,
            machines: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, ExternalMachine>> {
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn invoke(&self, action: &[&str], machine: &ExternalMachine) -> Result<(), MachineError> {
        let (program, leading) = self
            .command
            .split_first()
            .ok_or_else(|| MachineError::Usage("--machine-runtime needs a command".into()))?;
        let output = Command::new(program)
            .args(leading)
            .args(action)
            .args(["--name", &machine.spec.name, "--ip", &machine.spec.ip.to_string()])
            .arg("--user-data")
            .arg(&machine.user_data)
            .arg("--root")
            .arg(&machine.spec.root)
            .env_remove(CERT_VALIDITY_ENV)
            .envs(machine.spec.certificate_validity_env())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| MachineError::External {
                command: self.command.join(" "),
                reason: e.to_string(),
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(MachineError::External {
                command: format!("{} {}", self.command.join(" "), action.join(" ")),
                reason: format!(
                    "{}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            })
        }
    }

    fn known(&self, name: &str) -> Result<ExternalMachine, MachineError> {
        self.lock()
            .get(name)
            .cloned()
            .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))
    }
}

impl MachineRuntime for ExternalRuntime {
    fn boot(&self, spec: &MachineSpec) -> Result<(), MachineError> {
        let mut machine = ExternalMachine {
            spec: spec.clone(),
            user_data: write_user_data(spec)?,
            on: true,
            failure: None,
        };
        let result = self.invoke(&["boot"], &machine);
        if let Err(e) = &result {
            machine.failure = Some(e.to_string());
        }
        self.lock().insert(spec.name.clone(), machine);
        result
    }

    fn stop(&self, name: &str) -> Result<(), MachineError> {
        let machine = self.known(name)?;
        self.invoke(&["stop"], &machine)?;
        if let Some(m) = self.lock().get_mut(name) {
            m.on = false;
        }
        Ok(())
    }

    fn fault(&self, name: &str, fault: Fault) -> Result<(), MachineError> {
        let machine = self.known(name)?;
        self.invoke(&["fault", fault.as_arg()], &machine)?;
        if fault == Fault::PowerOff
            && let Some(m) = self.lock().get_mut(name)
        {
            m.on = false;
        }
        Ok(())
    }

    fn state(&self, name: &str) -> MachineState {
        match self.lock().get(name) {
            None => MachineState::Off,
            Some(m) if !m.on => MachineState::Off,
            Some(ExternalMachine {
                failure: Some(reason),
                ..
            }) => MachineState::Failed {
                reason: reason.clone(),
            },
            Some(m) => MachineState::Running {
                bootstrap_succeeded: bootstrap_succeeded(&m.spec.root),
            },
        }
    }
}
