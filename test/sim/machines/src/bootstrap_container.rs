//! Running a Bottlerocket machine's etcd bootstrap the way the EKS Anywhere bootstrap image
//! (`kubeadm-bootstrap` host container) does, inside the machine view, with the etcdadm stand-in.
//!
//! What the image does (aws/eks-anywhere-build-tooling, projects/aws/bottlerocket-bootstrap): it
//! links its `/var/lib/etcd` to the host's (`/.bottlerocket/rootfs/var/lib/etcd`), writes
//! `write_files` (content as is, octal permissions defaulting to 0640, owner looked up in its
//! own user database), splits `runcmd` into `EtcdadmInit <repository> <version> <cipher suites>`
//! or `EtcdadmJoin ... <endpoint>`, and runs `/opt/bin/etcdadm <init|join> phase <p> [endpoint]`
//! for each phase with `--version <version> --init-system kubelet --image-repository
//! <repository> --certs-dir /var/lib/etcd/pki --data-dir /var/lib/etcd/data
//! --kubelet-pod-manifest-path ./manifests --cipher-suites <list>` (EKS Anywhere's etcdadm), then
//! waits for the etcd static pod. The member name is the hostname, which Bottlerocket sets from
//! `settings.network.hostname`.
//!
//! Where the sim differs, and why:
//! - One `etcdadm init|join` of the upstream-faithful stand-in, with the same version, certs dir,
//!   data dir and endpoint, instead of the phases of EKS Anywhere's build: the stand-in is
//!   upstream etcdadm, which has no phases, no `--image-repository`, no kubelet init system and
//!   no `--cipher-suites`. etcd runs from the local etcd of that major.minor under the stand-in's
//!   systemd, not as a static pod from the image; the repository is only logged.
//! - Cipher suites: EKS Anywhere's build hands `--cipher-suites` to etcd from its first start;
//!   the stand-in has no such flag, so before it runs, `ETCD_CIPHER_SUITES=<list>` goes into a
//!   drop-in of etcd's unit ([`CIPHER_SUITES_DROP_IN`]), which the stand-in's systemd reads with
//!   the unit etcdadm writes: etcd starts once, with the suites, and is never restarted for them.
//! - A join endpoint that is a comma list goes to the stand-in as is and is refused there, as
//!   upstream refuses it; EKS Anywhere's build accepts one.
//! - Paths: `/.bottlerocket/rootfs/<p>` is the machine's `/<p>` and `/var/lib/etcd/<p>` the
//!   machine's own (the image's link). A path that would land only inside the container is an
//!   error: the sim has no container filesystem to put it in. Owners are recorded, not applied.
//! - Success: the image disables its host container when done; the sim writes the CAPI success
//!   sentinel instead, which is how its runtime tells a bootstrapped machine.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::bottlerocket::{BottlerocketMachine, EtcdadmWords};
use crate::cloud_config::{BOOTSTRAP_SUCCESS_MARKER, Permissions, WriteFile};
use crate::error::MachineError;
use crate::executor::{CommandEnvironment, open_log, run_logged};
use crate::isolation::is_isolated;
use crate::write_files::write_entry;

/// Where the bootstrap's output goes, in the machine view.
pub const BOOTSTRAP_LOG: &str = "/var/log/kubeadm-bootstrap.log";
/// Where a superpowered host container sees the host's root.
const HOST_ROOT: &str = "/.bottlerocket/rootfs";
/// The etcd directory the image links to the host's.
const ETCD_BASE: &str = "/var/lib/etcd";
const CERTS_DIR: &str = "/var/lib/etcd/pki";
const DATA_DIR: &str = "/var/lib/etcd/data";

