//! `etcdadm-sim bench restore`: how long a restore from continuous backup takes for a large full
//! snapshot and a long chain of deltas after it, split into the phases a user waits through, with
//! each run's restored data checked against the source so a fast wrong answer is never a figure.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::GetOptions;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::api::snapshot::{DeltasRestored, EtcdadmSnapshot, SnapshotPhase};
use etcdadm_shared::backup::delta::listing;
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::names;
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::testing::SeaweedFs;

use crate::bench::{load_average, spread};
use crate::demo::etcd_tls;
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster, create_store_secrets};
use crate::plane::{NAMESPACE, Plane, PlaneOptions};

const POLL: Duration = Duration::from_millis(50);
/// The loopback prefix (`127.0.111.N`) of this bench: no scenario or other bench uses it.
const BENCH_PREFIX: u8 = 111;
const BUCKET: &str = "etcd-backups";
/// The source cluster's name.
const SOURCE: &str = "source";
/// Each bulk key's value: 64 KiB, so 16 keys a MiB.
const VALUE_BYTES: usize = 64 << 10;
/// Bulk data, written before the full snapshot.
const BULK: &str = "bench/bulk/";
/// Small keys, written (and some deleted) after it: the deltas.
const SMALL: &str = "bench/small/";
/// The longest any one wait of the bench may take (a snapshot, the deltas' upload, a restore).
const TIMEOUT: Duration = Duration::from_secs(1200);
/// Where the first member's user data downloads the snapshot to, under the machine's root (the
/// bootstrap provider's `RESTORE_SNAPSHOT_FILE`).
const DOWNLOADED: &str = "var/lib/etcd-restore/snapshot.db";

/// What `etcdadm-sim bench restore` runs.
#[derive(Clone, Copy, Debug)]
pub struct RestoreOptions {
    /// MiB of data in the full snapshot.
    pub megabytes: u64,
    /// Writes (puts and deletes) after it, each one revision.
    pub events: u64,
    /// Restores with `to: {latest: true}`; one restore of the snapshot alone follows them.
    pub runs: usize,
}

impl RestoreOptions {
    fn command(&self) -> String {
        format!(
            "etcdadm-sim bench --work-dir <dir> restore --megabytes {} --events {} --runs {}",
            self.megabytes, self.events, self.runs
        )
    }
}

/// One write after the full snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Put(String, String),
    Delete(String),
}

/// The `i`th write after the full snapshot: every tenth deletes the key put nine writes before
/// (so each write is one revision: the key deleted exists), the others put a new small key.
fn op(i: u64) -> Op {
    if i % 10 == 9 {
        Op::Delete(small_key(i - 9))
    } else {
        Op::Put(small_key(i), format!("value-{i}"))
    }
}

fn small_key(i: u64) -> String {
    format!("{SMALL}{i:06}")
}

/// The bulk value of key `i`: 64 KiB of bytes that differ per key (xorshift), as real data
/// would, so nothing on the way can make them smaller.
fn bulk_value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut value = Vec::with_capacity(VALUE_BYTES);
    while value.len() < VALUE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        value.extend_from_slice(&x.to_le_bytes());
    }
    value.truncate(VALUE_BYTES);
    value
}

/// What a cluster holds of the bench's keys: the bulk keys' count and every small key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Contents {
    bulk: i64,
    small: BTreeMap<String, Vec<u8>>,
}

/// The bench's keys that `kv` holds at `revision` (None: now).
async fn contents(kv: &mut etcd_client::Client, revision: Option<i64>) -> Result<Contents, SimError> {
    let at = |options: GetOptions| match revision {
        Some(r) => options.with_revision(r),
        None => options,
    };
    let bulk = kv
        .get(BULK, Some(at(GetOptions::new().with_prefix().with_count_only())))
        .await
        .map_err(etcd_error)?
        .count();
    let small = kv
        .get(SMALL, Some(at(GetOptions::new().with_prefix())))
        .await
        .map_err(etcd_error)?
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
            )
        })
        .collect();
    Ok(Contents { bulk, small })
}

