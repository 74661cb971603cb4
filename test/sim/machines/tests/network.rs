#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real-etcdadm machines' network on this host (needs root and iproute2): a lab's bridge and
//! namespaces come and go with it, a killed test's leftovers are swept by the next lab, and
//! nothing is sent to a subnet whose bridge is gone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcdadm_sim_machines::network::{Lab, bridge_name, guard, netns_name, network_lock};

fn ip(args: &[&str]) -> String {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !matches!(
                stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]),
                Some("Z" | "X")
            )
        })
        .unwrap_or(false)
}

/// A process sleeping inside namespace `netns`; returns its PID.
fn sleeper_in(netns: &str) -> u32 {
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "sleep", "300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Reaped by whoever outlives it; the test only needs it killed.
    let pid = child.id();
    std::mem::forget(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ip(&["netns", "pids", netns]).contains(&pid.to_string()) {
        assert!(Instant::now() < deadline, "sleep did not enter {netns}");
        std::thread::sleep(Duration::from_millis(20));
    }
    pid
}

#[test]
fn a_lab_wires_namespaces_to_its_bridge_and_takes_everything_with_it() {
    let lab = Lab::create(250).unwrap();
    assert!(link_exists("eadmbr250"));
    let alias = std::fs::read_to_string("/sys/class/net/eadmbr250/ifalias").unwrap();
    assert!(
        alias.starts_with(&format!("etcdadm-sim owner={} ", std::process::id())),
        "{alias}"
    );
    assert!(Lab::create(250).is_err(), "a lab is owned by one test");

    let one = lab.add_namespace("m1", 2, false).unwrap();
    let two = lab.add_namespace("m2", 3, true).unwrap();
    assert_eq!(one.address.to_string(), "10.213.250.2");
    assert_eq!(two.second_address.unwrap().to_string(), "10.214.250.3");
    let route = ip(&["-n", &two.name, "-4", "route", "show", "default"]);
    assert!(route.contains("via 10.214.250.1 dev eth1"), "{route}");
    let route = ip(&["-n", &one.name, "-4", "route", "show", "default"]);
    assert!(route.contains("via 10.213.250.1 dev eth0"), "{route}");
    assert!(guard("https://10.213.250.2:2379").is_ok());
    let sleeping = sleeper_in(&one.name);

    drop(lab);
    assert!(!link_exists("eadmbr250") && !link_exists("eadm250v2") && !link_exists("eadm250w3"));
    assert!(!netns_exists(&one.name) && !netns_exists(&two.name));
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(sleeping) {
        assert!(Instant::now() < deadline, "a process in the lab outlived it");
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = guard("https://10.213.250.2:2379").unwrap_err();
    assert!(refused.contains("eadmbr250"), "{refused}");
}

#[test]
fn the_next_lab_sweeps_what_a_killed_test_left_and_nothing_else() {
    // What a test killed outright leaves: a bridge owned by a process that is gone (PID 1 never
    // started at tick 0), a veth on it, a namespace with a process in it.
    // Set up under the sweep's lock, or another test's lab could sweep it half made.
    let lock = network_lock().unwrap();
    let stale = bridge_name(251);
    let stale_ns = netns_name(251, "m1");
    ip(&["link", "add", &stale, "type", "bridge"]);
    ip(&[
        "link",
        "set",
        "dev",
        &stale,
        "alias",
        "etcdadm-sim owner=1 start=0",
    ]);
    ip(&["netns", "add", &stale_ns]);
    ip(&[
        "link",
        "add",
        "eadm251v2",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &stale_ns,
    ]);
    ip(&["link", "set", "dev", "eadm251v2", "master", &stale]);
    let sleeping = sleeper_in(&stale_ns);
    // Something of someone else's with a similar name stays.
    ip(&["link", "add", "eadmz", "type", "bridge"]);
    drop(lock);

    let lab = Lab::create(252).unwrap();
    assert!(
        !link_exists(&stale) && !link_exists("eadm251v2"),
        "stale links swept"
    );
    assert!(!netns_exists(&stale_ns), "stale namespace swept");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(sleeping) {
        assert!(
            Instant::now() < deadline,
            "the stale namespace's process survived the sweep"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(link_exists("eadmbr252"), "the new lab");
    assert!(link_exists("eadmz"), "a link that is not ours by its name stays");
    ip(&["link", "delete", "eadmz"]);

    // While a lab exists, its subnets are guarded by unreachable routes beneath the bridge's.
    let routes = ip(&["route", "show", "type", "unreachable"]);
    assert!(
        routes.contains("10.213.0.0/16") && routes.contains("10.214.0.0/16"),
        "{routes}"
    );
    drop(lab);
    assert!(!link_exists("eadmbr252"));
}
