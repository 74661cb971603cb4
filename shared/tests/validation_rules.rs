//! Every EtcdadmConfigSpec admission rule: a spec that breaks it is reported with the exact
//! field path, and the nearest spec that keeps it passes with no error at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use etcdadm_shared::api::EtcdadmConfigSpec;
use etcdadm_shared::validation::{FieldError, validate_config_spec};
use serde_json::{Value, json};

fn check(spec: Value, base: &str) -> Vec<FieldError> {
    let spec: EtcdadmConfigSpec = serde_json::from_value(spec).expect("spec fixture");
    validate_config_spec(&spec, base)
}

/// `spec` passes.
fn valid(spec: Value) {
    let errors = check(spec.clone(), "spec");
    assert!(errors.is_empty(), "{spec} must be valid, got {errors:?}");
}

/// `spec` fails with exactly one error, at `path`, whose message contains `words`.
fn invalid(spec: Value, path: &str, words: &str) {
    let errors = check(spec.clone(), "spec");
    assert_eq!(errors.len(), 1, "{spec}: expected one error, got {errors:?}");
    assert_eq!(errors[0].path, path, "{errors:?}");
    assert!(
        errors[0].message.contains(words),
        "{errors:?} should mention {words:?}"
    );
    assert!(errors[0].to_string().starts_with(&format!("{path}: ")));
}

fn bottlerocket() -> Value {
    json!({
        "format": "bottlerocket",
        "cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "bottlerocketConfig": {
            "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9",
            "bootstrapImage": "public.ecr.aws/bottlerocket/bottlerocket-bootstrap:v1.0.0",
            "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:3.9"
        }
    })
}

fn without(mut spec: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    spec.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    spec
}

fn with(mut spec: Value, pointer: &str, value: Value) -> Value {
    *spec.pointer_mut(pointer).unwrap() = value;
    spec
}

#[test]
fn empty_spec_is_valid() {
    valid(json!({}));
    valid(json!({"format": "cloud-config"}));
}

#[test]
fn bottlerocket_needs_its_config() {
    valid(bottlerocket());
    invalid(
        without(bottlerocket(), "/bottlerocketConfig"),
        "spec.bottlerocketConfig",
        "is required with format bottlerocket",
    );
}

#[test]
fn bottlerocket_needs_an_etcd_image() {
    valid(bottlerocket());
    invalid(
        without(bottlerocket(), "/bottlerocketConfig/etcdImage"),
        "spec.bottlerocketConfig.etcdImage",
        "is required with format bottlerocket",
    );
    invalid(
        with(bottlerocket(), "/bottlerocketConfig/etcdImage", json!(" ")),
        "spec.bottlerocketConfig.etcdImage",
        "is required",
    );
}

#[test]
fn bottlerocket_etcd_image_carries_the_version_tag() {
    valid(with(
        bottlerocket(),
        "/bottlerocketConfig/etcdImage",
        json!("registry:5000/etcd:3.5.9"),
    ));
    invalid(
        with(
            bottlerocket(),
            "/bottlerocketConfig/etcdImage",
            json!("registry:5000/etcd"),
        ),
        "spec.bottlerocketConfig.etcdImage",
        "is not <repository>:<etcd version>",
    );
    for bad in ["etcd:latest", "etcd:v3.5.9@sha256:abc", "my etcd:v3.5.9"] {
        invalid(
            with(bottlerocket(), "/bottlerocketConfig/etcdImage", json!(bad)),
            "spec.bottlerocketConfig.etcdImage",
            "the tag is the etcd version",
        );
    }
}

#[test]
fn bottlerocket_needs_a_bootstrap_image() {
    valid(bottlerocket());
    invalid(
        with(bottlerocket(), "/bottlerocketConfig/bootstrapImage", json!("")),
        "spec.bottlerocketConfig.bootstrapImage",
        "is required with format bottlerocket",
    );
}

#[test]
fn bottlerocket_needs_a_pause_image() {
    valid(bottlerocket());
    invalid(
        without(bottlerocket(), "/bottlerocketConfig/pauseImage"),
        "spec.bottlerocketConfig.pauseImage",
        "is required with format bottlerocket",
    );
}

