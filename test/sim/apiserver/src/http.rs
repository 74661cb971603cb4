//! The REST front: parses Kubernetes API paths and queries, calls the verbs, renders responses.
//! One handler serves both the in-process client and the HTTP listener.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::discovery;
use crate::error::ApiError;
use crate::negotiate::{Reading, Rendering, rendering};
use crate::openapi;
use crate::patch::PatchKind;
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::Store;
use crate::table;
use crate::verbs::{DeleteOptions, ListQuery, Sub};
use crate::watch::{WatchRequest, watch_stream};

/// Largest request body accepted.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// State shared by every front end of one server.
pub struct Shared {
    /// The objects.
    pub store: Arc<Mutex<Store>>,
    /// Requests served, for benchmarks.
    pub requests: AtomicU64,
    /// Requests served by kind (`GET secrets`, `PATCH etcdadmclusters/status`, `WATCH machines`),
    /// for benchmarks that ask what a controller reads and writes.
    pub tally: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Never fires: in-process clients have no listener to shut down.
    pub never_closing: watch::Sender<bool>,
}

impl Shared {
    /// The store, locked; a panic elsewhere cannot leave it half-written, so poison is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a handler needs: the shared state and the signal that ends this front end's watches.
#[derive(Clone)]
pub struct Endpoint {
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Fires when the listener shuts down.
    pub closing: watch::Receiver<bool>,
}

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

/// The addressed resource, parsed from the path.
struct Target {
    rt: Arc<ResourceType>,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Sub,
}

fn parse_target(
    store: &Store,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let no_route = || ApiError::no_route(path);
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if store
                .registry
                .find(group, version, plural)
                .is_some_and(|rt| rt.namespaced) =>
        {
            (Some(ns.to_string()), [&[*plural], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(*sub)),
        _ => return Err(no_route()),
    };
    let rt = store.registry.find(group, version, plural).ok_or_else(no_route)?;
    if namespace.is_some() != rt.namespaced && (name.is_some() || !rt.namespaced) {
        return Err(no_route());
    }
    let sub = match sub {
        None => Sub::Main,
        Some("status") if rt.status => Sub::Status,
        Some("scale") if rt.scale.is_some() => Sub::Scale,
        Some(_) => return Err(no_route()),
    };
    Ok(Target {
        rt,
        version: version.to_string(),
        namespace,
        name,
        sub,
    })
}

fn present(rt: &ResourceType, version: &str, sub: Sub, mut obj: Value) -> Value {
    if sub != Sub::Scale && obj.is_object() {
        obj["apiVersion"] = json!(rt.api_version(version));
    }
    obj
}

fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn flag(query: &HashMap<String, String>, key: &str) -> bool {
    matches!(query.get(key).map(String::as_str), Some("true" | "1"))
}

fn selectors(
    query: &HashMap<String, String>,
    rt: &ResourceType,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str), rt)
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn parse_body(bytes: &[u8], content_type: Option<&str>) -> Result<Value, ApiError> {
    let media = content_type
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    match media {
        "application/json" | "" | "*/*" => serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
        "application/yaml" => std::str::from_utf8(bytes)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_saphyr::from_str(text).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}"))),
        other => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({other}) - accepted media types include: \
             application/json, application/yaml"
        ))),
    }
}

fn delete_options(query: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    Ok(DeleteOptions {
        propagation: query
            .get("propagationPolicy")
            .cloned()
            .or_else(|| text(body.get("propagationPolicy"))),
        uid: text(body.pointer("/preconditions/uid")),
        resource_version: text(body.pointer("/preconditions/resourceVersion")),
    })
}

/// `<verb> <resource>[/<subresource>]` of a request, e.g. `PATCH etcdadmclusters/status`; a
/// watch counts as `WATCH`.
fn request_kind(parts: &http::request::Parts) -> String {
    let segments: Vec<&str> = parts.uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let mut rest = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &segments[..],
    };
    if rest.first() == Some(&"namespaces") && rest.len() > 2 {
        rest = &rest[2..];
    }
    let watching = parts
        .uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = if watching { "WATCH" } else { parts.method.as_str() };
    match (rest.first(), rest.get(2)) {
        (Some(resource), Some(sub)) => format!("{verb} {resource}/{sub}"),
        (Some(resource), None) => format!("{verb} {resource}"),
        (None, _) => format!("{verb} {}", parts.uri.path()),
    }
}

