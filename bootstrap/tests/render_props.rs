#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Whatever users write into a spec, the rendered document goes through cloud-init's Jinja stage
//! (a real Jinja engine, configured as cloud-init configures it) and parses as YAML, handing
//! cloud-init back exactly what they wrote: file fields and user fields whatever braces they
//! hold, and commands in order, the only text whose Jinja is expanded. Proxy values sit
//! inside a systemd drop-in; they are checked by undoing the systemd escaping of the drop-in's
//! `Environment=` lines (NO_PROXY as the comma-joined list).

use etcdadm_bootstrap::render::{
    CaFiles, EtcdadmCommand, LearnerJoin, RenderError, RenderInput, ResolvedSecrets, render_user_data,
};
use etcdadm_shared::api::config::{EtcdadmConfigSpec, File, ProxyConfiguration, User};
use proptest::prelude::*;
use serde_json::Value;

const CA_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
const CA_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEfake\n-----END RSA PRIVATE KEY-----\n";

/// Strings built from the pieces that break naive YAML (and shells, and jinja) plus any char.
fn nasty() -> impl Strategy<Value = String> {
    let tricky = prop::sample::select(vec![
        "\"",
        "'",
        ":",
        ": ",
        "#",
        " #",
        "- ",
        "\n",
        "\n\n",
        "\t",
        "\r\n",
        "{{",
        "}}",
        "{{ ds.meta_data.hostname }}",
        "\\",
        "%",
        "&",
        "*",
        "!",
        "|",
        ">",
        "<",
        "---",
        "...",
        " ",
        "é",
        "😀",
        "\u{2028}",
        "\u{85}",
        "\u{feff}",
        "\u{0}",
        "\u{7f}",
        "\u{1b}",
        "yes",
        "null",
        "0640",
        "~",
        "@",
        "`",
        "[",
        "]",
        "{",
        "}",
        ",",
        "$(x)",
        "{%",
        "%}",
        "{#",
        "#}",
        "{% endraw %}",
        "{%- raw -%}",
        "{{ '{{' }}",
    ]);
    let piece = prop_oneof![
        3 => any::<char>().prop_map(String::from),
        4 => tricky.prop_map(String::from),
        2 => "[a-z]{1,6}",
    ];
    prop::collection::vec(piece, 0..10).prop_map(|pieces| pieces.concat())
}

fn opt<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop::option::of(s)
}

fn user() -> impl Strategy<Value = User> {
    (
        nasty(),
        (opt(nasty()), opt(nasty()), opt(nasty()), opt(nasty())),
        (opt(nasty()), opt(nasty()), opt(nasty())),
        (opt(any::<bool>()), opt(any::<bool>())),
        prop::collection::vec(nasty(), 0..3),
    )
        .prop_map(
            |(
                name,
                (gecos, groups, home_dir, shell),
                (passwd, primary_group, sudo),
                (inactive, lock_password),
                keys,
            )| User {
                name,
                gecos,
                groups,
                home_dir,
                inactive,
                shell,
                passwd,
                passwd_from: None,
                primary_group,
                lock_password,
                sudo,
                ssh_authorized_keys: keys,
            },
        )
}

fn files() -> impl Strategy<Value = Vec<File>> {
    prop::collection::vec(
        (
            nasty(),
            opt(nasty()),
            opt(nasty()),
            opt(any::<bool>()),
            opt(nasty()),
        ),
        0..4,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            // A distinct absolute prefix per file: duplicate paths are (rightly) rejected.
            .map(|(i, (path, owner, permissions, append, content))| File {
                path: format!("/user/{i}/{path}"),
                owner,
                permissions,
                encoding: None,
                append,
                content,
                content_from: None,
            })
            .collect()
    })
}

fn no_nul(s: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    s.prop_map(|s| s.replace('\0', ""))
}

fn proxy() -> impl Strategy<Value = ProxyConfiguration> {
    (
        opt(no_nul(nasty())),
        opt(no_nul(nasty())),
        prop::collection::vec(no_nul(nasty()), 0..3),
    )
        .prop_map(|(http_proxy, https_proxy, no_proxy)| ProxyConfiguration {
            http_proxy,
            https_proxy,
            no_proxy,
        })
}

/// A command: the user's commands are Jinja templates (docs/bootstrap.md), so any text without
/// Jinja delimiters, sometimes with the hostname expression in it.
fn command() -> impl Strategy<Value = String> {
    (nasty(), any::<bool>()).prop_map(|(text, hostname)| {
        let mut text = text;
        while ["{{", "{%", "{#"].iter().any(|o| text.contains(o)) {
            text = text
                .replace("{{", "{ {")
                .replace("{%", "{ %")
                .replace("{#", "{ #");
        }
        if hostname {
            text.push_str(" {{ ds.meta_data.hostname }}");
        }
        text
    })
}

