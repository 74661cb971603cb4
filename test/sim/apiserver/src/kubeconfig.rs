//! The kubeconfig that points kubectl and kube-rs at a served API server.

/// A kubeconfig with one cluster, user and context named `sim` (namespace `default`).
pub fn render(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster:
    server: {url}
users:
- name: sim
  user: {{}}
contexts:
- name: sim
  context:
    cluster: sim
    user: sim
    namespace: default
current-context: sim
preferences: {{}}
"
    )
}
