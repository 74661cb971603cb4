//! How the `systemctl` stand-in reaches the machine's manager: one JSON request line (the
//! arguments) and one JSON reply over a Unix socket inside the machine view.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use super::manager::{Reply, ServiceManager};
use crate::error::MachineError;

/// The manager's socket in the machine view (`/run` is private to each machine).
pub const CONTROL_SOCKET: &str = "/run/sim-systemd/control.sock";

/// What `systemctl` prints where no manager runs, as real systemctl does without systemd.
pub const NO_SYSTEMD: &str = "System has not been booted with systemd as init system (PID 1). Can't operate.\n\
     Failed to connect to bus: Host is down";

/// Serve `manager` on `socket` forever, one thread per connection.
pub fn serve(manager: ServiceManager, socket: &Path) -> Result<(), MachineError> {
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(MachineError::io(socket))?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let manager = manager.clone();
            std::thread::spawn(move || answer(&manager, stream));
        }
    });
    Ok(())
}

fn answer(manager: &ServiceManager, stream: UnixStream) {
    let mut line = String::new();
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    if BufReader::new(stream).read_line(&mut line).is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Vec<String>>(&line) {
        Ok(args) => manager.command(&args),
        Err(e) => Reply {
            code: 1,
            stdout: String::new(),
            stderr: format!("bad request to the sim's service manager: {e}\n"),
        },
    };
    if let Ok(text) = serde_json::to_string(&reply) {
        let _ = writer.write_all(text.as_bytes());
    }
}

/// Send `args` to the manager on `socket` and return its reply.
pub fn request(socket: &Path, args: &[String]) -> Result<Reply, MachineError> {
    let mut stream = UnixStream::connect(socket).map_err(|_| MachineError::Tool(NO_SYSTEMD.into()))?;
    let mut line = serde_json::to_string(args).map_err(|e| MachineError::Tool(e.to_string()))?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(MachineError::io(socket))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(MachineError::io(socket))?;
    serde_json::from_str(&text)
        .map_err(|e| MachineError::Tool(format!("the sim's service manager answered badly: {e}")))
}
