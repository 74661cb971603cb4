//! `SIM_LOG_DIR`: where a scenario's or a benchmark run's controller logs and machines'
//! cloud-init output are kept, since its work directory goes with it.

use std::path::{Path, PathBuf};

/// With `SIM_LOG_DIR` set, copy the controllers' logs and each machine's cloud-init output (its
/// user data's and etcdadm's own output) from `work_dir` there, as `<prefix>-<file>`.
pub fn save(work_dir: &Path, prefix: &str) {
    let Some(dir) = std::env::var_os("SIM_LOG_DIR").map(PathBuf::from) else {
        return;
    };
    let _ = std::fs::create_dir_all(&dir);
    for file in ["etcdadm-controller.log", "etcdadm-bootstrap.log"] {
        let _ = std::fs::copy(work_dir.join(file), dir.join(format!("{prefix}-{file}")));
    }
    let machines = std::fs::read_dir(work_dir.join("machines"))
        .into_iter()
        .flatten()
        .flatten();
    for machine in machines {
        let name = machine.file_name().to_string_lossy().into_owned();
        let log = machine.path().join("var/log/cloud-init-output.log");
        let _ = std::fs::copy(log, dir.join(format!("{prefix}-{name}-cloud-init-output.log")));
    }
}
