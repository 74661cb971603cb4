//! The etcdadm stand-in: upstream's CLI and effects (`init`, `join <url>`, `reset`, and
//! `init|join phase <name>` for one phase), with real etcd run by the machine's service manager.
//!
//! As measured with upstream etcdadm and etcd 3.5.1 (docs/day2.md, "Learner joins"): `join` reuses
//! a member already listed with this machine's peer URL, such as a learner pre-added by the
//! EtcdadmCluster controller (no MemberAdd; etcd then starts as that learner), and adds a voter
//! otherwise; its last phase, `health`, makes a linearizable read, which a learner refuses, and
//! gives up [`membership::LEARNER_PATIENCE`] after etcd is ready unless the member was promoted
//! by then. Refusing a second learner, and a promotion before the learner is in sync, is etcd's
//! own doing.
//!
//! Where it differs from upstream etcdadm, and why:
//! - Addresses: upstream advertises the default-route interface's IP and also listens on
//!   `https://127.0.0.1:2379`. Every sim machine shares the host's network namespace, so a
//!   loopback listener would clash between machines: the stand-in advertises and listens only
//!   on the machine IP the runner passes in `SIM_MACHINE_IP` (`--bind-address`, as upstream,
//!   replaces that address for advertising, listening and the certificates), and its own health
//!   checks and `reset` use that address instead of 127.0.0.1.
//! - Install: no download. `--version` picks a local etcd by major.minor (see [`install`]);
//!   without `--version` the host's etcd is used (upstream would default to its built-in
//!   version). `--release-url` only appears in the error for an unavailable version.
//! - Member name: `--name`, else the hostname from the machine's private UTS namespace.
//! - Only `--init-system systemd` is supported (the stand-in `systemctl` plays systemd).
//! - Certificates: valid 365 days as upstream's, unless the machine runtime sets
//!   [`certs::CERT_VALIDITY_ENV`] (a scenario wanting members whose certificates expire soon).
//! - The unit starts `<--install-dir>/etcd`, as upstream's, but that is a link to a local etcd
//!   (upstream copies etcd and etcdctl out of the release archive it caches under
//!   `/var/cache/etcdadm`, and writes an `etcdctl.sh` wrapper beside them).
//! - Log lines carry Go `log` timestamps (upstream logs through logrus: `time=... level=...`).
//! - `init --snapshot`: upstream restores with etcd's library in its `snapshot` phase (into the
//!   data dir, as a one-member cluster of this name and peer URL, checking the hash unless
//!   `--skip-hash-check`), then configures and starts etcd on it; the stand-in runs the
//!   installed release's `etcdutl snapshot restore` (`etcdctl` for 3.4) with the same values.
//!   A restore whose revision the user data raised first (`restore-bump.sh`, docs/day2.md,
//!   "Revisions after a restore") hands over a database copied out of a data directory with
//!   `--skip-hash-check`, which both restore the same way.

pub mod certs;
pub mod cli;
pub mod config;
pub mod install;
pub mod membership;
pub mod phases;

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cli::{CliError, Invocation, Options};
use config::{ClusterState, MemberConfig};
use membership::MemberInfo;
use phases::{Phase, Verb};

use crate::log::go_log_line;

/// The environment variable carrying the machine's IP (set by the machine runner).
pub const MACHINE_IP_ENV: &str = "SIM_MACHINE_IP";
/// How long a started member may take to answer a linearizable read (a learner's refusal ends
/// it sooner: see [`membership::LEARNER_PATIENCE`]).
const HEALTH_BUDGET: Duration = Duration::from_secs(60);

/// Run `etcdadm <args>`; returns the process exit code. Messages go to stderr as upstream's do.
pub fn run(args: &[String]) -> i32 {
    let invocation = match cli::parse(args) {
        Ok(invocation) => invocation,
        Err(CliError::Usage(message)) => {
            eprintln!("Error: {message}\n{}", cli::usage());
            return 1;
        }
        Err(CliError::Panic(message)) => {
            eprintln!("panic: {message}\n\ngoroutine 1 [running]:");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!(
                "{}",
                go_log_line(&format!("[etcdadm] Error: starting the async runtime: {e}"))
            );
            return 1;
        }
    };
    let result = match invocation {
        Invocation::Help(text) => {
            println!("{text}");
            Ok(())
        }
        Invocation::Run {
            command,
            options,
            phases,
        } => runtime.block_on(run_phases(&command, &options, &phases)),
        Invocation::Reset(options) => runtime.block_on(reset(&options)),
    };
    match result {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("{}", go_log_line(&message));
            1
        }
    }
}

fn say(message: &str) {
    eprintln!("{}", go_log_line(message));
}

