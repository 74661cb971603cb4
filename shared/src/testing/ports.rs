//! Loopback ports for the servers a test starts, chosen so that no connection the test opens
//! can take one between its choice and its server's listen.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

/// Set in a test re-run in a network namespace of its own (the sim's `netns`), whose
/// ephemeral range, the ports the kernel gives outgoing connections and `bind(0)`, is
/// [`EPHEMERAL_RANGE`]: the ports below it are the test's alone to hand out.
pub const OWN_NETNS: &str = "ETCDADM_SIM_OWN_NETNS";

/// `net.ipv4.ip_local_port_range` in such a namespace.
pub const EPHEMERAL_RANGE: &str = "40000 60999";

/// The ports handed out in such a namespace, one after the other, never twice.
const OWN_PORTS: std::ops::RangeInclusive<u16> = 20000..=39999;

static NEXT_OWN: AtomicU16 = AtomicU16::new(*OWN_PORTS.start());

/// A free port on 127.0.0.1. In a namespace of the test's own, the next one below the
/// ephemeral range (a client's connection, which takes an ephemeral port, cannot hold it when
/// the server binds it); elsewhere the kernel's choice, which other tests share.
pub fn free_port() -> std::io::Result<u16> {
    if std::env::var_os(OWN_NETNS).is_none() {
        return TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port());
    }
    loop {
        let port = NEXT_OWN.fetch_add(1, Ordering::Relaxed);
        if !OWN_PORTS.contains(&port) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "every port below the namespace's ephemeral range was handed out",
            ));
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
}
