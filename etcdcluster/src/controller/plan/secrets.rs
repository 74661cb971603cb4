//! The Secrets shared with the bootstrap provider by contract: the etcd CA (created once, before
//! any member exists, and never replaced: docs/safety.md, "The CA") and `<cluster>-etcd-init`,
//! the first member's address and the join URLs, kept on the healthy voters.

use etcdadm_shared::contract::{ClusterRef, ca, init_secret};
use etcdadm_shared::error::Error;
use etcdadm_shared::names;

use crate::controller::decision::reason::PROVISIONING;
use crate::controller::decision::{
    After, Applied, ConcernStep, Decision, EventNote, FIELD_MANAGER, Hold, Outputs,
};
use crate::controller::observation::{CaView, ClusterView, Observation, healthy_client_urls};

/// Condition reasons of the CA.
pub mod reason {
    pub const CA_CORRUPT: &str = "EtcdCACorrupt";
    pub const CA_MISSING: &str = "EtcdCAMissing";
}

/// The apply site of the join URLs in `<cluster>-etcd-init`.
const JOIN_URLS_MANAGER: &str = "etcdadm-controller/init-secret-urls";

/// A step of this concern.
#[derive(Clone, Debug, PartialEq)]
pub enum SecretStep {
    /// Generate the CA into `<cluster>-managed-etcd`.
    CreateCa { cluster: ClusterRef },
    /// Publish `<cluster>-etcd-init` with the first member's address.
    PublishInitSecret {
        cluster: ClusterRef,
        address: String,
        client_urls: Vec<String>,
    },
    /// Point the join URLs of `<cluster>-etcd-init` at the healthy voters.
    UpdateInitSecretUrls {
        cluster: String,
        client_urls: Vec<String>,
    },
}

impl ConcernStep for SecretStep {
    type View = ();
    type Metrics = ();

    /// The condition reason and message for `Ready` while this step is next.
    fn reason(&self) -> (&'static str, String) {
        match self {
            SecretStep::CreateCa { .. } => (
                PROVISIONING,
                "preparing the EtcdadmCluster, its CA and the control plane gate".into(),
            ),
            SecretStep::PublishInitSecret { address, .. } => (
                PROVISIONING,
                format!("publishing the first member's address {address}"),
            ),
            SecretStep::UpdateInitSecretUrls { .. } => {
                (PROVISIONING, "updating the join URLs in the init Secret".into())
            }
        }
    }

    /// The Event this step leaves once applied (updating the join URLs only tidies up).
    fn event(&self, _: &Observation) -> Option<EventNote> {
        match self {
            SecretStep::CreateCa { cluster } => Some(EventNote::normal(
                "CACreated",
                format!(
                    "generated the etcd CA in Secret {}",
                    names::ca_secret_name(&cluster.name)
                ),
            )),
            SecretStep::PublishInitSecret { cluster, address, .. } => Some(EventNote::normal(
                "InitSecretPublished",
                format!(
                    "published Secret {} with the first member's address {address}",
                    names::init_secret_name(&cluster.name)
                ),
            )),
            SecretStep::UpdateInitSecretUrls { .. } => None,
        }
    }

    /// Perform the step: the CA and the init Secret are created only if absent.
    async fn apply(&self, out: &Outputs<'_>, o: &Observation) -> Result<Applied, Error> {
        match self {
            SecretStep::CreateCa { cluster } => {
                Ok(ca::create_ca(out.client, cluster, FIELD_MANAGER).await?.into())
            }
            SecretStep::PublishInitSecret {
                cluster,
                address,
                client_urls,
            } => Ok(
                init_secret::publish(out.client, cluster, address, client_urls, FIELD_MANAGER)
                    .await?
                    .into(),
            ),
            SecretStep::UpdateInitSecretUrls { cluster, client_urls } => {
                init_secret::apply_client_urls(
                    out.client,
                    cluster,
                    &o.namespace,
                    client_urls,
                    JOIN_URLS_MANAGER,
                )
                .await?;
                Ok(Applied::Done)
            }
        }
    }

    /// What comes after: the next step may follow at once.
    fn after(&self, _: &Observation) -> After {
        match self {
            SecretStep::CreateCa { .. }
            | SecretStep::PublishInitSecret { .. }
            | SecretStep::UpdateInitSecretUrls { .. } => After::Again,
        }
    }
}