#[test]
fn bottlerocket_renders_default_cipher_suites_when_none_are_given() {
    valid(without(bottlerocket(), "/cipherSuites"));
    valid(with(bottlerocket(), "/cipherSuites", json!(" ")));
}

/// What EKS Anywhere applies for etcd on Bottlerocket (vSphere template and Go builder): every
/// field has a place in the settings, so it is accepted as is.
#[test]
fn an_eks_anywhere_bottlerocket_spec_is_valid() {
    valid(merged(
        bottlerocket(),
        json!({
            "etcdadmBuiltin": true,
            "preEtcdadmCommands": [],
            "users": [{"name": "ec2-user", "sshAuthorizedKeys": ["ssh-rsa AAAA"], "sudo": "ALL=(ALL) NOPASSWD:ALL"}],
            "proxy": {"httpProxy": "http://proxy:3128", "httpsProxy": "http://proxy:3128", "noProxy": ["10.0.0.0/8"]},
            "registryMirror": {"endpoint": "mirror.example:443", "caCert": "-----BEGIN CERTIFICATE-----"},
            "bottlerocketConfig": {
                "etcdImage": "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.9-eks-1-28-9",
                "bootstrapImage": "public.ecr.aws/l0g8r8j6/bottlerocket-bootstrap:v1-28-9-eks-a-60",
                "pauseImage": "public.ecr.aws/eks-distro/kubernetes/pause:v1.28.9-eks-1-28-9",
                "adminImage": "public.ecr.aws/bottlerocket/bottlerocket-admin:v0.11.0",
                "controlImage": "public.ecr.aws/bottlerocket/bottlerocket-control:v0.7.0",
                "kernel": {"sysctlSettings": {"vm.max_map_count": "262144"}},
                "boot": {"bootKernelParameters": {"console": ["tty0"]}},
                "customBootstrapContainers": [{"name": "bottlerocket-bootstrap-snow", "image": "i", "essential": false, "mode": "always"}]
            },
            "ntp": {"servers": ["time.example"]},
            "certBundles": [{"name": "corp", "data": "-----BEGIN CERTIFICATE-----"}],
            "files": [{"path": "/var/lib/x/y.conf", "owner": "root:root", "permissions": "0600", "content": "x"}]
        }),
    ));
}

fn merged(mut base: Value, extra: Value) -> Value {
    fn merge(base: &mut Value, extra: Value) {
        match (base, extra) {
            (Value::Object(base), Value::Object(extra)) => {
                for (key, value) in extra {
                    merge(base.entry(key).or_insert(Value::Null), value);
                }
            }
            (base, extra) => *base = extra,
        }
    }
    merge(&mut base, extra);
    base
}

