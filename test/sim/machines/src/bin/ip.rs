//! The `ip` stand-in: a sim machine's one interface, `sim0`, holding the machine's IP and
//! carrying its default route, as `ip -4 route show default` and `ip -4 -o addr show [dev sim0]`
//! report them. Machines share the host's network namespace, whose own routes are not theirs.

use std::process::ExitCode;

const INTERFACE: &str = "sim0";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ip = std::env::var("SIM_MACHINE_IP").unwrap_or_default();
    match answer(&args, &ip) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// What `ip <args>` prints on a machine whose address is `ip`.
fn answer(args: &[String], ip: &str) -> Result<String, String> {
    if ip.parse::<std::net::Ipv4Addr>().is_err() {
        return Err("ip: the sim's stand-in runs inside a sim machine with an IPv4 SIM_MACHINE_IP".into());
    }
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !matches!(*a, "-4" | "-o" | "-oneline"))
        .collect();
    let one_line = args.iter().any(|a| a == "-o" || a == "-oneline");
    match words.as_slice() {
        ["route" | "r", "show" | "list" | "s" | "l", "default"] | ["route", "default"] => {
            Ok(format!("default dev {INTERFACE} scope link\n"))
        }
        ["addr" | "address" | "a", "show" | "list" | "s" | "l", rest @ ..]
            if matches!(
                rest,
                [] | ["scope", "global"] | ["dev", _] | ["dev", _, "scope", "global"]
            ) =>
        {
            if let ["dev", device, ..] = rest
                && *device != INTERFACE
            {
                return Err(format!("Device \"{device}\" does not exist."));
            }
            let line = format!("2: {INTERFACE}    inet {ip}/32 scope global {INTERFACE}");
            Ok(if one_line {
                format!("{line}\\       valid_lft forever preferred_lft forever\n")
            } else {
                format!("{line}\n       valid_lft forever preferred_lft forever\n")
            })
        }
        _ => Err(format!(
            "ip: the sim's stand-in answers `ip -4 route show default` and `ip -4 -o addr show [dev \
             {INTERFACE}] [scope global]` only, not `ip {}`",
            args.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::answer;

    fn ip(text: &str) -> Result<String, String> {
        let args: Vec<String> = text.split_whitespace().map(String::from).collect();
        answer(&args, "127.0.1.7")
    }

    #[test]
    fn the_default_route_goes_through_the_interface_holding_the_machine_ip() {
        assert_eq!(
            ip("-4 route show default").unwrap(),
            "default dev sim0 scope link\n"
        );
        assert_eq!(
            ip("-4 -o addr show dev sim0 scope global").unwrap(),
            "2: sim0    inet 127.0.1.7/32 scope global sim0\\       valid_lft forever preferred_lft forever\n"
        );
        assert_eq!(
            ip("-4 -o addr show dev eth0").unwrap_err(),
            "Device \"eth0\" does not exist."
        );
        assert_eq!(
            ip("-4 -o addr show scope global").unwrap(),
            ip("-4 -o addr show dev sim0 scope global").unwrap()
        );
        assert!(ip("link set sim0 down").unwrap_err().contains("only"));
        assert!(answer(&["route".into()], "").is_err());
    }
}
