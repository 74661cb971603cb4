//! What controllers are told about their scope, from the flags, and the watches, controller
//! configuration and resync ticks that honour it. With `--namespace` naming several namespaces,
//! every watch is one per namespace (the namespaced install grants nothing cluster-wide to list
//! or watch), merged into one stream, and a controller's own kind into one store.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::info;

use super::args::ManagerArgs;
use super::health::Readiness;

/// What controllers are told about their scope, from the flags.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerSettings {
    /// `--namespace`: watch only these namespaces (none: all of them).
    pub namespaces: Vec<String>,
    /// `--watch-filter`: the label selector every watch uses.
    pub label_selector: Option<String>,
    /// `--concurrency`.
    pub concurrency: u16,
    /// `--sync-period`.
    pub sync_period: Duration,
}

/// A kind a controller watches: namespaced, readable and sendable.
pub trait Watched:
    Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

impl ControllerSettings {
    /// Settings from the flags.
    pub fn from_args(args: &ManagerArgs) -> Self {
        ControllerSettings {
            namespaces: args.namespace.clone(),
            label_selector: args.watch_filter_selector(),
            concurrency: args.concurrency,
            sync_period: args.sync_period,
        }
    }

    /// One Api per watched namespace, or one over all namespaces.
    fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Watched,
        K::DynamicType: Default,
    {
        if self.namespaces.is_empty() {
            return vec![Api::all(client.clone())];
        }
        self.namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }

    /// A watcher configuration honouring `--watch-filter`.
    pub fn watcher_config(&self) -> watcher::Config {
        let config = watcher::Config::default().any_semantic();
        match &self.label_selector {
            Some(selector) => config.labels(selector),
            None => config,
        }
    }

    /// Every object of `K` touched in the watched namespaces, under `config`: for
    /// `Controller::watches_stream`.
    pub fn watch<K>(
        &self,
        client: &Client,
        config: watcher::Config,
    ) -> BoxStream<'static, Result<K, watcher::Error>>
    where
        K: Watched,
        K::DynamicType: Default,
    {
        let streams = self.apis::<K>(client).into_iter().map(|api| {
            watcher(api, config.clone())
                .default_backoff()
                .touched_objects()
                .boxed()
        });
        futures::stream::select_all(streams).boxed()
    }

    /// The watch of a controller's own kind (honouring the flags), reflected into the returned
    /// store, for `Controller::for_stream`. The caches count as synced at the first complete
    /// list of every watched namespace, seen in the stream itself: a second task waiting on the
    /// store would never wake, because kube-runtime's store readiness wakes only the last waiter
    /// (the controller's).
    pub fn watch_own_kind<K>(
        &self,
        client: &Client,
        readiness: Readiness,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    )
    where
        K: Watched,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (store, writer) = reflector::store();
        let kind = K::kind(&K::DynamicType::default()).to_string();
        let apis = self.apis::<K>(client);
        let mut merged = Merged::new(apis.len(), writer);
        let streams = apis.into_iter().enumerate().map(|(index, api)| {
            watcher(api, self.watcher_config())
                .default_backoff()
                .map(move |event| (index, event))
                .boxed()
        });
        let changes = futures::stream::select_all(streams).flat_map(move |(index, event)| {
            let changed: Vec<Result<K, watcher::Error>> = match event {
                Ok(event) => {
                    let applied = merged.apply(index, event);
                    if applied.synced {
                        info!(%kind, "cache synced");
                        readiness.set_synced();
                    }
                    applied.objects.into_iter().map(Ok).collect()
                }
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(changed)
        });
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

/// What one watch event did: the objects to reconcile, and whether every watch has now listed
/// for the first time.
struct Applied<K> {
    objects: Vec<K>,
    synced: bool,
}

/// One store written from several watches, one per namespace. A watch's (re)list replaces only
/// its own namespace's objects: the store is rebuilt from every namespace's at the end of each
/// list (a store's own relist would drop the other namespaces' objects), and first once every
/// namespace has listed, which is when the store is ready and the controller starts. A listed
/// object is handed to the controller at the end of its namespace's list, when the store has it
/// (a reconcile of an object the store lacks is dropped, not retried).
struct Merged<K>
where
    K: Watched,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    writer: Writer<K>,
    /// Each watch's objects by name, once listed.
    listed: Vec<BTreeMap<String, K>>,
    /// A list under way, per watch.
    listing: Vec<Option<BTreeMap<String, K>>>,
    synced: Vec<bool>,
    reported: bool,
}

impl<K> Merged<K>
where
    K: Watched,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    fn new(watches: usize, writer: Writer<K>) -> Self {
        Merged {
            writer,
            listed: vec![BTreeMap::new(); watches],
            listing: vec![None; watches],
            synced: vec![false; watches],
            reported: false,
        }
    }

    fn key(object: &K) -> String {
        format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
    }

