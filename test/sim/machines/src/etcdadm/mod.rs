//! The etcdadm stand-in: upstream's CLI and effects (`init`, `join <url>`, `reset`), with real
//! etcd run by the machine's service manager.
//!
//! Where it differs from upstream etcdadm, and why:
//! - Addresses: upstream advertises the default-route interface's IP and also listens on
//!   `https://127.0.0.1:2379`. Every sim machine shares the host's network namespace, so a
//!   loopback listener would clash between machines: the stand-in advertises and listens only
//!   on the machine IP the runner passes in `SIM_MACHINE_IP` (`--bind-address` overrides the
//!   listen address), and its own health checks and `reset` use that address instead of
//!   127.0.0.1.
//! - Install: no download. `--version` picks a local etcd by major.minor (see [`install`]);
//!   without `--version` the host's etcd is used (upstream would default to its built-in
//!   version). `--release-url` only appears in the error for an unavailable version.
//! - Member name: `--name`, else the hostname from the machine's private UTS namespace.
//! - Only `--init-system systemd` is supported (the stand-in `systemctl` plays systemd).

pub mod certs;
pub mod cli;
pub mod config;
pub mod install;
pub mod membership;

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cli::{Invocation, Options};
use config::{ClusterState, MemberConfig};
use membership::MemberInfo;

use crate::log::go_log_line;

/// The environment variable carrying the machine's IP (set by the machine runner).
pub const MACHINE_IP_ENV: &str = "SIM_MACHINE_IP";
/// How long a started member may take to answer a linearizable read.
const HEALTH_BUDGET: Duration = Duration::from_secs(60);

/// Run `etcdadm <args>`; returns the process exit code. Messages go to stderr as upstream's do.
pub fn run(args: &[String]) -> i32 {
    let invocation = match cli::parse(args) {
        Ok(invocation) => invocation,
        Err(message) => {
            eprintln!("Error: {message}\n{}", cli::usage());
            return 1;
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
        Invocation::Help => {
            println!("{}", cli::usage());
            Ok(())
        }
        Invocation::Init(options) => runtime.block_on(init(&options)),
        Invocation::Join { endpoint, options } => runtime.block_on(join(&endpoint, &options)),
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
        .map_err(|e| format!("[start] Error: running systemctl: {e}"))?;
    Ok(status.success())
}

fn write_file(path: &Path, content: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("[configure] Error: {}: {e}", parent.display()))?;
    }
    std::fs::write(path, content).map_err(|e| format!("[configure] Error: {}: {e}", path.display()))
}

fn gomaxprocs() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn remove_data_dir(options: &Options) {
    say(&format!(
        "[membership] Removing existing data dir {:?}",
        options.data_dir.display().to_string()
    ));
    let _ = std::fs::remove_dir_all(&options.data_dir);
}

/// Everything shared by init and join before the membership step.
struct Prepared {
    name: String,
    ip: IpAddr,
    listen: String,
    etcd: std::path::PathBuf,
}

fn prepare(options: &Options) -> Result<Prepared, String> {
    check_init_system(options)?;
    let ip = machine_ip()?;
    let name = member_name(options)?;
    let release = install::resolve(options.version.as_deref(), &options.release_url)?;
    say(&format!(
        "[install] Installing etcd {} from {}",
        release.version,
        release.etcd.display()
    ));
    let etcd = install::install(&release, &options.install_dir)?;
    let ca = certs::load_or_create_ca(&options.certs_dir)?;
    certs::ensure_leaf_certificates(&ca, &options.certs_dir, &name, ip)?;
    let listen = options
        .bind_address
        .clone()
        .filter(|b| b.parse::<IpAddr>().is_ok_and(|ip| !ip.is_unspecified()))
        .unwrap_or_else(|| ip.to_string());
    Ok(Prepared {
        name,
        ip,
        listen,
        etcd,
    })
}

