#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every shell script shipped or run by the distribution is shellcheck-clean (all severities).

use std::process::Command;

use etcdadm_manifest_tests::{find_tool, repo_root};

const SHELLCHECK_HINT: &str = "install it with `apt-get install shellcheck` (Debian/Ubuntu; .ci/setup \
    does this), `brew install shellcheck`, or from https://github.com/koalaman/shellcheck/releases, \
    or set SHELLCHECK to its path";

/// Scripts matched by `<dir>/*.sh` for the directories the distribution owns.
fn scripts() -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for dir in ["hack", "test/capd", "templates/backup", "templates/cloud-init"] {
        let entries =
            std::fs::read_dir(repo_root().join(dir)).unwrap_or_else(|e| panic!("cannot list {dir}: {e}"));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sh") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn scripts_are_shellcheck_clean() {
    let shellcheck = find_tool("shellcheck", "SHELLCHECK", SHELLCHECK_HINT).unwrap_or_else(|e| panic!("{e}"));
    let scripts = scripts();
    let names: Vec<String> = scripts
        .iter()
        .map(|p| p.strip_prefix(repo_root()).unwrap().display().to_string())
        .collect();
    for expected in [
        "hack/release.sh",
        "hack/sync-backup-template.sh",
        "test/capd/e2e.sh",
        "templates/backup/etcd-backup.sh",
        "templates/cloud-init/learner-join.sh",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not found among {names:?}"
        );
    }
    let output = Command::new(&shellcheck)
        .arg("--severity=style")
        .arg("--external-sources")
        .args(&scripts)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {SHELLCHECK_HINT}", shellcheck.display()));
    assert!(
        output.status.success(),
        "shellcheck found problems:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn scripts_are_executable_and_strict() {
    use std::os::unix::fs::PermissionsExt;
    for script in scripts() {
        let mode = std::fs::metadata(&script).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{} is not executable", script.display());
        let text = std::fs::read_to_string(&script).unwrap();
        let first_command = text
            .lines()
            .find(|l| !l.starts_with('#') && !l.trim().is_empty())
            .unwrap_or_default();
        assert!(
            first_command.starts_with("set -") && first_command.contains('e') && first_command.contains('u'),
            "{} does not start with `set -eu`-style strict mode (found {first_command:?})",
            script.display()
        );
    }
}
