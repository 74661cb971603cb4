#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Process machines end to end: real etcd behind the stand-ins, real TLS, real namespaces.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use etcdadm_bootstrap::render::{
    CaFiles, EtcdadmCommand, LEARNER_JOIN_SCRIPT, LearnerJoin, RenderInput, ResolvedSecrets, render_user_data,
};
use etcdadm_shared::api::config::EtcdadmConfigSpec;
use etcdadm_shared::etcd::{EtcdTls, Member, MemberClient, Refusal};
use etcdadm_shared::pki::{CertificateAuthority, IssuedCertificate, KeyType, LeafRequest, cert_not_after};
use etcdadm_shared::testing::{TempDir, etcd_binary, free_loopback_ip, mtls_http_client};
use etcdadm_sim_machines::{
    BuiltInRuntime, ExternalRuntime, Fault, MachineRuntime, MachineSpec, MachineState,
};

const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

fn require_etcd() {
    if let Err(hint) = etcd_binary() {
        panic!("{hint}");
    }
}

/// YAML block scalar lines for `content: |`.
fn block(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

/// User data in the shape the bootstrap provider renders (docs/bootstrap.md).
fn user_data(ca_cert: &str, ca_key: &str, extra_files: &str, runcmd: &[&str]) -> String {
    let mut text = String::from("## template: jinja\n#cloud-config\nwrite_files:\n");
    text.push_str("  - path: \"/etc/etcd/pki/ca.crt\"\n    owner: \"root:root\"\n    permissions: \"0640\"\n    content: |\n");
    text.push_str(&block(ca_cert));
    text.push_str("  - path: \"/etc/etcd/pki/ca.key\"\n    owner: \"root:root\"\n    permissions: \"0600\"\n    content: |\n");
    text.push_str(&block(ca_key));
    text.push_str(extra_files);
    text.push_str("  - path: \"/run/cluster-api/placeholder\"\n    owner: \"root:root\"\n    permissions: \"0640\"\n    content: \"Exists so that /run/cluster-api exists.\"\nruncmd:\n");
    for line in runcmd {
        text.push_str(&format!("  - {}\n", serde_json::to_string(line).unwrap()));
    }
    text.push_str("ntp:\n  enabled: false\n");
    text
}

fn success_line(etcdadm: &str) -> String {
    format!("{etcdadm} && echo success > /run/cluster-api/bootstrap-success.complete")
}

struct Sim {
    runtime: BuiltInRuntime,
    dir: TempDir,
    ca: CertificateAuthority,
    client: IssuedCertificate,
    async_runtime: tokio::runtime::Runtime,
}

impl Sim {
    fn new() -> Sim {
        require_etcd();
        let ca = CertificateAuthority::generate("etcd-ca").unwrap();
        let client = ca
            .issue(&LeafRequest::in_memory_client(
                "sim-test",
                Duration::from_secs(3600),
            ))
            .unwrap();
        Sim {
            runtime: BuiltInRuntime::new(env!("CARGO_BIN_EXE_etcdadm-sim-machine")),
            dir: TempDir::new("sim-machines"),
            ca,
            client,
            async_runtime: tokio::runtime::Runtime::new().unwrap(),
        }
    }

    fn root(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn boot(&self, name: &str, user_data: String) -> IpAddr {
        let ip = free_loopback_ip();
        self.boot_at(name, ip, user_data, None);
        ip
    }

    fn boot_at(&self, name: &str, ip: IpAddr, user_data: String, validity: Option<Duration>) {
        let spec = MachineSpec {
            name: name.into(),
            ip,
            root: self.root(name),
            user_data,
            member_certificate_validity: validity,
            default_route_on_second_interface: false,
        };
        self.runtime.boot(&spec).unwrap();
    }

    fn member_data(&self, runcmd: &[&str]) -> String {
        user_data(self.ca.cert_pem(), self.ca.key_pem(), "", runcmd)
    }

    fn boot_member(&self, name: &str, etcdadm: &str) -> IpAddr {
        let line = success_line(etcdadm);
        self.boot(name, self.member_data(&["systemctl stop kubelet", &line]))
    }

    fn diagnostics(&self, name: &str) -> String {
        let read = |rel: &str| std::fs::read_to_string(self.root(name).join(rel)).unwrap_or_default();
        format!(
            "== {name} machine.log ==\n{}\n== cloud-init-output.log ==\n{}\n== etcd journal ==\n{}",
            read("sim/machine.log"),
            read("var/log/cloud-init-output.log"),
            read("var/log/sim-journal/etcd.service.log")
        )
    }

    fn wait_running(&self, name: &str) -> bool {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            match self.runtime.state(name) {
                MachineState::Running { bootstrap_succeeded } => return bootstrap_succeeded,
                MachineState::Failed { reason } => {
                    panic!("{name} failed: {reason}\n{}", self.diagnostics(name))
                }
                MachineState::Off => panic!("{name} is off\n{}", self.diagnostics(name)),
                MachineState::Booting => {}
            }
            assert!(
                Instant::now() < deadline,
                "{name} still booting\n{}",
                self.diagnostics(name)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_bootstrapped(&self, name: &str) {
        assert!(
            self.wait_running(name),
            "{name} bootstrap did not succeed\n{}",
            self.diagnostics(name)
        );
    }

    fn health(&self, ip: IpAddr) -> Result<String, String> {
        let http = mtls_http_client(self.ca.cert_pem(), &self.client);
        let url = format!("https://{ip}:2379/health");
        self.async_runtime.block_on(async {
            let response = http.get(&url).send().await.map_err(|e| format!("{e:?}"))?;
            response.text().await.map_err(|e| e.to_string())
        })
    }

    fn wait_healthy(&self, ip: IpAddr, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match self.health(ip) {
                Ok(body) if body.contains("\"true\"") => return,
                other => assert!(Instant::now() < deadline, "{ip} not healthy: {other:?}"),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A client of the member at `ip`, for calls made through `self.async_runtime`.
    fn member_client(&self, ip: IpAddr) -> MemberClient {
        let tls = EtcdTls {
            ca_pem: self.ca.cert_pem().to_string(),
            cert_pem: self.client.cert_pem.clone(),
            key_pem: self.client.key_pem.clone(),
        };
        MemberClient::new(&format!("https://{ip}:2379"), &tls, Duration::from_secs(5)).unwrap()
    }

    /// (name, is_learner) of every member, as the member at `ip` reports them.
    fn members(&self, ip: IpAddr) -> Vec<(String, bool)> {
        let member = self.member_client(ip);
        self.async_runtime.block_on(async {
            let list = member.member_list().await.unwrap();
            let mut members: Vec<_> = list.iter().map(|m| (m.name.clone(), m.is_learner)).collect();
            members.sort();
            members
        })
    }

    /// Pre-add a learner with `peer_url` through the member at `ip`, as the EtcdadmCluster
    /// controller does, retrying while etcd's strict reconfiguration check refuses.
    fn add_learner(&self, ip: IpAddr, peer_url: &str) -> Member {
        let member = self.member_client(ip);
        let deadline = Instant::now() + Duration::from_secs(60);
        self.async_runtime.block_on(async {
            loop {
                match member.member_add(&[peer_url.to_string()], true).await {
                    Ok(added) => return added,
                    Err(e) if e.refusal() == Some(Refusal::UnhealthyCluster) && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => panic!("adding learner {peer_url}: {e}"),
                }
            }
        })
    }

    /// Promote `id` through the member at `ip` once etcd says it is in sync.
    fn promote(&self, ip: IpAddr, id: u64) {
        let member = self.member_client(ip);
        let deadline = Instant::now() + Duration::from_secs(60);
        self.async_runtime.block_on(async {
            loop {
                match member.member_promote(id).await {
                    Ok(()) => return,
                    Err(e) if e.refusal() == Some(Refusal::LearnerNotReady) && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("promoting {id:x}: {e}"),
                }
            }
        })
    }

    /// How long `<root>/etc/etcd/pki/<cert>.crt` of machine `name` is still valid.
    fn cert_time_left(&self, name: &str, cert: &str) -> Duration {
        let pem = std::fs::read_to_string(self.root(name).join(format!("etc/etcd/pki/{cert}.crt"))).unwrap();
        cert_not_after(&pem)
            .unwrap()
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    }

    fn output_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.root(name).join("var/log/cloud-init-output.log")).unwrap_or_default()
    }

    fn etcd_pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.root(name).join("sim/units/etcd.service.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

fn voting(names: &[&str]) -> Vec<(String, bool)> {
    names.iter().map(|n| (n.to_string(), false)).collect()
}

#[test]
fn members_init_join_survive_faults_and_reset() {
    let sim = Sim::new();

    // Init.
    let ip1 = sim.boot_member("m1", "etcdadm init --init-system systemd --name m1");
    sim.wait_bootstrapped("m1");
    sim.wait_healthy(ip1, Duration::from_secs(30));
    let root1 = sim.root("m1");
    let env = std::fs::read_to_string(root1.join("etc/etcd/etcd.env")).unwrap();
    assert!(
        env.contains(&format!("ETCD_LISTEN_CLIENT_URLS=https://{ip1}:2379\n")),
        "{env}"
    );
    assert!(env.contains("ETCD_INITIAL_CLUSTER_STATE=new\n"), "{env}");
    assert!(
        !Path::new("/etc/etcd/etcd.env").exists(),
        "etcd.env leaked onto the host"
    );
    for cert in ["server", "peer", "etcdctl-etcd-client", "apiserver-etcd-client"] {
        assert!(
            root1.join(format!("etc/etcd/pki/{cert}.crt")).exists(),
            "{cert}.crt missing"
        );
    }
    assert_eq!(
        std::fs::read_to_string(root1.join("etc/hostname")).unwrap(),
        "m1\n"
    );
    assert!(root1.join("etc/systemd/system/etcd.service").exists());
    assert!(
        std::fs::read_link(root1.join("opt/bin/etcd")).is_ok(),
        "etcd not installed in --install-dir"
    );
    let output_log = std::fs::read_to_string(root1.join("var/log/cloud-init-output.log")).unwrap();
    assert!(
        output_log.contains("Failed to stop kubelet.service: Unit kubelet.service not loaded."),
        "{output_log}"
    );
    assert!(
        output_log.contains("runcmd exit codes: [Some(5), Some(0)]"),
        "{output_log}"
    );
    assert_eq!(sim.members(ip1), voting(&["m1"]));

    // Joins, one at a time.
    let ip2 = sim.boot_member(
        "m2",
        &format!("etcdadm join https://{ip1}:2379 --init-system systemd --name m2"),
    );
    sim.wait_bootstrapped("m2");
    assert_eq!(sim.members(ip1), voting(&["m1", "m2"]));
    let env2 = std::fs::read_to_string(sim.root("m2").join("etc/etcd/etcd.env")).unwrap();
    assert!(env2.contains("ETCD_INITIAL_CLUSTER_STATE=existing\n"), "{env2}");
    assert!(
        env2.contains(&format!("m1=https://{ip1}:2380")) && env2.contains(&format!("m2=https://{ip2}:2380")),
        "{env2}"
    );

    let ip3 = sim.boot_member(
        "m3",
        &format!("etcdadm join https://{ip2}:2379 --init-system systemd --name m3"),
    );
    sim.wait_bootstrapped("m3");
    assert_eq!(sim.members(ip1), voting(&["m1", "m2", "m3"]));
    sim.wait_healthy(ip3, Duration::from_secs(30));

    // Kill: Restart=on-failure, and SIGKILL is a failure, so the manager starts etcd again.
    let before = sim.etcd_pid("m3").expect("etcd pid of m3");
    sim.runtime.fault("m3", Fault::Kill).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(after) = sim.etcd_pid("m3")
            && after != before
            && sim.health(ip3).is_ok_and(|b| b.contains("\"true\""))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd on m3 was not restarted\n{}",
            sim.diagnostics("m3")
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Pause / resume.
    sim.runtime.fault("m3", Fault::Pause).unwrap();
    assert!(sim.health(ip3).is_err(), "a paused member answered");
    sim.runtime.fault("m3", Fault::Resume).unwrap();
    sim.wait_healthy(ip3, Duration::from_secs(30));

    // Reset removes the member; its etcd exits 0 and is not restarted. Right after the pause,
    // etcd's strict reconfig check refuses the removal (peers not connected for 5 s yet); reset
    // does not retry, exits 1 and keeps the member, so the caller tries again, as a controller would.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reset = sim.runtime.run_in_machine("m3", "etcdadm reset").unwrap();
        if reset.status.success() {
            break;
        }
        let stderr = String::from_utf8_lossy(&reset.stderr);
        assert!(
            stderr.contains("Error removing member"),
            "{stderr}\n{}",
            sim.diagnostics("m3")
        );
        assert_eq!(
            sim.members(ip1),
            voting(&["m1", "m2", "m3"]),
            "a refused reset keeps the member"
        );
        assert!(Instant::now() < deadline, "etcdadm reset kept failing: {stderr}");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(sim.members(ip1), voting(&["m1", "m2"]));
    assert!(
        !sim.root("m3").join("etc/etcd/etcd.env").exists() || {
            // The overlay hides deleted lower files with whiteouts; the upper copy is gone or a whiteout.
            std::fs::metadata(sim.root("m3").join("etc/etcd/etcd.env"))
                .map(|m| m.len() == 0)
                .unwrap_or(true)
        }
    );
    let active = sim
        .runtime
        .run_in_machine("m3", "systemctl is-active etcd")
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "inactive");

    // Power off: everything dies, nothing answers on the address.
    sim.runtime.fault("m2", Fault::PowerOff).unwrap();
    assert_eq!(sim.runtime.state("m2"), MachineState::Off);
    assert!(sim.health(ip2).is_err(), "a powered-off member answered");
    assert!(
        sim.root("m2").join("etc/etcd/etcd.env").exists(),
        "power-off must keep the disk"
    );
}

const MEMBER_CERTS: [&str; 4] = ["server", "peer", "etcdctl-etcd-client", "apiserver-etcd-client"];
const DAY: Duration = Duration::from_secs(24 * 3600);

#[test]
fn a_pre_added_learner_is_reused_and_its_health_phase_fails_until_promoted() {
    let sim = Sim::new();

    // The first member, with certificates the scenario wants expiring in 20 days.
    let ip1 = free_loopback_ip();
    let init = success_line("etcdadm init --init-system systemd --name m1");
    sim.boot_at("m1", ip1, sim.member_data(&[&init]), Some(20 * DAY));
    sim.wait_bootstrapped("m1");
    for cert in MEMBER_CERTS {
        let left = sim.cert_time_left("m1", cert);
        assert!(
            left <= 20 * DAY && left > 20 * DAY - Duration::from_secs(3600),
            "{cert}: {left:?}"
        );
    }

    // The controller's part: a learner with m2's exact peer URL. Promoting it before it is in
    // sync, or adding a second learner, is refused by etcd itself.
    let ip2 = free_loopback_ip();
    let learner = sim.add_learner(ip1, &format!("https://{ip2}:2380"));
    assert!(learner.is_learner && !learner.is_started(), "{learner:?}");
    let leader = sim.member_client(ip1);
    let err = sim
        .async_runtime
        .block_on(leader.member_promote(learner.id))
        .unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::LearnerNotReady), "{err}");
    let another = format!("https://{}:2380", free_loopback_ip());
    let err = sim
        .async_runtime
        .block_on(leader.member_add(&[another], true))
        .unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::TooManyLearners), "{err}");

    // m2 runs a plain join: the learner is reused (no MemberAdd) and etcd starts as that
    // learner; the health phase's linearizable read is refused, so the join fails.
    let join = format!("etcdadm join https://{ip1}:2379 --init-system systemd --name m2");
    sim.boot_at("m2", ip2, sim.member_data(&[&success_line(&join)]), None);
    assert!(!sim.wait_running("m2"), "an unpromoted learner's join succeeded");
    let log = sim.output_log("m2");
    assert!(log.contains("[membership] Member was added"), "{log}");
    assert!(!log.contains("Adding member"), "{log}");
    assert!(
        log.contains("[health] local etcd endpoint is unhealthy: etcdserver: rpc not supported for learner"),
        "{log}"
    );
    assert!(log.contains("runcmd exit codes: [Some(1)]"), "{log}");
    let list = sim.async_runtime.block_on(leader.member_list()).unwrap();
    let listed = list
        .iter()
        .find(|m| m.id == learner.id)
        .expect("the pre-added member");
    assert_eq!(
        (listed.name.as_str(), listed.is_learner, list.len()),
        ("m2", true, 2),
        "{list:?}"
    );
    let status = sim
        .async_runtime
        .block_on(sim.member_client(ip2).status())
        .unwrap();
    assert!(status.is_learner && status.member_id == learner.id, "{status:?}");
    let env = std::fs::read_to_string(sim.root("m2").join("etc/etcd/etcd.env")).unwrap();
    assert!(
        env.contains("ETCD_INITIAL_CLUSTER_STATE=existing\n")
            && env.contains(&format!("m1=https://{ip1}:2380"))
            && env.contains(&format!("m2=https://{ip2}:2380")),
        "{env}"
    );

    // The health phase on its own gives up once the learner patience is spent...
    let etcd_pid = sim.etcd_pid("m2").expect("etcd runs on m2 after the failed join");
    let health = format!("etcdadm join phase health https://{ip1}:2379 --init-system systemd --name m2");
    let started = Instant::now();
    let output = sim.runtime.run_in_machine("m2", &health).unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rpc not supported for learner"), "{stderr}");
    assert!(
        took >= Duration::from_millis(2700) && took < Duration::from_secs(30),
        "gave up after {took:?}"
    );

    // ...and passes once the learner is promoted; etcd never stopped.
    sim.promote(ip1, learner.id);
    let output = sim.runtime.run_in_machine("m2", &health).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("[health] Local etcd endpoint is healthy"),
        "{stderr}"
    );
    assert_eq!(sim.members(ip1), voting(&["m1", "m2"]));
    assert_eq!(sim.etcd_pid("m2"), Some(etcd_pid));

    // A member booted without a validity gets etcdadm's year.
    for cert in MEMBER_CERTS {
        let left = sim.cert_time_left("m2", cert);
        assert!(left <= 365 * DAY && left > 364 * DAY, "{cert}: {left:?}");
    }
}

