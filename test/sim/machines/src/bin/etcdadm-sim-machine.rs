//! One process machine: `etcdadm-sim-machine boot --name N --ip IP --root DIR --user-data FILE`.

use std::process::ExitCode;

use etcdadm_sim_machines::runner::{RunnerArgs, boot, inside};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((mode, flags)) = args.split_first() else {
        eprintln!("usage: etcdadm-sim-machine boot --name N --ip IP --root DIR --user-data FILE");
        return ExitCode::from(2);
    };
    let parsed = match RunnerArgs::parse(flags) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("etcdadm-sim-machine: {e}");
            return ExitCode::from(2);
        }
    };
    let error = match mode.as_str() {
        "boot" => boot(&parsed),
        "inside" => inside(&parsed),
        other => {
            eprintln!("etcdadm-sim-machine: unknown mode {other:?} (use boot)");
            return ExitCode::from(2);
        }
    };
    eprintln!("etcdadm-sim-machine {}: {error}", parsed.name);
    ExitCode::FAILURE
}
