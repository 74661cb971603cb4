//! The demo's admission webhooks, wired as an install wires them (docs/demo.md): a serving
//! certificate for 127.0.0.1 from a CA of the demo's own (cert-manager's part), each manager
//! serving its webhooks on a port of its own, and config/webhook's configurations registered
//! on the real kube-apiserver with `clientConfig.url` on that port and the CA as `caBundle`
//! (the Services' part), so the demo refuses at admission what an installed provider refuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::error::SimError;
use crate::real_apiserver::IDENTITIES;
use crate::real_capi::cert_manager::{client_config, issue};

/// Who registers the webhook configurations (server-side apply's field manager).
const FIELD_MANAGER: &str = "etcdadm-sim-demo";
/// The kinds of config/webhook/webhooks.yaml.
const KINDS: [&str; 2] = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];
/// How long the managers may take to listen on their webhook ports.
const LISTEN_DEADLINE: Duration = Duration::from_secs(60);

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn setup(e: impl std::fmt::Display) -> SimError {
    SimError::Setup(e.to_string())
}

/// The serving certificate and each manager's webhook port.
pub struct DemoWebhooks {
    /// Holds `tls.crt` and `tls.key` (`--webhook-cert-dir`).
    pub cert_dir: PathBuf,
    ca_pem: String,
    /// Each manager binary's webhook port.
    pub ports: BTreeMap<&'static str, u16>,
}

impl DemoWebhooks {
    /// Issue the serving certificate into `work_dir/webhook-certs` and choose a free loopback
    /// port for each manager.
    pub fn prepare(work_dir: &Path) -> Result<DemoWebhooks, SimError> {
        let cert_dir = work_dir.join("webhook-certs");
        std::fs::create_dir_all(&cert_dir).map_err(|e| setup(format!("{}: {e}", cert_dir.display())))?;
        let issued = issue(
            "etcdadm-system",
            "etcdadm-serving-cert",
            "",
            vec!["localhost".into()],
        )?;
        for (file, pem) in [("tls.crt", &issued.cert_pem), ("tls.key", &issued.key_pem)] {
            let path = cert_dir.join(file);
            std::fs::write(&path, pem).map_err(|e| setup(format!("{}: {e}", path.display())))?;
        }
        let mut ports = BTreeMap::new();
        for (binary, _) in IDENTITIES {
            let port = etcdadm_shared::testing::ports::free_port()
                .map_err(|e| setup(format!("choosing a webhook port: {e}")))?;
            ports.insert(binary, port);
        }
        Ok(DemoWebhooks {
            cert_dir,
            ca_pem: issued.ca_pem,
            ports,
        })
    }

    /// Each manager's flags: its webhook server on its port, with the certificate.
    pub fn controller_args(&self) -> BTreeMap<&'static str, Vec<String>> {
        self.ports
            .iter()
            .map(|(binary, port)| {
                (
                    *binary,
                    vec![
                        format!("--webhook-port={port}"),
                        format!("--webhook-cert-dir={}", self.cert_dir.display()),
                    ],
                )
            })
            .collect()
    }

    /// Once every manager listens, register config/webhook's configurations pointing at them.
    pub async fn register(&self, client: &Client) -> Result<(), SimError> {
        for (binary, port) in &self.ports {
            wait_listening(binary, *port).await?;
        }
        let routes = self.service_ports()?;
        for mut configuration in webhook_configurations()? {
            if let Some(webhooks) = configuration["webhooks"].as_array_mut() {
                for webhook in webhooks {
                    webhook["clientConfig"] = client_config(&webhook["clientConfig"], &self.ca_pem, &routes)?;
                }
            }
            let (api, name) = api_of(client, &configuration)?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&configuration),
            )
            .await?;
        }
        Ok(())
    }

    /// Each webhook Service of config/webhook (`<namespace>/<name>`) and the port of the
    /// manager it selects.
    fn service_ports(&self) -> Result<BTreeMap<String, u16>, SimError> {
        let text = std::fs::read_to_string(repo("config/webhook/services.yaml")).map_err(setup)?;
        let services: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(setup)?;
        let mut routes = BTreeMap::new();
        for service in services {
            let selected = service["spec"]["selector"]["app.kubernetes.io/name"]
                .as_str()
                .unwrap_or_default();
            let Some((binary, _)) = IDENTITIES.iter().find(|(_, account)| *account == selected) else {
                return Err(setup(format!("config/webhook: no manager is {selected:?}")));
            };
            let key = format!(
                "{}/{}",
                service["metadata"]["namespace"].as_str().unwrap_or_default(),
                service["metadata"]["name"].as_str().unwrap_or_default()
            );
            routes.insert(key, self.ports.get(binary).copied().unwrap_or_default());
        }
        Ok(routes)
    }
}

/// config/webhook's configurations as written.
fn webhook_configurations() -> Result<Vec<Value>, SimError> {
    let text = std::fs::read_to_string(repo("config/webhook/webhooks.yaml")).map_err(setup)?;
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(setup)?;
    Ok(documents
        .into_iter()
        .filter(|d| KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .collect())
}

/// The API of `configuration`'s kind, and its name.
fn api_of(client: &Client, configuration: &Value) -> Result<(Api<DynamicObject>, String), SimError> {
    let kind = configuration["kind"].as_str().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind));
    let object: DynamicObject = serde_json::from_value(configuration.clone())?;
    Ok((Api::all_with(client.clone(), &resource), object.name_any()))
}

/// Remove config/webhook's configurations: admission as a cluster without the webhooks has it.
pub async fn unregister(client: &Client) -> Result<(), SimError> {
    for configuration in webhook_configurations()? {
        let (api, name) = api_of(client, &configuration)?;
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Wait until `binary` accepts connections on its webhook port.
async fn wait_listening(binary: &str, port: u16) -> Result<(), SimError> {
    let deadline = Instant::now() + LISTEN_DEADLINE;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SimError::Timeout(format!(
                "{binary} did not listen on its webhook port {port} within {LISTEN_DEADLINE:?}; see its log"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