/// What a command becomes once cloud-init's Jinja stage ran on a machine called [`HOSTNAME`].
fn expanded(command: &str) -> String {
    command.replace("{{ ds.meta_data.hostname }}", HOSTNAME)
}

const HOSTNAME: &str = "etcd-0.example";

/// The user data as cloud-init hands it to its YAML reader: the `## template: jinja` header
/// taken off and the rest rendered by Jinja as cloud-init configures it (trim_blocks; Jinja's
/// default of dropping the final newline).
fn cloud_init_jinja(text: &str) -> String {
    let template = text
        .strip_prefix("## template: jinja\n")
        .expect("the Jinja header");
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_keep_trailing_newline(false);
    env.render_str(
        template,
        minijinja::context! { ds => minijinja::context! { meta_data => minijinja::context! { hostname => HOSTNAME } } },
    )
    .unwrap_or_else(|e| panic!("cloud-init's Jinja stage would fail: {e:#}\n{text}"))
}

fn spec() -> impl Strategy<Value = EtcdadmConfigSpec> {
    (
        prop::collection::vec(command(), 0..4),
        prop::collection::vec(command(), 0..4),
        prop::collection::vec(command(), 0..3),
        files(),
        prop::collection::vec(user(), 0..3),
        opt(proxy()),
    )
        .prop_map(|(pre, post, install, files, mut users, proxy)| {
            // User names are unique (the renderer refuses duplicates); keep the first of each.
            let mut seen = std::collections::BTreeSet::new();
            users.retain(|u: &User| seen.insert(u.name.clone()));
            (pre, post, install, files, users, proxy)
        })
        .prop_map(|(pre, post, install, files, users, proxy)| EtcdadmConfigSpec {
            pre_etcdadm_commands: pre,
            post_etcdadm_commands: post,
            etcdadm_install_commands: install,
            files,
            users,
            proxy,
            ..Default::default()
        })
}

const JOIN_URLS: [&str; 1] = ["https://10.0.0.1:2379"];

/// Init, or (`learner`) the join of a learner the EtcdadmCluster controller pre-adds.
fn render(spec: &EtcdadmConfigSpec, learner: bool) -> Result<String, RenderError> {
    let urls: Vec<String> = JOIN_URLS.iter().map(|u| u.to_string()).collect();
    render_user_data(&RenderInput {
        spec,
        machine_name: "etcd-0",
        ca: CaFiles {
            cert_pem: CA_CERT,
            key_pem: CA_KEY,
        },
        command: if learner {
            EtcdadmCommand::Join {
                urls: &urls,
                learner: Some(LearnerJoin::default()),
            }
        } else {
            EtcdadmCommand::Init
        },
        secrets: &ResolvedSecrets::default(),
    })
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn check_opt(doc: &Value, key: &str, expected: &Option<String>) {
    match expected {
        Some(s) => assert_eq!(doc[key].as_str(), Some(s.as_str()), "{key}"),
        None => assert!(doc.get(key).is_none(), "{key} should be absent"),
    }
}

fn check_opt_bool(doc: &Value, key: &str, expected: Option<bool>) {
    assert_eq!(doc.get(key).and_then(Value::as_bool), expected, "{key}");
}

/// Undoes the escaping systemd's `Environment="..."` parser undoes, for the sequences we emit.
fn systemd_unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    let code = |chars: &mut std::str::Chars, digits: usize| {
        let hex: String = chars.by_ref().take(digits).collect();
        char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap()
    };
    while let Some(c) = chars.next() {
        match c {
            '%' => {
                assert_eq!(chars.next(), Some('%'), "lone % in {s:?}");
                out.push('%');
            }
            '\\' => match chars.next().unwrap() {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                'x' => out.push(code(&mut chars, 2)),
                'u' => out.push(code(&mut chars, 4)),
                other => panic!("unexpected escape \\{other} in {s:?}"),
            },
            '"' => panic!("unescaped quote in {s:?}"),
            c => out.push(c),
        }
    }
    out
}

