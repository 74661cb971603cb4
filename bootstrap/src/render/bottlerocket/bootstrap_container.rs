//! The kubeadm-bootstrap host container's user data: the cloud-config-like YAML the EKS Anywhere
//! bootstrap image reads. It writes `write_files` (path, owner, permissions, content) from inside
//! its superpowered container, then splits `runcmd`, one string, on whitespace: `EtcdadmInit
//! <repository> <version> <cipher suites>` or `EtcdadmJoin ... <join URL>`, every word required.

use askama::Template;
use etcdadm_shared::api::config::EtcdadmConfigSpec;
use etcdadm_shared::bottlerocket::split_etcd_image;
use etcdadm_shared::validation::quoted;

use crate::render::error::RenderError;
use crate::render::etcdadm_command::{cipher_suites, join_target};
use crate::render::files::{FileEntry, ca_files, check_unique_paths, user_files};
use crate::render::input::{EtcdadmCommand, RenderInput};
use crate::render::yaml::{double_quoted, scalar};

/// Where the bootstrap image's etcdadm keeps certificates (`--certs-dir`); the image links
/// `/var/lib/etcd` to the host's, so the CA written here is on the host.
const CERTS_DIR: &str = "/var/lib/etcd/pki";
/// Where a superpowered host container sees the host's root filesystem.
pub const HOST_ROOT: &str = "/.bottlerocket/rootfs";
/// The command words the bootstrap image dispatches on.
const INIT_WORD: &str = "EtcdadmInit";
const JOIN_WORD: &str = "EtcdadmJoin";
/// The cipher suite word when the spec names none (the image needs every word): Go's TLS 1.2
/// ECDHE suites with AEAD ciphers, the modern part of what etcd offers by default.
pub const DEFAULT_CIPHER_SUITES: &str = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,\
TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,\
TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,\
TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256";
/// cloud-init's mode for a file without permissions (the image's own default is 0640): the
/// spec means the same on both formats.
const DEFAULT_FILE_MODE: &str = "0644";
/// The image looks owners up in its own user database: root is the one it surely has.
const DEFAULT_OWNER: &str = "root:root";
/// Indentation of a file's content block under its `- path:` entry.
const FILE_CONTENT_INDENT: usize = 6;

#[derive(Template)]
#[template(path = "bootstrap-container.yaml")]
struct BootstrapContainerTemplate {
    write_files: Vec<FileView>,
    runcmd: String,
}

struct FileView {
    path: String,
    owner: String,
    permissions: String,
    content: String,
}

