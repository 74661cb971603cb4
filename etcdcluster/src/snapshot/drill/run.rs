//! One restore drill, start to end: the snapshot downloaded into a scratch directory and checked
//! against the SHA-256 its status records, restored into a throwaway etcd, every delta after it
//! checked and replayed (`backup::delta::replay`), then the copy compared with the cluster at
//! the revision restored: its key count, and the values of keys sampled evenly from the copy.
//! Every step has a deadline; the process and the directory go whatever happens.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::GetOptions;
use kube::Client;
use kube::api::Api;

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::snapshot::DrillResult;
use etcdadm_shared::backup::delta::chain::Target;
use etcdadm_shared::backup::delta::replay;
use etcdadm_shared::etcd::{EtcdTls, MemberClient};
use etcdadm_shared::store::StoreClient;
use etcdadm_shared::store::limits::object_deadline;

use super::super::observe::{CLIENT_COMMON_NAME, cluster_cas, store_client};
use super::process::{Limits, Scratch, Throwaway, Tools, restore_and_start};
use super::{Drill, Sample, Source, compare, over_cap, printable, sample_positions, source_unreadable};

/// Where drills run and what they use.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where etcd and its restore tool are (`--drill-etcd-dir`); none: PATH.
    pub etcd_dir: Option<PathBuf>,
    /// Where scratch directories are made.
    pub scratch: PathBuf,
    /// Deadline of each store request but the snapshot's download.
    pub store_deadline: Duration,
}

/// What a drill found, before it is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub result: DrillResult,
    pub message: String,
    pub revision: Option<i64>,
    pub deltas: Option<i64>,
    pub keys: Option<i64>,
    pub sampled: Option<i64>,
}

impl Report {
    fn failed(message: String) -> Report {
        Report::only(DrillResult::Failed, message)
    }

    fn only(result: DrillResult, message: String) -> Report {
        Report {
            result,
            message,
            revision: None,
            deltas: None,
            keys: None,
            sampled: None,
        }
    }
}

/// Deadline of each call to the source member or the throwaway etcd.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys of the copy read per page while sampling.
const PAGE_KEYS: i64 = 256;
/// A sampled key longer than this gives its place to the next one, and one whose value is
/// larger is left out: the source is read through the controller's capped client (docs/day2.md,
/// "Restore drills").
const MAX_SAMPLED_KEY: usize = 4 << 10;
const MAX_SAMPLED_VALUE: usize = 48 << 10;
/// The throwaway etcd's quota: twice the snapshot, at least etcd's default 2 GiB.
const MIN_QUOTA: u64 = 2 << 30;
const MAX_QUOTA: u64 = 32 << 30;
/// Lifetime of the client certificate the source is read with.
const SOURCE_CERT_VALIDITY: Duration = Duration::from_secs(3600);

/// How long a whole drill of a `size`-byte snapshot may take: its download's deadline, as long
/// again to restore it, and an hour for the deltas and the comparison.
pub fn deadline(size: u64) -> Duration {
    object_deadline(size) * 2 + Duration::from_secs(3600)
}

/// Run `want` for the cluster `cluster` in `namespace`, within [`deadline`].
pub async fn drill(
    client: &Client,
    namespace: &str,
    cluster: &str,
    want: &Drill,
    settings: &Settings,
) -> Report {
    let limit = deadline(want.size);
    match tokio::time::timeout(limit, steps(client, namespace, cluster, want, settings)).await {
        Ok(report) => report,
        Err(_) => Report::failed(format!("the drill did not finish within {limit:?}")),
    }
}

