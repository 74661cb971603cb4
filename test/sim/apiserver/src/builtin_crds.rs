//! The minimal CAPI and sim CRDs this server ships, so the sim needs no CAPI manifests.
//!
//! Schemas keep every field (`x-kubernetes-preserve-unknown-fields`): the server stores what
//! controllers write and leaves validation to them. Only v1beta2 is served; v1beta1 would need
//! conversion of the object references, which is not implemented.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

/// One shipped CRD: group, kind, plural, short names.
struct Shipped(&'static str, &'static str, &'static str, &'static [&'static str]);

const SHIPPED: &[Shipped] = &[
    Shipped("cluster.x-k8s.io", "Cluster", "clusters", &["cl"]),
    Shipped("cluster.x-k8s.io", "Machine", "machines", &["ma"]),
    Shipped(
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
        &["kcp"],
    ),
    Shipped(
        "infrastructure.cluster.x-k8s.io",
        "SimCluster",
        "simclusters",
        &[],
    ),
    Shipped(
        "infrastructure.cluster.x-k8s.io",
        "SimMachine",
        "simmachines",
        &[],
    ),
    Shipped(
        "infrastructure.cluster.x-k8s.io",
        "SimMachineTemplate",
        "simmachinetemplates",
        &[],
    ),
];

/// The shipped CRDs, all namespaced, `v1beta2`, with a status subresource.
pub fn shipped_crds() -> Vec<CustomResourceDefinition> {
    SHIPPED
        .iter()
        .filter_map(|Shipped(group, kind, plural, short)| {
            let crd = json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.{group}")},
                "spec": {
                    "group": group,
                    "names": {
                        "kind": kind,
                        "listKind": format!("{kind}List"),
                        "plural": plural,
                        "singular": kind.to_lowercase(),
                        "shortNames": short,
                        "categories": ["cluster-api"],
                    },
                    "scope": "Namespaced",
                    "versions": [{
                        "name": "v1beta2",
                        "served": true,
                        "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                        }},
                    }],
                },
            });
            // The literal above is a valid CRD; a failure here would be caught by the unit test.
            serde_json::from_value(crd).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_crd_parses_and_is_servable() {
        let crds = shipped_crds();
        assert_eq!(crds.len(), SHIPPED.len());
        for crd in &crds {
            let rt = crate::resources::ResourceType::from_crd(crd).unwrap();
            assert!(rt.status && rt.namespaced && rt.custom);
        }
    }
}
