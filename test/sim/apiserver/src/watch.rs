//! Watch streams: newline-delimited events replayed from the history, then followed live.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::{Instant, Interval};

use crate::error::ApiError;
use crate::negotiate::Rendering;
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{EventKind, Store, meta_str};
use crate::table;

/// How often a watch that asked for bookmarks gets one. The real server sends them about once
/// a minute; more often costs little here and lets clients resume closer to the present.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// What a watch asked for.
#[derive(Clone, Debug)]
pub struct WatchRequest {
    /// The resource.
    pub rt: Arc<ResourceType>,
    /// The version the client speaks.
    pub version: String,
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `resourceVersion`; `None` for unset or "0" (start with the current state).
    pub since: Option<u64>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents` (streaming list).
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// The form of the events' objects.
    pub rendering: Rendering,
    /// Whether a `Table` event carried the column definitions yet (only the first does).
    pub headers_sent: bool,
}

impl WatchRequest {
    /// Whether a stored object is one this watch reports (selectors apply to it as served).
    fn matches(&self, stored: &Value) -> bool {
        let obj = self.rt.viewed(stored);
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta_str(&obj, "namespace") == Some(ns))
            && self.labels.matches(&obj)
            && self.fields.matches(&obj)
    }

    /// An ADDED, MODIFIED or DELETED event for a stored object, in the form asked for.
    fn line(&mut self, kind: &str, stored: &Value) -> Bytes {
        let mut obj = self.rt.view(stored.clone());
        if obj.is_object() {
            obj["apiVersion"] = json!(self.rt.api_version(&self.version));
        }
        let obj = match self.rendering {
            Rendering::Json => obj,
            Rendering::Metadata => table::metadata_only(&obj),
            Rendering::Table(include) => {
                let row = table::row(
                    &self.rt,
                    &self.version,
                    &obj,
                    include,
                    k8s_openapi::jiff::Timestamp::now(),
                );
                let rv = obj
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or_default();
                let headers = !std::mem::replace(&mut self.headers_sent, true);
                table::table(
                    &self.rt,
                    &self.version,
                    vec![row],
                    json!({"resourceVersion": rv}),
                    headers,
                )
            }
        };
        raw_line(kind, obj)
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut obj = json!({
            "apiVersion": self.rt.api_version(&self.version),
            "kind": self.rt.kind,
            "metadata": {"resourceVersion": rv.to_string()},
        });
        if initial_events_end {
            obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        raw_line("BOOKMARK", obj)
    }
}

fn raw_line(kind: &str, obj: Value) -> Bytes {
    let mut text = json!({"type": kind, "object": obj}).to_string();
    text.push('\n');
    Bytes::from(text)
}

struct WatchState {
    store: Arc<Mutex<Store>>,
    request: WatchRequest,
    changes: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    last_rv: u64,
    pending: VecDeque<Bytes>,
    deadline: Instant,
    ticker: Interval,
    caught_up: bool,
    done: bool,
}

fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl WatchState {
    /// Queues the changes after `last_rv`, or a 410 when they are no longer retained.
    fn catch_up(&mut self, store: &Store) {
        if self.last_rv < store.compacted_rv {
            let gone = ApiError::gone(format!(
                "too old resource version: {} ({})",
                self.last_rv,
                store.compacted_rv + 1
            ));
            self.pending.push_back(raw_line("ERROR", gone.to_status()));
            self.done = true;
            return;
        }
        let key = self.request.rt.storage_key();
        let start = store.history.partition_point(|c| c.rv <= self.last_rv);
        for change in store.history.iter().skip(start) {
            if change.resource != key {
                continue;
            }
            let now = self.request.matches(&change.object);
            let before = change
                .previous
                .as_deref()
                .is_some_and(|p| self.request.matches(p));
            let kind = match (change.kind, before, now) {
                (EventKind::Added, _, true) => "ADDED",
                (EventKind::Modified, true, true) => "MODIFIED",
                (EventKind::Modified, false, true) => "ADDED",
                (EventKind::Modified, true, false) => "DELETED",
                (EventKind::Deleted, _, true) => "DELETED",
                _ => continue,
            };
            self.pending.push_back(self.request.line(kind, &change.object));
        }
        self.last_rv = self.last_rv.max(store.rv);
    }
}

/// The event stream of a watch. It ends at the timeout, when the server shuts down, or when the
/// client goes away (the stream is dropped with the response body).
pub fn watch_stream(
    store: Arc<Mutex<Store>>,
    closing: watch::Receiver<bool>,
    request: WatchRequest,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let mut request = request;
    let (changes, pending, last_rv) = {
        let guard = lock(&store);
        let changes = guard.notify.subscribe();
        let mut pending = VecDeque::new();
        let last_rv = match request.since {
            Some(rv) => rv,
            None => {
                let (rt, namespace) = (request.rt.clone(), request.namespace.clone());
                for obj in guard.iter(&rt, namespace.as_deref()) {
                    if request.matches(obj) {
                        pending.push_back(request.line(EventKind::Added.as_str(), obj));
                    }
                }
                if request.send_initial_events {
                    pending.push_back(request.bookmark(guard.rv, true));
                }
                guard.rv
            }
        };
        (changes, pending, last_rv)
    };
    let far_future = Duration::from_secs(365 * 24 * 3600);
    let state = WatchState {
        store,
        deadline: Instant::now() + request.timeout.unwrap_or(far_future),
        ticker: tokio::time::interval_at(Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL),
        request,
        changes,
        closing,
        last_rv,
        pending,
        caught_up: false,
        done: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(line) = state.pending.pop_front() {
                return Some((Ok(line), state));
            }
            if state.done {
                return None;
            }
            if !state.caught_up {
                // Events may have happened between the snapshot and the first poll.
                state.caught_up = true;
                let store = state.store.clone();
                state.catch_up(&lock(&store));
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(state.deadline) => state.done = true,
                _ = state.closing.changed() => state.done = true,
                changed = state.changes.changed() => {
                    if changed.is_err() {
                        state.done = true;
                    } else {
                        let store = state.store.clone();
                        state.catch_up(&lock(&store));
                    }
                }
                _ = state.ticker.tick(), if state.request.bookmarks => {
                    let line = state.request.bookmark(state.last_rv, false);
                    state.pending.push_back(line);
                }
            }
        }
    })
}
