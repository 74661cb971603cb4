//! The `systemctl` stand-in: forwards its arguments to the machine's service manager.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use etcdadm_sim_machines::systemd::protocol::{CONTROL_SOCKET, request};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let socket = std::env::var("SIM_SYSTEMD_SOCKET").unwrap_or_else(|_| CONTROL_SOCKET.to_string());
    match request(Path::new(&socket), &args) {
        Ok(reply) => {
            let _ = std::io::stdout().write_all(reply.stdout.as_bytes());
            let _ = std::io::stderr().write_all(reply.stderr.as_bytes());
            ExitCode::from(u8::try_from(reply.code).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
