//! A network of its own for each real-etcdadm machine: the host gets a bridge on two private
//! subnets, each machine a network namespace joined to it by a veth pair, so etcdadm sees an
//! interface holding the default route, as on a cloud VM. Nothing reaches those subnets unless
//! the bridge exists: the host keeps `unreachable` routes for them, and [`guard`] refuses a
//! test's client call when the bridge is gone.
//!
//! Everything created carries a prefix no other software uses (links `eadm…`, namespaces
//! `etcdadm-sim.…`), and the bridge's alias names its owner process (PID and start time): a
//! sweep at every start removes whatever a killed test left behind, and only that.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::MachineError;

/// First two octets of the subnet machines are reached on (`10.213.<lab>.0/24`).
pub const PRIMARY_NET: [u8; 2] = [10, 213];
/// First two octets of the second subnet (`10.214.<lab>.0/24`), for machines whose default
/// route is on a second interface.
pub const SECONDARY_NET: [u8; 2] = [10, 214];
/// Host numbers of the bridge's own address and of the first and last address handed out.
pub const GATEWAY_HOST: u8 = 1;
pub const FIRST_HOST: u8 = 2;
/// Addresses above this are for service namespaces (an S3 store, ...), not machines.
pub const LAST_MACHINE_HOST: u8 = 239;
/// Prefix of every link this module creates.
pub const LINK_PREFIX: &str = "eadm";
/// Prefix of every network namespace this module creates (`/run/netns/<name>`).
pub const NETNS_PREFIX: &str = "etcdadm-sim.";
const NETNS_DIR: &str = "/run/netns";
const ALIAS_PREFIX: &str = "etcdadm-sim owner=";
/// Held while a lab's bridge is created (two steps: the link, then its alias) and while the
/// sweep decides, so a sweep never takes a bridge whose alias is not set yet.
const LOCK_FILE: &str = "/tmp/etcdadm-sim-network.lock";
/// Metric of the host's `unreachable` routes: any real route to the subnets wins over them.
const GUARD_METRIC: &str = "4000";

/// `eadmbr<lab>`.
pub fn bridge_name(lab: u8) -> String {
    format!("{LINK_PREFIX}br{lab}")
}

/// Host side of a machine's veth: `eadm<lab>v<host>` (first interface), `eadm<lab>w<host>`
/// (second). At most 15 characters, the kernel's limit.
pub fn host_veth_name(lab: u8, host: u8, second: bool) -> String {
    format!("{LINK_PREFIX}{lab}{}{host}", if second { 'w' } else { 'v' })
}

/// `etcdadm-sim.<lab>.<name>`.
pub fn netns_name(lab: u8, name: &str) -> String {
    format!("{NETNS_PREFIX}{lab}.{name}")
}

/// The lab a namespace of ours belongs to, from its name.
pub fn lab_of_netns(netns: &str) -> Option<u8> {
    netns.strip_prefix(NETNS_PREFIX)?.split('.').next()?.parse().ok()
}

/// The lab a link of ours belongs to (`eadmbr7` → 7, `eadm7v12` → 7), from its name.
pub fn lab_of_link(link: &str) -> Option<u8> {
    let rest = link.strip_prefix(LINK_PREFIX)?;
    if let Some(lab) = rest.strip_prefix("br") {
        return lab.parse().ok();
    }
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    let marker_ok = after.starts_with(['v', 'w']) && after[1..].parse::<u8>().is_ok();
    marker_ok.then(|| digits.parse().ok()).flatten()
}

/// `<net>.<lab>.<host>`.
pub fn address(net: [u8; 2], lab: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(net[0], net[1], lab, host)
}

/// Whether `ip` lies in the subnets any lab may use (`10.213.0.0/16`, `10.214.0.0/16`).
pub fn in_lab_range(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            [a, b] == PRIMARY_NET || [a, b] == SECONDARY_NET
        }
        IpAddr::V6(_) => false,
    }
}

/// The bridge's alias: who owns the lab.
pub fn owner_alias(owner: ProcessIdentity) -> String {
    format!("{ALIAS_PREFIX}{} start={}", owner.pid, owner.start_ticks)
}

