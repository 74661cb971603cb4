//! The Bottlerocket user data: TOML settings whose superpowered `kubeadm-bootstrap` host
//! container runs etcdadm. Decides what goes in and in which order (maps sorted, lists in spec
//! order); the askama template only lays out values already quoted as TOML strings.
//!
//! Every spec field lands somewhere or is refused: the renderer applies the same rules as
//! admission ([`etcdadm_shared::bottlerocket`]) before writing anything.

mod admin_container;
mod bootstrap_container;
mod toml_text;

use askama::Template;
use base64::Engine;
use etcdadm_shared::api::config::{BottlerocketConfig, EtcdadmConfigSpec};
use etcdadm_shared::bottlerocket::{
    ADMIN_CONTAINER, BOOTSTRAP_CONTAINER, CONTROL_CONTAINER, REGISTRY_MIRROR_CA_BUNDLE,
};
use etcdadm_shared::validation::validate_config_spec;

pub use bootstrap_container::{DEFAULT_CIPHER_SUITES, HOST_ROOT};

use self::toml_text::{basic_string, string_array};
use super::error::RenderError;
use super::input::RenderInput;
use super::secrets::{REGISTRY_CREDENTIALS_SECRET, ResolvedSecrets, check_resolved};

/// The registry the mirror stands in for (EKS Anywhere's images come from there).
const MIRRORED_REGISTRY: &str = "public.ecr.aws";

#[derive(Template)]
#[template(path = "settings.toml")]
struct SettingsTemplate {
    host_containers: Vec<HostContainerView>,
    pause_image: String,
    hostname: String,
    https_proxy: Option<String>,
    no_proxy: Option<String>,
    bootstrap_containers: Vec<BootstrapContainerView>,
    mirror_endpoints: Option<String>,
    registry_logins: Vec<RegistryLoginView>,
    trust_bundles: Vec<TrustBundleView>,
    time_servers: Option<String>,
    sysctl: Vec<(String, String)>,
    kernel_parameters: Vec<(String, String)>,
}

struct HostContainerView {
    name: String,
    superpowered: bool,
    source: Option<String>,
    user_data: Option<String>,
}

struct BootstrapContainerView {
    name: String,
    essential: bool,
    mode: String,
    source: String,
    user_data: Option<String>,
}

struct RegistryLoginView {
    registry: String,
    username: String,
    password: String,
}

struct TrustBundleView {
    name: String,
    data: String,
}