/// Wait until machine `name`'s cloud-init output shows `text`.
fn wait_for_output(sim: &Sim, name: &str, text: &str) {
    let deadline = Instant::now() + BOOT_TIMEOUT;
    while !sim.output_log(name).contains(text) {
        assert!(
            Instant::now() < deadline,
            "{name} never printed {text:?}\n{}",
            sim.diagnostics(name)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bootstrap provider's learner join user data for machine `name`, joining through `url`.
fn learner_join_user_data(sim: &Sim, name: &str, url: &str) -> String {
    let spec = EtcdadmConfigSpec {
        // The default install commands download etcdadm; the machine has the stand-in.
        etcdadm_builtin: Some(true),
        ..Default::default()
    };
    render_user_data(&RenderInput {
        spec: &spec,
        machine_name: name,
        ca: CaFiles {
            cert_pem: sim.ca.cert_pem(),
            key_pem: sim.ca.key_pem(),
        },
        command: EtcdadmCommand::Join {
            urls: &[url.to_string()],
            learner: Some(LearnerJoin::default()),
        },
        secrets: &ResolvedSecrets::default(),
    })
    .unwrap()
}

#[test]
fn rendered_learner_join_waits_for_its_member_then_for_its_promotion() {
    let sim = Sim::new();
    let ip1 = sim.boot_member("m1", "etcdadm init --init-system systemd --name m1");
    sim.wait_bootstrapped("m1");
    let url = format!("https://{ip1}:2379");

    // The machine boots before its member exists: the user data waits instead of joining.
    let ip2 = free_loopback_ip();
    let peer2 = format!("https://{ip2}:2380");
    sim.boot_at("m2", ip2, learner_join_user_data(&sim, "m2", &url), None);
    wait_for_output(&sim, "m2", &format!("for {url} to list one of {peer2} ("));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        sim.members(ip1),
        voting(&["m1"]),
        "joined before its member was added"
    );

    // The controller's part, done by hand: add the learner once the machine has an address,
    // promote it once etcd has it in sync.
    let learner = sim.add_learner(ip1, &peer2);
    wait_for_output(&sim, "m2", &format!("{url} lists {peer2}: etcd binds to {ip2}"));
    wait_for_output(&sim, "m2", "re-running etcdadm's health phase");
    sim.promote(ip1, learner.id);
    sim.wait_bootstrapped("m2");
    let log = sim.output_log("m2");
    assert!(log.contains("[membership] Member was added"), "{log}");
    assert!(
        log.contains("etcd learner join: etcd is healthy: the member was promoted"),
        "{log}"
    );
    let list = sim
        .async_runtime
        .block_on(sim.member_client(ip1).member_list())
        .unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    let m2 = list
        .iter()
        .find(|m| m.id == learner.id)
        .expect("the pre-added member");
    assert_eq!((m2.name.as_str(), m2.is_learner), ("m2", false));

    // A machine whose member never comes: the wait gives up and says why, etcdadm never runs.
    let ip3 = free_loopback_ip();
    sim.boot_at("m3", ip3, learner_join_user_data(&sim, "m3", &url), None);
    wait_for_output(
        &sim,
        "m3",
        &format!("for {url} to list one of https://{ip3}:2380 ("),
    );
    let wait = format!("sh {LEARNER_JOIN_SCRIPT} wait-listed 3 {url}");
    let output = sim.runtime.run_in_machine("m3", &wait).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "gave up after 3 s: {url} never listed any of https://{ip3}:2380 (the member list has none of them)"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("etcdadm join is not run"), "{stderr}");
    let healthy = format!("sh {LEARNER_JOIN_SCRIPT} wait-healthy 3 {url} --init-system systemd --name m3");
    let output = sim.runtime.run_in_machine("m3", &healthy).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("etcdadm join failed before etcd ran"), "{stderr}");
    assert_eq!(sim.members(ip1), voting(&["m1", "m2"]));
}