/// Each step of a drill in order; the first that fails ends it with its report.
async fn steps(client: &Client, namespace: &str, cluster: &str, want: &Drill, settings: &Settings) -> Report {
    let tools = match Tools::find(settings.etcd_dir.as_deref()) {
        Ok(tools) => tools,
        Err(e) => return Report::failed(e),
    };
    let store = match store_client(client, namespace, &want.store, settings.store_deadline).await {
        Ok(Ok(store)) => store,
        Ok(Err(e)) => return Report::failed(format!("the snapshot's store: {e}")),
        Err(e) => {
            return Report::only(
                DrillResult::Inconclusive,
                format!("reading the store's Secrets: {e}"),
            );
        }
    };
    let scratch = match Scratch::new(&settings.scratch, &want.snapshot) {
        Ok(scratch) => scratch,
        Err(e) => {
            return Report::failed(format!(
                "making a scratch directory in {}: {e}",
                settings.scratch.display()
            ));
        }
    };
    let copy = match restored(&tools, &store, &scratch, want).await {
        Ok(copy) => copy,
        Err(report) => return *report,
    };
    let verified = match replay::verify(&store, &want.key, want.base, want.recorded, Target::Latest).await {
        Ok(verified) => verified,
        Err(e) => return Report::failed(format!("the deltas after the snapshot: {e}")),
    };
    let deltas = i64::try_from(verified.chain.deltas.len()).unwrap_or(i64::MAX);
    let mut writer = match copy.client.etcd_client().await {
        Ok(writer) => writer,
        Err(e) => return Report::failed(format!("connecting to the throwaway etcd: {e}")),
    };
    if let Err(e) = replay::replay(&store, &want.key, want.base, &verified, &mut writer).await {
        return Report::failed(format!("replaying the deltas: {e}"));
    }
    let mut report = compared(client, namespace, cluster, want, &copy, verified.revision).await;
    if report.result == DrillResult::Inconclusive {
        // What did work is worth saying: the backup restored.
        report.message = format!(
            "the snapshot and {deltas} delta objects restored; {}",
            report.message
        );
    }
    report.revision = Some(verified.revision);
    report.deltas = Some(deltas);
    drop(copy);
    drop(scratch);
    report
}

/// The snapshot downloaded, checked and served by a throwaway etcd.
async fn restored(
    tools: &Tools,
    store: &StoreClient,
    scratch: &Scratch,
    want: &Drill,
) -> Result<Throwaway, Box<Report>> {
    let failed = |message: String| Box::new(Report::failed(message));
    let file_path = scratch.path().join("snapshot.db");
    let mut file = tokio::fs::File::create(&file_path)
        .await
        .map_err(|e| failed(format!("creating {}: {e}", file_path.display())))?;
    let sha256 = store
        .download_to(&want.key, want.size, &mut file)
        .await
        .map_err(|e| failed(format!("downloading the snapshot: {e}")))?;
    drop(file);
    if !sha256.eq_ignore_ascii_case(&want.sha256) {
        return Err(failed(format!(
            "the snapshot's object {} has SHA-256 {sha256}, its status records {}: it was altered or damaged",
            store.location(&want.key),
            want.sha256
        )));
    }
    let limits = Limits {
        restore: object_deadline(want.size),
        start: Duration::from_secs(120),
        call: CALL_TIMEOUT,
    };
    let quota = want.size.saturating_mul(2).clamp(MIN_QUOTA, MAX_QUOTA);
    let copy = restore_and_start(tools, scratch, &file_path, quota, limits)
        .await
        .map_err(|e| failed(format!("restoring the snapshot: {e}")))?;
    // The data directory holds it now: the download's disk goes.
    let _ = tokio::fs::remove_file(&file_path).await;
    Ok(copy)
}

