//! The committed CRDs in config/crd/bases are exactly what the types generate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
    let drifted = etcdadm_shared::crd::drifted(&etcdadm_bootstrap::crds(), &dir).unwrap();
    assert!(
        drifted.is_empty(),
        "config/crd/bases is stale for {drifted:?}; regenerate with `cargo run -p etcdadm-bootstrap -- crd --out-dir config/crd/bases`"
    );
}
