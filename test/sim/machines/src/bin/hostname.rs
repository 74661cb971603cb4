//! The `hostname` stand-in: the machine's name from its private UTS namespace, `-i`/`-I` its IP.

use std::process::ExitCode;

const KERNEL_HOSTNAME: &str = "/proc/sys/kernel/hostname";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let current = std::fs::read_to_string(KERNEL_HOSTNAME)
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("SIM_MACHINE_NAME"))
        .unwrap_or_default();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["-f" | "--fqdn" | "--long" | "-s" | "--short"] => println!("{current}"),
        ["-i" | "--ip-address" | "-I" | "--all-ip-addresses"] => {
            println!("{}", std::env::var("SIM_MACHINE_IP").unwrap_or_default());
        }
        [name] if !name.starts_with('-') => {
            // Only a machine has a private UTS namespace; on the host this would rename the host.
            if std::env::var_os("SIM_MACHINE_NAME").is_none() {
                eprintln!("hostname: the sim's stand-in only sets the name inside a sim machine");
                return ExitCode::FAILURE;
            }
            if let Err(e) = std::fs::write(KERNEL_HOSTNAME, name) {
                eprintln!("hostname: you must be root to change the host name ({e})");
                return ExitCode::FAILURE;
            }
        }
        _ => {
            eprintln!("Usage: hostname [-f|-s|-i|-I] [name] (the sim's stand-in)");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
