//! The etcdadm stand-in binary; named `etcdadm` so machines find it first on PATH.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = etcdadm_sim_machines::etcdadm::run(&args);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