/// The CA: created when nothing exists yet; a corrupt one is reported, and a missing one under
/// existing members is asked for back (a new CA would cut every member off).
pub fn ca(o: &Observation) -> Option<Decision<SecretStep>> {
    let ClusterView::Found { reference, .. } = &o.cluster else {
        return None;
    };
    match &o.ca {
        CaView::Corrupt(problem) => Some(Decision::Hold(Hold::refuse(
            reason::CA_CORRUPT,
            format!("{problem}; fix or restore the Secret, it is never replaced"),
        ))),
        CaView::Missing if !o.machines.is_empty() || o.initialized => Some(Decision::Hold(Hold::refuse(
            reason::CA_MISSING,
            format!(
                "Secret {} is missing while etcd members exist; restore it (a new CA would \
                 cut every member off)",
                names::ca_secret_name(&reference.name)
            ),
        ))),
        CaView::Missing => Some(Decision::Do(SecretStep::CreateCa {
            cluster: reference.clone(),
        })),
        CaView::Valid(_) => None,
    }
}

/// Publish `<cluster>-etcd-init` once the first Machine has an address.
pub fn publish_init_secret(o: &Observation) -> Option<Decision<SecretStep>> {
    if o.init_secret.is_some() {
        return None;
    }
    let ClusterView::Found { reference, .. } = &o.cluster else {
        return None;
    };
    let first = o.active_machines().next()?;
    let address = first.address.clone()?;
    let healthy_urls = healthy_client_urls(o);
    let client_urls = if healthy_urls.is_empty() {
        vec![names::client_url(&address)]
    } else {
        healthy_urls
    };
    Some(Decision::Do(SecretStep::PublishInitSecret {
        cluster: reference.clone(),
        address,
        client_urls,
    }))
}

/// Keep the init Secret's join URLs on the healthy voters (called once every member is healthy,
/// so a new member never joins through a removed one).
pub fn init_secret_urls(o: &Observation) -> Option<Decision<SecretStep>> {
    let secret = o.init_secret.as_ref()?;
    let cluster = o.cluster.name()?;
    let healthy_urls = healthy_client_urls(o);
    (!healthy_urls.is_empty() && secret.client_urls != healthy_urls).then(|| {
        Decision::Do(SecretStep::UpdateInitSecretUrls {
            cluster: cluster.to_string(),
            client_urls: healthy_urls,
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::controller::testing::reason;
    use crate::controller::testing::*;

    #[test]
    fn ca_is_created_once_and_never_regenerated_under_members() {
        let mut o = base();
        o.ca = CaView::Missing;
        assert_eq!(
            plan(&o),
            Step::Secrets(SecretStep::CreateCa {
                cluster: cluster_ref()
            })
        );
        o.ca = CaView::Corrupt("Secret default/c1-managed-etcd has no tls.key".into());
        let step = plan(&o);
        assert_eq!(wait_reason(&step), reason::CA_CORRUPT);
        assert!(wait_message(&step).contains("no tls.key"));
        assert!(!step.writes());
        let mut o = running(1);
        o.ca = CaView::Missing;
        assert_eq!(wait_reason(&plan(&o)), reason::CA_MISSING);
    }

    #[test]
    fn the_init_secret_is_published_once_the_first_machine_has_an_address() {
        let mut o = base();
        o.machines.push(machine("c1-etcd-a", None, None));
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_MACHINE_ADDRESS);
        o.machines[0].address = Some("10.0.0.1".into());
        assert_eq!(
            plan(&o),
            Step::Secrets(SecretStep::PublishInitSecret {
                cluster: cluster_ref(),
                address: "10.0.0.1".into(),
                client_urls: vec!["https://10.0.0.1:2379".into()]
            })
        );
        // Published, first member not answering yet: no second Machine.
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        o.etcd = EtcdView::Unreachable {
            message: "connection refused".into(),
        };
        assert_eq!(wait_reason(&plan(&o)), reason::WAITING_FOR_FIRST_MEMBER);
    }

    #[test]
    fn init_secret_urls_follow_the_healthy_voters_once_ready() {
        let mut o = running(3);
        o.init_secret = Some(InitSecret {
            address: Some("10.0.0.1".into()),
            client_urls: vec!["https://10.0.0.1:2379".into()],
        });
        let Step::Secrets(SecretStep::UpdateInitSecretUrls { client_urls, .. }) = plan(&o) else {
            panic!("expected an init Secret update: {:?}", plan(&o));
        };
        assert_eq!(client_urls.len(), 3);
    }
}