fn base64_of(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn non_empty(value: &str) -> Option<&str> {
    Some(value).filter(|v| !v.is_empty())
}

/// The Bottlerocket user data for `input`.
pub fn render(input: &RenderInput) -> Result<String, RenderError> {
    let spec = input.spec;
    if let Some(problem) = validate_config_spec(spec, "spec").into_iter().next() {
        return Err(RenderError::invalid(problem.path, problem.message));
    }
    check_resolved(spec, input.secrets)?;
    if input.machine_name.is_empty() {
        return Err(RenderError::invalid(
            "machine name",
            "is empty: it is the Bottlerocket hostname and so the etcd member name",
        ));
    }
    let config = spec.bottlerocket_config.clone().unwrap_or_default();
    let proxy = spec.proxy.clone().unwrap_or_default();
    let mirror = spec.registry_mirror.as_ref();
    let mirror_endpoint = mirror.and_then(|m| m.endpoint.as_deref()).and_then(non_empty);
    let ntp_servers = spec
        .ntp
        .as_ref()
        .filter(|n| n.enabled != Some(false))
        .map(|n| n.servers.as_slice())
        .filter(|servers| !servers.is_empty());

    let template = SettingsTemplate {
        host_containers: host_containers(spec, &config, input)?,
        pause_image: basic_string(&config.pause_image),
        hostname: basic_string(input.machine_name),
        https_proxy: proxy.https_proxy.as_deref().map(basic_string),
        no_proxy: (!proxy.no_proxy.is_empty()).then(|| string_array(&proxy.no_proxy)),
        bootstrap_containers: config
            .custom_bootstrap_containers
            .iter()
            .map(|c| BootstrapContainerView {
                name: basic_string(&c.name),
                essential: c.essential,
                mode: basic_string(&c.mode),
                source: basic_string(&c.image),
                user_data: c.user_data.as_deref().map(basic_string),
            })
            .collect(),
        mirror_endpoints: mirror_endpoint.map(|e| string_array(&[format!("https://{e}")])),
        registry_logins: registry_logins(mirror_endpoint, input.secrets)?,
        trust_bundles: trust_bundles(spec),
        time_servers: ntp_servers.map(string_array),
        sysctl: config
            .kernel
            .iter()
            .flat_map(|k| &k.sysctl_settings)
            .map(|(key, value)| (basic_string(key), basic_string(value)))
            .collect(),
        kernel_parameters: config
            .boot
            .iter()
            .flat_map(|b| &b.boot_kernel_parameters)
            .map(|(key, values)| (basic_string(key), string_array(values)))
            .collect(),
    };
    let mut out = template.render()?;
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// admin (always: it carries the users' SSH keys), kubeadm-bootstrap, control when its image is
/// set, then the spec's own host containers.
fn host_containers(
    spec: &EtcdadmConfigSpec,
    config: &BottlerocketConfig,
    input: &RenderInput,
) -> Result<Vec<HostContainerView>, RenderError> {
    let mut containers = vec![
        HostContainerView {
            name: ADMIN_CONTAINER.into(),
            superpowered: true,
            source: non_empty(&config.admin_image).map(basic_string),
            user_data: Some(basic_string(&base64_of(&admin_container::user_data(
                spec,
                input.secrets,
            )?))),
        },
        HostContainerView {
            name: BOOTSTRAP_CONTAINER.into(),
            superpowered: true,
            source: Some(basic_string(&config.bootstrap_image)),
            user_data: Some(basic_string(&base64_of(&bootstrap_container::user_data(input)?))),
        },
    ];
    if let Some(image) = non_empty(&config.control_image) {
        containers.push(HostContainerView {
            name: CONTROL_CONTAINER.into(),
            superpowered: false,
            source: Some(basic_string(image)),
            user_data: None,
        });
    }
    containers.extend(config.custom_host_containers.iter().map(|c| HostContainerView {
        name: basic_string(&c.name),
        superpowered: c.superpowered,
        source: Some(basic_string(&c.image)),
        user_data: c.user_data.as_deref().map(basic_string),
    }));
    Ok(containers)
}

/// The login for the mirror and, because Bottlerocket's host-container pulls ask for the
/// registry they name, for the registry it mirrors too.
fn registry_logins(
    mirror_endpoint: Option<&str>,
    secrets: &ResolvedSecrets,
) -> Result<Vec<RegistryLoginView>, RenderError> {
    let Some(endpoint) = mirror_endpoint else {
        return Ok(vec![]);
    };
    let (username, password) = match (&secrets.registry_username, &secrets.registry_password) {
        (None, None) => return Ok(vec![]),
        (Some(username), Some(password)) => (username, password),
        _ => {
            return Err(RenderError::invalid(
                "spec.registryMirror",
                format!(
                    "Secret {REGISTRY_CREDENTIALS_SECRET} needs both username and password, or neither key"
                ),
            ));
        }
    };
    Ok([MIRRORED_REGISTRY, endpoint]
        .map(|registry| RegistryLoginView {
            registry: basic_string(registry),
            username: basic_string(username),
            password: basic_string(password),
        })
        .into())
}

/// The mirror's CA, then `certBundles`, all trusted, PEM as base64.
fn trust_bundles(spec: &EtcdadmConfigSpec) -> Vec<TrustBundleView> {
    let mirror_ca = spec
        .registry_mirror
        .as_ref()
        .and_then(|m| m.ca_cert.as_deref())
        .and_then(non_empty)
        .map(|ca| TrustBundleView {
            name: REGISTRY_MIRROR_CA_BUNDLE.into(),
            data: basic_string(&base64_of(ca)),
        });
    mirror_ca
        .into_iter()
        .chain(spec.cert_bundles.iter().map(|bundle| TrustBundleView {
            name: basic_string(&bundle.name),
            data: basic_string(&base64_of(&bundle.data)),
        }))
        .collect()
}