/// The YAML document for `input`'s machine.
pub fn user_data(input: &RenderInput) -> Result<String, RenderError> {
    let mut files = ca_files(&input.ca, CERTS_DIR)?;
    files.extend(user_files(input.spec, input.secrets)?);
    check_unique_paths(&files)?;
    let template = BootstrapContainerTemplate {
        write_files: files.iter().map(file_view).collect(),
        runcmd: double_quoted(&etcdadm_line(input.spec, &input.command)?),
    };
    let mut out = template.render()?;
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The CA goes where the image's etcdadm reads it; the user's files go to their path on the
/// host, through the host root the container sees.
fn file_view(file: &FileEntry) -> FileView {
    let path = match &file.source_field {
        None => file.path.clone(),
        Some(_) => format!("{HOST_ROOT}{}", file.path),
    };
    FileView {
        path: double_quoted(&path),
        owner: double_quoted(file.owner.as_deref().unwrap_or(DEFAULT_OWNER)),
        permissions: double_quoted(file.permissions.as_deref().unwrap_or(DEFAULT_FILE_MODE)),
        content: scalar(&file.content, FILE_CONTENT_INDENT),
    }
}

/// `EtcdadmInit <repository> <version> <cipher suites>` or `EtcdadmJoin ... <join URL>`.
pub fn etcdadm_line(spec: &EtcdadmConfigSpec, command: &EtcdadmCommand) -> Result<String, RenderError> {
    const IMAGE_FIELD: &str = "spec.bottlerocketConfig.etcdImage";
    let image = spec
        .bottlerocket_config
        .as_ref()
        .and_then(|b| b.etcd_image.as_deref())
        .unwrap_or_default()
        .trim();
    let (repository, version) = split_etcd_image(image).ok_or_else(|| {
        RenderError::invalid(
            IMAGE_FIELD,
            format!("{} is not <repository>:<etcd version>", quoted(image)),
        )
    })?;
    let ciphers = cipher_suites(spec)?.unwrap_or_else(|| DEFAULT_CIPHER_SUITES.to_string());
    let words = [repository, version, ciphers.as_str()].join(" ");
    match command {
        EtcdadmCommand::Init => Ok(format!("{INIT_WORD} {words}")),
        EtcdadmCommand::InitFromSnapshot(_) => Err(RenderError::invalid(
            "spec.format",
            "the Bottlerocket bootstrap image cannot restore a snapshot; a cluster created from \
             a snapshot needs cloud-config user data",
        )),
        EtcdadmCommand::Join { learner: Some(_), .. } => Err(RenderError::invalid(
            "spec.format",
            "the Bottlerocket bootstrap image joins as a voting member; a learner join needs \
             cloud-config user data",
        )),
        EtcdadmCommand::Join { urls, learner: None } => {
            let target = join_target(urls, spec.flavor())?;
            if target.contains(char::is_whitespace) {
                return Err(RenderError::invalid(
                    "join URL",
                    format!(
                        "{} holds whitespace, which would split the bootstrap image's command",
                        quoted(&target)
                    ),
                ));
            }
            Ok(format!("{JOIN_WORD} {words} {target}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::LearnerJoin;
    use etcdadm_shared::api::config::{BottlerocketConfig, EtcdadmFlavor, Format};

    fn spec(image: &str, ciphers: Option<&str>) -> EtcdadmConfigSpec {
        EtcdadmConfigSpec {
            format: Some(Format::Bottlerocket),
            cipher_suites: ciphers.map(str::to_string),
            bottlerocket_config: Some(BottlerocketConfig {
                etcd_image: Some(image.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn init_names_repository_version_and_ciphers() {
        let line = etcdadm_line(
            &spec(
                "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9",
                Some("TLS_A, TLS_B"),
            ),
            &EtcdadmCommand::Init,
        )
        .unwrap();
        assert_eq!(
            line,
            "EtcdadmInit public.ecr.aws/eks-distro/etcd-io/etcd 3.5.9-eks-1-28-9 TLS_A,TLS_B"
        );
    }

    #[test]
    fn no_cipher_suites_is_the_default_list_never_an_empty_word() {
        for ciphers in [None, Some(""), Some(" , ")] {
            let line = etcdadm_line(&spec("r/etcd:3.4.23", ciphers), &EtcdadmCommand::Init).unwrap();
            assert_eq!(line, format!("EtcdadmInit r/etcd 3.4.23 {DEFAULT_CIPHER_SUITES}"));
            assert_eq!(line.split_whitespace().count(), 4);
        }
    }

    #[test]
    fn join_adds_one_url_or_the_eks_anywhere_list() {
        let urls = vec![
            "https://10.0.0.1:2379".to_string(),
            "https://10.0.0.2:2379".into(),
        ];
        let mut s = spec("r/etcd:v3.5.9", Some("TLS_A"));
        let line = etcdadm_line(
            &s,
            &EtcdadmCommand::Join {
                urls: &urls,
                learner: None,
            },
        )
        .unwrap();
        assert_eq!(line, "EtcdadmJoin r/etcd 3.5.9 TLS_A https://10.0.0.1:2379");
        s.etcdadm_flavor = Some(EtcdadmFlavor::EksAnywhere);
        let line = etcdadm_line(
            &s,
            &EtcdadmCommand::Join {
                urls: &urls,
                learner: None,
            },
        )
        .unwrap();
        assert!(
            line.ends_with(" https://10.0.0.1:2379,https://10.0.0.2:2379"),
            "{line}"
        );
        let spaced = vec!["https://a b:2379".to_string()];
        let err = etcdadm_line(
            &s,
            &EtcdadmCommand::Join {
                urls: &spaced,
                learner: None,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("whitespace"), "{err}");
        let err = etcdadm_line(
            &s,
            &EtcdadmCommand::Join {
                urls: &urls,
                learner: Some(LearnerJoin::default()),
            },
        )
        .unwrap_err();
        assert_eq!(err.field_path(), Some("spec.format"), "{err}");
    }

    #[test]
    fn an_image_without_a_version_tag_names_its_field() {
        let err = etcdadm_line(&spec("r/etcd", None), &EtcdadmCommand::Init).unwrap_err();
        assert_eq!(err.field_path(), Some("spec.bottlerocketConfig.etcdImage"));
    }
}