fn etcd_error(e: impl std::fmt::Display) -> SimError {
    SimError::Setup(format!("etcd: {e}"))
}

/// The source once its continuous backup holds everything: the full snapshot's name, size and
/// revision, the last revision written, and the bench's keys at both.
struct Source {
    snapshot: String,
    size: u64,
    base: i64,
    last: i64,
    at_base: Contents,
    at_last: Contents,
}

/// When each step of a restore was first seen, from the EtcdadmCluster's creation.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// The first Machine exists.
    machine: Option<Duration>,
    /// It has an address: it booted and runs its user data.
    address: Option<Duration>,
    /// The snapshot file on it has the snapshot's size.
    downloaded: Option<Duration>,
    /// Its etcd answers `/health` healthy: restored from the full snapshot and started.
    healthy: Option<Duration>,
    /// Its revision moved past the one it started with: the deltas were read and checked whole,
    /// and the first of their events is written.
    writing: Option<Duration>,
    /// The `Restored` Event: with `to`, after the deltas were replayed.
    restored: Option<Duration>,
    ready: Option<Duration>,
}

/// The phases of a restore, each what ends it and how long it took from the previous end seen
/// (`None`: its end was not seen, and the next phase counts from the last end seen).
fn phases(seen: &Seen) -> Vec<(&'static str, Option<Duration>)> {
    let ends = [
        ("Machine created", seen.machine),
        ("boot", seen.address),
        ("download", seen.downloaded),
        ("restore + etcd start", seen.healthy),
        ("deltas read + checked", seen.writing),
        ("deltas written (Restored Event)", seen.restored),
        ("Ready", seen.ready),
    ];
    let mut last = Duration::ZERO;
    ends.into_iter()
        .map(|(what, end)| {
            let took = end.map(|end| {
                let took = end.saturating_sub(last);
                last = last.max(end);
                took
            });
            (what, took)
        })
        .collect()
}

/// One restore's outcome.
struct RestoreRun {
    seen: Seen,
    deltas: Option<DeltasRestored>,
    /// Revisions the restored member moved by from when it was first seen healthy to Ready:
    /// one per replayed revision, or more if something wrote the events twice.
    written: Option<i64>,
}

/// Create the EtcdadmCluster `<name>-etcd` of one member with `extra_spec`, no control plane.
async fn create_cluster(client: &Client, name: &str, extra_spec: Value) -> Result<(), SimError> {
    create_managed_cluster(
        client,
        NAMESPACE,
        &ManagedCluster {
            name,
            replicas: 1,
            zones: &[],
            config_spec: json!({}),
            health_check: Value::Null,
            with_kcp: false,
            extra_spec,
        },
    )
    .await
}

fn clusters(client: &Client) -> Api<EtcdadmCluster> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// Poll `check` every [`POLL`] until it answers, for at most [`TIMEOUT`].
async fn wait<T, F, Fut>(what: &str, mut check: F) -> Result<T, SimError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, SimError>>,
{
    let started = Instant::now();
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if started.elapsed() > TIMEOUT {
            return Err(SimError::Timeout(format!("{what} after {TIMEOUT:?}")));
        }
        tokio::time::sleep(POLL * 4).await;
    }
}

/// A client of the single member of `<name>-etcd` once it is Ready.
async fn ready_member(client: &Client, name: &str) -> Result<MemberClient, SimError> {
    let etcd = wait(&format!("{name}-etcd not Ready"), || async {
        let etcd = clusters(client).get(&format!("{name}-etcd")).await?;
        let ready = etcd.status.as_ref().is_some_and(|s| s.ready);
        Ok(ready.then_some(etcd))
    })
    .await?;
    let url = etcd
        .status
        .and_then(|s| s.members.into_iter().find_map(|m| m.client_url))
        .ok_or_else(|| SimError::Setup(format!("{name}-etcd is Ready with no member's client URL")))?;
    let tls = etcd_tls(client, NAMESPACE, name)
        .await?
        .ok_or_else(|| SimError::Setup(format!("no etcd CA of {name}")))?;
    MemberClient::new(&url, &tls, Duration::from_secs(60)).map_err(etcd_error)
}

