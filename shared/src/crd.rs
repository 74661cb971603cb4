//! CRD manifests rendered from the API types: what `<binary> crd` prints and config/crd/bases holds.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// File name kubebuilder would give a CRD: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// The YAML document of one CRD, with a trailing newline.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let mut value = serde_json::to_value(crd)?;
    drop_null_enum_values(&mut value);
    let mut yaml = serde_saphyr::to_string(&value)?;
    if !yaml.ends_with('\n') {
        yaml.push('\n');
    }
    Ok(yaml)
}

/// Rendering a CRD failed (a bug in the types, never user input).
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("CRD does not serialize to JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("CRD does not serialize to YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser::Error),
    #[error("writing CRD files: {0}")]
    Io(#[from] std::io::Error),
}

/// Print the CRDs as one multi-document YAML stream, or write one file each into `out_dir`.
pub fn emit(crds: &[CustomResourceDefinition], out_dir: Option<&std::path::Path>) -> Result<(), CrdError> {
    for crd in crds {
        let yaml = to_yaml(crd)?;
        match out_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(file_name(crd)), yaml)?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}

/// Names of the CRDs whose file in `dir` differs from what the code generates (missing counts).
pub fn drifted(crds: &[CustomResourceDefinition], dir: &std::path::Path) -> Result<Vec<String>, CrdError> {
    let mut drifted = vec![];
    for crd in crds {
        let name = file_name(crd);
        let committed = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
        if committed != to_yaml(crd)? {
            drifted.push(name);
        }
    }
    Ok(drifted)
}

/// schemars lists `null` among the values of an optional enum; `nullable: true` already says it.
fn drop_null_enum_values(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "enum"
                    && let Value::Array(values) = child
                {
                    values.retain(|v| !v.is_null());
                } else {
                    drop_null_enum_values(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null_enum_values),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EtcdadmCluster, EtcdadmConfig, EtcdadmConfigTemplate};
    use kube::CustomResourceExt;

    #[test]
    fn crds_carry_contract_labels_and_no_null_enum_values() {
        for crd in [
            EtcdadmCluster::crd(),
            EtcdadmConfig::crd(),
            EtcdadmConfigTemplate::crd(),
        ] {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("cluster.x-k8s.io/v1beta1").map(String::as_str),
                Some("v1beta1")
            );
            assert_eq!(
                labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
                Some("v1beta1")
            );
            let yaml = to_yaml(&crd).unwrap();
            assert!(!yaml.contains("- null"), "{}", file_name(&crd));
        }
    }

    #[test]
    fn etcdadm_cluster_crd_has_scale_status_short_name_and_replica_rule() {
        let crd = EtcdadmCluster::crd();
        assert_eq!(
            file_name(&crd),
            "etcdcluster.cluster.x-k8s.io_etcdadmclusters.yaml"
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["etcdc".to_string()]));
        let version = &crd.spec.versions[0];
        let sub = version.subresources.as_ref().unwrap();
        assert!(sub.status.is_some());
        let scale = sub.scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.readyReplicas");
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        );
        let yaml = to_yaml(&crd).unwrap();
        assert!(yaml.contains("x-kubernetes-validations"));
        assert!(yaml.contains("% 2 == 1"), "replicas must be odd by CEL");
    }
}