    /// Apply watch `index`'s `event` to the store.
    fn apply(&mut self, index: usize, event: watcher::Event<K>) -> Applied<K> {
        let objects = if self.listed.len() == 1 {
            // One watch: the store's own list handling is exact, and the controller waits for
            // the store's readiness (its first complete list) before it reconciles anything.
            self.writer.apply_watcher_event(&event);
            match event {
                watcher::Event::InitDone => {
                    self.synced[0] = true;
                    vec![]
                }
                watcher::Event::Apply(object) | watcher::Event::InitApply(object) => vec![object],
                watcher::Event::Init | watcher::Event::Delete(_) => vec![],
            }
        } else {
            self.apply_merged(index, event)
        };
        let all = self.synced.iter().all(|s| *s);
        let synced = all && !self.reported;
        self.reported |= all;
        Applied { objects, synced }
    }

    fn apply_merged(&mut self, index: usize, event: watcher::Event<K>) -> Vec<K> {
        let (Some(listed), Some(listing)) = (self.listed.get_mut(index), self.listing.get_mut(index)) else {
            return vec![];
        };
        match event {
            watcher::Event::Init => {
                *listing = Some(BTreeMap::new());
                vec![]
            }
            watcher::Event::InitApply(object) => {
                if let Some(listing) = listing {
                    listing.insert(Self::key(&object), object);
                }
                vec![]
            }
            watcher::Event::InitDone => {
                *listed = listing.take().unwrap_or_default();
                let objects = listed.values().cloned().collect();
                if let Some(synced) = self.synced.get_mut(index) {
                    *synced = true;
                }
                if self.synced.iter().all(|s| *s) {
                    self.writer.apply_watcher_event(&watcher::Event::Init);
                    for object in self.listed.iter().flat_map(BTreeMap::values) {
                        self.writer
                            .apply_watcher_event(&watcher::Event::InitApply(object.clone()));
                    }
                    self.writer.apply_watcher_event(&watcher::Event::InitDone);
                }
                objects
            }
            watcher::Event::Apply(object) => {
                listed.insert(Self::key(&object), object.clone());
                self.writer
                    .apply_watcher_event(&watcher::Event::Apply(object.clone()));
                vec![object]
            }
            watcher::Event::Delete(object) => {
                listed.remove(&Self::key(&object));
                self.writer.apply_watcher_event(&watcher::Event::Delete(object));
                vec![]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn object(namespace: &str, name: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": namespace}}))
            .unwrap()
    }

    fn names(store: &Store<ConfigMap>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        names.sort();
        names
    }

    fn names_of(objects: &[ConfigMap]) -> Vec<String> {
        objects.iter().map(|o| o.name_any()).collect()
    }

    #[test]
    fn one_namespaces_relist_replaces_its_objects_only_and_the_store_waits_for_every_namespace() {
        use watcher::Event::*;
        let (store, writer) = reflector::store::<ConfigMap>();
        let mut merged = Merged::new(2, writer);
        assert!(merged.apply(0, Init).objects.is_empty());
        assert!(merged.apply(0, InitApply(object("a", "x"))).objects.is_empty());
        let done = merged.apply(0, InitDone);
        assert!(!done.synced, "b has not listed yet");
        assert_eq!(
            names_of(&done.objects),
            ["x"],
            "a's objects at the end of a's list"
        );
        assert!(names(&store).is_empty(), "the store waits for b");
        assert!(store.wait_until_ready().now_or_never().is_none());
        let early = merged.apply(0, Apply(object("a", "w")));
        assert_eq!(names_of(&early.objects), ["w"]);
        merged.apply(1, Init);
        assert!(merged.apply(1, InitApply(object("b", "y"))).objects.is_empty());
        let done = merged.apply(1, InitDone);
        assert!(done.synced, "both listed: synced, once");
        assert_eq!(names_of(&done.objects), ["y"]);
        assert!(store.wait_until_ready().now_or_never().is_some());
        assert_eq!(names(&store), ["a/w", "a/x", "b/y"]);
        assert!(!merged.apply(0, Apply(object("a", "z"))).synced);
        assert_eq!(names(&store), ["a/w", "a/x", "a/z", "b/y"]);
        // a relists (its watch expired): w and x are gone, b keeps y.
        merged.apply(0, Init);
        merged.apply(0, InitApply(object("a", "z")));
        let done = merged.apply(0, InitDone);
        assert!(!done.synced, "synced is told once");
        assert_eq!(names_of(&done.objects), ["z"]);
        assert_eq!(names(&store), ["a/z", "b/y"]);
        merged.apply(1, Delete(object("b", "y")));
        assert_eq!(names(&store), ["a/z"]);
    }

    #[test]
    fn one_watch_is_the_stores_own() {
        use watcher::Event::*;
        let (store, writer) = reflector::store::<ConfigMap>();
        let mut merged = Merged::new(1, writer);
        merged.apply(0, Init);
        assert_eq!(
            names_of(&merged.apply(0, InitApply(object("a", "x"))).objects),
            ["x"]
        );
        assert!(merged.apply(0, InitDone).synced);
        merged.apply(0, Apply(object("b", "y")));
        assert_eq!(names(&store), ["a/x", "b/y"]);
    }
}