/// Write `megabytes` of bulk keys through `kv`.
async fn write_bulk(kv: &mut etcd_client::Client, megabytes: u64) -> Result<(), SimError> {
    let keys = megabytes * (1 << 20) / VALUE_BYTES as u64;
    for i in 0..keys {
        kv.put(format!("{BULK}{i:06}"), bulk_value(i), None)
            .await
            .map_err(etcd_error)?;
    }
    Ok(())
}

/// Make the writes after the full snapshot; returns the last one's revision.
async fn write_events(kv: &mut etcd_client::Client, events: u64) -> Result<i64, SimError> {
    let mut last = 0;
    for i in 0..events {
        let header = match op(i) {
            Op::Put(key, value) => kv.put(key, value, None).await.map_err(etcd_error)?.take_header(),
            Op::Delete(key) => kv.delete(key, None).await.map_err(etcd_error)?.take_header(),
        };
        last = header.map_or(last, |h| h.revision());
    }
    Ok(last)
}

/// Turn continuous backup on and wait for its full snapshot to succeed. One that fails is
/// reported, and the controller's next one (after its backoff) waited for.
async fn continuous_snapshot(client: &Client) -> Result<EtcdadmSnapshot, SimError> {
    clusters(client)
        .patch(
            &format!("{SOURCE}-etcd"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {"continuous": {"interval": "5s"}}}})),
        )
        .await?;
    let snapshots: Api<EtcdadmSnapshot> = Api::namespaced(client.clone(), NAMESPACE);
    let prefix = format!("{SOURCE}-etcd-continuous-");
    let told = std::cell::RefCell::new(std::collections::BTreeSet::new());
    wait("continuous backup's full snapshot not Succeeded", || async {
        let list: Vec<EtcdadmSnapshot> = snapshots
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.name_any().starts_with(&prefix))
            .collect();
        for failed in list.iter().filter(|s| s.phase() == SnapshotPhase::Failed) {
            if told.borrow_mut().insert(failed.name_any()) {
                let why = failed.status.as_ref().and_then(|s| s.conditions.first());
                println!(
                    "continuous backup's full snapshot {} failed ({}); waiting for the controller's next one",
                    failed.name_any(),
                    why.map_or(String::new(), |c| c.message.clone().unwrap_or_default())
                );
            }
        }
        Ok(list.into_iter().find(|s| s.phase() == SnapshotPhase::Succeeded))
    })
    .await
}

/// Wait until the store holds deltas of the snapshot at `key` reaching revision `last`;
/// returns how many objects.
async fn wait_uploaded(store: &StoreClient, key: &str, last: i64) -> Result<usize, SimError> {
    wait(&format!("deltas not uploaded up to revision {last}"), || async {
        let names = listing::listed(store, key)
            .await
            .map_err(|e| SimError::Setup(format!("listing deltas: {e}")))?;
        let reached = names.iter().map(|n| n.last).max().unwrap_or(0);
        Ok((reached >= last).then_some(names.len()))
    })
    .await
}

/// Wait until the EtcdadmSnapshot `name`'s `status.deltas.lastRevision` reaches `last`. A
/// restore's replay is keyed by it too: one under way when it changes is started again beside
/// the first (BENCHMARKS.md, section 22), so the restores are timed only once it holds still.
async fn recorded_up_to(client: &Client, name: &str, last: i64) -> Result<(), SimError> {
    let snapshots: Api<EtcdadmSnapshot> = Api::namespaced(client.clone(), NAMESPACE);
    wait(
        &format!("{name}'s status.deltas.lastRevision not at {last}"),
        || async {
            let snapshot = snapshots.get(name).await?;
            let recorded = snapshot.status.and_then(|s| s.deltas).map(|d| d.last_revision);
            Ok(recorded.is_some_and(|r| r >= last).then_some(()))
        },
    )
    .await
}

