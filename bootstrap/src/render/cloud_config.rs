//! The cloud-config document: decides what goes in it and in which order; the askama template
//! only lays out values that are already quoted YAML scalars, made literal for cloud-init's
//! Jinja stage except the user's own commands (`jinja.rs`).

use askama::Template;
use etcdadm_shared::api::config::{EtcdadmConfigSpec, Ntp, User};
use etcdadm_shared::validation::quoted;

use super::containerd::containerd_setup;
use super::error::RenderError;
use super::etcdadm_command::{
    LEARNER_JOIN_SCRIPT, LEARNER_JOIN_SCRIPT_CONTENT, default_install_commands, etcdadm_runcmd,
    settings_drop_in,
};
use super::files::{
    ETCDADM_CERTS_DIR, FileEntry, ca_files, cert_bundle_files, check_content_sources, check_unique_paths,
    placeholder_file, user_files,
};
use super::input::{EtcdadmCommand, RenderInput};
use super::jinja::literal;
use super::restore;
use super::secrets::ResolvedSecrets;
use super::secrets::check_resolved;
use super::yaml::{double_quoted, scalar};

/// What the reference runs before etcdadm on cloud-config machines: images built for Kubernetes
/// nodes start a kubelet that would fight etcd for nothing. Plain, as the reference has it:
/// runcmd is one `sh` script without `set -e`, so a missing kubelet unit only logs an error and
/// the next command still runs; `|| true` would add nothing.
const STOP_KUBELET: &str = "systemctl stop kubelet";

/// Indentation of a file's content block under its `- path:` entry.
const FILE_CONTENT_INDENT: usize = 6;

#[derive(Template)]
#[template(path = "cloud-config.yaml")]
struct CloudConfigTemplate {
    write_files: Vec<FileView>,
    runcmd: Vec<String>,
    ntp: Option<NtpView>,
    users: Vec<UserView>,
}

struct FileView {
    path: String,
    owner: Option<String>,
    permissions: Option<String>,
    encoding: Option<&'static str>,
    append: Option<bool>,
    content: String,
}

struct NtpView {
    enabled: Option<bool>,
    servers: Vec<String>,
}

struct UserView {
    name: String,
    passwd: Option<String>,
    gecos: Option<String>,
    groups: Option<String>,
    homedir: Option<String>,
    inactive: Option<bool>,
    lock_passwd: Option<bool>,
    shell: Option<String>,
    primary_group: Option<String>,
    sudo: Option<String>,
    ssh_authorized_keys: Vec<String>,
}