/// Bottlerocket user data in the shape the bootstrap provider renders: the kubeadm-bootstrap
/// host container's base64 YAML (CA under /var/lib/etcd/pki, a file through the host root, one
/// etcdadm line) and the hostname setting.
fn bottlerocket_user_data(sim: &Sim, hostname: &str, runcmd: &str) -> String {
    use base64::Engine;
    let mut inner = String::from("#cloud-config\nwrite_files:\n");
    for (path, permissions, content) in [
        ("/var/lib/etcd/pki/ca.crt", "0640", sim.ca.cert_pem()),
        ("/var/lib/etcd/pki/ca.key", "0600", sim.ca.key_pem()),
        ("/.bottlerocket/rootfs/opt/etcd/token", "0644", "token\n"),
    ] {
        inner.push_str(&format!(
            "  - path: \"{path}\"\n    owner: \"root:root\"\n    permissions: \"{permissions}\"\n    content: |\n"
        ));
        inner.push_str(&block(content));
    }
    inner.push_str(&format!("runcmd: {}\n", serde_json::to_string(runcmd).unwrap()));
    let encoded = base64::engine::general_purpose::STANDARD.encode(inner);
    format!(
        "[settings.host-containers.admin]\nenabled = true\nsuperpowered = true\n\n\
         [settings.host-containers.kubeadm-bootstrap]\nenabled = true\nsuperpowered = true\n\
         source = \"public.ecr.aws/l0g8r8j6/bottlerocket-bootstrap:v1\"\nuser-data = \"{encoded}\"\n\n\
         [settings.network]\nhostname = \"{hostname}\"\n"
    )
}

