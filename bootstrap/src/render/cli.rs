//! `etcdadm-bootstrap render`: shows operators exactly what a machine would run, from files on
//! disk instead of the cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args};
use etcdadm_shared::api::config::{EtcdadmConfig, EtcdadmConfigSpec, EtcdadmConfigTemplate};
use etcdadm_shared::pki::{CertificateAuthority, PkiError};

use super::error::RenderError;
use super::input::{CaFiles, EtcdadmCommand, LearnerJoin, RenderInput};
use super::render_user_data;
use super::secrets::{ResolvedSecrets, secret_refs};

/// Arguments of the `render` subcommand.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["init", "join"])))]
pub struct RenderArgs {
    /// YAML file holding an EtcdadmConfig (or an EtcdadmConfigTemplate).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Directory holding the etcd CA as ca.crt and ca.key (PEM).
    #[arg(long, value_name = "DIR")]
    pub ca_dir: PathBuf,
    /// Render `etcdadm init` (the first member).
    #[arg(long)]
    pub init: bool,
    /// Render `etcdadm join URL` (a learner join when the EtcdadmConfig carries the
    /// EtcdadmCluster controller's learner-join annotation); repeat for the eks-anywhere
    /// flavor's URL list.
    #[arg(long, value_name = "URL")]
    pub join: Vec<String>,
    /// Machine name for `etcdadm --name` (default: the config's metadata.name).
    #[arg(long, value_name = "NAME")]
    pub machine_name: Option<String>,
    /// Value of a Secret key the config refers to (passwdFrom, contentFrom), read from FILE.
    #[arg(long = "secret", value_name = "NAME/KEY=FILE")]
    pub secrets: Vec<String>,
}

/// Why `render` failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderCliError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("no machine name: pass --machine-name or set metadata.name in the config")]
    NoMachineName,
    #[error("etcd CA in {dir}: {source}")]
    Ca { dir: PathBuf, source: PkiError },
    #[error("--secret {arg}: expected NAME/KEY=FILE")]
    SecretSyntax { arg: String },
    #[error("--secret {arg}: the config refers to no Secret {name} key {key}")]
    UnusedSecret { arg: String, name: String, key: String },
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// The user data the arguments describe.
pub fn run(args: &RenderArgs) -> Result<String, RenderCliError> {
    let (name, spec, learner) = read_config(&args.file)?;
    let machine_name = args
        .machine_name
        .clone()
        .or(name)
        .filter(|n| !n.is_empty())
        .ok_or(RenderCliError::NoMachineName)?;

    let cert_pem = read(&args.ca_dir.join("ca.crt"))?;
    let key_pem = read(&args.ca_dir.join("ca.key"))?;
    // The controller would refuse a CA etcdadm cannot use; so does the preview.
    CertificateAuthority::from_pem(&cert_pem, &key_pem).map_err(|source| RenderCliError::Ca {
        dir: args.ca_dir.clone(),
        source,
    })?;

    let secrets = resolve_secrets(&spec, &args.secrets)?;
    let command = if args.init {
        EtcdadmCommand::Init
    } else {
        EtcdadmCommand::Join {
            urls: &args.join,
            learner,
        }
    };
    let input = RenderInput {
        spec: &spec,
        machine_name: &machine_name,
        ca: CaFiles {
            cert_pem: &cert_pem,
            key_pem: &key_pem,
        },
        command,
        secrets: &secrets,
    };
    Ok(render_user_data(&input)?)
}

/// The object's name and spec, and whether a join would be a learner join (an EtcdadmConfig the
/// EtcdadmCluster controller marked; never a template). The kind is checked: any other object
/// would parse as an empty spec (every field is optional) and render a misleading minimal
/// document.
fn read_config(
    path: &Path,
) -> Result<(Option<String>, EtcdadmConfigSpec, Option<LearnerJoin>), RenderCliError> {
    let text = read(path)?;
    let config_error = |message: String| RenderCliError::Config {
        path: path.to_path_buf(),
        message,
    };
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| config_error(format!("not YAML: {e}")))?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    match kind {
        "EtcdadmConfig" => {
            let config: EtcdadmConfig = serde_json::from_value(value)
                .map_err(|e| config_error(format!("not a valid EtcdadmConfig: {e}")))?;
            let learner = LearnerJoin::of(&config);
            Ok((config.metadata.name, config.spec, learner))
        }
        "EtcdadmConfigTemplate" => {
            let template: EtcdadmConfigTemplate = serde_json::from_value(value)
                .map_err(|e| config_error(format!("not a valid EtcdadmConfigTemplate: {e}")))?;
            Ok((template.metadata.name, template.spec.template.spec, None))
        }
        other => Err(config_error(format!(
            "kind is {other:?}; expected EtcdadmConfig or EtcdadmConfigTemplate"
        ))),
    }
}

/// Values given with `--secret` for the references the spec makes. A reference left without a
/// value is reported by the renderer, naming its field; a value nothing refers to is a typo.
fn resolve_secrets(spec: &EtcdadmConfigSpec, args: &[String]) -> Result<ResolvedSecrets, RenderCliError> {
    let mut files: BTreeMap<(String, String), (&String, PathBuf)> = BTreeMap::new();
    for arg in args {
        let syntax = || RenderCliError::SecretSyntax { arg: arg.clone() };
        let (name_key, file) = arg.split_once('=').ok_or_else(syntax)?;
        let (name, key) = name_key.split_once('/').ok_or_else(syntax)?;
        if name.is_empty() || key.is_empty() || file.is_empty() {
            return Err(syntax());
        }
        files.insert((name.into(), key.into()), (arg, PathBuf::from(file)));
    }

    let refs = secret_refs(spec);
    let mut resolved = ResolvedSecrets::default();
    for r in &refs {
        if let Some((_, file)) = files.get(&(r.secret_name.clone(), r.key.clone())) {
            resolved.insert(&r.target, read(file)?);
        }
    }
    for ((name, key), (arg, _)) in &files {
        if !refs.iter().any(|r| &r.secret_name == name && &r.key == key) {
            return Err(RenderCliError::UnusedSecret {
                arg: (*arg).clone(),
                name: name.clone(),
                key: key.clone(),
            });
        }
    }
    Ok(resolved)
}

fn read(path: &Path) -> Result<String, RenderCliError> {
    std::fs::read_to_string(path).map_err(|source| RenderCliError::Read {
        path: path.to_path_buf(),
        source,
    })
}
