//! The machine's service manager: what `systemctl` talks to inside a process machine.
//!
//! The runner plays systemd's part: it reads units from `/etc/systemd/system` (plus `.d/*.conf`
//! drop-ins), starts `ExecStart` with the unit's environment as its own child, waits for
//! `READY=1` on `NOTIFY_SOCKET` for `Type=notify`, and restarts per `Restart=`/`RestartSec=`.
//! Differences from systemd: no unit search path beyond `/etc/systemd/system`, no dependencies,
//! no cgroups (a unit is its main process), no `$VAR` expansion in `ExecStart`, and units are
//! re-read at every start, so `daemon-reload` has nothing left to do.

pub mod manager;
pub mod protocol;
pub mod unit;

pub use manager::{ManagerPaths, Reply, ServiceManager};