fn machine_ip() -> Result<IpAddr, String> {
    let text = std::env::var(MACHINE_IP_ENV).map_err(|_| {
        format!("[defaults] Error: {MACHINE_IP_ENV} is not set: the sim's etcdadm runs inside a sim machine")
    })?;
    text.parse()
        .map_err(|_| format!("[defaults] Error: {MACHINE_IP_ENV}={text:?} is not an IP address"))
}

/// The address the member advertises and listens on: `--bind-address` when it names one, as
/// upstream, else the machine's.
fn external_address(options: &Options) -> Result<IpAddr, String> {
    match options.bind_address.as_deref().map(str::parse::<IpAddr>) {
        Some(Ok(ip)) if !ip.is_unspecified() => Ok(ip),
        Some(Ok(_)) | None => machine_ip(),
        Some(Err(_)) => Err(format!(
            "[defaults] Error: --bind-address {:?} is not an IP address",
            options.bind_address.as_deref().unwrap_or_default()
        )),
    }
}

fn member_name(options: &Options) -> Result<String, String> {
    if let Some(name) = &options.name {
        return Ok(name.clone());
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .map_err(|e| format!("[defaults] Error: reading the hostname: {e}"))
}

fn check_init_system(options: &Options) -> Result<(), String> {
    if options.init_system == "systemd" {
        Ok(())
    } else {
        Err(format!(
            "[defaults] Error: init system {:?} is not supported by the sim (use systemd)",
            options.init_system
        ))
    }
}

fn systemctl(args: &[&str]) -> Result<bool, String> {
    let status = Command::new("systemctl")
        .args(args)
        .status()
        .map_err(|e| format!("running systemctl: {e}"))?;
    Ok(status.success())
}

/// Write `content` to `path` with file mode `mode` (upstream: 0600 for the env files, which hold
/// key paths, 0755 for the unit).
fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(path, content).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn gomaxprocs() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn remove_data_dir(phase: Phase, options: &Options) {
    say(&format!(
        "[{}] Removing existing data dir {:?}",
        phase.name(),
        options.data_dir.display().to_string()
    ));
    let _ = std::fs::remove_dir_all(&options.data_dir);
}

/// What every phase works with (upstream's `phaseInput`): the options and the defaults derived
/// from them, and the initial cluster once the membership (join) has decided it.
struct Member<'a> {
    command: &'a cli::Command,
    options: &'a Options,
    name: String,
    ip: IpAddr,
    /// `--initial-cluster-token` of a new cluster (init): the snapshot restore and etcd.env
    /// use the same one.
    token: String,
    initial_cluster: Option<String>,
}

/// Run `phases` of `command` in order; the first failure ends the run as `[<phase>] <error>`.
async fn run_phases(command: &cli::Command, options: &Options, phases: &[Phase]) -> Result<(), String> {
    check_init_system(options)?;
    let name = member_name(options)?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut member = Member {
        command,
        options,
        token: format!("{name}-{:x}", nanos & 0xffff_ffff),
        name,
        ip: external_address(options)?,
        initial_cluster: None,
    };
    for phase in phases {
        run_phase(*phase, &mut member)
            .await
            .map_err(|e| format!("[{}] {e}", phase.name()))?;
    }
    match command.verb() {
        Verb::Init if phases == Verb::Init.phases() => say("[cluster] etcd cluster initialized"),
        Verb::Join if phases == Verb::Join.phases() => say("[cluster] etcd member joined"),
        _ => {}
    }
    Ok(())
}