/// The source cluster: bulk data, continuous backup's full snapshot of it, then the events,
/// every one of them uploaded as deltas.
async fn prepare_source(plane: &Plane, s3: &SeaweedFs, options: &RestoreOptions) -> Result<Source, SimError> {
    let client = &plane.client;
    let store = serde_json::to_value(s3.store(BUCKET))?;
    create_cluster(client, SOURCE, json!({"backup": {"store": {"s3": store}}})).await?;
    let member = ready_member(client, SOURCE).await?;
    let mut kv = member.workload_client().await.map_err(etcd_error)?;
    let started = Instant::now();
    write_bulk(&mut kv, options.megabytes).await?;
    println!(
        "source: {} MiB in {} keys of 64 KiB written in {:.0} s",
        options.megabytes,
        options.megabytes * 16,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let full = continuous_snapshot(client).await?;
    let status = full.status.clone().unwrap_or_default();
    let (Some(base), Some(location)) = (status.revision, status.location.clone()) else {
        return Err(SimError::Setup(format!(
            "snapshot {} has no revision or location",
            full.name_any()
        )));
    };
    let size = u64::try_from(status.size.unwrap_or(0)).unwrap_or(0);
    println!(
        "continuous backup on: full snapshot {} ({:.1} MiB, revision {base}) Succeeded {:.0} s after",
        full.name_any(),
        size as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );
    let at_base = contents(&mut kv, Some(base)).await?;
    let started = Instant::now();
    let last = write_events(&mut kv, options.events).await?;
    let written = started.elapsed();
    let at_last = contents(&mut kv, Some(last)).await?;
    let key = location
        .strip_prefix(&format!("{BUCKET}/"))
        .unwrap_or(&location)
        .to_string();
    let objects = wait_uploaded(&s3.client(BUCKET), &key, last).await?;
    println!(
        "{} events written after it one at a time in {:.1} s (revisions {}–{last}); {objects} delta objects hold them \
         all {:.0} s after the first",
        options.events,
        written.as_secs_f64(),
        base + 1,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    recorded_up_to(client, &full.name_any(), last).await?;
    println!(
        "the snapshot's status.deltas.lastRevision reached {last} {:.0} s later (written at most every 60 s)",
        started.elapsed().as_secs_f64()
    );
    Ok(Source {
        snapshot: full.name_any(),
        size,
        base,
        last,
        at_base,
        at_last,
    })
}

/// What a restore's observer holds between looks.
#[derive(Default)]
struct Watch {
    seen: Seen,
    /// The restored member, once healthy, and the first revision read from it.
    member: Option<(MemberClient, i64)>,
}

/// Look once at the restore of `<name>-etcd` at `now`, noting each step first seen.
async fn observe(
    client: &Client,
    work_dir: &Path,
    (name, size): (&str, u64),
    watch: &mut Watch,
    now: Duration,
) -> Result<(), SimError> {
    let seen = &mut watch.seen;
    let selector = format!("{}={name}-etcd", names::ETCD_CLUSTER_LABEL);
    let machines = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&selector))
        .await?;
    let Some(machine) = machines.items.first() else {
        return Ok(());
    };
    seen.machine.get_or_insert(now);
    let Some(address) = machine.etcd_address() else {
        return Ok(());
    };
    seen.address.get_or_insert(now);
    let file = work_dir
        .join("machines")
        .join(machine.name_any())
        .join(DOWNLOADED);
    if seen.downloaded.is_none() && std::fs::metadata(&file).is_ok_and(|m| size > 0 && m.len() >= size) {
        seen.downloaded = Some(now);
    }
    match &watch.member {
        None => {
            if let Some(member) = healthy(client, name, address).await
                && let Ok(revision) = member.local_revision().await
            {
                seen.healthy = Some(now);
                watch.member = Some((member, revision));
            }
        }
        Some((member, first)) if seen.writing.is_none() => {
            if member.local_revision().await.is_ok_and(|r| r > *first) {
                seen.writing = Some(now);
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// The etcd at `address` (with `<name>`'s CA) when it answers `/health` healthy.
async fn healthy(client: &Client, name: &str, address: &str) -> Option<MemberClient> {
    let tls: EtcdTls = etcd_tls(client, NAMESPACE, name).await.ok()??;
    let member = MemberClient::new(&names::client_url(address), &tls, Duration::from_millis(500)).ok()?;
    member.health().await.is_ok_and(|h| h.healthy).then_some(member)
}

/// When `<name>-etcd`'s `Restored` Event was written, from `start` (its `eventTime`: the
/// controller's clock is this machine's; a poll would see it late or, just before Ready, not at
/// all).
async fn restored_at(client: &Client, name: &str, start: SystemTime) -> Result<Option<Duration>, SimError> {
    let regarding = format!("{name}-etcd");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NAMESPACE);
    let start_us = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Restored")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding.as_str())
        })
        .filter_map(|e| e.event_time.as_ref())
        .map(|t| Duration::from_micros(u64::try_from(t.0.as_microsecond() - start_us).unwrap_or(0)))
        .min())
}

