//! Wakes a stand-in's poll loop as soon as an object it reads changes, as a watch-driven
//! controller (real Cluster API, an infrastructure provider) reacts: a pass every tick alone
//! added up to a tick per hop to every Machine's boot. The tick stays, as the fallback and for
//! what is due by the clock.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

/// The wake-up of one poll loop.
#[derive(Clone, Default)]
pub struct Wake(Arc<Notify>);

impl Wake {
    /// Until dropped, note every change of the objects of `resources` in `namespace` (errors are
    /// retried with the watcher's own backoff). Run it beside the loop, in the same task, so it
    /// ends with it.
    pub async fn watch(&self, client: Client, namespace: String, resources: Vec<ApiResource>) {
        let watches = resources.into_iter().map(|resource| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
            let notify = self.0.clone();
            watcher(api, watcher::Config::default())
                .default_backoff()
                .for_each(move |event| {
                    if event.is_ok() {
                        notify.notify_one();
                    }
                    std::future::ready(())
                })
        });
        futures::future::join_all(watches).await;
    }

    /// Run `pass` over and over until dropped: again as soon as an object of `resources` in
    /// `namespace` changes, else once `longest()` (asked after each pass) has gone by.
    pub async fn drive<P, F>(
        client: Client,
        namespace: String,
        resources: Vec<ApiResource>,
        mut pass: P,
        longest: impl Fn() -> Duration,
    ) where
        P: FnMut() -> F,
        F: Future<Output = ()>,
    {
        let wake = Wake::default();
        let passes = async {
            loop {
                pass().await;
                wake.wait(longest()).await;
            }
        };
        futures::future::join(wake.watch(client, namespace, resources), passes).await;
    }

    /// Wait `longest`, or less when something changed since the last wait ended.
    pub async fn wait(&self, longest: Duration) {
        tokio::select! {
            () = tokio::time::sleep(longest) => {}
            () = self.0.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_ends_the_wait_and_one_noted_while_busy_is_not_lost() {
        let wake = Wake::default();
        // Noted while the loop was busy: the next wait ends at once.
        wake.0.notify_one();
        let woken = tokio::time::timeout(Duration::from_secs(30), wake.wait(Duration::from_secs(3600))).await;
        assert!(woken.is_ok(), "a change noted before the wait ends it");
        // Nothing noted: the wait lasts its tick.
        let idle =
            tokio::time::timeout(Duration::from_millis(50), wake.wait(Duration::from_secs(3600))).await;
        assert!(idle.is_err(), "nothing changed, so the wait went on");
    }
}
