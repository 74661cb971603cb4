//! The crate's one error type; every message says what was wrong and what to do about it.

use std::path::PathBuf;

/// Everything that can go wrong booting, running or driving a process machine.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("user data: {0}")]
    UserData(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "isolating machine {machine} failed: {reason}; the sim needs root and `unshare --mount --uts` \
         plus overlay mounts (util-linux), and never falls back to writing host files"
    )]
    Isolation { machine: String, reason: String },
    #[error("machine network: {0}")]
    Network(String),
    #[error("machine {0} is not known to this runtime: boot it first")]
    UnknownMachine(String),
    #[error("machine {0} is already running: stop it before booting it again")]
    AlreadyRunning(String),
    #[error("starting `{program}` failed: {reason}")]
    Spawn { program: String, reason: String },
    #[error("external machine runtime `{command}` failed: {reason}")]
    External { command: String, reason: String },
    #[error("{0}")]
    Usage(String),
    /// A stand-in tool failed; the message is what the real tool would print.
    #[error("{0}")]
    Tool(String),
}

impl MachineError {
    /// A short label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            MachineError::UserData(_) => "user-data",
            MachineError::Io { .. } => "io",
            MachineError::Isolation { .. } => "isolation",
            MachineError::Network(_) => "network",
            MachineError::UnknownMachine(_) => "unknown-machine",
            MachineError::AlreadyRunning(_) => "already-running",
            MachineError::Spawn { .. } => "spawn",
            MachineError::External { .. } => "external-runtime",
            MachineError::Usage(_) => "usage",
            MachineError::Tool(_) => "tool",
        }
    }

    /// Wrap an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> MachineError {
        let path = path.into();
        move |source| MachineError::Io { path, source }
    }
}
