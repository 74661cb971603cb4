//! Bootstrap figures for BENCHMARKS.md: user-data renders per second (minimal and full spec,
//! cloud-config and Bottlerocket) and etcd CA generation time. `cargo bench -p etcdadm-bootstrap --bench render`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use etcdadm_bootstrap::render::{CaFiles, EtcdadmCommand, RenderInput, ResolvedSecrets, render_user_data};
use etcdadm_shared::api::EtcdadmConfig;
use etcdadm_shared::api::config::EtcdadmConfigSpec;
use etcdadm_shared::pki::CertificateAuthority;

/// Median and spread of `runs` timings of `f`.
fn timed(runs: usize, mut f: impl FnMut()) -> (Duration, Duration, Duration) {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[runs / 2], times[0], times[runs - 1])
}

fn renders_per_second(
    label: &str,
    spec: &EtcdadmConfigSpec,
    ca: &CertificateAuthority,
    secrets: &ResolvedSecrets,
) {
    let input = RenderInput {
        spec,
        machine_name: "etcd-0",
        ca: CaFiles {
            cert_pem: ca.cert_pem(),
            key_pem: ca.key_pem(),
        },
        command: EtcdadmCommand::Init,
        secrets,
    };
    let batch = 2_000;
    let (median, min, max) = timed(7, || {
        for _ in 0..batch {
            std::hint::black_box(render_user_data(&input).unwrap());
        }
    });
    let rate = |d: Duration| batch as f64 / d.as_secs_f64();
    println!(
        "render {label}: {:.0} renders/s (median of 7 batches of {batch}; {:.0}–{:.0})",
        rate(median),
        rate(max),
        rate(min)
    );
}

fn main() {
    let ca = CertificateAuthority::generate("etcd-ca").unwrap();
    renders_per_second(
        "minimal spec",
        &EtcdadmConfigSpec::default(),
        &ca,
        &ResolvedSecrets::default(),
    );
    let full = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/full-config.yaml"
    ))
    .unwrap();
    let full: EtcdadmConfig = serde_saphyr::from_str(&full).unwrap();
    let mut secrets = ResolvedSecrets::default();
    for reference in etcdadm_bootstrap::render::secret_refs(&full.spec) {
        secrets.insert(&reference.target, "from-a-secret".into());
    }
    renders_per_second("full spec", &full.spec, &ca, &secrets);
    let bottlerocket = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/bottlerocket-full-config.yaml"
    ))
    .unwrap();
    let bottlerocket: EtcdadmConfig = serde_saphyr::from_str(&bottlerocket).unwrap();
    let mut secrets = ResolvedSecrets::default();
    for reference in etcdadm_bootstrap::render::secret_refs(&bottlerocket.spec) {
        secrets.insert(&reference.target, "from-a-secret".into());
    }
    renders_per_second("full Bottlerocket spec", &bottlerocket.spec, &ca, &secrets);
    let (median, min, max) = timed(9, || {
        std::hint::black_box(CertificateAuthority::generate("etcd-ca").unwrap());
    });
    println!(
        "CA generation (RSA 2048, self-signed): median {:.0} ms ({:.0}–{:.0} ms, 9 runs)",
        median.as_secs_f64() * 1e3,
        min.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}