/// The copy compared with the source at `revision`.
async fn compared(
    client: &Client,
    namespace: &str,
    cluster: &str,
    want: &Drill,
    copy: &Throwaway,
    revision: i64,
) -> Report {
    let inconclusive = |message: String| Report::only(DrillResult::Inconclusive, message);
    let mut source = match source_client(client, namespace, cluster, want).await {
        Ok(source) => source,
        Err(e) => return inconclusive(format!("reading the source cluster: {e}")),
    };
    let mut reader = match copy.client.workload_client().await {
        Ok(reader) => reader,
        Err(e) => return Report::failed(format!("connecting to the throwaway etcd: {e}")),
    };
    let at = GetOptions::new().with_revision(revision);
    let source_count = match source
        .get(vec![0], Some(at.clone().with_all_keys().with_count_only()))
        .await
    {
        Ok(answer) => answer.count(),
        Err(e) => return inconclusive(source_problem(&e, revision)),
    };
    let restored_count = match reader
        .get(vec![0], Some(GetOptions::new().with_all_keys().with_count_only()))
        .await
    {
        Ok(answer) => answer.count(),
        Err(e) => return Report::failed(format!("counting the restored keys: {e}")),
    };
    let mut report = Report::only(DrillResult::Failed, String::new());
    report.keys = Some(restored_count);
    let keys = match sampled_keys(&mut reader, restored_count, want.sample_keys).await {
        Ok(keys) => keys,
        Err(e) => {
            report.message = format!("reading the restored keys: {e}");
            return report;
        }
    };
    let mut samples = Vec::with_capacity(keys.len());
    for key in keys {
        let restored = match reader.get(key.clone(), None).await {
            Ok(answer) => answer.kvs().first().map(|kv| kv.value().to_vec()),
            Err(e) => {
                report.message = format!("reading key {} from the copy: {e}", printable(&key));
                return report;
            }
        };
        let Some(restored) = restored.filter(|v| v.len() <= MAX_SAMPLED_VALUE) else {
            continue;
        };
        let source_value = match source.get(key.clone(), Some(at.clone())).await {
            Ok(answer) => match answer.kvs().first() {
                Some(kv) => Source::Value(kv.value().to_vec()),
                None => Source::Absent,
            },
            Err(e) if over_cap(&e.to_string()) => Source::OverCap,
            Err(e) => return inconclusive(source_problem(&e, revision)),
        };
        samples.push(Sample {
            key,
            restored,
            source: source_value,
        });
    }
    let (result, message) = compare(source_count, restored_count, &samples).outcome(revision, samples.len());
    report.result = result;
    report.message = message;
    report.sampled = Some(i64::try_from(samples.len()).unwrap_or(i64::MAX));
    report
}

/// The controller's (capped) client of the member `want` names, with an identity from each of
/// the cluster's CAs.
async fn source_client(
    client: &Client,
    namespace: &str,
    cluster: &str,
    want: &Drill,
) -> Result<etcd_client::Client, String> {
    let clusters: Api<EtcdadmCluster> = Api::namespaced(client.clone(), namespace);
    let etcd = clusters
        .get_opt(cluster)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("EtcdadmCluster {cluster} is gone"))?;
    let cas = cluster_cas(client, &etcd).await.map_err(|e| e.to_string())??;
    let cas: Vec<&etcdadm_shared::pki::CertificateAuthority> = cas.iter().collect();
    let tls =
        EtcdTls::issued_by_each(&cas, CLIENT_COMMON_NAME, SOURCE_CERT_VALIDITY).map_err(|e| e.to_string())?;
    let member =
        MemberClient::with_config(&want.member.client_url, tls, CALL_TIMEOUT).map_err(|e| e.to_string())?;
    member.etcd_client().await.map_err(|e| e.to_string())
}

/// Why the source could not be read at `revision` (see [`source_unreadable`]).
fn source_problem(e: &etcd_client::Error, revision: i64) -> String {
    source_unreadable(&e.to_string(), revision)
}

/// The keys at [`sample_positions`] of the copy's `total`, read a page at a time; keys longer
/// than [`MAX_SAMPLED_KEY`] give their place to the next key.
async fn sampled_keys(
    reader: &mut etcd_client::Client,
    total: i64,
    wanted: usize,
) -> Result<Vec<Vec<u8>>, etcd_client::Error> {
    let positions = sample_positions(u64::try_from(total).unwrap_or(0), wanted);
    let mut want = positions.iter().copied().peekable();
    let mut keys = Vec::with_capacity(positions.len());
    let mut index = 0u64;
    let mut from = vec![0u8];
    let mut owed = 0usize;
    while want.peek().is_some() || owed > 0 {
        let page = reader
            .get(
                from.clone(),
                Some(
                    GetOptions::new()
                        .with_from_key()
                        .with_keys_only()
                        .with_limit(PAGE_KEYS),
                ),
            )
            .await?;
        let Some(last) = page.kvs().last().map(|kv| kv.key().to_vec()) else {
            break;
        };
        for kv in page.kvs() {
            if want.peek() == Some(&index) {
                want.next();
                owed += 1;
            }
            if owed > 0 && kv.key().len() <= MAX_SAMPLED_KEY {
                keys.push(kv.key().to_vec());
                owed -= 1;
            }
            index += 1;
        }
        from = last;
        from.push(0);
    }
    Ok(keys)
}
