//! How the sim's CAPI stand-in boots, stops and breaks machines: the built-in runtime spawns
//! `etcdadm-sim-machine` processes (running the etcdadm stand-in on a loopback address, or the
//! real etcdadm in a network namespace of their own); an external runtime hands the same
//! actions to a command.
//!
//! Over 600 lines: the built-in and the external runtime answer the same actions side by side,
//! so each action reads as one place where both are seen.

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use crate::cloud_config::BOOTSTRAP_SUCCESS_MARKER;
use crate::error::MachineError;
use crate::etcdadm::certs::CERT_VALIDITY_ENV;
use crate::isolation::RECORDS_VIEW;
use crate::network::{FIRST_HOST, LAST_MACHINE_HOST, Lab, Namespace, PRIMARY_NET};
use crate::runner::{RunnerArgs, pid_dir, records_dir, status_path, write_status};
use crate::systemd::manager::{recorded_main_pid, recorded_starts, signal};
use crate::systemd::unit::parse_env_file;

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
    /// A second interface holds the default route, while `ip` stays on the first (as some
    /// infrastructure providers report one address and route through another). Only machines
    /// with a network of their own can have it.
    pub default_route_on_second_interface: bool,
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
    /// The address of machine `name` while it is on (not stopped): what a cloud's API answers
    /// for an instance, so an infrastructure provider can find a machine it booted again (after
    /// `clusterctl move`, whose copies carry no status).
    fn address(&self, name: &str) -> Option<IpAddr>;
    /// Whether a machine may be given `ip` (besides no other Machine having it): by default,
    /// etcd's ports are free on it on this host.
    fn address_free(&self, ip: IpAddr) -> bool {
        [2379u16, 2380]
            .iter()
            .all(|port| std::net::TcpListener::bind(std::net::SocketAddr::new(ip, *port)).is_ok())
    }
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
    /// Its network namespace, when it has one.
    netns: Option<Namespace>,
}

/// Machines with the real etcdadm: each in a namespace on `lab`'s bridge.
#[derive(Debug)]
struct RealEtcdadm {
    etcdadm: PathBuf,
    lab: Arc<Lab>,
    /// Programs the machines' image carries besides etcdadm.
    image_tools: Vec<PathBuf>,
}

/// Machines as local `etcdadm-sim-machine` processes, each leading its own process group so a
/// power-off reaches every process it started. All machines are killed when this is dropped.
#[derive(Debug)]
pub struct BuiltInRuntime {
    runner: PathBuf,
    real: Option<RealEtcdadm>,
    machines: Mutex<HashMap<String, BuiltInMachine>>,
}

impl BuiltInRuntime {
    /// A runtime starting machines with the `etcdadm-sim-machine` binary at `runner` (the
    /// stand-ins must sit beside it).
    pub fn new(runner: impl Into<PathBuf>) -> BuiltInRuntime {
        BuiltInRuntime {
            runner: runner.into(),
            real: None,
            machines: Mutex::new(HashMap::new()),
        }
    }

    /// A runtime whose machines run the real `etcdadm` at `etcdadm`, each in a network namespace
    /// on `lab`'s bridge (addresses `10.213.<lab>.N`), their image carrying `image_tools` too.
    pub fn real_etcdadm(
        runner: impl Into<PathBuf>,
        etcdadm: impl Into<PathBuf>,
        lab: Arc<Lab>,
        image_tools: Vec<PathBuf>,
    ) -> BuiltInRuntime {
        BuiltInRuntime {
            runner: runner.into(),
            real: Some(RealEtcdadm {
                etcdadm: etcdadm.into(),
                lab,
                image_tools,
            }),
            machines: Mutex::new(HashMap::new()),
        }
    }

