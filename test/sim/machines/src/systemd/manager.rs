//! Starting, supervising and stopping units; answering `systemctl` verbs as systemd does
//! (same exit codes, same one-line messages for the cases provisioning scripts meet).
//!
//! Over 600 lines: one table of units under one lock, which every `systemctl` verb and the
//! supervisor read and change.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::unit::{ServiceType, Unit, parse_unit, unit_environment, unit_name};

/// Where the manager finds units and keeps its records, in the machine view.
#[derive(Debug, Clone)]
pub struct ManagerPaths {
    /// Unit files (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// Main PIDs, one `<unit>.pid` per running unit, for the runtime's faults.
    pub pid_dir: PathBuf,
    /// Unit output, one `<unit>.log` each: the machine's journal.
    pub journal_dir: PathBuf,
    /// `NOTIFY_SOCKET`s.
    pub notify_dir: PathBuf,
}

/// What a `systemctl` invocation prints and exits with.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Reply {
    fn ok() -> Reply {
        Reply::default()
    }

    fn error(code: i32, message: String) -> Reply {
        Reply {
            code,
            stdout: String::new(),
            stderr: format!("{message}\n"),
        }
    }
}

/// systemd's `ActiveState` (auto-restart shows as `activating`, as in systemd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ActiveState {
    #[default]
    Inactive,
    Activating,
    Active,
    AutoRestart,
    Failed,
}

impl ActiveState {
    fn word(self) -> &'static str {
        match self {
            ActiveState::Inactive => "inactive",
            ActiveState::Activating | ActiveState::AutoRestart => "activating",
            ActiveState::Active => "active",
            ActiveState::Failed => "failed",
        }
    }
}

#[derive(Debug, Default)]
struct Service {
    enabled: bool,
    active: ActiveState,
    pid: Option<u32>,
    stop_requested: bool,
    last_exit: Option<String>,
}

type Services = HashMap<String, Service>;

/// The machine's systemd. Cheap to clone; all clones share state.
#[derive(Debug, Clone)]
pub struct ServiceManager {
    paths: Arc<ManagerPaths>,
    shared: Arc<(Mutex<Services>, Condvar)>,
}

/// Exit codes of `systemctl` (LSB: 3 not running, 4 no such unit; 5 not loaded/not found).
const EXIT_FAILURE: i32 = 1;
const EXIT_NOT_RUNNING: i32 = 3;
const EXIT_NO_SUCH_UNIT: i32 = 4;
const EXIT_NOT_LOADED: i32 = 5;