async fn run_phase(phase: Phase, member: &mut Member<'_>) -> Result<(), String> {
    // One arm per etcdadm phase, in the order etcdadm runs them.
    let options = member.options;
    match phase {
        Phase::Stop => disable_and_stop(),
        Phase::Install => {
            if member.command.verb() == Verb::Init {
                disable_and_stop()?;
                if options.data_dir.exists() {
                    remove_data_dir(phase, options);
                }
            }
            let release = install::resolve(options.version.as_deref(), &options.release_url)?;
            say(&format!(
                "[install] Installing etcd {} from {}",
                release.version,
                release.etcd.display()
            ));
            install::install(&release, &options.install_dir).map(drop)
        }
        Phase::Certificates => {
            let validity = certs::validity(std::env::var(certs::CERT_VALIDITY_ENV).ok().as_deref())?;
            certs::load_or_create_ca(&options.certs_dir)
                .and_then(|ca| {
                    certs::ensure_leaf_certificates(
                        &ca,
                        &options.certs_dir,
                        &certs::MemberIdentity {
                            name: &member.name,
                            ip: member.ip,
                            server_extra_sans: &options.server_cert_extra_sans,
                        },
                        validity,
                    )
                })
                .map_err(|e| format!("failed creating PKI assets: {e}"))
        }
        Phase::Snapshot => match &options.snapshot {
            Some(file) => {
                restore_snapshot(file, member).map_err(|e| format!("error restoring snapshot: {e}"))
            }
            None => Ok(()),
        },
        Phase::Membership => {
            let cli::Command::Join { endpoint } = member.command else {
                return Ok(());
            };
            if member.initial_cluster.is_none() {
                member.initial_cluster = Some(membership_phase(endpoint, member).await?);
            }
            Ok(())
        }
        Phase::Configure => {
            let config = member_config(member)?;
            write_file(
                Path::new(config::ENV_FILE),
                &config::render_env_file(&config),
                0o600,
            )?;
            write_file(
                Path::new(config::UNIT_FILE),
                &config::render_unit_file(&options.install_dir.join("etcd")),
                0o755,
            )
        }
        Phase::Start => {
            for step in [&["daemon-reload"][..], &["enable", "etcd"], &["start", "etcd"]] {
                if !systemctl(step)? {
                    return Err(format!(
                        "error starting etcd: `systemctl {}` failed",
                        step.join(" ")
                    ));
                }
            }
            Ok(())
        }
        Phase::Etcdctl => write_file(
            Path::new(config::ETCDCTL_ENV_FILE),
            &config::render_etcdctl_env(&options.certs_dir.display().to_string()),
            0o600,
        ),
        Phase::Health => {
            say("[health] Checking local etcd endpoint health");
            let tls = certs::etcdctl_tls(&options.certs_dir)?;
            let own = etcdadm_shared::names::client_url(&member.ip.to_string());
            membership::wait_healthy(&own, &tls, HEALTH_BUDGET)
                .await
                .map_err(|e| format!("local etcd endpoint is unhealthy: {e}"))?;
            say("[health] Local etcd endpoint is healthy");
            Ok(())
        }
        Phase::PostInitInstructions => {
            say("To add another member to the cluster, copy the CA cert/key to its certificate dir and run:");
            say(&format!(
                "\tetcdadm join {}",
                etcdadm_shared::names::client_url(&member.ip.to_string())
            ));
            Ok(())
        }
    }
}

/// `<name>=<peer URL>`: the one-member cluster `init` founds.
fn own_initial_cluster(member: &Member<'_>) -> String {
    let peer_url = etcdadm_shared::names::peer_url(&member.ip.to_string());
    format!("{}={peer_url}", member.name)
}

/// Restore `file` into the (removed by the install phase) data dir as this one-member cluster.
fn restore_snapshot(file: &Path, member: &Member<'_>) -> Result<(), String> {
    let options = member.options;
    if !file.is_file() {
        return Err(format!("snapshot file {} does not exist", file.display()));
    }
    let installed = options.install_dir.join("etcd");
    let etcdutl = std::fs::canonicalize(&installed)
        .ok()
        .and_then(|etcd| etcd.parent().map(|dir| dir.join("etcdutl")))
        .filter(|tool| tool.is_file());
    let tool = etcdutl.unwrap_or_else(|| options.install_dir.join("etcdctl"));
    say(&format!(
        "[snapshot] Restoring {} into {} with {}",
        file.display(),
        options.data_dir.display(),
        tool.display()
    ));
    let peer_url = etcdadm_shared::names::peer_url(&member.ip.to_string());
    let mut restore = Command::new(&tool);
    restore
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(file)
        .arg(format!("--data-dir={}", options.data_dir.display()))
        .arg(format!("--name={}", member.name))
        .arg(format!("--initial-cluster={}", own_initial_cluster(member)))
        .arg(format!("--initial-cluster-token={}", member.token))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"));
    if options.skip_hash_check {
        restore.arg("--skip-hash-check");
    }
    let output = restore
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} snapshot restore exited with {}: {}",
            tool.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(())
}

fn disable_and_stop() -> Result<(), String> {
    if systemctl(&["is-enabled", "--quiet", "etcd"]).unwrap_or(false) && !systemctl(&["disable", "etcd"])? {
        return Err("error disabling and stopping etcd service: `systemctl disable etcd` failed".into());
    }
    if systemctl(&["is-active", "--quiet", "etcd"])? && !systemctl(&["stop", "etcd"])? {
        return Err("error disabling and stopping etcd service: `systemctl stop etcd` failed".into());
    }
    Ok(())
}

