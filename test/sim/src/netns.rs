//! A test in a network namespace of its own: Cluster API's managers serve their webhooks on
//! every interface (they have no flag to choose one), and a test may only start servers on
//! 127.0.0.1 or inside network namespaces it creates. So a test that runs them first re-runs
//! itself under `unshare --net`, where the only interface is a loopback of its own; everything
//! it starts inherits that namespace, and no port of it can clash with another test's.

use std::process::Command;

/// Set in the re-run process: the test is inside its own network namespace.
const INSIDE: &str = etcdadm_shared::testing::ports::OWN_NETNS;

/// Whether this process runs in the network namespace [`run_isolated`] made for it.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Run the test `name` (its path in this test binary, as `--exact` takes it) in a network
/// namespace of its own and return its result, unless this process already is that run
/// ([`inside`]), in which case it returns `None` and the caller goes on with the test's body.
///
/// Needs root (the namespace) and util-linux's `unshare` and iproute2's `ip`, as the
/// real-etcdadm machines do; `.ci/setup` installs them.
pub fn run_isolated(name: &str) -> Option<Result<(), String>> {
    if inside() {
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Some(Err(format!("locating the test binary: {e}"))),
    };
    // `ip link set lo up`: a new namespace's loopback starts down. Its ephemeral range moves
    // up, so the ports the test hands its servers are never a connection's (`ports`).
    let script = format!(
        "ip link set lo up && echo '{}' > /proc/sys/net/ipv4/ip_local_port_range && exec \"$0\" \"$@\"",
        etcdadm_shared::testing::ports::EPHEMERAL_RANGE
    );
    let status = Command::new("unshare")
        .args(["--net", "--", "sh", "-c", &script])
        .arg(&exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .status();
    Some(match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!(
            "{name} failed in its own network namespace ({status}); its output is above"
        )),
        Err(e) => Err(format!(
            "cannot run `unshare --net` for {name}: {e}; it needs root and util-linux's unshare \
             (and iproute2's ip), which .ci/setup installs"
        )),
    })
}
