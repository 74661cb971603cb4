#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `restore-bump.sh`, the helper a restoring first member runs before `etcdadm init --snapshot`,
//! run for real with `sh`: an etcd tool without `--bump-revision` (the host's etcd 3.4
//! `etcdctl`, even when it answers to the name `etcdutl`) leaves the snapshot alone and runs the
//! etcdadm command unchanged; the command's arguments reach it intact. (No etcd release with the
//! flag can be installed here, so the branch that bumps is covered by shellcheck and the render
//! tests only: docs/day2.md, "Revisions after a restore".)

use std::path::{Path, PathBuf};
use std::process::Command;

use etcdadm_bootstrap::render::RESTORE_BUMP_SCRIPT_CONTENT;

fn host_etcdctl() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcdctl"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("no etcdctl on PATH: install etcd (Debian: apt-get install etcd-client)"))
}

/// Run the helper with `bin` first on the PATH: its output (what the "etcdadm" command, a shell
/// that prints its arguments, printed last) and its stderr.
fn run(bin: &Path, snapshot: &Path, install_dir: &Path) -> (String, String) {
    let dir = snapshot.parent().unwrap();
    let script = dir.join("restore-bump.sh");
    std::fs::write(&script, RESTORE_BUMP_SCRIPT_CONTENT).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("sh")
        .env("PATH", path)
        .arg(&script)
        .arg("1000000000")
        .arg(snapshot)
        .arg(install_dir)
        .args(["sh", "-c", "echo etcdadm \"$@\"", "etcdadm"])
        .args(["init", "--name", "etcd 0", "--snapshot"])
        .arg(snapshot)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn without_an_etcdutl_that_bumps_the_snapshot_is_left_alone_and_etcdadm_runs_unchanged() {
    let dir = std::env::temp_dir().join(format!("restore-bump-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let snapshot = dir.join("snapshot.db");
    std::fs::write(&snapshot, b"not touched").unwrap();
    // The host's etcdctl answers `snapshot restore --help` without --bump-revision.
    let impostor = dir.join("bin").join("etcdutl");
    let _ = std::fs::remove_file(&impostor);
    std::os::unix::fs::symlink(host_etcdctl(), &impostor).unwrap();
    for install_dir in [dir.join("none"), dir.join("bin")] {
        let (out, err) = run(&dir.join("bin"), &snapshot, &install_dir);
        assert_eq!(
            out.lines().last(),
            Some(format!("etcdadm init --name etcd 0 --snapshot {}", snapshot.display()).as_str()),
            "no --skip-hash-check: {out}{err}"
        );
        assert!(out.contains("the revision is not raised"), "{out}");
        assert_eq!(std::fs::read(&snapshot).unwrap(), b"not touched");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