#[test]
fn bottlerocket_members_init_and_join_through_the_bootstrap_container() {
    let sim = Sim::new();
    let words = "public.ecr.aws/eks-distro/etcd-io/etcd 3.4.23 TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256";
    let ip1 = sim.boot(
        "b1",
        bottlerocket_user_data(&sim, "b1", &format!("EtcdadmInit {words}")),
    );
    sim.wait_bootstrapped("b1");
    sim.wait_healthy(ip1, Duration::from_secs(30));
    let root = sim.root("b1");
    for cert in ["ca", "server", "peer", "etcdctl-etcd-client"] {
        assert!(
            root.join(format!("var/lib/etcd/pki/{cert}.crt")).exists(),
            "{cert}.crt"
        );
    }
    assert!(root.join("var/lib/etcd/data/member").is_dir(), "data dir");
    assert_eq!(
        std::fs::read_to_string(root.join("opt/etcd/token")).unwrap(),
        "token\n"
    );
    // The suites reach etcd from its first start (a drop-in written before etcdadm runs): the
    // running process has them, and etcd was started once.
    let env = sim.runtime.etcd_environment("b1").unwrap();
    assert!(
        env.contains(&(
            "ETCD_CIPHER_SUITES".to_string(),
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()
        )),
        "{env:?}"
    );
    assert_eq!(sim.runtime.etcd_starts("b1").unwrap(), 1, "etcd was restarted");
    let log = std::fs::read_to_string(root.join("var/log/kubeadm-bootstrap.log")).unwrap();
    assert!(
        log.contains(
            "etcdadm init --version 3.4.23 --certs-dir /var/lib/etcd/pki --data-dir /var/lib/etcd/data"
        ),
        "{log}"
    );
    assert_eq!(
        sim.members(ip1),
        voting(&["b1"]),
        "member name = the hostname setting"
    );

    let ip2 = sim.boot(
        "b2",
        bottlerocket_user_data(&sim, "b2", &format!("EtcdadmJoin {words} https://{ip1}:2379")),
    );
    sim.wait_bootstrapped("b2");
    sim.wait_healthy(ip2, Duration::from_secs(60));
    assert_eq!(sim.members(ip2), voting(&["b1", "b2"]));

    // A line the bootstrap image would refuse (no endpoint) fails the machine, saying so.
    sim.boot(
        "b3",
        bottlerocket_user_data(&sim, "b3", &format!("EtcdadmJoin {words}")),
    );
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        match sim.runtime.state("b3") {
            MachineState::Failed { reason } => {
                assert!(
                    reason.contains("invalid bootstrap etcdadm join command"),
                    "{reason}"
                );
                break;
            }
            MachineState::Booting => {}
            other => panic!("expected a failure, got {other:?}\n{}", sim.diagnostics("b3")),
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn etcdadm_refuses_what_upstream_refuses() {
    let sim = Sim::new();
    // Outside any machine: CLI parsing fails before any effect.
    let output = Command::new(env!("CARGO_BIN_EXE_etcdadm"))
        .args([
            "join",
            "https://127.0.0.1:2379",
            "--cipher-suites",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Error: unknown flag: --cipher-suites"),
        "{stderr}"
    );
    // A join phase without the endpoint crashes upstream's setup (a Go panic, exit 2); an
    // unknown phase name prints the phase help and exits 0, as cobra does.
    let standin = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_etcdadm"))
            .args(args)
            .output()
            .unwrap()
    };
    let output = standin(&["join", "phase", "health"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("panic: runtime error: index out of range"));
    let output = standin(&["join", "phase", "healthy", "https://127.0.0.1:2379"]);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("Run health phase"));

    // Inside a machine: an ECDSA "CA" at the default path, an RSA CA elsewhere for the comma list.
    let ecdsa = sim
        .ca
        .issue(&LeafRequest {
            key_type: KeyType::EcdsaP256,
            ..LeafRequest::member("ecdsa-ca", vec![], vec![])
        })
        .unwrap();
    let rsa_files = format!(
        "  - path: /etc/etcd/rsa-pki/ca.crt\n    content: |\n{}  - path: /etc/etcd/rsa-pki/ca.key\n    permissions: \"0600\"\n    content: |\n{}",
        block(sim.ca.cert_pem()),
        block(sim.ca.key_pem())
    );
    let data = user_data(
        &ecdsa.cert_pem,
        &ecdsa.key_pem,
        &rsa_files,
        &[
            "etcdadm init --init-system systemd --name bad",
            "etcdadm join https://127.0.0.1:2379 --name bad --cipher-suites TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "etcdadm join https://127.0.0.2:2379,https://127.0.0.3:2379 --certs-dir /etc/etcd/rsa-pki --name bad",
            "hostname",
        ],
    );
    sim.boot("bad", data);
    assert!(!sim.wait_running("bad"), "no bootstrap marker expected");
    let log = std::fs::read_to_string(sim.root("bad").join("var/log/cloud-init-output.log")).unwrap();
    assert!(
        log.contains("the private key file /etc/etcd/pki/ca.key isn't in RSA format"),
        "{log}"
    );
    assert!(log.contains("Error: unknown flag: --cipher-suites"), "{log}");
    assert!(
        log.contains("[membership] error listing members: context deadline exceeded"),
        "{log}"
    );
    assert!(
        log.contains("runcmd exit codes: [Some(1), Some(1), Some(1), Some(0)]"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l == "bad"),
        "hostname inside the machine: {log}"
    );
}

#[test]
fn unsupported_jinja_fails_the_machine_with_the_reason() {
    let sim = Sim::new();
    let data =
        "## template: jinja\n#cloud-config\nruncmd:\n  - echo {{ ds.meta_data.instance_id }}\n".to_string();
    sim.boot("jinja", data);
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        match sim.runtime.state("jinja") {
            MachineState::Failed { reason } => {
                assert!(reason.contains("ds.meta_data.instance_id"), "{reason}");
                break;
            }
            MachineState::Booting => {}
            other => panic!("expected a failure, got {other:?}"),
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn external_runtime_hands_actions_to_the_command() {
    let dir = TempDir::new("sim-external");
    let calls = dir.path().join("calls");
    let validities = dir.path().join("validities");
    let script = dir.path().join("runtime.sh");
    std::fs::write(
        &script,
        format!(
            "echo \"$@\" >> {}\necho \"$1 ${{SIM_MEMBER_CERT_VALIDITY_SECONDS:-unset}}\" >> {}\n[ \"$1\" != fail ]\n",
            calls.display(),
            validities.display()
        ),
    )
    .unwrap();
    let runtime = ExternalRuntime::new(&format!("sh {}", script.display())).unwrap();
    let root = dir.path().join("x1");
    let spec = MachineSpec {
        name: "x1".into(),
        ip: "127.0.1.9".parse().unwrap(),
        root: root.clone(),
        user_data: "#cloud-config\n".into(),
        member_certificate_validity: None,
        default_route_on_second_interface: false,
    };
    runtime.boot(&spec).unwrap();
    assert_eq!(
        runtime.state("x1"),
        MachineState::Running {
            bootstrap_succeeded: false
        }
    );
    std::fs::create_dir_all(root.join("run/cluster-api")).unwrap();
    std::fs::write(
        root.join("run/cluster-api/bootstrap-success.complete"),
        "success\n",
    )
    .unwrap();
    assert_eq!(
        runtime.state("x1"),
        MachineState::Running {
            bootstrap_succeeded: true
        }
    );
    runtime.fault("x1", Fault::Pause).unwrap();
    runtime.stop("x1").unwrap();
    assert_eq!(runtime.state("x1"), MachineState::Off);
    assert_eq!(runtime.state("never-booted"), MachineState::Off);
    let user_data = root.join("sim/user-data");
    assert_eq!(std::fs::read_to_string(&user_data).unwrap(), "#cloud-config\n");
    let tail = format!(
        "--name x1 --ip 127.0.1.9 --user-data {} --root {}",
        user_data.display(),
        root.display()
    );
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        format!("boot {tail}\nfault pause {tail}\nstop {tail}\n")
    );

    // A certificate validity reaches the command in its environment, for the boot it was set for.
    runtime
        .boot(&MachineSpec {
            name: "x2".into(),
            root: dir.path().join("x2"),
            member_certificate_validity: Some(Duration::from_secs(20 * 24 * 3600)),
            ..spec
        })
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&validities).unwrap(),
        "boot unset\nfault unset\nstop unset\nboot 1728000\n"
    );
}
