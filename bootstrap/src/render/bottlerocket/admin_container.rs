//! The admin host container's user data: its one login user, that user's password hash (serial
//! console) and SSH keys, as the Bottlerocket admin container reads them.

use serde::Serialize;

use etcdadm_shared::api::config::EtcdadmConfigSpec;

use crate::render::error::RenderError;
use crate::render::secrets::ResolvedSecrets;

#[derive(Serialize)]
struct AdminUserData<'a> {
    /// Without a user the admin container logs in `ec2-user`.
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(rename = "password-hash", skip_serializing_if = "Option::is_none")]
    password_hash: Option<&'a str>,
    ssh: Ssh<'a>,
}

#[derive(Serialize)]
struct Ssh<'a> {
    #[serde(rename = "authorized-keys")]
    authorized_keys: &'a [String],
}

/// The JSON document (admission allows at most one user; the renderer's validation too). A
/// password is set only with `lockPassword: false`: cloud-init locks it otherwise, and so does
/// the admin container when it gets no hash.
pub fn user_data(spec: &EtcdadmConfigSpec, secrets: &ResolvedSecrets) -> Result<String, RenderError> {
    let user = spec.users.first();
    let password_hash =
        match user {
            Some(user) if user.lock_password == Some(false) => match &user.passwd_from {
                Some(from) => Some(secrets.user_passwords.get(&user.name).ok_or_else(|| {
                    RenderError::UnresolvedSecret {
                        field_path: "spec.users[0].passwdFrom".into(),
                        secret_name: from.secret.name.clone(),
                        key: from.secret.key.clone(),
                    }
                })?),
                None => user.passwd.as_ref(),
            },
            _ => None,
        };
    let document = AdminUserData {
        user: user.map(|u| u.name.as_str()),
        password_hash: password_hash.map(String::as_str),
        ssh: Ssh {
            authorized_keys: user.map(|u| u.ssh_authorized_keys.as_slice()).unwrap_or_default(),
        },
    };
    serde_json::to_string(&document)
        .map_err(|e| RenderError::invalid("spec.users", format!("cannot be encoded as JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdadm_shared::api::config::User;

    #[test]
    fn no_user_means_no_keys_for_the_default_user() {
        let json = user_data(&EtcdadmConfigSpec::default(), &ResolvedSecrets::default()).unwrap();
        assert_eq!(json, r#"{"ssh":{"authorized-keys":[]}}"#);
    }

    #[test]
    fn the_user_its_keys_and_an_unlocked_password() {
        let mut user = User {
            name: "ops".into(),
            passwd: Some("$6$x".into()),
            ssh_authorized_keys: vec!["ssh-ed25519 AAAA a@b".into()],
            ..Default::default()
        };
        let spec = |user: &User| EtcdadmConfigSpec {
            users: vec![user.clone()],
            ..Default::default()
        };
        let secrets = ResolvedSecrets::default();
        assert_eq!(
            user_data(&spec(&user), &secrets).unwrap(),
            r#"{"user":"ops","ssh":{"authorized-keys":["ssh-ed25519 AAAA a@b"]}}"#,
            "locked unless lockPassword: false, as cloud-init"
        );
        user.lock_password = Some(false);
        assert_eq!(
            user_data(&spec(&user), &secrets).unwrap(),
            r#"{"user":"ops","password-hash":"$6$x","ssh":{"authorized-keys":["ssh-ed25519 AAAA a@b"]}}"#
        );
    }
}
