//! `etcdadm-sim bench continuous`: what continuous backup's recorders cost the controller, one
//! per cluster. N recorders, each on a connection of its own as the controller keeps one per
//! cluster, watch one real etcd member from its revision and upload deltas into a real store
//! (SeaweedFS) while a client writes; this process's resident memory and CPU are read before
//! the recorders start and over the window, so the figures are the recorders' alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcdadm_shared::backup::delta::record::{MAX_DELTA_BYTES, RecordLimits, Recorder};
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::pki::CertificateAuthority;
use etcdadm_shared::testing::{SeaweedFs, TlsEtcdCluster};

use crate::bench::usage_of;
use crate::error::SimError;

/// What `bench continuous` runs.
#[derive(Clone, Copy, Debug)]
pub struct ContinuousOptions {
    pub recorders: usize,
    /// Writes a second to the member (each recorder sees them all, as each cluster its own).
    pub writes_per_second: u32,
    pub interval: Duration,
    pub window: Duration,
}

/// Run the recorders over the window and print their cost.
pub async fn run_continuous(options: ContinuousOptions) -> Result<(), SimError> {
    // Setup, the recorders, the window and the report in the order they happen: a script.
    let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
    let ca = CertificateAuthority::generate("etcd-ca").map_err(|e| setup(&e))?;
    let etcd = TlsEtcdCluster::start(&ca, 1);
    let url = etcd.client_urls()[0].clone();
    let tls = EtcdTls::issued_by(&ca, "bench", Duration::from_secs(3600)).map_err(|e| setup(&e))?;
    let s3 = SeaweedFs::start().await;
    let store = s3.create_bucket("etcd-backups").await;
    // SeaweedFS grows a bucket's volumes on its first write; uploads racing that growth wait
    // on it, which is the store's start, not the recorders' cost.
    store
        .put_object("bench/warm-up", vec![0; 16])
        .await
        .map_err(|e| setup(&e))?;
    let writer = MemberClient::new(&url, &tls, Duration::from_secs(10)).map_err(|e| setup(&e))?;
    let mut kv = writer.workload_client().await.map_err(|e| setup(&e))?;
    kv.put("bench/start", "x", None).await.map_err(|e| setup(&e))?;
    let base = writer.local_revision().await.map_err(|e| setup(&e))?;
    let me = std::process::id();
    let before = usage_of(me).ok_or_else(|| setup(&"no /proc usage of this process"))?;

    let uploaded = Arc::new(AtomicU64::new(0));
    let mut stops = vec![];
    for i in 0..options.recorders {
        let member = MemberClient::new(&url, &tls, Duration::from_secs(10)).map_err(|e| setup(&e))?;
        let mut client = member.etcd_client().await.map_err(|e| setup(&e))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        let (store, uploaded) = (store.clone(), uploaded.clone());
        tokio::spawn(async move {
            let _member = member;
            let key = format!("bench/c{i:04}/full.db");
            let recorder = Recorder {
                store: &store,
                snapshot_key: &key,
                base,
                limits: RecordLimits {
                    interval: options.interval,
                    max_bytes: MAX_DELTA_BYTES,
                },
            };
            let mut tell = |_| {
                uploaded.fetch_add(1, Ordering::Relaxed);
            };
            let stop = async {
                let _ = stopped.await;
            };
            if let Err(e) = recorder.run(&mut client, None, &mut tell, stop).await {
                eprintln!("recorder {i}: {e}");
            }
        });
    }
    // Let every watch open, then measure over the window while the client writes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = usage_of(me).ok_or_else(|| setup(&"no /proc usage of this process"))?;
    let started = Instant::now();
    let pace = Duration::from_secs(1) / options.writes_per_second.max(1);
    let value = "v".repeat(100);
    let mut writes = 0u64;
    while started.elapsed() < options.window {
        kv.put(format!("bench/key-{:06}", writes % 10_000), value.as_str(), None)
            .await
            .map_err(|e| setup(&e))?;
        writes += 1;
        tokio::time::sleep(pace).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let end = usage_of(me).ok_or_else(|| setup(&"no /proc usage of this process"))?;
    for stop in stops {
        let _ = stop.send(());
    }
    let n = options.recorders.max(1) as f64;
    let resident = end.rss_kib.saturating_sub(before.rss_kib) as f64 / 1024.0;
    let cpu = (end.cpu_seconds - start.cpu_seconds) / seconds;
    println!(
        "command: etcdadm-sim bench continuous --recorders {} --writes-per-second {} --interval-seconds {} --window-seconds {}",
        options.recorders,
        options.writes_per_second,
        options.interval.as_secs(),
        options.window.as_secs()
    );
    println!(
        "{} recorders, {writes} writes in {seconds:.0} s ({:.1}/s, each seen by every recorder), {} deltas uploaded",
        options.recorders,
        writes as f64 / seconds,
        uploaded.load(Ordering::Relaxed)
    );
    println!(
        "resident memory: +{resident:.1} MiB for all ({:.0} KiB per recorder); CPU {:.1} % of a core for all ({:.3} % per recorder)",
        resident * 1024.0 / n,
        cpu * 100.0,
        cpu * 100.0 / n
    );
    println!(
        "at 1,000 clusters: about {:.0} MiB and {:.0} % of a core at this write rate per cluster",
        resident / n * 1000.0,
        cpu * 100.0 / n * 1000.0
    );
    // BENCH_STORE_LOG=1: the store's own last words, for an upload that stalled.
    if std::env::var_os("BENCH_STORE_LOG").is_some() {
        let log = s3.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    drop(etcd);
    Ok(())
}
