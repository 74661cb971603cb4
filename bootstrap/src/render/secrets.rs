//! The Secret keys a spec refers to, so the caller can fetch them before rendering, which stays
//! pure, and name the referring field when one is missing.

use std::collections::BTreeMap;

use etcdadm_shared::api::config::{EtcdadmConfigSpec, Format};

use super::error::RenderError;

/// The Secret, in the config's namespace, whose `username` and `password` keys log Bottlerocket
/// in to the registry mirror (the reference provider's convention). Optional: without it, pulls
/// are anonymous.
pub const REGISTRY_CREDENTIALS_SECRET: &str = "registry-credentials";

/// Secret-backed values already fetched by the caller.
#[derive(Clone, Default, PartialEq)]
pub struct ResolvedSecrets {
    /// Hashed passwords by user name (`users[].passwdFrom`).
    pub user_passwords: BTreeMap<String, String>,
    /// File contents by file path (`files[].contentFrom`).
    pub file_contents: BTreeMap<String, String>,
    /// Registry mirror login, from [`REGISTRY_CREDENTIALS_SECRET`].
    pub registry_username: Option<String>,
    pub registry_password: Option<String>,
}

/// Names what is resolved, never the values (passwords, tokens).
impl std::fmt::Debug for ResolvedSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedSecrets")
            .field("user_passwords", &self.user_passwords.keys().collect::<Vec<_>>())
            .field("file_contents", &self.file_contents.keys().collect::<Vec<_>>())
            .field("registry_username", &self.registry_username.is_some())
            .field("registry_password", &self.registry_password.is_some())
            .finish()
    }
}

impl ResolvedSecrets {
    /// Whether a value for `target` was supplied.
    pub fn contains(&self, target: &SecretTarget) -> bool {
        match target {
            SecretTarget::UserPassword { user } => self.user_passwords.contains_key(user),
            SecretTarget::FileContent { path } => self.file_contents.contains_key(path),
            SecretTarget::RegistryUsername => self.registry_username.is_some(),
            SecretTarget::RegistryPassword => self.registry_password.is_some(),
        }
    }

    /// Stores a fetched value where the renderer will look for it.
    pub fn insert(&mut self, target: &SecretTarget, value: String) {
        match target {
            SecretTarget::UserPassword { user } => {
                self.user_passwords.insert(user.clone(), value);
            }
            SecretTarget::FileContent { path } => {
                self.file_contents.insert(path.clone(), value);
            }
            SecretTarget::RegistryUsername => self.registry_username = Some(value),
            SecretTarget::RegistryPassword => self.registry_password = Some(value),
        }
    }
}

/// What a Secret value is used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretTarget {
    /// The hashed password of this user.
    UserPassword { user: String },
    /// The content of the file at this path.
    FileContent { path: String },
    /// The registry mirror user name.
    RegistryUsername,
    /// The registry mirror password.
    RegistryPassword,
}

/// One use of a Secret key by the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRefUse {
    /// The referring field, e.g. `spec.users[1].passwdFrom`.
    pub field_path: String,
    /// Secret name, in the config's namespace.
    pub secret_name: String,
    /// Key within the Secret.
    pub key: String,
    /// Where the value goes.
    pub target: SecretTarget,
    /// A missing Secret is no error: the value is used only when the Secret exists (a key
    /// missing from an existing Secret still is).
    pub optional: bool,
}

/// The first reference the spec needs a value for and `secrets` lacks, as the error naming it
/// (in spec order: users, then files).
pub fn check_resolved(spec: &EtcdadmConfigSpec, secrets: &ResolvedSecrets) -> Result<(), RenderError> {
    match secret_refs(spec)
        .into_iter()
        .find(|r| !r.optional && !secrets.contains(&r.target))
    {
        Some(missing) => Err(RenderError::UnresolvedSecret {
            field_path: missing.field_path,
            secret_name: missing.secret_name,
            key: missing.key,
        }),
        None => Ok(()),
    }
}