fn member_config(
    prepared: &Prepared,
    options: &Options,
    initial_cluster: String,
    state: ClusterState,
) -> MemberConfig {
    MemberConfig {
        name: prepared.name.clone(),
        advertise_address: prepared.ip.to_string(),
        listen_address: prepared.listen.clone(),
        certs_dir: options.certs_dir.display().to_string(),
        data_dir: options.data_dir.display().to_string(),
        initial_cluster,
        state,
        gomaxprocs: gomaxprocs(),
    }
}

async fn configure_and_start(
    config: &MemberConfig,
    prepared: &Prepared,
    options: &Options,
) -> Result<(), String> {
    write_file(Path::new(config::ENV_FILE), &config::render_env_file(config))?;
    write_file(
        Path::new(config::UNIT_FILE),
        &config::render_unit_file(&prepared.etcd),
    )?;
    write_file(
        Path::new(config::ETCDCTL_ENV_FILE),
        &config::render_etcdctl_env(&config.certs_dir),
    )?;
    for step in [&["daemon-reload"][..], &["enable", "etcd"], &["start", "etcd"]] {
        if !systemctl(step)? {
            return Err(format!("[start] Error: `systemctl {}` failed", step.join(" ")));
        }
    }
    say("[health] Checking local etcd endpoint health");
    let tls = certs::etcdctl_tls(&options.certs_dir)?;
    let deadline = Instant::now() + HEALTH_BUDGET;
    loop {
        match membership::check_health(&config.client_url(), &tls).await {
            Ok(()) => {
                say("[health] Local etcd endpoint is healthy");
                return Ok(());
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("[health] Local etcd endpoint is unhealthy: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

async fn init(options: &Options) -> Result<(), String> {
    let prepared = prepare(options)?;
    let peer_url = etcdadm_shared::names::peer_url(&prepared.ip.to_string());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let token = format!("{}-{:x}", prepared.name, nanos & 0xffff_ffff);
    let config = member_config(
        &prepared,
        options,
        format!("{}={peer_url}", prepared.name),
        ClusterState::New { token },
    );
    configure_and_start(&config, &prepared, options).await?;
    say("[cluster] etcd cluster initialized");
    Ok(())
}

async fn join(endpoint: &str, options: &Options) -> Result<(), String> {
    check_init_system(options)?;
    if systemctl(&["is-active", "--quiet", "etcd"])? {
        systemctl(&["stop", "etcd"])?;
    }
    if systemctl(&["is-enabled", "--quiet", "etcd"]).unwrap_or(false) {
        systemctl(&["disable", "etcd"])?;
    }
    let prepared = prepare(options)?;
    let tls = certs::etcdctl_tls(&options.certs_dir)?;
    let peer_url = etcdadm_shared::names::peer_url(&prepared.ip.to_string());
    say("[membership] Checking if this member was added");
    let members = membership::list_members(endpoint, &tls)
        .await
        .map_err(|e| format!("[membership] Error listing members: {e}"))?;
    let (local, members) = match membership::member_for_peer_url(&members, &peer_url) {
        Some(local) => {
            say("[membership] Member was added");
            (local.clone(), members.clone())
        }
        None => {
            say("[membership] Member was not added");
            remove_data_dir(options);
            say("[membership] Adding member");
            membership::add_member(endpoint, &tls, &peer_url, options.retry).await?
        }
    };
    let initial_cluster = if local.started() {
        say("[membership] Member was started; keeping the data dir");
        cluster_string(&members)
    } else {
        say("[membership] Member was not started");
        remove_data_dir(options);
        let mut desired: Vec<MemberInfo> = members.into_iter().filter(|m| m.id != local.id).collect();
        desired.push(MemberInfo {
            id: local.id,
            name: prepared.name.clone(),
            peer_urls: vec![peer_url.clone()],
        });
        cluster_string(&desired)
    };
    let config = member_config(&prepared, options, initial_cluster, ClusterState::Existing);
    configure_and_start(&config, &prepared, options).await?;
    say("[cluster] etcd member joined");
    Ok(())
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
            let tls = certs::etcdctl_tls(&options.certs_dir)?;
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