/// The owner an alias names, if it is one of ours.
pub fn parse_owner_alias(alias: &str) -> Option<ProcessIdentity> {
    let rest = alias.trim().strip_prefix(ALIAS_PREFIX)?;
    let (pid, start) = rest.split_once(" start=")?;
    Some(ProcessIdentity {
        pid: pid.parse().ok()?,
        start_ticks: start.parse().ok()?,
    })
}

/// A process, told apart from a later one with the same PID by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot the process started.
    pub start_ticks: u64,
}

impl ProcessIdentity {
    /// This process.
    pub fn current() -> Option<ProcessIdentity> {
        Self::of(std::process::id())
    }

    /// Process `pid`, if it runs.
    pub fn of(pid: u32) -> Option<ProcessIdentity> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        start_ticks_from_stat(&stat).map(|start_ticks| ProcessIdentity { pid, start_ticks })
    }

    /// Whether this very process still runs.
    pub fn alive(self) -> bool {
        ProcessIdentity::of(self.pid) == Some(self)
    }
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line; the command name may hold spaces.
pub fn start_ticks_from_stat(stat: &str) -> Option<u64> {
    let after_comm = stat.rsplit_once(')')?.1;
    // Fields after the name start at field 3 (state): starttime is the 20th of them.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// What the sweep found to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    pub namespaces: Vec<String>,
    pub links: Vec<String>,
}

/// What of ours is stale: every namespace and link of a lab whose bridge is missing, has no
/// owner alias, or whose owner process is gone. `owner_alive` answers for an alias's owner.
pub fn plan_sweep(
    links: &[(String, String)],
    namespaces: &[String],
    owner_alive: impl Fn(ProcessIdentity) -> bool,
) -> SweepPlan {
    let live_labs: Vec<u8> = links
        .iter()
        .filter(|(name, _)| name.starts_with(&format!("{LINK_PREFIX}br")))
        .filter(|(_, alias)| parse_owner_alias(alias).is_some_and(&owner_alive))
        .filter_map(|(name, _)| lab_of_link(name))
        .collect();
    let stale = |lab: Option<u8>| lab.is_none_or(|lab| !live_labs.contains(&lab));
    SweepPlan {
        namespaces: namespaces
            .iter()
            .filter(|n| n.starts_with(NETNS_PREFIX) && stale(lab_of_netns(n)))
            .cloned()
            .collect(),
        links: links
            .iter()
            .map(|(name, _)| name)
            .filter(|n| n.starts_with(LINK_PREFIX) && lab_of_link(n).is_some() && stale(lab_of_link(n)))
            .cloned()
            .collect(),
    }
}

fn ip_command(args: &[&str]) -> Result<String, MachineError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| MachineError::Spawn {
            program: "ip".into(),
            reason: format!("{e}; the real-etcdadm machines need iproute2 and root"),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(MachineError::Network(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Links named with our prefix, with their aliases.
fn our_links() -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(LINK_PREFIX))
        .map(|name| {
            let alias = std::fs::read_to_string(format!("/sys/class/net/{name}/ifalias")).unwrap_or_default();
            (name, alias.trim().to_string())
        })
        .collect()
}

/// Network namespaces named with our prefix.
fn our_namespaces() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(NETNS_PREFIX))
        .collect()
}

/// Kill (SIGKILL) every process in namespace `netns` and wait until none is left.
pub fn kill_namespace_processes(netns: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<String> = ip_command(&["netns", "pids", netns])
            .map(|out| out.split_whitespace().map(String::from).collect())
            .unwrap_or_default();
        let alive: Vec<&String> = pids.iter().filter(|pid| !is_zombie(pid)).collect();
        if alive.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in alive {
            let _ = Command::new("kill")
                .args(["-KILL", pid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_zombie(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next());
            matches!(state, Some(Some('Z' | 'X')))
        })
        .unwrap_or(true)
}

fn delete_namespace(netns: &str) {
    kill_namespace_processes(netns);
    // Deleting the namespace takes the veth pairs with it (both ends).
    let _ = ip_command(&["netns", "delete", netns]);
}

/// The lock every lab creation and sweep holds (released when the file is dropped): whoever
/// builds or inspects our links and namespaces by hand holds it too.
pub fn network_lock() -> Result<std::fs::File, MachineError> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .map_err(MachineError::io(LOCK_FILE))?;
    file.lock().map_err(MachineError::io(LOCK_FILE))?;
    Ok(file)
}

