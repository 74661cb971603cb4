//! Prometheus's `promtool` for the tests of the alerting rules: found as CI installs it, or a
//! failure saying how to install it, and run in a directory holding the rules and their tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to get promtool when none is found.
pub const PROMTOOL_HINT: &str = "install it with `apt-get install prometheus` (Debian/Ubuntu: promtool comes \
    with it; .ci/setup does this), or from https://prometheus.io/download/, or set PROMTOOL to its path";

/// `$PROMTOOL`, else `promtool` on PATH; panics with [`PROMTOOL_HINT`] when there is none.
pub fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| panic!("promtool not found; {PROMTOOL_HINT}"))
}

/// What `promtool <args>` printed in `dir`; panics when it fails.
pub fn run_promtool(args: &[&str], dir: &Path) -> String {
    let tool = promtool();
    let output = Command::new(&tool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {PROMTOOL_HINT}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}