/// Every Secret key the spec refers to, in spec order.
pub fn secret_refs(spec: &EtcdadmConfigSpec) -> Vec<SecretRefUse> {
    let users = spec.users.iter().enumerate().filter_map(|(i, user)| {
        user.passwd_from.as_ref().map(|from| SecretRefUse {
            field_path: format!("spec.users[{i}].passwdFrom"),
            secret_name: from.secret.name.clone(),
            key: from.secret.key.clone(),
            target: SecretTarget::UserPassword {
                user: user.name.clone(),
            },
            optional: false,
        })
    });
    let files = spec.files.iter().enumerate().filter_map(|(i, file)| {
        file.content_from.as_ref().map(|from| SecretRefUse {
            field_path: format!("spec.files[{i}].contentFrom"),
            secret_name: from.secret.name.clone(),
            key: from.secret.key.clone(),
            target: SecretTarget::FileContent {
                path: file.path.clone(),
            },
            optional: false,
        })
    });
    let registry_login = (spec.format() == Format::Bottlerocket && spec.registry_mirror.is_some())
        .then(|| {
            [
                ("username", SecretTarget::RegistryUsername),
                ("password", SecretTarget::RegistryPassword),
            ]
            .map(|(key, target)| SecretRefUse {
                field_path: "spec.registryMirror".into(),
                secret_name: REGISTRY_CREDENTIALS_SECRET.into(),
                key: key.into(),
                target,
                optional: true,
            })
        })
        .into_iter()
        .flatten();
    users.chain(files).chain(registry_login).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdadm_shared::api::config::{File, FileSource, PasswdSource, SecretKeyRef, User};

    fn key_ref(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn lists_password_and_content_references_with_their_fields() {
        let spec = EtcdadmConfigSpec {
            users: vec![
                User {
                    name: "plain".into(),
                    passwd: Some("x".into()),
                    ..Default::default()
                },
                User {
                    name: "deploy".into(),
                    passwd_from: Some(PasswdSource {
                        secret: key_ref("deploy-password", "passwd"),
                    }),
                    ..Default::default()
                },
            ],
            files: vec![File {
                path: "/etc/token".into(),
                content_from: Some(FileSource {
                    secret: key_ref("tokens", "t"),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let refs = secret_refs(&spec);
        assert_eq!(
            refs,
            [
                SecretRefUse {
                    field_path: "spec.users[1].passwdFrom".into(),
                    secret_name: "deploy-password".into(),
                    key: "passwd".into(),
                    target: SecretTarget::UserPassword {
                        user: "deploy".into()
                    },
                    optional: false,
                },
                SecretRefUse {
                    field_path: "spec.files[0].contentFrom".into(),
                    secret_name: "tokens".into(),
                    key: "t".into(),
                    target: SecretTarget::FileContent {
                        path: "/etc/token".into()
                    },
                    optional: false,
                },
            ]
        );

        let mut resolved = ResolvedSecrets::default();
        for r in &refs {
            resolved.insert(&r.target, format!("value of {}", r.key));
        }
        assert_eq!(resolved.user_passwords["deploy"], "value of passwd");
        assert_eq!(resolved.file_contents["/etc/token"], "value of t");
    }

    #[test]
    fn a_bottlerocket_registry_mirror_may_log_in_with_the_reference_secret() {
        let mut spec = EtcdadmConfigSpec {
            registry_mirror: Some(Default::default()),
            ..Default::default()
        };
        assert!(secret_refs(&spec).is_empty(), "cloud-config uses no login");
        spec.format = Some(Format::Bottlerocket);
        let refs = secret_refs(&spec);
        let keys: Vec<(&str, &str, bool)> = refs
            .iter()
            .map(|r| (r.secret_name.as_str(), r.key.as_str(), r.optional))
            .collect();
        assert_eq!(
            keys,
            [
                ("registry-credentials", "username", true),
                ("registry-credentials", "password", true)
            ]
        );
        let mut resolved = ResolvedSecrets::default();
        resolved.insert(&refs[1].target, "p".into());
        assert!(resolved.contains(&SecretTarget::RegistryPassword));
        assert!(!resolved.contains(&SecretTarget::RegistryUsername));
        assert!(
            !format!("{resolved:?}").contains("\"p\""),
            "values are never printed"
        );
    }
}