/// Remove everything of ours that no live test owns. Returns what was removed.
pub fn sweep_stale() -> Result<SweepPlan, MachineError> {
    let _lock = network_lock()?;
    Ok(sweep_locked())
}

fn sweep_locked() -> SweepPlan {
    let plan = plan_sweep(&our_links(), &our_namespaces(), ProcessIdentity::alive);
    for netns in &plan.namespaces {
        delete_namespace(netns);
    }
    for link in &plan.links {
        let _ = ip_command(&["link", "delete", link]);
    }
    if !our_links()
        .iter()
        .any(|(name, _)| name.starts_with(&format!("{LINK_PREFIX}br")))
    {
        for net in [PRIMARY_NET, SECONDARY_NET] {
            let _ = ip_command(&[
                "route",
                "delete",
                "unreachable",
                &guard_route(net),
                "metric",
                GUARD_METRIC,
            ]);
        }
    }
    plan
}

fn guard_route(net: [u8; 2]) -> String {
    format!("{}.{}.0.0/16", net[0], net[1])
}

/// Refuse a test's client call to `url` (or a bare address) inside the labs' subnets unless the
/// bridge of that subnet exists: without it the host would route the traffic elsewhere.
pub fn guard(url: &str) -> Result<(), String> {
    let Some(ip) = host_of(url) else {
        return Ok(());
    };
    if !in_lab_range(ip) {
        return Ok(());
    }
    let IpAddr::V4(v4) = ip else { return Ok(()) };
    let lab = v4.octets()[2];
    if Path::new("/sys/class/net").join(bridge_name(lab)).exists() {
        Ok(())
    } else {
        Err(format!(
            "refusing to contact {url}: bridge {} of its lab is gone, so {ip} is no machine of this test",
            bridge_name(lab)
        ))
    }
}

/// The IP address in `https://10.213.4.2:2379/...` or `10.213.4.2`.
pub fn host_of(url: &str) -> Option<IpAddr> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    host.parse().ok()
}

/// One lab: its bridge on `10.213.<lab>.1/24` and `10.214.<lab>.1/24`, and the namespaces on
/// it. Dropping it kills every process in them and removes namespaces, veths and bridge.
#[derive(Debug)]
pub struct Lab {
    id: u8,
}

/// A namespace on a lab's bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    /// Address of the first interface (`eth0`), on the primary subnet.
    pub address: Ipv4Addr,
    /// Address of the second interface (`eth1`) when it holds the default route.
    pub second_address: Option<Ipv4Addr>,
}

impl Namespace {
    /// `/run/netns/<name>`, what `nsenter --net=` takes.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// The command prefix running a program in this namespace (network only).
    pub fn enter_command(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net={}", self.path().display()),
            "--".into(),
        ]
    }
}

impl Lab {
    /// Sweep what killed tests left, then create lab `id`'s bridge. Refused while a live process
    /// owns the lab.
    pub fn create(id: u8) -> Result<Lab, MachineError> {
        if id == 0 {
            return Err(MachineError::Network("lab 0 is reserved: use 1..=255".into()));
        }
        let _lock = network_lock()?;
        sweep_locked();
        let bridge = bridge_name(id);
        if let Some((_, alias)) = our_links().into_iter().find(|(name, _)| *name == bridge) {
            return Err(MachineError::Network(format!(
                "lab {id} (bridge {bridge}) is in use by another test ({alias}); pick another prefix"
            )));
        }
        let owner = ProcessIdentity::current()
            .ok_or_else(|| MachineError::Network("cannot read /proc/self/stat".into()))?;
        ip_command(&["link", "add", &bridge, "type", "bridge"])?;
        // A partition a killed test left would cut this lab off too.
        clear_partition(id);
        let configured = Self::configure_bridge(id, &bridge, owner);
        if configured.is_err() {
            let _ = ip_command(&["link", "delete", &bridge]);
        }
        configured.map(|()| Lab { id })
    }