fn drop_in_values(content: &str) -> Vec<(String, String)> {
    let mut lines = content.lines();
    assert_eq!(lines.next(), Some("[Service]"));
    lines
        .map(|line| {
            let body = line
                .strip_prefix("Environment=\"")
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| panic!("bad drop-in line {line:?}"));
            let (name, value) = body.split_once('=').unwrap();
            (name.to_string(), systemd_unescape(value))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn user_strings_round_trip_through_jinja_and_yaml(spec in spec(), learner in any::<bool>()) {
        let text = render(&spec, learner).unwrap();
        prop_assert!(text.starts_with("## template: jinja\n#cloud-config\n"));
        let rendered = cloud_init_jinja(&text);
        let doc: Value = serde_saphyr::from_str(&rendered)
            .unwrap_or_else(|e| panic!("rendered document is not YAML: {e}\n{rendered}"));

        // Commands: pre first, install right after, post last, each as written with its
        // Jinja expanded.
        let runcmd = strings(&doc["runcmd"]);
        let pre: Vec<String> = spec.pre_etcdadm_commands.iter().map(|c| expanded(c)).collect();
        let post: Vec<String> = spec.post_etcdadm_commands.iter().map(|c| expanded(c)).collect();
        let install: Vec<String> = spec.etcdadm_install_commands.iter().map(|c| expanded(c)).collect();
        prop_assert_eq!(&runcmd[..pre.len()], &pre[..]);
        let after_pre = &runcmd[pre.len()..];
        if install.is_empty() {
            prop_assert!(after_pre[0].contains("releases/download"));
        } else {
            prop_assert_eq!(&after_pre[..install.len()], &install[..]);
        }
        prop_assert_eq!(&runcmd[runcmd.len() - post.len()..], &post[..]);
        let etcdadm = &runcmd[runcmd.len() - post.len() - 1];
        if learner {
            prop_assert!(etcdadm.starts_with("sh /run/cluster-api/etcd-learner-join.sh wait-listed "), "{}", etcdadm);
            prop_assert!(etcdadm.contains(&format!("{{ etcdadm join {} ", JOIN_URLS[0])), "{}", etcdadm);
        } else {
            prop_assert!(etcdadm.starts_with("etcdadm init "), "{}", etcdadm);
        }

        // Files: the two CA files, then the user's, field by field.
        let written = doc["write_files"].as_array().unwrap();
        for (i, file) in spec.files.iter().enumerate() {
            let entry = &written[2 + i];
            prop_assert_eq!(entry["path"].as_str(), Some(file.path.as_str()));
            check_opt(entry, "owner", &file.owner);
            check_opt(entry, "permissions", &file.permissions);
            check_opt_bool(entry, "append", file.append);
            prop_assert_eq!(entry["content"].as_str(), Some(file.content.as_deref().unwrap_or("")));
        }

        // Users: every field.
        if spec.users.is_empty() {
            prop_assert!(doc.get("users").is_none());
        }
        for (i, user) in spec.users.iter().enumerate() {
            let entry = &doc["users"][i];
            prop_assert_eq!(entry["name"].as_str(), Some(user.name.as_str()));
            check_opt(entry, "passwd", &user.passwd);
            check_opt(entry, "gecos", &user.gecos);
            check_opt(entry, "groups", &user.groups);
            check_opt(entry, "homedir", &user.home_dir);
            check_opt(entry, "shell", &user.shell);
            check_opt(entry, "primary_group", &user.primary_group);
            check_opt(entry, "sudo", &user.sudo);
            check_opt_bool(entry, "inactive", user.inactive);
            check_opt_bool(entry, "lock_passwd", user.lock_password);
            let keys = entry.get("ssh_authorized_keys").map(strings).unwrap_or_default();
            prop_assert_eq!(keys, user.ssh_authorized_keys.clone());
        }

        // Proxy: the drop-in's values, systemd escaping undone.
        if let Some(proxy) = &spec.proxy {
            let drop_in = written
                .iter()
                .find(|f| f["path"] == "/etc/systemd/system/containerd.service.d/http-proxy.conf")
                .unwrap();
            let mut expected = Vec::new();
            if let Some(v) = &proxy.http_proxy { expected.push(("HTTP_PROXY".to_string(), v.clone())); }
            if let Some(v) = &proxy.https_proxy { expected.push(("HTTPS_PROXY".to_string(), v.clone())); }
            if !proxy.no_proxy.is_empty() { expected.push(("NO_PROXY".to_string(), proxy.no_proxy.join(","))); }
            prop_assert_eq!(drop_in_values(drop_in["content"].as_str().unwrap()), expected);
        }
    }
}

#[test]
fn systemd_unescape_undoes_what_the_renderer_does() {
    assert_eq!(
        systemd_unescape(r#"a%%b\"c\\d\ne\x01\u0085"#),
        "a%b\"c\\d\ne\u{1}\u{85}"
    );
}

#[test]
fn html_sensitive_characters_are_not_escaped() {
    let spec = EtcdadmConfigSpec {
        pre_etcdadm_commands: vec![r#"echo "<a href='x'>&amp;</a>" > /tmp/x"#.into()],
        ..Default::default()
    };
    let text = render(&spec, false).unwrap();
    assert!(
        text.contains(r#"  - "echo \"<a href='x'>&amp;</a>\" > /tmp/x""#),
        "{text}"
    );
    assert!(!text.contains("&lt;") && !text.contains("&#"));
}
