//! What controllers are told about their scope, from the flags, and the watches, controller
//! configuration and resync ticks that honour it.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, controller, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use super::args::ManagerArgs;
use super::health::Readiness;

/// What controllers are told about their scope, from the flags.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerSettings {
    /// `--namespace`: watch only this namespace.
    pub namespace: Option<String>,
    /// `--watch-filter`: the label selector every watch uses.
    pub label_selector: Option<String>,
    /// `--concurrency`.
    pub concurrency: u16,
    /// `--sync-period`.
    pub sync_period: Duration,
}

impl ControllerSettings {
    /// Settings from the flags.
    pub fn from_args(args: &ManagerArgs) -> Self {
        ControllerSettings {
            namespace: args.namespace.clone(),
            label_selector: args.watch_filter_selector(),
            concurrency: args.concurrency,
            sync_period: args.sync_period,
        }
    }

    /// An Api over the watched namespace, or all namespaces.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// A watcher configuration honouring `--watch-filter`.
    pub fn watcher_config(&self) -> watcher::Config {
        let config = watcher::Config::default().any_semantic();
        match &self.label_selector {
            Some(selector) => config.labels(selector),
            None => config,
        }
    }

    /// The watch of a controller's own kind (honouring the flags), reflected into the returned
    /// store, for `Controller::for_stream`. The caches count as synced at the first complete
    /// list, seen in the stream itself: a second task waiting on the store would never wake,
    /// because kube-runtime's store readiness wakes only the last waiter (the controller's).
    pub fn watch_own_kind<K>(
        &self,
        client: &Client,
        readiness: Readiness,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    )
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (store, writer) = reflector::store();
        let kind = K::kind(&K::DynamicType::default()).to_string();
        let changes = watcher(self.api::<K>(client), self.watcher_config())
            .default_backoff()
            .inspect(move |event| {
                if matches!(event, Ok(watcher::Event::InitDone)) {
                    info!(%kind, "cache synced");
                    readiness.set_synced();
                }
            })
            .reflect(writer)
            .applied_objects();
        (store, changes)
    }

    /// A controller configuration honouring `--concurrency`.
    pub fn controller_config(&self) -> controller::Config {
        controller::Config::default().concurrency(self.concurrency)
    }

    /// Ticks every sync period (the first after one period): feed it to
    /// `Controller::reconcile_all_on` so every object is looked at again without a change.
    pub fn resync_ticks(&self) -> impl Stream<Item = ()> + Send + 'static {
        let period = self.sync_period;
        futures::stream::unfold((), move |()| async move {
            tokio::time::sleep(period).await;
            Some(((), ()))
        })
    }
}