    /// The lab of a real-etcdadm runtime.
    pub fn lab(&self) -> Option<&Arc<Lab>> {
        self.real.as_ref().map(|real| &real.lab)
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

    /// Every machine this runtime ever booted, by name (whatever its state now).
    pub fn machine_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().keys().cloned().collect();
        names.sort();
        names
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
        let (pid, root, ip, env, networked) = {
            let machines = self.lock();
            let machine = machines
                .get(name)
                .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
            let pid = machine
                .child
                .as_ref()
                .map(Child::id)
                .ok_or_else(|| MachineError::Usage(format!("machine {name} is off")))?;
            let networked = machine.netns.is_some();
            (
                pid,
                machine.root.clone(),
                machine.ip,
                machine.env.clone(),
                networked,
            )
        };
        let records = if networked {
            PathBuf::from(RECORDS_VIEW)
        } else {
            records_dir(&root)
        };
        let environment = crate::executor::CommandEnvironment {
            standin_dir: records.join("bin"),
            vars: vec![],
        };
        let namespaces: &[&str] = if networked {
            &["--mount", "--uts", "--net"]
        } else {
            &["--mount", "--uts"]
        };
        Command::new("nsenter")
            .args(["--target", &pid.to_string()])
            .args(namespaces)
            .args(["--", "env"])
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

    fn power_off(&self, machine: &mut BuiltInMachine) {
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
        // Whatever is left in its namespace goes with it, and so does its address.
        if let (Some(netns), Some(real)) = (machine.netns.take(), &self.real) {
            real.lab.remove(&netns);
        }
    }

    /// The environment the running etcd of machine `name` was started with, from
    /// `/proc/<pid>/environ`: the settings etcd actually runs with (its `ETCD_*` variables),
    /// whatever files on the machine say.
    pub fn etcd_environment(&self, name: &str) -> Result<Vec<(String, String)>, MachineError> {
        let pid = self.etcd_pid(name)?;
        let path = PathBuf::from(format!("/proc/{pid}/environ"));
        let raw = std::fs::read(&path).map_err(MachineError::io(&path))?;
        Ok(parse_environ(&raw))
    }

    /// How many times machine `name`'s service manager has started etcd: 1 for a member that
    /// ran with every setting from its first start and was never restarted since.
    pub fn etcd_starts(&self, name: &str) -> Result<usize, MachineError> {
        let machines = self.lock();
        let machine = machines
            .get(name)
            .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
        Ok(recorded_starts(&pid_dir(&machine.root), "etcd"))
    }

    /// The value of metric `metric` (no labels) that etcd on real-etcdadm machine `name` serves,
    /// read from inside the machine through its loopback listener with etcdadm's etcdctl client
    /// certificate, e.g. `etcd_server_quota_backend_bytes`.
    pub fn etcd_metric(&self, name: &str, metric: &str) -> Result<f64, MachineError> {
        const CURL: &str = "curl -sS --max-time 5 --cacert /etc/etcd/pki/ca.crt \
             --cert /etc/etcd/pki/etcdctl-etcd-client.crt --key /etc/etcd/pki/etcdctl-etcd-client.key \
             https://127.0.0.1:2379/metrics";
        if self.lock().get(name).is_some_and(|m| m.netns.is_none()) {
            return Err(MachineError::Usage(format!(
                "machine {name} runs the etcdadm stand-in, whose etcd has no loopback listener"
            )));
        }
        let output = self.run_in_machine(name, CURL)?;
        if !output.status.success() {
            return Err(MachineError::Tool(format!(
                "reading etcd's metrics on {name}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        metric_value(&text, metric)
            .ok_or_else(|| MachineError::Tool(format!("etcd on {name} serves no metric {metric}")))
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
        // A machine's boot in order (root, network, runner), each undone by stop.
        crate::isolation::check_root(&spec.root)?;
        let mut machines = self.lock();
        if let Some(existing) = machines.get_mut(&spec.name)
            && let Some(child) = existing.child.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            return Err(MachineError::AlreadyRunning(spec.name.clone()));
        }
        if spec.default_route_on_second_interface && self.real.is_none() {
            return Err(MachineError::Usage(format!(
                "machine {}: a second interface needs a network of its own (the real-etcdadm runtime)",
                spec.name
            )));
        }
        let user_data = write_user_data(spec)?;
        write_status(&records_dir(&spec.root), "booting")?;
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
            etcdadm: self.real.as_ref().map(|real| real.etcdadm.clone()),
            image_tools: self
                .real
                .as_ref()
                .map(|real| real.image_tools.clone())
                .unwrap_or_default(),
        };
        let env: Vec<_> = spec.certificate_validity_env().into_iter().collect();
        let netns = match &self.real {
            Some(real) => Some(real.lab.add_namespace(
                &spec.name,
                self.host_number(spec.ip)?,
                spec.default_route_on_second_interface,
            )?),
            None => None,
        };
        // The runner enters the machine's network namespace first, when it has one.
        let mut command = match &netns {
            Some(ns) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net={}", ns.path().display()))
                    .arg("--")
                    .arg(&self.runner);
                command
            }
            None => Command::new(&self.runner),
        };
        let spawned = command
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
            });
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let (Some(real), Some(ns)) = (&self.real, &netns) {
                    real.lab.remove(ns);
                }
                return Err(e);
            }
        };
        machines.insert(
            spec.name.clone(),
            BuiltInMachine {
                root: spec.root.clone(),
                ip: spec.ip,
                env,
                child: Some(child),
                netns,
            },
        );
        Ok(())
    }

    fn stop(&self, name: &str) -> Result<(), MachineError> {
        let mut machines = self.lock();
        let machine = machines
            .get_mut(name)
            .ok_or_else(|| MachineError::UnknownMachine(name.to_string()))?;
        self.power_off(machine);
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

    fn address(&self, name: &str) -> Option<IpAddr> {
        self.lock().get(name).filter(|m| m.child.is_some()).map(|m| m.ip)
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

    fn address_free(&self, ip: IpAddr) -> bool {
        match &self.real {
            None => [2379u16, 2380]
                .iter()
                .all(|port| std::net::TcpListener::bind(std::net::SocketAddr::new(ip, *port)).is_ok()),
            Some(_) => {
                self.host_number(ip).is_ok() && !self.lock().values().any(|m| m.ip == ip && m.child.is_some())
            }
        }
    }
}

/// `KEY=VALUE` pairs of a NUL-separated `/proc/<pid>/environ`.
pub fn parse_environ(raw: &[u8]) -> Vec<(String, String)> {
    raw.split(|b| *b == 0)
        .filter_map(|entry| {
            let text = String::from_utf8_lossy(entry);
            text.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The value of an unlabelled sample `metric` in Prometheus text exposition.
pub fn metric_value(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == metric).then(|| value.trim().parse().ok()).flatten()
        })
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

impl BuiltInRuntime {
    /// The last octet of a machine address in this runtime's lab (`10.213.<lab>.N`).
    fn host_number(&self, ip: IpAddr) -> Result<u8, MachineError> {
        let Some(real) = &self.real else {
            return Err(MachineError::Usage("this runtime has no lab".into()));
        };
        let IpAddr::V4(v4) = ip else {
            return Err(MachineError::Usage(format!("{ip}: machines have IPv4 addresses")));
        };
        let [a, b, lab, host] = v4.octets();
        if [a, b] != PRIMARY_NET || lab != real.lab.id() || !(FIRST_HOST..=LAST_MACHINE_HOST).contains(&host)
        {
            return Err(MachineError::Usage(format!(
                "{ip} is not a machine address of lab {} ({}.{}.{}.{FIRST_HOST}-{LAST_MACHINE_HOST})",
                real.lab.id(),
                PRIMARY_NET[0],
                PRIMARY_NET[1],
                real.lab.id()
            )));
        }
        Ok(host)
    }
}

impl Drop for BuiltInRuntime {
    fn drop(&mut self) {
        let mut machines = std::mem::take(&mut *self.lock());
        for machine in machines.values_mut() {
            self.power_off(machine);
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

    fn address(&self, name: &str) -> Option<IpAddr> {
        self.lock().get(name).filter(|m| m.on).map(|m| m.spec.ip)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_environ_and_metrics() {
        assert_eq!(
            parse_environ(b"ETCD_NAME=m1\0ETCD_CIPHER_SUITES=A,B\0EMPTY=\0"),
            vec![
                ("ETCD_NAME".to_string(), "m1".to_string()),
                ("ETCD_CIPHER_SUITES".into(), "A,B".into()),
                ("EMPTY".into(), String::new())
            ]
        );
        let text = "# HELP etcd_server_quota_backend_bytes Current backend storage quota size in bytes.\n\
                    # TYPE etcd_server_quota_backend_bytes gauge\n\
                    etcd_server_quota_backend_bytes 2.147483648e+09\n\
                    etcd_server_has_leader 1\n";
        assert_eq!(
            metric_value(text, "etcd_server_quota_backend_bytes"),
            Some(2_147_483_648.0)
        );
        assert_eq!(metric_value(text, "etcd_server_has_leader"), Some(1.0));
        assert_eq!(metric_value(text, "etcd_server"), None);
    }
}