/// What `etcd.env` says for this member: init founds a one-member cluster, join enters the
/// cluster its membership phase found.
fn member_config(member: &Member<'_>) -> Result<MemberConfig, String> {
    let options = member.options;
    let (initial_cluster, state) = match member.command {
        cli::Command::Init => (
            own_initial_cluster(member),
            ClusterState::New {
                token: member.token.clone(),
            },
        ),
        cli::Command::Join { .. } => (
            member
                .initial_cluster
                .clone()
                .ok_or("the membership phase has not run")?,
            ClusterState::Existing,
        ),
    };
    let listen = options
        .bind_address
        .clone()
        .filter(|b| b.parse::<IpAddr>().is_ok_and(|ip| !ip.is_unspecified()))
        .unwrap_or_else(|| member.ip.to_string());
    Ok(MemberConfig {
        name: member.name.clone(),
        advertise_address: member.ip.to_string(),
        listen_address: listen,
        certs_dir: options.certs_dir.display().to_string(),
        data_dir: options.data_dir.display().to_string(),
        initial_cluster,
        state,
        gomaxprocs: gomaxprocs(),
    })
}

/// Upstream's join membership: a member already listed with this machine's peer URL (added by
/// an earlier run, or pre-added as a learner) is used as it is; otherwise a voter is added.
/// Returns the initial cluster etcd starts with.
async fn membership_phase(endpoint: &str, member: &Member<'_>) -> Result<String, String> {
    let options = member.options;
    let tls = certs::etcdctl_tls(&options.certs_dir)?;
    let peer_url = etcdadm_shared::names::peer_url(&member.ip.to_string());
    say("[membership] Checking if this member was added");
    let members = membership::list_members(endpoint, &tls)
        .await
        .map_err(|e| format!("error listing members: {e}"))?;
    let (local, members) = match membership::member_for_peer_url(&members, &peer_url) {
        Some(local) => {
            say("[membership] Member was added");
            (local.clone(), members.clone())
        }
        None => {
            say("[membership] Member was not added");
            remove_data_dir(Phase::Membership, options);
            say("[membership] Adding member");
            membership::add_member(endpoint, &tls, &peer_url, options.retry).await?
        }
    };
    say("[membership] Checking if member was started");
    if local.started() {
        say("[membership] Member was started");
        say(&format!(
            "[membership] Keeping existing data dir {:?}",
            options.data_dir.display().to_string()
        ));
        return Ok(cluster_string(&members));
    }
    say("[membership] Member was not started");
    remove_data_dir(Phase::Membership, options);
    let mut desired: Vec<MemberInfo> = members.into_iter().filter(|m| m.id != local.id).collect();
    desired.push(MemberInfo {
        id: local.id,
        name: member.name.clone(),
        peer_urls: vec![peer_url],
    });
    Ok(cluster_string(&desired))
}

fn cluster_string(members: &[MemberInfo]) -> String {
    config::initial_cluster(members.iter().map(|m| (m.name.as_str(), m.peer_urls.as_slice())))
}

async fn reset(options: &Options) -> Result<(), String> {
    let active = systemctl(&["is-active", "--quiet", "etcd"])?;
    if !active {
        say("[reset] etcd service is not running");
        say("[membership] Assuming that the member was removed");
    } else {
        say("[reset] etcd service is running");
        if !options.skip_remove_member {
            let ip = machine_ip()?;
            let own = etcdadm_shared::names::client_url(&ip.to_string());
            let peer_url = etcdadm_shared::names::peer_url(&ip.to_string());
            let tls =
                certs::etcdctl_tls(&options.certs_dir).map_err(|e| format!("[membership] Error: {e}"))?;
            say("[membership] Checking if this member was removed");
            let members = membership::list_members(&own, &tls)
                .await
                .map_err(|e| format!("[membership] Error listing members: {e}"))?;
            match membership::member_for_peer_url(&members, &peer_url) {
                Some(local) if members.len() > 1 => {
                    say("[membership] Member was not removed");
                    say("[membership] Removing member");
                    membership::remove_member(&own, &tls, local.id).await?;
                }
                Some(_) => say("[membership] Not removing member because it is the last in the cluster"),
                None => say("[membership] Member was removed"),
            }
        }
        if !systemctl(&["stop", "etcd"])? {
            return Err("[reset] Error stopping existing etcd service".into());
        }
    }
    if systemctl(&["is-enabled", "--quiet", "etcd"]).unwrap_or(false) {
        systemctl(&["disable", "etcd"])?;
    }
    for dir in [&options.data_dir, &options.certs_dir] {
        if let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            say(&format!("{}: {e}", dir.display()));
        }
    }
    for file in [config::UNIT_FILE, config::ENV_FILE, config::ETCDCTL_ENV_FILE] {
        let _ = std::fs::remove_file(file);
    }
    install::uninstall(&options.install_dir);
    say("[cluster] etcd reset complete");
    Ok(())
}
