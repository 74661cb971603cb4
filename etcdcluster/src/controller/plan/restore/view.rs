//! What the restore concern reads and sees: what a first member is restored from (`spec.restore`,
//! or the snapshot of a recovery that is restoring), its download and the restore Secret
//! (`observation::restore_source` reads them).

use kube::Client;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::error::Error;

use crate::controller::decision::ConcernView;
use crate::controller::observation::clock::UnhealthyClock;
use crate::controller::observation::restore_source::{self, RestoreObservation};
use crate::controller::observation::{Reads, RestoreView};

/// What a first member is restored from, while `spec.restore` is set or a recovery restores.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreFrom {
    pub view: Option<RestoreView>,
}

impl ConcernView for RestoreFrom {
    type Read = Option<RestoreObservation>;

    async fn read(client: &Client, namespace: &str, etcd: &EtcdadmCluster) -> Result<Self::Read, Error> {
        restore_source::observe(client, namespace, etcd).await
    }

    /// The restore Secret's age, and the deltas' refusal's, on the clock.
    fn view(read: &Self::Read, _: &Reads, clock: &UnhealthyClock) -> Self {
        RestoreFrom {
            view: read.as_ref().map(|r| {
                let mut view = r.view.clone();
                view.secret_age = r.secret_written.map(|t| clock.since(t));
                view.deltas_unusable_age = view
                    .secret
                    .as_ref()
                    .and_then(|s| s.deltas_unusable.as_ref())
                    .map(|(_, at)| clock.since(*at));
                view
            }),
        }
    }
}