/// Every field that would be ignored on Bottlerocket is refused, at its own path.
#[test]
fn bottlerocket_refuses_what_it_cannot_carry() {
    let cases = [
        (
            json!({"cloudInitConfig": {"version": "3.5.9"}}),
            "spec.cloudInitConfig",
            "only used with format cloud-config",
        ),
        (
            json!({"etcdadmBuiltin": false}),
            "spec.etcdadmBuiltin",
            "comes with the bottlerocket bootstrap image",
        ),
        (
            json!({"etcdadmInstallCommands": ["curl x"]}),
            "spec.etcdadmInstallCommands",
            "no shell",
        ),
        (
            json!({"preEtcdadmCommands": ["echo"]}),
            "spec.preEtcdadmCommands",
            "no shell",
        ),
        (
            json!({"postEtcdadmCommands": ["echo"]}),
            "spec.postEtcdadmCommands",
            "no shell",
        ),
        (
            json!({"users": [{"name": "a"}, {"name": "b"}]}),
            "spec.users[1]",
            "one login user",
        ),
        (
            json!({"users": [{"name": "a", "gecos": "A"}]}),
            "spec.users[0].gecos",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "groups": "wheel"}]}),
            "spec.users[0].groups",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "homeDir": "/h"}]}),
            "spec.users[0].homeDir",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "shell": "/bin/sh"}]}),
            "spec.users[0].shell",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "primaryGroup": "a"}]}),
            "spec.users[0].primaryGroup",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "inactive": true}]}),
            "spec.users[0].inactive",
            "sets up its user itself",
        ),
        (
            json!({"users": [{"name": "a", "sudo": "ALL=(ALL) ALL"}]}),
            "spec.users[0].sudo",
            "always gets",
        ),
        (
            json!({"users": [{"name": "a$"}]}),
            "spec.users[0].name",
            "ending in $",
        ),
        (
            json!({"files": [{"path": "/etc/motd"}]}),
            "spec.files[0].path",
            "is not under /var, /opt, /local, /mnt",
        ),
        (
            json!({"files": [{"path": "/var/../etc/x"}]}),
            "spec.files[0].path",
            "is not under",
        ),
        (
            json!({"files": [{"path": "/var/x", "encoding": "base64"}]}),
            "spec.files[0].encoding",
            "writes content as given",
        ),
        (
            json!({"files": [{"path": "/var/x", "append": true}]}),
            "spec.files[0].append",
            "whole files",
        ),
        (
            json!({"files": [{"path": "/var/x", "owner": "etcd:etcd"}]}),
            "spec.files[0].owner",
            "use root:root",
        ),
        (
            json!({"files": [{"path": "/var/x", "permissions": "rw-r--r--"}]}),
            "spec.files[0].permissions",
            "octal",
        ),
        (
            json!({"proxy": {"httpProxy": "http://a:1", "httpsProxy": "http://b:1"}}),
            "spec.proxy.httpProxy",
            "HTTPS only",
        ),
        (
            json!({"proxy": {"httpProxy": "http://a:1"}}),
            "spec.proxy.httpProxy",
            "HTTPS only",
        ),
        (
            json!({"ntp": {"enabled": false}}),
            "spec.ntp.enabled",
            "always runs its NTP client",
        ),
        (
            json!({"registryMirror": {"endpoint": "m.example", "caCert": "PEM"}, "certBundles": [{"name": "registry-mirror-ca", "data": "x"}]}),
            "spec.certBundles[0].name",
            "registry mirror's CA bundle",
        ),
        (
            json!({"bottlerocketConfig": {"customHostContainers": [{"name": "admin", "image": "i", "superpowered": true}]}}),
            "spec.bottlerocketConfig.customHostContainers[0].name",
            "the provider defines",
        ),
        (
            json!({"bottlerocketConfig": {"controlImage": "c", "customHostContainers": [{"name": "control", "image": "i", "superpowered": false}]}}),
            "spec.bottlerocketConfig.customHostContainers[0].name",
            "the provider defines",
        ),
        (
            json!({"bottlerocketConfig": {"customHostContainers": [{"name": "a.b", "image": "i", "superpowered": false}]}}),
            "spec.bottlerocketConfig.customHostContainers[0].name",
            "not a container name",
        ),
        (
            json!({"bottlerocketConfig": {"customHostContainers": [{"name": "h", "image": " ", "superpowered": false}]}}),
            "spec.bottlerocketConfig.customHostContainers[0].image",
            "is required",
        ),
        (
            json!({"bottlerocketConfig": {"customHostContainers": [{"name": "h", "image": "i", "superpowered": false, "userData": "not base64!"}]}}),
            "spec.bottlerocketConfig.customHostContainers[0].userData",
            "not base64",
        ),
        (
            json!({"bottlerocketConfig": {"customBootstrapContainers": [{"name": "b", "image": "i", "mode": "sometimes"}]}}),
            "spec.bottlerocketConfig.customBootstrapContainers[0].mode",
            "always, off, once",
        ),
        (
            json!({"bottlerocketConfig": {"customBootstrapContainers": [{"name": "b", "image": "i", "mode": "once", "userData": "%%"}]}}),
            "spec.bottlerocketConfig.customBootstrapContainers[0].userData",
            "not base64",
        ),
        (
            json!({"bottlerocketConfig": {"kernel": {"sysctlSettings": {" ": "1"}}}}),
            "spec.bottlerocketConfig.kernel.sysctlSettings",
            "empty key",
        ),
        (
            json!({"bottlerocketConfig": {"boot": {"bootKernelParameters": {"": ["x"]}}}}),
            "spec.bottlerocketConfig.boot.bootKernelParameters",
            "empty key",
        ),
    ];
    for (extra, path, words) in cases {
        invalid(merged(bottlerocket(), extra), path, words);
    }
    // The same fields, set to what the admin container and Bottlerocket do anyway, pass.
    valid(merged(
        bottlerocket(),
        json!({"etcdadmBuiltin": true, "users": [{"name": "ops", "inactive": false, "sudo": "ALL=(ALL) NOPASSWD: ALL",
            "passwd": "$6$x", "lockPassword": false}], "ntp": {"enabled": true},
            "files": [{"path": "/opt/x", "owner": "root", "permissions": "600", "append": false}]}),
    ));
}