    fn configure_bridge(id: u8, bridge: &str, owner: ProcessIdentity) -> Result<(), MachineError> {
        ip_command(&["link", "set", "dev", bridge, "alias", &owner_alias(owner)])?;
        for net in [PRIMARY_NET, SECONDARY_NET] {
            let gateway = format!("{}/24", address(net, id, GATEWAY_HOST));
            ip_command(&["address", "add", &gateway, "dev", bridge])?;
        }
        ip_command(&["link", "set", "dev", bridge, "up"])?;
        for net in [PRIMARY_NET, SECONDARY_NET] {
            ip_command(&[
                "route",
                "replace",
                "unreachable",
                &guard_route(net),
                "metric",
                GUARD_METRIC,
            ])?;
        }
        Ok(())
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    /// Cut the host (the management side: controllers, test clients) off from the lab's
    /// machines while the machines keep reaching one another over the bridge: `prohibit` routes
    /// for the primary subnet, more specific than the bridge's /24, so the host's packets to a
    /// machine are refused at once and the bridge forwards the machines' own.
    pub fn cut_off_host(&self) -> Result<(), MachineError> {
        for route in partition_routes(self.id) {
            ip_command(&["route", "replace", "prohibit", &route])?;
        }
        Ok(())
    }

    /// Undo [`Lab::cut_off_host`] (nothing to undo is fine).
    pub fn reconnect_host(&self) {
        clear_partition(self.id);
    }

    /// Whether the bridge still exists (see [`guard`]).
    pub fn bridge_exists(&self) -> bool {
        Path::new("/sys/class/net").join(bridge_name(self.id)).exists()
    }

    /// The bridge's address on the primary subnet.
    pub fn gateway(&self) -> Ipv4Addr {
        address(PRIMARY_NET, self.id, GATEWAY_HOST)
    }

    /// Create namespace `name` with `eth0` at `<primary>.<host>/24` and `lo` up; the default
    /// route goes via the bridge on `eth0`, or, with `second_interface`, on an `eth1` at
    /// `<secondary>.<host>/24`. A stale namespace of the same name is replaced.
    pub fn add_namespace(
        &self,
        name: &str,
        host: u8,
        second_interface: bool,
    ) -> Result<Namespace, MachineError> {
        if !(FIRST_HOST..=254).contains(&host) {
            return Err(MachineError::Network(format!(
                "host number {host} is outside {FIRST_HOST}..=254"
            )));
        }
        let netns = netns_name(self.id, name);
        if our_namespaces().contains(&netns) {
            delete_namespace(&netns);
        }
        ip_command(&["netns", "add", &netns])?;
        let created = Namespace {
            name: netns.clone(),
            address: address(PRIMARY_NET, self.id, host),
            second_address: second_interface.then(|| address(SECONDARY_NET, self.id, host)),
        };
        let result = self.wire(&created, host);
        if result.is_err() {
            delete_namespace(&netns);
        }
        result.map(|()| created)
    }

    fn wire(&self, ns: &Namespace, host: u8) -> Result<(), MachineError> {
        let bridge = bridge_name(self.id);
        let netns = ns.name.as_str();
        let mut interfaces = vec![(
            "eth0",
            host_veth_name(self.id, host, false),
            ns.address,
            PRIMARY_NET,
        )];
        if let Some(second) = ns.second_address {
            interfaces.push(("eth1", host_veth_name(self.id, host, true), second, SECONDARY_NET));
        }
        for (inner, outer, addr, _) in &interfaces {
            let _ = ip_command(&["link", "delete", outer]);
            ip_command(&[
                "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns,
            ])?;
            ip_command(&["link", "set", "dev", outer, "master", &bridge, "up"])?;
            ip_command(&["-n", netns, "address", "add", &format!("{addr}/24"), "dev", inner])?;
            ip_command(&["-n", netns, "link", "set", "dev", inner, "up"])?;
        }
        ip_command(&["-n", netns, "link", "set", "dev", "lo", "up"])?;
        let (inner, _, _, net) = interfaces
            .last()
            .ok_or_else(|| MachineError::Network("no interface".into()))?;
        let via = address(*net, self.id, GATEWAY_HOST).to_string();
        ip_command(&["-n", netns, "route", "add", "default", "via", &via, "dev", inner])?;
        Ok(())
    }

    /// Kill everything in `namespace` and remove it (with its veths).
    pub fn remove(&self, namespace: &Namespace) {
        delete_namespace(&namespace.name);
    }
}

/// The two halves of lab `id`'s primary subnet, as [`Lab::cut_off_host`] routes them.
fn partition_routes(id: u8) -> [String; 2] {
    [0, 128].map(|host| format!("{}/25", address(PRIMARY_NET, id, host)))
}

/// Remove lab `id`'s partition routes, if any.
fn clear_partition(id: u8) {
    for route in partition_routes(id) {
        let _ = ip_command(&["route", "delete", "prohibit", &route]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.reconnect_host();
        let prefix = netns_name(self.id, "");
        for netns in our_namespaces().iter().filter(|n| n.starts_with(&prefix)) {
            delete_namespace(netns);
        }
        for (link, _) in our_links() {
            if lab_of_link(&link) == Some(self.id) {
                let _ = ip_command(&["link", "delete", &link]);
            }
        }
        let _ = sweep_stale();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernels_limit_and_read_back() {
        assert_eq!(bridge_name(255), "eadmbr255");
        assert_eq!(host_veth_name(255, 254, true), "eadm255w254");
        assert!(host_veth_name(255, 254, false).len() <= 15);
        assert_eq!(lab_of_link("eadmbr7"), Some(7));
        assert_eq!(lab_of_link("eadm7v12"), Some(7));
        assert_eq!(lab_of_link("eadm7w12"), Some(7));
        assert_eq!(lab_of_link("eadm7x12"), None);
        assert_eq!(lab_of_link("eth0"), None);
        assert_eq!(netns_name(7, "c1-etcd-abcde"), "etcdadm-sim.7.c1-etcd-abcde");
        assert_eq!(lab_of_netns("etcdadm-sim.7.c1-etcd-abcde"), Some(7));
        assert_eq!(lab_of_netns("other"), None);
    }

    #[test]
    fn owner_aliases_round_trip() {
        let owner = ProcessIdentity {
            pid: 42,
            start_ticks: 9001,
        };
        assert_eq!(parse_owner_alias(&owner_alias(owner)), Some(owner));
        assert_eq!(parse_owner_alias("something else"), None);
    }

    #[test]
    fn start_time_is_read_past_a_command_name_with_spaces() {
        let stat = "123 (a b) c) S 1 123 123 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10";
        assert_eq!(start_ticks_from_stat(stat), Some(777));
        assert!(ProcessIdentity::current().is_some_and(ProcessIdentity::alive));
    }

    #[test]
    fn the_sweep_takes_only_what_no_live_owner_holds() {
        let live = ProcessIdentity {
            pid: 1,
            start_ticks: 1,
        };
        let dead = ProcessIdentity {
            pid: 2,
            start_ticks: 2,
        };
        let links = vec![
            ("eadmbr3".to_string(), owner_alias(live)),
            ("eadm3v2".to_string(), String::new()),
            ("eadmbr4".to_string(), owner_alias(dead)),
            ("eadm4v2".to_string(), String::new()),
            ("eadm5v9".to_string(), String::new()),
            ("eadmfoo".to_string(), String::new()),
        ];
        let namespaces = vec![
            "etcdadm-sim.3.m1".to_string(),
            "etcdadm-sim.4.m1".to_string(),
            "etcdadm-sim.6.m1".to_string(),
            "someone-else".to_string(),
        ];
        let plan = plan_sweep(&links, &namespaces, |owner| owner == live);
        assert_eq!(plan.namespaces, ["etcdadm-sim.4.m1", "etcdadm-sim.6.m1"]);
        assert_eq!(plan.links, ["eadmbr4", "eadm4v2", "eadm5v9"]);
    }

    #[test]
    fn only_lab_addresses_are_guarded() {
        assert_eq!(
            host_of("https://10.213.4.2:2379"),
            Some("10.213.4.2".parse().unwrap())
        );
        assert_eq!(host_of("10.214.4.2"), Some("10.214.4.2".parse().unwrap()));
        assert_eq!(host_of("https://[::1]:2379/x"), Some("::1".parse().unwrap()));
        assert!(guard("https://127.0.0.1:2379").is_ok());
        assert!(guard("https://example.invalid:2379").is_ok());
        // Lab 0 is never created.
        let refused = guard("https://10.213.0.9:2379").unwrap_err();
        assert!(refused.contains("eadmbr0"), "{refused}");
        assert!(in_lab_range("10.214.9.9".parse().unwrap()));
        assert!(!in_lab_range("10.215.9.9".parse().unwrap()));
    }
}
