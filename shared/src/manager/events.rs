//! Events, with repeats within six minutes folded into a series as client-go does, remembering
//! only the name and count of what was sent: kube's `Recorder` keeps every Event it sent, whole,
//! until its next publish, so the thousands an adoption emits stayed in memory for good.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, Resource};
use tracing::warn;

/// Repeats of an Event within this long of the last one are counted in its series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// An Event to publish about an object: what a step did, or a change of state.
#[derive(Clone, Debug, PartialEq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl EventNote {
    pub fn normal(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: false,
            reason,
            note,
        }
    }

    pub fn warning(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: true,
            reason,
            note,
        }
    }
}

/// Publishes Events as `reporter`.
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    sent: Mutex<Sent>,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            sent: Mutex::default(),
        }
    }

    /// A recorder reporting as `controller`, instance `$POD_NAME` (the Deployment sets it).
    pub fn for_controller(client: Client, controller: &str) -> Self {
        let reporter = Reporter {
            controller: controller.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Recorder::new(client, reporter)
    }

    /// Publish `note` about `object` for `action`; a failure to publish is logged, never fatal
    /// (the condition says the same).
    pub async fn note<K>(&self, object: &K, action: &str, note: EventNote)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.into(),
            note: Some(note.note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.publish(&event, &object.object_ref(&())).await {
            warn!(object = ?object.meta().name, error = %e, "publishing event failed");
        }
    }

    /// Create the Event `event` about `regarding`, or count it in the series of the same Event
    /// (type, action, reason, object, related object) sent within [`SERIES_WINDOW`].
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let key = series_key(event, regarding);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let now = Timestamp::now();
        let repeat = self.lock().repeat(&key, Instant::now());
        let counted = match repeat {
            Some((name, count)) => {
                let series = serde_json::json!({
                    "series": EventSeries { count, last_observed_time: MicroTime(now) },
                });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                    .await
                {
                    Ok(_) => Some((name, count)),
                    // Deleted since (by hand, or expired): the repeat starts a new Event.
                    Err(kube::Error::Api(status)) if status.code == 404 => None,
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        let (name, count) = match counted {
            Some(counted) => counted,
            None => {
                let new = self.new_event(event, regarding, now);
                let name = new.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &new).await?;
                (name, 1)
            }
        };
        self.lock().sent(key, name, count, Instant::now());
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sent> {
        self.sent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_name(event.type_).to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            ..K8sEvent::default()
        }
    }
}

fn type_name(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two Events the same one repeated (their notes may differ).
fn series_key(event: &Event, regarding: &ObjectReference) -> String {
    let object = |r: &ObjectReference| {
        [&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid]
            .map(|part| part.as_deref().unwrap_or_default())
            .join("/")
    };
    [
        type_name(event.type_),
        &event.action,
        &event.reason,
        &object(regarding),
        &event.secondary.as_ref().map(object).unwrap_or_default(),
    ]
    .join("\n")
}

/// The Events sent within the last [`SERIES_WINDOW`]: by key, their name and count, and the keys
/// oldest first (an entry per send; one older than its key's last send is skipped).
#[derive(Default)]
struct Sent {
    by_key: HashMap<String, (String, i32, Instant)>,
    order: VecDeque<(Instant, String)>,
}

impl Sent {
    /// The name and next count of `key`'s series, if it was sent within the window before `now`.
    fn repeat(&mut self, key: &str, now: Instant) -> Option<(String, i32)> {
        self.expire(now);
        let (name, count, _) = self.by_key.get(key)?;
        Some((name.clone(), count.saturating_add(1)))
    }

    fn sent(&mut self, key: String, name: String, count: i32, now: Instant) {
        self.order.push_back((now, key.clone()));
        self.by_key.insert(key, (name, count, now));
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front()
            && now.saturating_duration_since(*at) >= SERIES_WINDOW
        {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.by_key.get(&key).is_some_and(|(_, _, last)| *last == at) {
                self.by_key.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn repeats_within_the_window_count_in_one_series_and_only_the_last_send_keeps_it() {
        let mut sent = Sent::default();
        let t0 = Instant::now();
        assert_eq!(sent.repeat("a", t0), None);
        sent.sent("a".into(), "e1".into(), 1, t0);
        let t1 = t0 + SERIES_WINDOW / 2;
        assert_eq!(sent.repeat("a", t1), Some(("e1".into(), 2)));
        sent.sent("a".into(), "e1".into(), 2, t1);
        sent.sent("b".into(), "e2".into(), 1, t1);
        // The first send of "a" has aged out, its repeat has not.
        let t2 = t0 + SERIES_WINDOW;
        assert_eq!(sent.repeat("a", t2), Some(("e1".into(), 3)));
        // Nothing sent for a whole window: a new Event, and nothing is remembered.
        let t3 = t1 + SERIES_WINDOW;
        assert_eq!(sent.repeat("a", t3), None);
        assert_eq!(sent.repeat("b", t3), None);
        assert!(sent.by_key.is_empty() && sent.order.is_empty());
    }

    #[test]
    fn events_differing_only_in_their_note_are_one_series() {
        let event = |reason: &str, note: &str| Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let object = |name: &str| ObjectReference {
            kind: Some("EtcdadmCluster".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        };
        let key = series_key(&event("Scaled", "to 3"), &object("a"));
        assert_eq!(key, series_key(&event("Scaled", "to 5"), &object("a")));
        assert_ne!(key, series_key(&event("Scaled", "to 3"), &object("b")));
        assert_ne!(key, series_key(&event("Rolled", "to 3"), &object("a")));
    }
}