#[test]
fn cloud_config_refuses_bottlerocket_settings() {
    valid(json!({"format": "cloud-config", "cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}));
    let cloud = with(bottlerocket(), "/format", json!("cloud-config"));
    invalid(
        cloud,
        "spec.bottlerocketConfig",
        "is only used with format bottlerocket",
    );
    invalid(
        without(bottlerocket(), "/format"),
        "spec.bottlerocketConfig",
        "is only used with format bottlerocket",
    );
}

#[test]
fn cloud_init_version_is_semver_without_v() {
    valid(json!({"cloudInitConfig": {"version": "3.5.9"}}));
    valid(json!({"cloudInitConfig": {"version": "3.6.0-rc.1+build.2"}}));
    valid(json!({"cloudInitConfig": {"version": ""}}));
    invalid(
        json!({"cloudInitConfig": {"version": "v3.5.9"}}),
        "spec.cloudInitConfig.version",
        "drop the leading v",
    );
    invalid(
        json!({"cloudInitConfig": {"version": "3.5"}}),
        "spec.cloudInitConfig.version",
        "is not an etcd version",
    );
}

#[test]
fn a_huge_value_is_quoted_in_part_with_its_length() {
    let huge = "9".repeat(1 << 20);
    let errors = check(json!({"cloudInitConfig": {"version": huge}}), "spec");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.cloudInitConfig.version");
    let message = &errors[0].message;
    assert!(
        message.len() < 400,
        "{} characters: {}",
        message.len(),
        &message[..400]
    );
    assert!(message.contains("(1048576 characters)"), "{message}");
    assert!(message.contains("is not an etcd version"), "{message}");
}

#[test]
fn cipher_suites_are_names_go_knows() {
    valid(json!({"cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_AES_128_CBC_SHA"}));
    valid(json!({"cipherSuites": ""}));
    invalid(
        json!({"cipherSuites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA512"}),
        "spec.cipherSuites",
        "\"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA512\" is not a cipher suite Go's crypto/tls knows",
    );
    invalid(
        json!({"cipherSuites": "TLS_A;reboot"}),
        "spec.cipherSuites",
        "is not a cipher suite",
    );
}

#[test]
fn cipher_suites_refuse_tls13_names() {
    valid(json!({"cipherSuites": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"}));
    invalid(
        json!({"cipherSuites": "TLS_AES_128_GCM_SHA256"}),
        "spec.cipherSuites",
        "TLS 1.3 suite",
    );
}

#[test]
fn cipher_suites_have_no_empty_entries() {
    valid(json!({"cipherSuites": "TLS_RSA_WITH_AES_128_CBC_SHA,TLS_RSA_WITH_AES_256_CBC_SHA"}));
    invalid(
        json!({"cipherSuites": "TLS_RSA_WITH_AES_128_CBC_SHA,,TLS_RSA_WITH_AES_256_CBC_SHA"}),
        "spec.cipherSuites",
        "entry 2 is empty",
    );
}

fn files(third: Value) -> Value {
    json!({"files": [
        {"path": "/etc/a", "content": "a"},
        {"path": "/etc/b", "contentFrom": {"secret": {"name": "s", "key": "k"}}},
        third,
    ]})
}

#[test]
fn file_content_and_content_from_are_exclusive() {
    valid(files(json!({"path": "/etc/c", "content": "c"})));
    valid(files(json!({"path": "/etc/c"})));
    invalid(
        files(
            json!({"path": "/etc/c", "content": "c", "contentFrom": {"secret": {"name": "s", "key": "k"}}}),
        ),
        "spec.files[2].contentFrom",
        "content and contentFrom are mutually exclusive",
    );
}

#[test]
fn file_paths_are_absolute() {
    valid(files(json!({"path": "/etc/c"})));
    invalid(
        files(json!({"path": "etc/c"})),
        "spec.files[2].path",
        "\"etc/c\" is not an absolute path",
    );
    invalid(
        files(json!({"path": ""})),
        "spec.files[2].path",
        "is not an absolute path",
    );
}

#[test]
fn file_paths_are_unique() {
    valid(files(json!({"path": "/etc/c"})));
    invalid(
        files(json!({"path": "/etc/a"})),
        "spec.files[2].path",
        "/etc/a is also written by spec.files[0]",
    );
}

fn users(second: Value) -> Value {
    json!({"users": [{"name": "etcd"}, second]})
}

#[test]
fn user_names_are_required() {
    valid(users(json!({"name": "admin"})));
    invalid(users(json!({"name": ""})), "spec.users[1].name", "is required");
}

#[test]
fn user_names_are_posix() {
    for ok in ["_svc", "ops-1", "machine$", "a2345678901234567890123456789012"] {
        valid(users(json!({"name": ok})));
    }
    for bad in ["Admin", "1st", "a b", "a:b", "a23456789012345678901234567890123"] {
        invalid(
            users(json!({"name": bad})),
            "spec.users[1].name",
            "is not a valid user name",
        );
    }
}

#[test]
fn user_names_are_unique() {
    valid(users(json!({"name": "etcd2"})));
    invalid(
        users(json!({"name": "etcd"})),
        "spec.users[1].name",
        "is already the name of spec.users[0]",
    );
}

#[test]
fn skipping_a_mirrors_certificate_check_is_an_explicit_opt_in_without_a_ca() {
    valid(json!({"registryMirror": {"endpoint": "mirror.local:5000", "insecureSkipVerify": true}}));
    valid(
        json!({"registryMirror": {"endpoint": "mirror.local:5000", "caCert": "PEM", "insecureSkipVerify": false}}),
    );
    invalid(
        json!({"registryMirror": {"endpoint": "mirror.local:5000", "caCert": "PEM", "insecureSkipVerify": true}}),
        "spec.registryMirror.insecureSkipVerify",
        "remove one of them",
    );
    let mut skipping = bottlerocket();
    skipping["registryMirror"] = json!({"endpoint": "mirror.local:5000", "insecureSkipVerify": true});
    invalid(
        skipping,
        "spec.registryMirror.insecureSkipVerify",
        "Bottlerocket always checks",
    );
}

#[test]
fn registry_mirror_needs_an_endpoint() {
    valid(json!({"registryMirror": {"endpoint": "mirror.local:5000"}}));
    invalid(
        json!({"registryMirror": {"caCert": "PEM"}}),
        "spec.registryMirror.endpoint",
        "is required when registryMirror is set",
    );
}

#[test]
fn registry_mirror_endpoint_is_host_port_path() {
    for ok in ["mirror.local", "10.0.0.1:443/v2/ns", "[fd00::1]:5000"] {
        valid(json!({"registryMirror": {"endpoint": ok}}));
    }
    for (bad, words) in [
        ("https://mirror.local", "must not have a scheme"),
        ("mirror.local:70000", "invalid port"),
        ("mirror local", "only letters, digits"),
        ("mirror.local/../etc", "'..' path segment"),
        ("-mirror", "invalid host name"),
    ] {
        invalid(
            json!({"registryMirror": {"endpoint": bad}}),
            "spec.registryMirror.endpoint",
            words,
        );
    }
}

#[test]
fn paths_start_at_the_given_base_and_all_errors_are_reported() {
    let errors = check(
        json!({
            "cloudInitConfig": {"version": "v1"},
            "files": [{"path": "x"}],
            "users": [{"name": "Root"}],
        }),
        "spec.template.spec",
    );
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.template.spec.cloudInitConfig.version",
            "spec.template.spec.files[0].path",
            "spec.template.spec.users[0].name",
        ]
    );
}