/// Restore `source`'s snapshot into the new cluster `name` (to the latest delta when `latest`),
/// timing each step from the creation to Ready, then check what it holds.
async fn restore(
    plane: &Plane,
    work_dir: &Path,
    name: &str,
    source: &Source,
    latest: bool,
) -> Result<RestoreRun, SimError> {
    let client = &plane.client;
    let mut restore = json!({"snapshot": {"name": source.snapshot}});
    if latest {
        restore["to"] = json!({"latest": true});
    }
    let (start, wall) = (Instant::now(), SystemTime::now());
    create_cluster(client, name, json!({"restore": restore})).await?;
    let mut watch = Watch::default();
    loop {
        let now = start.elapsed();
        if now > TIMEOUT {
            return Err(SimError::Timeout(format!(
                "{name}-etcd not Ready after {TIMEOUT:?}: {:?}",
                watch.seen
            )));
        }
        // Ready first: observing takes a while, and the time to Ready must not include it.
        let etcd = clusters(client).get(&format!("{name}-etcd")).await?;
        if etcd
            .status
            .as_ref()
            .is_some_and(|s| s.ready && s.ready_replicas == Some(1))
        {
            watch.seen.ready = Some(start.elapsed());
            break;
        }
        observe(client, work_dir, (name, source.size), &mut watch, now).await?;
        tokio::time::sleep(POLL).await;
    }
    // Only a replay's Event ends a phase: restored from the snapshot alone, it says that the
    // member is healthy, with the status that makes the cluster Ready.
    if latest {
        watch.seen.restored = restored_at(client, name, wall).await?;
    }
    let written = match &watch.member {
        Some((member, first)) => member.local_revision().await.ok().map(|r| r - first),
        None => None,
    };
    let deltas = check(client, name, source, latest).await?;
    delete(client, name).await?;
    Ok(RestoreRun {
        seen: watch.seen,
        deltas,
        written,
    })
}

/// The restored cluster `name` holds exactly the source's keys at the point restored (its last
/// revision when `latest`, else the full snapshot's), and its status says it reached it.
async fn check(
    client: &Client,
    name: &str,
    source: &Source,
    latest: bool,
) -> Result<Option<DeltasRestored>, SimError> {
    let member = ready_member(client, name).await?;
    let mut kv = member.workload_client().await.map_err(etcd_error)?;
    let held = contents(&mut kv, None).await?;
    let (expected, revision) = match latest {
        true => (&source.at_last, source.last),
        false => (&source.at_base, source.base),
    };
    let etcd = clusters(client).get(&format!("{name}-etcd")).await?;
    let from = etcd.status.and_then(|s| s.restored_from);
    let deltas = from.as_ref().and_then(|f| f.deltas.clone());
    let reached = match (&deltas, &from) {
        (Some(d), _) => Some(d.revision),
        (None, Some(f)) => f.revision,
        (None, None) => None,
    };
    let wrong = |what: String| Err(SimError::Setup(format!("{name}-etcd restored wrong: {what}")));
    if reached != Some(revision) {
        return wrong(format!(
            "status.restoredFrom reaches revision {reached:?}, not {revision}"
        ));
    }
    if held.bulk != expected.bulk || held.small.len() != expected.small.len() {
        return wrong(format!(
            "{} bulk and {} small keys, the source held {} and {} at revision {revision}",
            held.bulk,
            held.small.len(),
            expected.bulk,
            expected.small.len()
        ));
    }
    if held.small != expected.small {
        return wrong(format!(
            "a small key's value differs from the source's at revision {revision}"
        ));
    }
    Ok(deltas)
}