/// Serves one request.
pub async fn handle(State(endpoint): State<Endpoint>, request: Request) -> Response {
    endpoint.shared.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    if let Ok(mut tally) = endpoint.shared.tally.lock() {
        *tally.entry(request_kind(&parts)).or_default() += 1;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "cannot read the request body: {e}"
            )));
        }
    };
    let response = route(&endpoint, &parts, &bytes);
    let shared = endpoint.shared.clone();
    if shared.lock().garbage_pending {
        tokio::spawn(async move { shared.lock().collect_garbage() });
    }
    response
}

fn route(endpoint: &Endpoint, parts: &http::request::Parts, body: &[u8]) -> Response {
    let path = parts.uri.path();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let store_ref = endpoint.shared.clone();
    let discovered = {
        let store = store_ref.lock();
        match segments.as_slice() {
            ["version"] => Some(Some(discovery::version())),
            ["api"] => Some(Some(discovery::core_versions(host))),
            ["apis"] => Some(Some(discovery::group_list(&store.registry))),
            ["api", version] => Some(discovery::resource_list(&store.registry, "", version)),
            ["apis", group] => Some(discovery::group(&store.registry, group)),
            ["apis", group, version] => Some(discovery::resource_list(&store.registry, group, version)),
            ["openapi", "v3"] => Some(Some(openapi::index(&store))),
            ["openapi", "v3", "apis", group, version] => Some(openapi::document(&store, group, version)),
            ["healthz" | "livez" | "readyz"] => {
                let mut ok = Response::new(Body::from("ok"));
                ok.headers_mut()
                    .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain"));
                return ok;
            }
            _ => None,
        }
    };
    if let Some(doc) = discovered {
        return match doc {
            Some(doc) if parts.method == Method::GET => json_response(200, &doc),
            Some(_) => error_response(&ApiError::method_not_allowed(format!(
                "{} is not allowed on {path}",
                parts.method
            ))),
            None => error_response(&ApiError::no_route(path)),
        };
    }
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return error_response(&ApiError::no_route(path)),
    };
    match resource_request(endpoint, parts, group, version, rest, body) {
        Ok(response) => response,
        Err(err) => error_response(&err),
    }
}

