#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The image's base images are pinned by digest: a rebuild cannot pick up whatever a tag points
//! to by then. (The development machines have no Docker or registry access: the digests are
//! those that several public repositories pin for the same tags, not pulled here.)

#[test]
fn every_base_image_is_pinned_by_digest() {
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .collect();
    assert_eq!(stages.len(), 2, "{stages:?}");
    for stage in stages {
        let image = stage.split_whitespace().nth(1).unwrap();
        let (name, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("{stage}: not pinned by digest"));
        assert!(name.contains(':'), "{stage}: name the tag the digest is of");
        assert!(
            digest.len() == 64
                && digest
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{stage}: not a sha256 digest"
        );
    }
}
