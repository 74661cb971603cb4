//! Which form a response takes, from the request's `Accept` header: the object as JSON, a
//! `Table` (`kubectl get`), or metadata only (`PartialObjectMetadata`, kube's metadata watches).
//! A form asked for and not served here (YAML, protobuf, a `v1beta1` Table) is skipped for the
//! next one the client accepts; when none is left the answer is 406, never another form.

use crate::error::ApiError;
use crate::table::Include;

/// The form of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    Json,
    Table(Include),
    /// `PartialObjectMetadata`, or `PartialObjectMetadataList` for a list.
    Metadata,
}

/// What a request reads, which decides the forms it may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// GET of one object.
    One,
    /// A list.
    List,
    /// A watch: events whose objects take the form.
    Watch,
    /// Anything else (writes, subresources): JSON only.
    Other,
}

const SERVED: &str = "application/json, application/json;as=Table;v=v1;g=meta.k8s.io, \
     application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, \
     application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";

/// The form for `accept` (absent or empty: JSON); `include` is the `includeObject` parameter.
pub fn rendering(
    accept: Option<&str>,
    reading: Reading,
    include: Option<&str>,
) -> Result<Rendering, ApiError> {
    let accept = accept.unwrap_or_default().trim();
    if accept.is_empty() {
        return Ok(Rendering::Json);
    }
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| {
                (
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').to_string(),
                )
            })
            .collect();
        let param = |key: &str| params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        if param("q").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0)) {
            continue;
        }
        if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        let meta_v1 = param("g") == Some("meta.k8s.io") && param("v") == Some("v1");
        let chosen = match (param("as"), reading) {
            (None, _) => Some(Rendering::Json),
            (Some("Table"), Reading::One | Reading::List | Reading::Watch) if meta_v1 => {
                let include = Include::parse(include).map_err(ApiError::bad_request)?;
                Some(Rendering::Table(include))
            }
            (Some("PartialObjectMetadata"), Reading::One | Reading::Watch) if meta_v1 => {
                Some(Rendering::Metadata)
            }
            (Some("PartialObjectMetadataList"), Reading::List) if meta_v1 => Some(Rendering::Metadata),
            _ => None,
        };
        if let Some(chosen) = chosen {
            return Ok(chosen);
        }
    }
    Err(ApiError::not_acceptable(format!(
        "only the following media types are accepted: {SERVED} (as Table or metadata only for get, list and \
         watch of a resource; this server serves neither YAML nor protobuf)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL_GET: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

    #[test]
    fn kubectl_get_gets_a_table_and_writes_get_json() {
        assert_eq!(
            rendering(Some(KUBECTL_GET), Reading::List, None).unwrap(),
            Rendering::Table(Include::Metadata)
        );
        assert_eq!(
            rendering(Some(KUBECTL_GET), Reading::Watch, Some("Object")).unwrap(),
            Rendering::Table(Include::Object)
        );
        assert_eq!(
            rendering(Some(KUBECTL_GET), Reading::Other, None).unwrap(),
            Rendering::Json
        );
        assert_eq!(rendering(None, Reading::One, None).unwrap(), Rendering::Json);
        assert_eq!(
            rendering(Some("*/*"), Reading::One, None).unwrap(),
            Rendering::Json
        );
    }

    #[test]
    fn metadata_only_as_kube_asks_for_it() {
        let list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let one = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
        assert_eq!(
            rendering(Some(list), Reading::List, None).unwrap(),
            Rendering::Metadata
        );
        assert_eq!(
            rendering(Some(one), Reading::Watch, None).unwrap(),
            Rendering::Metadata
        );
        assert_eq!(rendering(Some(one), Reading::List, None).unwrap_err().code, 406);
    }

    #[test]
    fn what_is_not_served_is_not_acceptable() {
        for accept in [
            "application/vnd.kubernetes.protobuf",
            "application/yaml",
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
            "application/json;q=0",
            "text/html",
        ] {
            assert_eq!(
                rendering(Some(accept), Reading::List, None).unwrap_err().code,
                406,
                "{accept}"
            );
        }
        assert_eq!(
            rendering(
                Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
                Reading::Other,
                None
            )
            .unwrap_err()
            .code,
            406
        );
        assert_eq!(
            rendering(Some(KUBECTL_GET), Reading::List, Some("All"))
                .unwrap_err()
                .code,
            400
        );
    }
}