fn resource_request(
    endpoint: &Endpoint,
    parts: &http::request::Parts,
    group: &str,
    version: &str,
    rest: &[&str],
    body: &[u8],
) -> Result<Response, ApiError> {
    // The verb table of one resource request, as the real server routes it: one arm per verb.
    let query = parse_query(parts.uri.query());
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let mut store = endpoint.shared.lock();
    let target = parse_target(&store, group, version, rest, parts.uri.path())?;
    let rt = target.rt.clone();
    let ns = target.namespace.clone().unwrap_or_default();
    let verb = match (&parts.method, &target.name) {
        (&Method::GET, None) if flag(&query, "watch") => "watch",
        (&Method::GET, None) => "list",
        (&Method::POST, None) => "create",
        (&Method::GET, Some(_)) => "get",
        (&Method::PUT, Some(_)) => "update",
        (&Method::PATCH, Some(_)) => "patch",
        (&Method::DELETE, Some(_)) => "delete",
        (method, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on {} by this server (deletecollection is not implemented)",
                parts.uri.path()
            )));
        }
    };
    let allowed = if target.sub == Sub::Main {
        rt.allows(verb)
    } else {
        matches!(verb, "get" | "update" | "patch")
    };
    if verb == "create" && rt.namespaced && target.namespace.is_none() {
        return Err(ApiError::no_route(parts.uri.path()));
    }
    if !allowed {
        return Err(ApiError::method_not_allowed(format!(
            "{verb} is not supported on {}.{}",
            rt.plural, rt.group
        )));
    }
    if matches!(verb, "create" | "update" | "patch")
        && query.get("fieldValidation").is_some_and(|v| v == "Strict")
    {
        return Err(ApiError::bad_request(
            "fieldValidation=Strict is not supported by this server: unknown fields are pruned (custom \
             resources) or ignored (built-in kinds), never reported; use Ignore or Warn",
        ));
    }
    let reading = match (verb, target.sub) {
        ("get", Sub::Main) => Reading::One,
        ("list", Sub::Main) => Reading::List,
        ("watch", Sub::Main) => Reading::Watch,
        _ => Reading::Other,
    };
    let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let form = rendering(accept, reading, query.get("includeObject").map(String::as_str))?;
    let name = target.name.clone().unwrap_or_default();
    let show = |obj: Value| present(&rt, &target.version, target.sub, obj);
    match verb {
        "watch" => {
            let (labels, fields) = selectors(&query, &rt)?;
            let since = match query.get("resourceVersion").map(String::as_str) {
                None | Some("" | "0") => None,
                Some(rv) => Some(
                    rv.parse::<u64>()
                        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
                ),
            };
            let send_initial_events = flag(&query, "sendInitialEvents");
            if send_initial_events && !flag(&query, "allowWatchBookmarks") {
                return Err(ApiError::invalid(
                    "ListOptions",
                    "",
                    "meta.k8s.io",
                    "allowWatchBookmarks: Required value: allowWatchBookmarks must be true if sendInitialEvents = true",
                ));
            }
            let request = WatchRequest {
                rt: rt.clone(),
                version: target.version.clone(),
                namespace: target.namespace.clone(),
                labels,
                fields,
                since: if send_initial_events { None } else { since },
                bookmarks: flag(&query, "allowWatchBookmarks"),
                send_initial_events,
                timeout: query
                    .get("timeoutSeconds")
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_secs),
                rendering: form,
                headers_sent: false,
            };
            drop(store);
            let stream = watch_stream(endpoint.shared.store.clone(), endpoint.closing.clone(), request);
            let mut response = Response::new(Body::from_stream(stream));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok(response)
        }
        "list" => {
            let (labels, fields) = selectors(&query, &rt)?;
            if query.get("resourceVersionMatch").is_some_and(|m| m == "Exact")
                && query.get("resourceVersion").and_then(|rv| rv.parse::<u64>().ok()) != Some(store.rv)
            {
                return Err(ApiError::gone(
                    "this server lists only at the latest resourceVersion",
                ));
            }
            let list_query = ListQuery {
                labels,
                fields,
                limit: query.get("limit").and_then(|l| l.parse().ok()),
                continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
            };
            let page = store.list(&rt, target.namespace.as_deref(), &list_query)?;
            let mut metadata = json!({"resourceVersion": page.rv.to_string()});
            if let Some(token) = page.continue_token {
                metadata["continue"] = json!(token);
                metadata["remainingItemCount"] = json!(page.remaining);
            }
            let items = page.items.into_iter().map(show);
            let body = match form {
                Rendering::Json => json!({
                    "apiVersion": rt.api_version(&target.version),
                    "kind": format!("{}List", rt.kind),
                    "metadata": metadata,
                    "items": items.collect::<Vec<_>>(),
                }),
                Rendering::Metadata => json!({
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadataList",
                    "metadata": metadata,
                    "items": items.map(|o| table::metadata_only(&o)).collect::<Vec<_>>(),
                }),
                Rendering::Table(include) => {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    let rows = items
                        .map(|o| table::row(&rt, &target.version, &o, include, now))
                        .collect();
                    table::table(&rt, &target.version, rows, metadata, true)
                }
            };
            Ok(json_response(200, &body))
        }
        "get" => {
            let object = show(store.read(&rt, &ns, &name, target.sub)?);
            let body = match form {
                Rendering::Json => object,
                Rendering::Metadata => table::metadata_only(&object),
                Rendering::Table(include) => {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    let rv = object.pointer("/metadata/resourceVersion").cloned();
                    let row = table::row(&rt, &target.version, &object, include, now);
                    table::table(
                        &rt,
                        &target.version,
                        vec![row],
                        json!({"resourceVersion": rv}),
                        true,
                    )
                }
            };
            Ok(json_response(200, &body))
        }
        "create" => {
            let obj = parse_body(body, content_type)?;
            Ok(json_response(201, &show(store.create(&rt, &ns, obj, dry_run)?)))
        }
        "update" => {
            let obj = parse_body(body, content_type)?;
            Ok(json_response(
                200,
                &show(store.replace(&rt, &ns, &name, obj, target.sub, dry_run)?),
            ))
        }
        "patch" => {
            let kind = content_type.and_then(PatchKind::from_content_type).ok_or_else(|| {
                ApiError::unsupported_media_type(format!(
                    "the body of the request was in an unknown format ({}) - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    content_type.unwrap_or("none")
                ))
            })?;
            let updated = store.patch(
                &rt,
                &ns,
                &name,
                target.sub,
                kind,
                body,
                query.get("fieldManager").map(String::as_str),
                flag(&query, "force"),
                dry_run,
            )?;
            Ok(json_response(200, &show(updated)))
        }
        "delete" => {
            let options = delete_options(&query, body)?;
            Ok(json_response(
                200,
                &show(store.delete(&rt, &ns, &name, &options, dry_run)?),
            ))
        }
        _ => Err(ApiError::internal(format!("verb {verb} has no handler"))),
    }
}