/// The machine path a file written at `container_path` by the bootstrap container lands on.
pub fn machine_path(container_path: &str) -> Result<String, MachineError> {
    let under = |base: &str| {
        container_path
            .strip_prefix(base)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if let Some(rest) = under(HOST_ROOT) {
        return Ok(if rest.is_empty() { "/".into() } else { rest.into() });
    }
    if under(ETCD_BASE).is_some() {
        return Ok(container_path.into());
    }
    Err(MachineError::UserData(format!(
        "write_files {container_path}: this path is inside the bootstrap container only (not under \
         {HOST_ROOT} or {ETCD_BASE}); the sim models what reaches the host"
    )))
}

/// The stand-in invocation for the image's words.
pub fn etcdadm_args(words: &EtcdadmWords) -> Vec<String> {
    let mut args: Vec<String> = match words {
        EtcdadmWords::Init { .. } => vec!["init".into()],
        EtcdadmWords::Join { endpoint, .. } => vec!["join".into(), endpoint.clone()],
    };
    for (flag, value) in [
        ("--version", words.version()),
        ("--certs-dir", CERTS_DIR),
        ("--data-dir", DATA_DIR),
    ] {
        args.extend([flag.to_string(), value.to_string()]);
    }
    args
}

/// Where the sim puts the cipher suites for etcd's first start (see the module comment).
pub const CIPHER_SUITES_DROP_IN: &str = "/etc/systemd/system/etcd.service.d/10-cipher-suites.conf";

/// The drop-in setting `ETCD_CIPHER_SUITES` to `list` (suite names: plain words).
pub fn cipher_suites_drop_in(list: &str) -> String {
    format!("[Service]\nEnvironment=\"ETCD_CIPHER_SUITES={list}\"\n")
}

/// Bootstrap the machine (call inside the machine view). Returns whether etcd is up as asked.
pub fn run(
    machine: &BottlerocketMachine,
    environment: &CommandEnvironment,
    log_path: &Path,
) -> Result<bool, MachineError> {
    // The bootstrap container's steps in the order the image runs them.
    let mut log = open_log(log_path)?;
    let mut note = |line: String| {
        let _ = writeln!(log, "[sim] {line}");
    };
    if let Some(hostname) = &machine.hostname {
        std::fs::write("/proc/sys/kernel/hostname", hostname)
            .map_err(MachineError::io("/proc/sys/kernel/hostname"))?;
        std::fs::write("/etc/hostname", format!("{hostname}\n"))
            .map_err(MachineError::io("/etc/hostname"))?;
        note(format!("settings.network.hostname: {hostname}"));
    }
    for file in &machine.bootstrap.write_files {
        let target = machine_path(&file.path)?;
        if !is_isolated(Path::new(&target)) {
            return Err(MachineError::UserData(format!(
                "write_files {} lands on {target}, outside the machine's private directories ({}); \
                 the sim would write it on the host",
                file.path,
                crate::isolation::ISOLATED_DIRS.join(", ")
            )));
        }
        let entry = WriteFile {
            path: target.clone(),
            content: file.content.clone(),
            encoding: None,
            permissions: Some(Permissions::Text(format!("{:o}", file.mode()?))),
            owner: Some(file.owner.clone()),
            append: false,
        };
        write_entry(Path::new("/"), &entry)?;
        note(format!(
            "write_files: {} -> {target} (owner {:?} recorded, not applied)",
            file.path, file.owner
        ));
    }
    let words = EtcdadmWords::parse(&machine.bootstrap.runcmd)?;
    let repository = match &words {
        EtcdadmWords::Init { repository, .. } | EtcdadmWords::Join { repository, .. } => repository,
    };
    note(format!(
        "runcmd: {} (etcd image {repository}:v{}; the stand-in runs the local etcd of that version)",
        machine.bootstrap.runcmd,
        words.version()
    ));
    let drop_in = Path::new(CIPHER_SUITES_DROP_IN);
    if let Some(parent) = drop_in.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    std::fs::write(drop_in, cipher_suites_drop_in(words.cipher_suites()))
        .map_err(MachineError::io(drop_in))?;
    note(format!(
        "{CIPHER_SUITES_DROP_IN}: ETCD_CIPHER_SUITES={}",
        words.cipher_suites()
    ));
    let args = etcdadm_args(&words);
    note(format!("etcdadm {}", args.join(" ")));
    let succeeded = command(&mut log, log_path, environment, "etcdadm", &args)?;
    if !succeeded {
        let _ = writeln!(log, "[sim] etcdadm failed: the machine is not bootstrapped");
        return Ok(false);
    }
    let sentinel = PathBuf::from("/").join(BOOTSTRAP_SUCCESS_MARKER);
    if let Some(parent) = sentinel.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    std::fs::write(&sentinel, "success\n").map_err(MachineError::io(&sentinel))?;
    let _ = writeln!(log, "[sim] bootstrap succeeded");
    Ok(true)
}

/// Run `program args` (see [`run_logged`]); whether it exited 0.
fn command(
    log: &mut File,
    log_path: &Path,
    environment: &CommandEnvironment,
    program: &str,
    args: &[String],
) -> Result<bool, MachineError> {
    let status = run_logged(log, log_path, environment, program, args)?.map_err(|e| MachineError::Spawn {
        program: program.into(),
        reason: e.to_string(),
    })?;
    let _ = writeln!(log, "[sim] {program} exited with {status}");
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_paths_map_to_the_host_they_reach() {
        assert_eq!(
            machine_path("/var/lib/etcd/pki/ca.crt").unwrap(),
            "/var/lib/etcd/pki/ca.crt"
        );
        assert_eq!(
            machine_path("/.bottlerocket/rootfs/opt/etcd/token").unwrap(),
            "/opt/etcd/token"
        );
        for inside in ["/etc/motd", "/var/lib/etcdx/a", "/.bottlerocket/rootfsx/a"] {
            assert!(machine_path(inside).is_err(), "{inside}");
        }
    }

    #[test]
    fn the_words_become_the_stand_ins_flags() {
        let join = EtcdadmWords::parse("EtcdadmJoin r/etcd 3.4.23 TLS_A https://10.0.0.1:2379").unwrap();
        assert_eq!(
            etcdadm_args(&join).join(" "),
            "join https://10.0.0.1:2379 --version 3.4.23 --certs-dir /var/lib/etcd/pki --data-dir /var/lib/etcd/data"
        );
        let init = EtcdadmWords::parse("EtcdadmInit r/etcd 3.5.9-eks-1 TLS_A").unwrap();
        assert!(
            etcdadm_args(&init)
                .join(" ")
                .starts_with("init --version 3.5.9-eks-1 ")
        );
    }

    #[test]
    fn cipher_suites_reach_etcd_through_a_drop_in() {
        let unit = crate::systemd::unit::parse_unit(
            "etcd.service",
            &[
                "[Service]\nExecStart=/opt/bin/etcd\n".to_string(),
                cipher_suites_drop_in("TLS_A,TLS_B"),
            ],
        )
        .unwrap();
        assert_eq!(
            unit.environment,
            vec![("ETCD_CIPHER_SUITES".to_string(), "TLS_A,TLS_B".to_string())]
        );
    }
}