impl ServiceManager {
    pub fn new(paths: ManagerPaths) -> ServiceManager {
        ServiceManager {
            paths: Arc::new(paths),
            shared: Arc::new((Mutex::new(HashMap::new()), Condvar::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Services> {
        self.shared.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, Services>, timeout: Duration) -> MutexGuard<'a, Services> {
        match self.shared.1.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    fn changed(&self) {
        self.shared.1.notify_all();
    }

    /// Answer one `systemctl` command line (without the program name).
    pub fn command(&self, args: &[String]) -> Reply {
        let quiet = args.iter().any(|a| a == "-q" || a == "--quiet");
        let now = args.iter().any(|a| a == "--now");
        let words: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        let Some((verb, units)) = words.split_first() else {
            return Reply::error(
                EXIT_FAILURE,
                "the sim's systemctl needs a verb (start, stop, ...)".into(),
            );
        };
        let units: Vec<String> = units.iter().map(|u| unit_name(u)).collect();
        let needs_unit = !matches!(verb.as_str(), "daemon-reload" | "reset-failed");
        if needs_unit && units.is_empty() {
            return Reply::error(EXIT_FAILURE, "Too few arguments.".to_string());
        }
        let mut combined = Reply::ok();
        for unit in if units.is_empty() {
            vec![String::new()]
        } else {
            units
        } {
            let reply = match verb.as_str() {
                "daemon-reload" => Reply::ok(),
                "start" => self.start(&unit),
                "stop" => self.stop(&unit),
                "restart" => self.restart(&unit),
                "enable" => self.set_enabled(&unit, true, now),
                "disable" => self.set_enabled(&unit, false, now),
                "is-active" => self.is_active(&unit, quiet),
                "is-enabled" => self.is_enabled(&unit, quiet),
                "is-failed" => self.is_failed(&unit, quiet),
                "status" => self.status(&unit),
                "reset-failed" => self.reset_failed(&unit),
                other => Reply::error(EXIT_FAILURE, format!("Unknown command verb {other}.")),
            };
            combined.stdout.push_str(&reply.stdout);
            combined.stderr.push_str(&reply.stderr);
            if combined.code == 0 {
                combined.code = reply.code;
            }
        }
        combined
    }

    fn unit_path(&self, unit: &str) -> PathBuf {
        self.paths.unit_dir.join(unit)
    }

    fn load(&self, unit: &str) -> Result<Option<Unit>, String> {
        let path = self.unit_path(unit);
        let Ok(main) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let mut texts = vec![main];
        let drop_in_dir = self.paths.unit_dir.join(format!("{unit}.d"));
        if let Ok(entries) = std::fs::read_dir(&drop_in_dir) {
            let mut drop_ins: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect();
            drop_ins.sort();
            for drop_in in drop_ins {
                texts.push(
                    std::fs::read_to_string(&drop_in).map_err(|e| format!("{}: {e}", drop_in.display()))?,
                );
            }
        }
        parse_unit(unit, &texts).map(Some)
    }

    fn start(&self, unit_name: &str) -> Reply {
        let unit = match self.load(unit_name) {
            Ok(Some(unit)) => unit,
            Ok(None) => {
                return Reply::error(
                    EXIT_NOT_LOADED,
                    format!("Failed to start {unit_name}: Unit {unit_name} not found."),
                );
            }
            Err(e) => return Reply::error(EXIT_FAILURE, format!("Failed to start {unit_name}: {e}")),
        };
        let mut services = self.lock();
        let service = services.entry(unit_name.to_string()).or_default();
        match service.active {
            ActiveState::Active | ActiveState::AutoRestart => return Reply::ok(),
            ActiveState::Activating => {}
            ActiveState::Inactive | ActiveState::Failed => {
                service.active = ActiveState::Activating;
                service.stop_requested = false;
                let manager = self.clone();
                let unit = unit.clone();
                std::thread::spawn(move || manager.supervise(unit));
            }
        }
        let deadline = unit.timeout_start.map(|t| Instant::now() + t);
        loop {
            let active = services.get(unit_name).map(|s| s.active).unwrap_or_default();
            match active {
                ActiveState::Active => return Reply::ok(),
                ActiveState::Activating => {}
                ActiveState::Inactive | ActiveState::Failed | ActiveState::AutoRestart => {
                    return Reply::error(
                        EXIT_FAILURE,
                        format!(
                            "Job for {unit_name} failed because the control process exited with error code.\n\
                             See \"systemctl status {unit_name}\" and \"journalctl -xeu {unit_name}\" for details."
                        ),
                    );
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                drop(services);
                let _ = self.stop(unit_name);
                return Reply::error(
                    EXIT_FAILURE,
                    format!("Job for {unit_name} failed because a timeout was exceeded."),
                );
            }
            services = self.wait(services, Duration::from_millis(200));
        }
    }

    /// Run the unit's main process until it is stopped or exits for good, restarting it as
    /// `Restart=` says. Runs on its own thread, one per activation.
    fn supervise(&self, unit: Unit) {
        loop {
            let exit = match self.run_once(&unit) {
                Ok(status) => status,
                Err(reason) => {
                    let mut services = self.lock();
                    if let Some(service) = services.get_mut(&unit.name) {
                        service.active = ActiveState::Failed;
                        service.last_exit = Some(reason);
                    }
                    self.changed();
                    return;
                }
            };
            let mut services = self.lock();
            let Some(service) = services.get_mut(&unit.name) else {
                return;
            };
            service.pid = None;
            service.last_exit = Some(exit.to_string());
            let _ = std::fs::remove_file(self.paths.pid_dir.join(format!("{}.pid", unit.name)));
            if service.stop_requested {
                service.active = ActiveState::Inactive;
                self.changed();
                return;
            }
            let failed = !exit.success();
            if !unit.restart.restarts(failed) {
                service.active = if failed {
                    ActiveState::Failed
                } else {
                    ActiveState::Inactive
                };
                self.changed();
                return;
            }
            service.active = ActiveState::AutoRestart;
            self.changed();
            let restart_at = Instant::now() + unit.restart_sec;
            loop {
                let stop = services.get(&unit.name).is_none_or(|s| s.stop_requested);
                if stop {
                    if let Some(service) = services.get_mut(&unit.name) {
                        service.active = ActiveState::Inactive;
                    }
                    self.changed();
                    return;
                }
                let now = Instant::now();
                if now >= restart_at {
                    break;
                }
                services = self.wait(services, restart_at - now);
            }
            if let Some(service) = services.get_mut(&unit.name) {
                service.active = ActiveState::Activating;
            }
            self.changed();
        }
    }

    /// Start the main process once and wait for it to exit.
    fn run_once(&self, unit: &Unit) -> Result<ExitStatus, String> {
        let environment = unit_environment(unit, |path| std::fs::read_to_string(path))?;
        std::fs::create_dir_all(&self.paths.journal_dir).map_err(|e| e.to_string())?;
        let journal_path = self.paths.journal_dir.join(format!("{}.log", unit.name));
        let journal = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| format!("{}: {e}", journal_path.display()))?;
        let notify = match unit.service_type {
            ServiceType::Notify => Some(self.notify_socket(&unit.name)?),
            _ => None,
        };
        let (program, args) = unit.exec_start.split_first().ok_or("no ExecStart")?;
        let mut command = Command::new(program);
        command
            .args(args)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .envs(environment)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(journal.try_clone().map_err(|e| e.to_string())?)
            .stderr(journal);
        if let Some((path, _)) = &notify {
            command.env("NOTIFY_SOCKET", path);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("Failed to execute {program}: {e}"))?;
        {
            let mut services = self.lock();
            if let Some(service) = services.get_mut(&unit.name) {
                service.pid = Some(child.id());
                if notify.is_none() {
                    service.active = ActiveState::Active;
                }
                if service.stop_requested {
                    let _ = child.kill();
                }
            }
            let _ = std::fs::create_dir_all(&self.paths.pid_dir);
            let _ = std::fs::write(
                self.paths.pid_dir.join(format!("{}.pid", unit.name)),
                child.id().to_string(),
            );
            // Every start of the main process, one PID a line: how often etcd was (re)started.
            if let Ok(mut starts) = std::fs::File::options()
                .create(true)
                .append(true)
                .open(self.paths.pid_dir.join(format!("{}.starts", unit.name)))
            {
                let _ = std::io::Write::write_all(&mut starts, format!("{}\n", child.id()).as_bytes());
            }
            self.changed();
        }
        let exited = Arc::new(AtomicBool::new(false));
        if let Some((_, socket)) = notify {
            let manager = self.clone();
            let name = unit.name.clone();
            let exited = Arc::clone(&exited);
            std::thread::spawn(move || manager.await_ready(&name, &socket, &exited));
        }
        let status = child.wait().map_err(|e| e.to_string());
        exited.store(true, Ordering::SeqCst);
        status
    }

    fn notify_socket(&self, unit: &str) -> Result<(PathBuf, UnixDatagram), String> {
        std::fs::create_dir_all(&self.paths.notify_dir).map_err(|e| e.to_string())?;
        let path = self.paths.notify_dir.join(format!("{unit}.notify"));
        let _ = std::fs::remove_file(&path);
        let socket =
            UnixDatagram::bind(&path).map_err(|e| format!("NOTIFY_SOCKET {}: {e}", path.display()))?;
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(|e| e.to_string())?;
        Ok((path, socket))
    }

    fn await_ready(&self, unit: &str, socket: &UnixDatagram, exited: &AtomicBool) {
        let mut buffer = [0u8; 4096];
        while !exited.load(Ordering::SeqCst) {
            let Ok(length) = socket.recv(&mut buffer) else {
                continue;
            };
            let message = String::from_utf8_lossy(&buffer[..length]);
            if message.lines().any(|line| line.trim() == "READY=1") {
                let mut services = self.lock();
                if let Some(service) = services.get_mut(unit)
                    && service.active == ActiveState::Activating
                {
                    service.active = ActiveState::Active;
                }
                self.changed();
            }
        }
    }

    fn stop(&self, unit_name: &str) -> Reply {
        let known = self.lock().contains_key(unit_name);
        if !known && !self.unit_path(unit_name).exists() {
            return Reply::error(
                EXIT_NOT_LOADED,
                format!("Failed to stop {unit_name}: Unit {unit_name} not loaded."),
            );
        }
        let timeout = self
            .load(unit_name)
            .ok()
            .flatten()
            .map_or(Duration::from_secs(90), |u| u.timeout_stop);
        let mut services = self.lock();
        let Some(service) = services.get_mut(unit_name) else {
            return Reply::ok();
        };
        match service.active {
            ActiveState::Inactive => return Reply::ok(),
            ActiveState::Failed => {
                service.active = ActiveState::Inactive;
                return Reply::ok();
            }
            ActiveState::Activating | ActiveState::Active | ActiveState::AutoRestart => {}
        }
        service.stop_requested = true;
        if let Some(pid) = service.pid {
            // systemd follows SIGTERM with SIGCONT so a stopped (paused) process can act on it.
            signal(pid, "TERM");
            signal(pid, "CONT");
        }
        self.changed();
        let deadline = Instant::now() + timeout;
        let mut killed = false;
        loop {
            let Some(service) = services.get(unit_name) else {
                return Reply::ok();
            };
            if service.active == ActiveState::Inactive {
                return Reply::ok();
            }
            if Instant::now() >= deadline && !killed {
                if let Some(pid) = service.pid {
                    signal(pid, "KILL");
                }
                killed = true;
            }
            services = self.wait(services, Duration::from_millis(100));
        }
    }

    fn restart(&self, unit_name: &str) -> Reply {
        if !self.unit_path(unit_name).exists() {
            return Reply::error(
                EXIT_NOT_LOADED,
                format!("Failed to restart {unit_name}: Unit {unit_name} not found."),
            );
        }
        let stopped = self.stop(unit_name);
        if stopped.code != 0 {
            return stopped;
        }
        self.start(unit_name)
    }

    fn set_enabled(&self, unit_name: &str, enabled: bool, now: bool) -> Reply {
        if !self.unit_path(unit_name).exists() {
            let verb = if enabled { "enable" } else { "disable" };
            return Reply::error(
                EXIT_FAILURE,
                format!("Failed to {verb} unit: Unit file {unit_name} does not exist."),
            );
        }
        self.lock().entry(unit_name.to_string()).or_default().enabled = enabled;
        match (now, enabled) {
            (true, true) => self.start(unit_name),
            (true, false) => self.stop(unit_name),
            _ => Reply::ok(),
        }
    }

    fn active_state(&self, unit_name: &str) -> ActiveState {
        self.lock().get(unit_name).map(|s| s.active).unwrap_or_default()
    }

    fn is_active(&self, unit_name: &str, quiet: bool) -> Reply {
        let active = self.active_state(unit_name);
        Reply {
            code: if active == ActiveState::Active {
                0
            } else {
                EXIT_NOT_RUNNING
            },
            stdout: if quiet {
                String::new()
            } else {
                format!("{}\n", active.word())
            },
            stderr: String::new(),
        }
    }

    fn is_failed(&self, unit_name: &str, quiet: bool) -> Reply {
        let active = self.active_state(unit_name);
        Reply {
            code: if active == ActiveState::Failed {
                0
            } else {
                EXIT_FAILURE
            },
            stdout: if quiet {
                String::new()
            } else {
                format!("{}\n", active.word())
            },
            stderr: String::new(),
        }
    }

    fn is_enabled(&self, unit_name: &str, quiet: bool) -> Reply {
        if !self.unit_path(unit_name).exists() {
            return Reply::error(
                EXIT_FAILURE,
                format!("Failed to get unit file state for {unit_name}: No such file or directory"),
            );
        }
        let enabled = self.lock().get(unit_name).is_some_and(|s| s.enabled);
        let word = if enabled { "enabled" } else { "disabled" };
        Reply {
            code: if enabled { 0 } else { EXIT_FAILURE },
            stdout: if quiet { String::new() } else { format!("{word}\n") },
            stderr: String::new(),
        }
    }

    fn reset_failed(&self, unit_name: &str) -> Reply {
        let mut services = self.lock();
        for (name, service) in services.iter_mut() {
            if (unit_name.is_empty() || name == unit_name) && service.active == ActiveState::Failed {
                service.active = ActiveState::Inactive;
            }
        }
        Reply::ok()
    }

    fn status(&self, unit_name: &str) -> Reply {
        let path = self.unit_path(unit_name);
        if !path.exists() {
            return Reply::error(EXIT_NO_SUCH_UNIT, format!("Unit {unit_name} could not be found."));
        }
        let description = self
            .load(unit_name)
            .ok()
            .flatten()
            .and_then(|u| u.description)
            .unwrap_or_else(|| unit_name.to_string());
        let services = self.lock();
        let service = services.get(unit_name);
        let active = service.map(|s| s.active).unwrap_or_default();
        let enabled = if service.is_some_and(|s| s.enabled) {
            "enabled"
        } else {
            "disabled"
        };
        let mut text = format!(
            "* {unit_name} - {description}\n     Loaded: loaded ({}; {enabled})\n     Active: {}{}\n",
            path.display(),
            active.word(),
            if active == ActiveState::Active {
                " (running)"
            } else {
                ""
            },
        );
        if let Some(pid) = service.and_then(|s| s.pid) {
            text.push_str(&format!("   Main PID: {pid}\n"));
        }
        if let Some(exit) = service.and_then(|s| s.last_exit.as_ref()) {
            text.push_str(&format!("  Last exit: {exit}\n"));
        }
        Reply {
            code: if active == ActiveState::Active {
                0
            } else {
                EXIT_NOT_RUNNING
            },
            stdout: text,
            stderr: String::new(),
        }
    }
}

/// Send a signal by name with `kill(1)`: the crate forbids `unsafe`, so no raw `kill(2)`.
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// How many times the manager started `unit`'s main process under `pid_dir` (first start,
/// restarts, `Restart=` recoveries alike).
pub fn recorded_starts(pid_dir: &Path, unit: &str) -> usize {
    std::fs::read_to_string(pid_dir.join(format!("{}.starts", unit_name(unit))))
        .map(|text| text.lines().filter(|line| !line.trim().is_empty()).count())
        .unwrap_or(0)
}

/// The main PID the manager recorded for `unit` under `pid_dir`, if it runs.
pub fn recorded_main_pid(pid_dir: &Path, unit: &str) -> Option<u32> {
    std::fs::read_to_string(pid_dir.join(format!("{}.pid", unit_name(unit))))
        .ok()?
        .trim()
        .parse()
        .ok()
}