/// Delete `<name>-etcd` and wait until its Machines are gone, so no restored cluster is still
/// running (checked by the controller, its etcd holding the data) while the next one is timed.
async fn delete(client: &Client, name: &str) -> Result<(), SimError> {
    clusters(client)
        .delete(&format!("{name}-etcd"), &DeleteParams::default())
        .await?;
    let selector = format!("{}={name}-etcd", names::ETCD_CLUSTER_LABEL);
    let machines = Api::<Machine>::namespaced(client.clone(), NAMESPACE);
    wait(&format!("{name}-etcd's Machines not gone"), || async {
        let left = machines.list(&ListParams::default().labels(&selector)).await?;
        let gone = clusters(client).get_opt(&format!("{name}-etcd")).await?.is_none();
        Ok((gone && left.items.is_empty()).then_some(()))
    })
    .await
}

/// The median of `values` (the upper one of an even count), `None` when empty.
fn median(values: &[Duration]) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied()
}

fn seconds(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// One row: the label, creation → Ready, each phase, what status says was replayed, the load.
fn print_row(label: &str, total: Option<Duration>, took: &[Option<Duration>], deltas: &str, load: &str) {
    let cells: Vec<String> = took.iter().map(|d| seconds(*d)).collect();
    println!(
        "{label:<18} {:>9} | {} | {deltas} | {load}",
        seconds(total),
        cells.join(" | ")
    );
}

fn print_run(label: &str, run: &RestoreRun, load: &str) {
    let took: Vec<Option<Duration>> = phases(&run.seen).into_iter().map(|(_, t)| t).collect();
    let written = run.written.map_or("?".into(), |w| w.to_string());
    let deltas = run
        .deltas
        .as_ref()
        .map_or(format!("- ({written} revisions written)"), |d| {
            format!(
                "{} objects, {} events ({written} revisions written)",
                d.objects, d.events
            )
        });
    print_row(label, run.seen.ready, &took, &deltas, load);
}

/// The median row of `runs`: creation → Ready and each phase on its own.
fn print_median(runs: &[RestoreRun]) {
    let all: Vec<Vec<(&str, Option<Duration>)>> = runs.iter().map(|r| phases(&r.seen)).collect();
    let count = all.first().map_or(0, Vec::len);
    let took: Vec<Option<Duration>> = (0..count)
        .map(|i| {
            median(
                &all.iter()
                    .filter_map(|p| p.get(i).and_then(|(_, t)| *t))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let totals: Vec<Duration> = runs.iter().filter_map(|r| r.seen.ready).collect();
    print_row("to latest, median", median(&totals), &took, "", "");
}

/// Set up the source and its continuous backup, restore `runs` times to the latest delta and
/// once from the snapshot alone, and print each run's phases and the median.
pub async fn run_restore(work_dir: &Path, options: &RestoreOptions) -> Result<(), SimError> {
    println!("command: {}", options.command());
    let _ = std::fs::remove_dir_all(work_dir);
    let plane = Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, BENCH_PREFIX],
        ..Default::default()
    })
    .await?;
    println!(
        "one plane, SeaweedFS, one-member clusters; Machines boot with the sim's default delay ({})",
        PlaneOptions::default().boot_delay.describe()
    );
    let s3 = SeaweedFs::start().await;
    let bucket = s3.create_bucket(BUCKET).await;
    // SeaweedFS grows a bucket's volumes on its first write: the store's start, not a restore.
    bucket
        .put_object("bench/warm-up", vec![0; 16])
        .await
        .map_err(|e| SimError::Setup(e.to_string()))?;
    create_store_secrets(&plane.client, &s3).await?;
    let source = prepare_source(&plane, &s3, options).await?;
    let titles: Vec<&str> = phases(&Seen::default()).iter().map(|(what, _)| *what).collect();
    println!(
        "{:<18} {:>9} | {} | status.restoredFrom.deltas | load (1 min)",
        "restore",
        "to Ready",
        titles.join(" | ")
    );
    let mut runs = vec![];
    for run in 1..=options.runs {
        let load = format!("load {}", load_average());
        let result = restore(&plane, work_dir, &format!("latest-{run}"), &source, true).await?;
        print_run(&format!("to latest #{run}"), &result, &load);
        runs.push(result);
    }
    let load = format!("load {}", load_average());
    let alone = restore(&plane, work_dir, "snapshot-only", &source, false).await?;
    print_run("snapshot alone", &alone, &load);
    print_median(&runs);
    let totals: Vec<Duration> = runs.iter().filter_map(|r| r.seen.ready).collect();
    println!(
        "to latest, create → Ready: median (min–max) {} over {} runs; every restore held the source's keys at its point",
        spread(&totals),
        totals.len()
    );
    drop(plane);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tenth_write_deletes_a_key_put_before_it() {
        let cases = [
            (0, Op::Put(small_key(0), "value-0".into())),
            (8, Op::Put(small_key(8), "value-8".into())),
            (9, Op::Delete(small_key(0))),
            (10, Op::Put(small_key(10), "value-10".into())),
            (19, Op::Delete(small_key(10))),
        ];
        for (i, want) in cases {
            assert_eq!(op(i), want, "write {i}");
        }
        // Every key deleted was put earlier and not deleted since.
        let mut live = std::collections::BTreeSet::new();
        for i in 0..1000 {
            match op(i) {
                Op::Put(key, _) => assert!(live.insert(key)),
                Op::Delete(key) => assert!(live.remove(&key), "write {i} deletes {key}, not live"),
            }
        }
        assert_eq!(live.len(), 800);
    }

    #[test]
    fn bulk_values_are_64_kib_and_differ_per_key() {
        assert_eq!(bulk_value(0).len(), VALUE_BYTES);
        assert_ne!(bulk_value(0), bulk_value(1));
        assert_eq!(bulk_value(7), bulk_value(7));
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_upper_middle() {
        let d = Duration::from_secs;
        let cases: [(&[Duration], Option<Duration>); 4] = [
            (&[], None),
            (&[d(4)], Some(d(4))),
            (&[d(9), d(1), d(5)], Some(d(5))),
            (&[d(3), d(1), d(2), d(4)], Some(d(3))),
        ];
        for (values, want) in cases {
            assert_eq!(median(values), want, "{values:?}");
        }
    }

    fn at(secs: u64) -> Option<Duration> {
        Some(Duration::from_secs(secs))
    }

    #[test]
    fn phases_count_from_the_last_end_seen() {
        let every = Seen {
            machine: at(1),
            address: at(2),
            downloaded: at(5),
            healthy: at(7),
            writing: at(8),
            restored: at(10),
            ready: at(11),
        };
        let missed_download = Seen {
            downloaded: None,
            ..every.clone()
        };
        let cases = [
            (every, [at(1), at(1), at(3), at(2), at(1), at(2), at(1)]),
            (missed_download, [at(1), at(1), None, at(5), at(1), at(2), at(1)]),
        ];
        for (seen, want) in cases {
            let got: Vec<Option<Duration>> = phases(&seen).into_iter().map(|(_, took)| took).collect();
            assert_eq!(got, want, "{seen:?}");
        }
    }
}