/// The cloud-config user data for `input`.
pub fn render(input: &RenderInput) -> Result<String, RenderError> {
    let spec = input.spec;
    if spec.bottlerocket_config.is_some() {
        return Err(RenderError::invalid(
            "spec.bottlerocketConfig",
            "is only used with format bottlerocket; remove it or set spec.format: bottlerocket",
        ));
    }
    check_unique_user_names(spec)?;
    check_content_sources(spec)?;
    // Missing values are reported in spec order (users, then files), whatever the layout order.
    check_resolved(spec, input.secrets)?;

    let mut files = ca_files(&input.ca, ETCDADM_CERTS_DIR)?;
    files.extend(user_files(spec, input.secrets)?);
    files.extend(cert_bundle_files(spec)?);
    let containerd = containerd_setup(spec.proxy.as_ref(), spec.registry_mirror.as_ref())?;
    files.extend(containerd.files);
    files.push(placeholder_file());
    files.extend(settings_drop_in(spec)?);
    if let EtcdadmCommand::InitFromSnapshot(download) = input.command {
        files.extend(restore::files(download)?);
    }
    if let EtcdadmCommand::Join { learner: Some(_), .. } = input.command {
        files.push(FileEntry::generated(
            LEARNER_JOIN_SCRIPT,
            "0755",
            LEARNER_JOIN_SCRIPT_CONTENT.to_string(),
        ));
    }
    check_unique_paths(&files)?;

    // Always quoted: the last command may end the document, where a block is unsafe. The
    // user's own commands are Jinja templates (docs/bootstrap.md); every line we build, though
    // it holds user values, reaches the shell as written.
    let theirs = |c: &String| double_quoted(c);
    let ours = |c: &str| literal(&double_quoted(c)).into_owned();
    let mut runcmd: Vec<String> = spec.pre_etcdadm_commands.iter().map(theirs).collect();
    if !spec.cert_bundles.is_empty() {
        // Before the install commands, whose downloads may need the extra trust.
        runcmd.push(ours("update-ca-certificates"));
    }
    if !spec.etcdadm_builtin() {
        if spec.etcdadm_install_commands.is_empty() {
            runcmd.extend(default_install_commands().iter().map(|c| ours(c)));
        } else {
            runcmd.extend(spec.etcdadm_install_commands.iter().map(theirs));
        }
    }
    runcmd.push(ours(STOP_KUBELET));
    runcmd.extend(containerd.commands.iter().map(|c| ours(c)));
    runcmd.push(ours(&etcdadm_runcmd(spec, input.machine_name, &input.command)?));
    runcmd.extend(spec.post_etcdadm_commands.iter().map(theirs));

    let template = CloudConfigTemplate {
        write_files: files.iter().map(file_view).collect(),
        runcmd,
        ntp: spec.ntp.as_ref().map(ntp_view),
        users: users(spec, input.secrets)?,
    };
    let mut out = template.render()?;
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// `s` as a double-quoted YAML scalar that cloud-init's Jinja stage leaves as it is.
fn quoted_literal(s: &str) -> String {
    literal(&double_quoted(s)).into_owned()
}

fn file_view(file: &FileEntry) -> FileView {
    FileView {
        path: quoted_literal(&file.path),
        owner: file.owner.as_deref().map(quoted_literal),
        permissions: file.permissions.as_deref().map(quoted_literal),
        encoding: file.encoding.map(|e| e.as_str()),
        append: file.append,
        content: literal(&scalar(&file.content, FILE_CONTENT_INDENT)).into_owned(),
    }
}

/// `enabled` exactly as given: `false` must reach cloud-init as false.
fn ntp_view(ntp: &Ntp) -> NtpView {
    NtpView {
        enabled: ntp.enabled,
        servers: ntp.servers.iter().map(|s| quoted_literal(s)).collect(),
    }
}

fn users(spec: &EtcdadmConfigSpec, secrets: &ResolvedSecrets) -> Result<Vec<UserView>, RenderError> {
    spec.users
        .iter()
        .enumerate()
        .map(|(i, user)| user_view(i, user, secrets))
        .collect()
}

/// `passwdFrom` wins over `passwd`, as in CAPI's kubeadm provider.
/// Passwords from Secrets are matched to users by name, so two users with one name are ambiguous.
fn check_unique_user_names(spec: &EtcdadmConfigSpec) -> Result<(), RenderError> {
    for (index, user) in spec.users.iter().enumerate() {
        if let Some(first) = spec.users[..index].iter().position(|u| u.name == user.name) {
            return Err(RenderError::invalid(
                format!("spec.users[{index}].name"),
                format!(
                    "{} is already the name of spec.users[{first}]",
                    quoted(&user.name)
                ),
            ));
        }
    }
    Ok(())
}

fn user_view(index: usize, user: &User, secrets: &ResolvedSecrets) -> Result<UserView, RenderError> {
    let passwd = match &user.passwd_from {
        Some(from) => Some(secrets.user_passwords.get(&user.name).cloned().ok_or_else(|| {
            RenderError::UnresolvedSecret {
                field_path: format!("spec.users[{index}].passwdFrom"),
                secret_name: from.secret.name.clone(),
                key: from.secret.key.clone(),
            }
        })?),
        None => user.passwd.clone(),
    };
    let quoted = |value: &Option<String>| value.as_deref().map(quoted_literal);
    Ok(UserView {
        name: quoted_literal(&user.name),
        passwd: passwd.as_deref().map(quoted_literal),
        gecos: quoted(&user.gecos),
        groups: quoted(&user.groups),
        homedir: quoted(&user.home_dir),
        inactive: user.inactive,
        lock_passwd: user.lock_password,
        shell: quoted(&user.shell),
        primary_group: quoted(&user.primary_group),
        sudo: quoted(&user.sudo),
        ssh_authorized_keys: user
            .ssh_authorized_keys
            .iter()
            .map(|k| quoted_literal(k))
            .collect(),
    })
}
